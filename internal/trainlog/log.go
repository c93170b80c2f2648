// Package trainlog diagnoses a mixed-precision training run from its
// history: the loss of every optimizer step and the GradScaler loss scale
// after every step, held in a Log (package logfile reads one from the
// forms people have). It reconstructs what the scaler did (skipped steps,
// backoff runs, collapse, pinning, warm-up; lower bounds when the log holds
// every Nth step) and what the telemetry says about the modules once, runs
// the FP5xxx checks as analyzers over those facts (checks.RunAnalyzers:
// --checks switches them off) and takes the one verdict their findings
// decide; with telemetry it names the modules whose gradients overflow or
// lose mass to fp16. The failure classes are those of the table in
// DESIGN.md, decided by the evidence rather than by when the loss went
// NaN: a NaN after a collapsing scale (gradient overflow, whenever it
// comes), an early NaN without one (a forward overflow or poisoned data),
// a later NaN with a healthy scale (the forward pass began to overflow), a
// plateau above the fp32 baseline (underflow at a pinned scale, skipped
// steps), non-finite losses the run recovered from (a batch is the
// suspect), wasted warm-up steps, healthy. A log that points to captures
// of the failing step defers that failure's class to their replay.
package trainlog

import "fp16audit/report"

// Log is one training run: one entry per optimizer step, or per sampled
// step when Steps says so. Scales[i] is scaler.get_scale() read after the
// scaler.update() of step i, that is the scale the next step uses; a step
// whose gradients overflowed shows as a backoff (Scales[i] = Scales[i-1] ×
// backoff_factor). Losses may hold NaN and ±Inf. A log has losses, scales
// or both; when both, they have the same length.
type Log struct {
	// Path names the log in messages and reports.
	Path string
	// FirstStep is the step number of the first entry: the CSV's first
	// step value, 0 for JSON.
	FirstStep int
	// Steps holds the step number of every entry when the entries are not
	// consecutive steps (a log written every N steps); nil means FirstStep,
	// FirstStep+1, and so on.
	Steps []int
	// Losses is nil when the log records no losses.
	Losses []float64
	// Scales is nil when the log records no scales. NaN marks an entry
	// whose scale was not recorded (a scale column logged less often than
	// the loss); no GradScaler scale is NaN.
	Scales []float64
	// Skipped holds a log's own record of skipped steps (a skipped,
	// found_inf or overflow column): 1 skipped, 0 not, -1 not recorded;
	// nil when the log has none.
	Skipped []int8
	// Epochs holds the epoch of every step, nil when unknown.
	Epochs []int
	// StepsPerEpoch is the JSON field steps_per_epoch, 0 when absent.
	StepsPerEpoch int
	// Scaler is the GradScaler configuration the log states; zero fields
	// were not stated.
	Scaler report.ScalerConfig
	// Format is how the log was read (report.RunInfo.Format).
	Format string
	// PerEpoch is set when every entry is one epoch (fastai's
	// history.csv); Steps then holds epoch numbers.
	PerEpoch bool
	// ValidLosses holds a per-epoch log's validation losses (NaN where
	// none was computed), nil otherwise.
	ValidLosses []float64
	// Telemetry holds the per-module gradient telemetry of a log written
	// by the Python companion, in file order; TelemetryModules is the
	// number of modules its header says were watched (0: no telemetry).
	Telemetry        []TelemetryLine
	TelemetryModules int
	// Captures are the capture lines of the companion's log
	// (docs/capture.md): the capture folders the recorder wrote, or
	// failed to write, during the run, in file order.
	Captures []Capture
	// Notes and NotDerived are facts the reader learned about the log
	// (columns it recognised, a run that stopped early) and what the form
	// of the log cannot tell; the report carries them.
	Notes      []string
	NotDerived []string
}

// TelemetryLine is one telemetry line of the companion's log: per-module
// gradient summaries of one step, measured on the scaled gradients as fp16
// would hold them (python/README.md, "telemetry").
type TelemetryLine struct {
	// Line is the line of the file, for messages.
	Line  int
	Step  int
	Skip  bool // reasons holds "skipped"
	Full  bool // measured is "full": the underflow counts are present
	Scale float64
	// FirstNonFiniteOutput and FirstNonFiniteParams are the companion's
	// first module, in backward order, whose output or parameter
	// gradient held Inf/NaN in fp16; "" when none did.
	FirstNonFiniteOutput string
	FirstNonFiniteParams string
	// Modules are in backward order: the order their first gradient
	// arrived in.
	Modules []ModuleGrads
}

// Capture is one capture line of the companion's log: the recorder wrote
// the state of step Step to the folder Path when Trigger fired, or failed
// to and left Error.
type Capture struct {
	// Line is the line of the file, for messages.
	Line        int
	Step        int
	Trigger     string
	Path, Error string
}

// ModuleGrads is one module's entry in a telemetry line; Output and Params
// are nil when that gradient did not arrive.
type ModuleGrads struct {
	Name, Type     string
	Output, Params *GradSummary
}

// GradSummary is the companion's summary of one gradient of one module.
// The pointer fields are nil when the line did not measure them.
type GradSummary struct {
	Numel        int
	NonFinite    int
	NonFiniteSrc int
	MaxAbs       float64
	Nonzero      *int
	Underflow    *int
	Subnormal    *int
	// SumSq is the squared L2 norm of the scaled gradient over the
	// elements fp16 holds finite, LostSumSq that of what fp16 loses of
	// them (fp16(x) − x): lost_mass is √(LostSumSq/SumSq). A log written
	// before the companion recorded them has neither.
	SumSq, LostSumSq *float64
}

// Len is the number of entries in the log: its steps, or its samples when
// Steps is set.
func (l *Log) Len() int { return max(len(l.Losses), len(l.Scales)) }

// Step is the step number of entry i.
func (l *Log) Step(i int) int {
	if l.Steps != nil {
		return l.Steps[i]
	}
	return l.FirstStep + i
}

// LastStep is the step number of the last entry.
func (l *Log) LastStep() int { return l.Step(l.Len() - 1) }

// Sampled reports whether the log holds fewer entries than the steps it
// spans: a log written every N steps.
func (l *Log) Sampled() bool { return l.Steps != nil && !l.PerEpoch }

// DefaultScaler is PyTorch's GradScaler configuration by default
// (torch.amp.GradScaler and fastai's MixedPrecision, which passes its
// kwargs through).
var DefaultScaler = report.ScalerConfig{InitScale: 65536, GrowthFactor: 2, BackoffFactor: 0.5, GrowthInterval: 2000}
