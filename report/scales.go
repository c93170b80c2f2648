package report

import (
	"fmt"
	"math"

	"fp16audit/checks"
)

// ScalesSchema names the JSON shape of ScalesReport. It changes only when a field
// is removed or changes meaning; new fields may appear within a version.
// v1.1 judges the telemetry's underflowing gradients by the mass they lose
// when the log records it (telemetry.underflow, measure lost_mass) and
// records the --checks selection. v1.2 tells the non-finite losses a run
// recovered from (losses.recovered_nonfinite, the recovered-nan verdict)
// from the failing one the NaN verdicts and scales.scale_at_first_nan are
// about (losses.failing_step), judges a collapse by the backoffs of finite
// losses whenever the NaN comes, pins a scale held down to the end of the
// run (scales.pinned_since) and lists the captures the log points to;
// v1 and v1.1 documents read as v1.2.
const ScalesSchema = "fp16audit.scales/v1.2"

// ScalesSchemaV11 is the version before ScalesSchema, which `fp16audit
// render` still reads.
const ScalesSchemaV11 = "fp16audit.scales/v1.1"

// ScalesSchemaV1 is the first version of ScalesSchema, which `fp16audit
// render` still reads.
const ScalesSchemaV1 = "fp16audit.scales/v1"

// Verdict identifiers of `fp16audit scales`, in the order the diagnosis tests
// them. They are
// stable: scripts may branch on them.
const (
	// ScalesGradientOverflowNaN: the loss went NaN after the loss scale
	// collapsed, whenever that happens: chronic gradient overflow,
	// divergence (FP5002).
	ScalesGradientOverflowNaN = "gradient-overflow-nan"
	// ScalesEarlyNaN: the loss went NaN/Inf within the first epoch (or the
	// first EarlySteps steps) without a collapse before it: a forward
	// overflow or poisoned data (FP5001).
	ScalesEarlyNaN = "early-nan"
	// ScalesForwardOverflowNaN: NaN mid-training with a healthy scale: the
	// forward pass began to overflow as the weights grew (FP5003).
	ScalesForwardOverflowNaN = "forward-overflow-nan"
	// ScalesLateNaN: NaN mid-training in a log without scales, so the
	// cause cannot be told (FP5004).
	ScalesLateNaN = "late-nan"
	// ScalesPlateauUnderflow: the run ends above the fp32 baseline beyond
	// the tolerance, with many skipped steps or a scale pinned low (FP5005).
	ScalesPlateauUnderflow = "plateau-underflow"
	// ScalesPlateauUnexplained: the run ends above the fp32 baseline
	// beyond the tolerance, but the scale history is clean (FP5006).
	ScalesPlateauUnexplained = "plateau-unexplained"
	// ScalesRecoveredNaN: some losses were NaN/Inf, but the run went on
	// with finite losses after them: the scaler skipped those steps, and
	// their batches are the suspects (FP5012).
	ScalesRecoveredNaN = "recovered-nan"
	// ScalesWastedWarmup: the first steps were all skipped while the scale
	// came down from init_scale (FP5008).
	ScalesWastedWarmup = "wasted-warmup"
	// ScalesFP16Noise: a gap to the fp32 baseline within the tolerance and
	// no sign of skipping or underflow (FP5007).
	ScalesFP16Noise = "fp16-noise"
	// ScalesHealthy: none of the above; warnings may remain (FP5009,
	// FP5010) when there is no baseline to judge their cost.
	ScalesHealthy = "healthy"
)

// ScalesReport is the finished diagnosis of a training log (`fp16audit
// scales`). Renderers read it
// and compute nothing. Steps are numbered as in the log (a CSV's step
// column, from 0 in JSON).
type ScalesReport struct {
	Schema   string   `json:"schema"`
	Run      RunInfo  `json:"run"`
	Baseline *RunInfo `json:"baseline,omitempty"`
	// GradScaler is the configuration the reconstruction used; absent
	// without scales.
	GradScaler *ScalerInfo      `json:"grad_scaler,omitempty"`
	Thresholds ScalesThresholds `json:"thresholds"`
	// Checks is the --checks selection the diagnosis ran ("all" by
	// default): a check switched off neither reports nor decides.
	Checks string `json:"checks,omitempty"`
	// Verdict is one of the Scales* verdict identifiers.
	Verdict     string `json:"verdict"`
	VerdictText string `json:"verdict_text"`
	Fix         string `json:"fix,omitempty"`
	// Scales is the reconstruction from the scale series; absent without
	// scales.
	Scales *ScaleStats `json:"scales,omitempty"`
	// Losses summarizes the loss series; absent without losses.
	Losses *LossStats `json:"losses,omitempty"`
	// Comparison sets the run against the fp32 baseline; absent without a
	// baseline or when the run has no losses.
	Comparison *Comparison `json:"comparison,omitempty"`
	// Epochs holds the skip count per epoch when epochs and scales are
	// known.
	Epochs []EpochStats `json:"epochs,omitempty"`
	// Series is the history in at most 120 buckets of
	// consecutive steps, for plots.
	Series   []Bucket         `json:"series"`
	Findings []checks.Finding `json:"findings"`
	// Telemetry is what the companion's per-module gradient telemetry
	// (python/README.md) says about the modules whose gradients overflow
	// or underflow; absent when the log carries none.
	Telemetry *TelemetryStats `json:"telemetry,omitempty"`
	// Captures are the capture folders the log points to (its capture
	// lines, docs/capture.md), in log order; absent when it has none.
	Captures []Capture `json:"captures,omitempty"`
	// NotDerived names what the log did not allow to derive, and why.
	NotDerived []string `json:"not_derived"`
	// Notes are facts about how the log was read that a reader must know.
	Notes []string `json:"notes"`
}

// RunInfo describes one input log.
type RunInfo struct {
	Path string `json:"path"`
	// Steps is the number of optimizer steps the log spans, from FirstStep
	// to its last step; for a per-epoch log (PerEpoch), the number of
	// epochs. A sampled log whose first sample lies within one sampling
	// gap of step 0 is read from step 0 (its first scale follows
	// init_scale), and FirstStep is then 0.
	Steps         int  `json:"steps"`
	FirstStep     int  `json:"first_step"`
	HasLosses     bool `json:"has_losses"`
	HasScales     bool `json:"has_scales"`
	Epochs        int  `json:"epochs,omitempty"`
	StepsPerEpoch int  `json:"steps_per_epoch,omitempty"`
	// Format is how the log was read: json, csv, tsv, jsonl, trainlog (the
	// companion's JSON Lines log), tfevents, npy, list (a plain list of
	// numbers) or fastai-history (fastai's CSVLogger history.csv).
	Format string `json:"format,omitempty"`
	// Samples is the number of entries of a log that does not hold every
	// step (sampled every SampleEvery steps, the most common gap); absent
	// for a log with one entry per step.
	Samples     int `json:"samples,omitempty"`
	SampleEvery int `json:"sample_every,omitempty"`
	// PerEpoch is set when the log holds one entry per epoch (fastai's
	// history.csv): step numbers in the report are then epoch numbers.
	PerEpoch bool `json:"per_epoch,omitempty"`
}

// ScalerInfo is the GradScaler configuration used for the reconstruction
// and where each value came from: "log", "inferred" (from the series) or
// "default" (PyTorch's).
type ScalerInfo struct {
	ScalerConfig
	InitScaleFrom      string `json:"init_scale_from"`
	GrowthIntervalFrom string `json:"growth_interval_from"`
}

// ScaleStats is what the scale series says about the scaler.
type ScaleStats struct {
	// Skipped counts every step whose scale backed off: its gradients held
	// Inf/NaN and the optimizer step was skipped. In a sampled log it is a
	// lower bound (SkippedLowerBound): the backoffs the scale ratios
	// between samples prove, and SkippedMax the most the gaps allow.
	Skipped           int     `json:"skipped_steps"`
	SkipRate          float64 `json:"skip_rate"`
	SkippedLowerBound bool    `json:"skipped_lower_bound,omitempty"`
	SkippedMax        *int    `json:"skipped_steps_max,omitempty"`
	// SkippedAt lists the skipped steps, at most 1000 of them.
	SkippedAt          []int `json:"skipped_at"`
	SkippedAtTruncated bool  `json:"skipped_at_truncated,omitempty"`
	// WarmupSkipped counts the consecutive skipped steps at the very start
	// and WarmupScale is the scale they ended at (the first that worked).
	WarmupSkipped int     `json:"warmup_skipped"`
	WarmupScale   float64 `json:"warmup_scale,omitempty"`
	// SkipRateAfterWarmup is the skip rate of the steps after the warm-up
	// run and before the first NaN: the rate the diagnosis judges.
	SkipRateAfterWarmup float64 `json:"skip_rate_after_warmup"`
	// LongestBackoffRun is the longest run of consecutive skipped steps.
	LongestBackoffRun      int     `json:"longest_backoff_run"`
	LongestBackoffRunStart int     `json:"longest_backoff_run_start"`
	MinScale               float64 `json:"min_scale"`
	MinScaleStep           int     `json:"min_scale_step"`
	MaxScale               float64 `json:"max_scale"`
	FinalScale             float64 `json:"final_scale"`
	Growths                int     `json:"growths"`
	// LongestNoGrowth is the longest stretch before the failing NaN
	// without a growth of the scale, with its start and the backoffs
	// inside it.
	LongestNoGrowth         int `json:"longest_no_growth_steps"`
	LongestNoGrowthStart    int `json:"longest_no_growth_start"`
	LongestNoGrowthBackoffs int `json:"longest_no_growth_backoffs"`
	// Pinned is set when that stretch spans PinnedIntervals growth
	// intervals with at least as many backoffs (PinnedScale: the scale at
	// its end), or when the scale is held down: it fell CollapseBits or
	// more below its highest value after the warm-up, to at most LowScale,
	// and stayed there from PinnedSince to the end of the judged steps,
	// for at least the final window, without growing back (GradScaler
	// regains one growth per growth interval of clean steps).
	Pinned      bool    `json:"pinned"`
	PinnedScale float64 `json:"pinned_scale,omitempty"`
	PinnedSince *int    `json:"pinned_since,omitempty"`
	// InferredNaNStep is set for a log without losses whose last steps
	// were all skipped (at least eight): non-finite gradients on every
	// step, which is what a NaN loss does. The diagnosis takes it as the
	// first NaN.
	InferredNaNStep *int `json:"inferred_nan_step,omitempty"`
	// ScaleAtFirstNaN is the scale in effect at the failing step
	// (LossStats.FailingStep: the non-finite loss the run did not recover
	// from), the scale after the previous step's update.
	ScaleAtFirstNaN *float64 `json:"scale_at_first_nan,omitempty"`
	// CollapseBits is how far the scale fell, in powers of two, from its
	// highest value in the window before the failing step (after the
	// warm-up) to ScaleAtFirstNaN; BackoffsBeforeNaN counts the skipped
	// steps in that window and GradientBackoffsBeforeNaN those of them
	// whose loss was finite: gradients that overflowed while the forward
	// pass did not (all of them in a log without losses). A collapse is
	// CollapseBits of fall with as many halvings from such backoffs.
	CollapseBits              *float64 `json:"collapse_bits,omitempty"`
	CollapseWindow            int      `json:"collapse_window,omitempty"`
	BackoffsBeforeNaN         int      `json:"backoffs_before_nan,omitempty"`
	GradientBackoffsBeforeNaN int      `json:"gradient_backoffs_before_nan,omitempty"`
}

// LossStats summarizes the loss series.
type LossStats struct {
	// NonFinite counts the NaN/Inf losses, TrailingNonFinite those of them
	// that end the log in one run (a run that never recovered).
	NonFinite         int `json:"nonfinite"`
	TrailingNonFinite int `json:"trailing_nonfinite,omitempty"`
	// FirstNonFiniteStep is the step of the first NaN/Inf loss, absent
	// when every loss is finite. Inferred is set when the log has no
	// losses and the step was inferred from the scale halving on every
	// step to the end of the log.
	FirstNonFiniteStep  *int   `json:"first_nonfinite_step,omitempty"`
	FirstNonFiniteValue string `json:"first_nonfinite_value,omitempty"`
	Inferred            bool   `json:"inferred,omitempty"`
	// FailingStep is where the loss went NaN/Inf for good: the log ends
	// with a non-finite loss, and this is the first step of the shortest
	// final stretch in which at least half the losses are non-finite (a
	// failure that begins on some batches and then takes all is one).
	// Absent when the last loss is finite. FailingValue is its loss.
	FailingStep  *int   `json:"failing_step,omitempty"`
	FailingValue string `json:"failing_value,omitempty"`
	// Recovered counts the non-finite losses before FailingStep (all of
	// them when it is absent): steps the run went on from with finite
	// losses. RecoveredAt lists their steps, at most 1000.
	Recovered   int   `json:"recovered_nonfinite,omitempty"`
	RecoveredAt []int `json:"recovered_nonfinite_steps,omitempty"`
	// FirstLoss and FinalLoss are means of the first and last windows of
	// finite losses (FinalWindow steps, before FailingStep); FirstSteps
	// and FinalSteps are the steps those windows span.
	FirstLoss   *float64   `json:"first_loss,omitempty"`
	FinalLoss   *float64   `json:"final_loss,omitempty"`
	FinalWindow int        `json:"final_window"`
	FirstSteps  *StepRange `json:"first_steps,omitempty"`
	FinalSteps  *StepRange `json:"final_steps,omitempty"`
	// LastFiniteStep is the step of the last finite loss in the log (after
	// a NaN that the run recovered from, later than FinalSteps); absent
	// when no loss is finite.
	LastFiniteStep *int `json:"last_finite_step,omitempty"`
}

// StepRange is the steps From to To of a log, both included.
type StepRange struct {
	From int `json:"from"`
	To   int `json:"to"`
}

// Comparison sets the run's final loss against the fp32 baseline's over the
// same steps.
type Comparison struct {
	// Steps is the number of steps both logs cover; both final losses are
	// means over the Window steps that end there.
	Steps        int     `json:"steps"`
	Window       int     `json:"window"`
	RunLoss      float64 `json:"run_loss"`
	BaselineLoss float64 `json:"baseline_loss"`
	// Gap is (run - baseline) / |baseline|.
	Gap       float64 `json:"gap"`
	Tolerance float64 `json:"tolerance"`
}

// EpochStats counts the skipped steps of one epoch.
type EpochStats struct {
	Epoch    int     `json:"epoch"`
	Steps    int     `json:"steps"`
	Skipped  int     `json:"skipped"`
	SkipRate float64 `json:"skip_rate"`
}

// Bucket summarizes consecutive steps From..To for plots: the mean of the
// finite losses (and of the fp32 baseline's over the same steps, when one
// is given), the non-finite losses, log2 of the scale's range and the
// skipped steps.
type Bucket struct {
	From         int      `json:"from"`
	To           int      `json:"to"`
	Loss         *float64 `json:"loss,omitempty"`
	BaselineLoss *float64 `json:"baseline_loss,omitempty"`
	NonFinite    int      `json:"nonfinite,omitempty"`
	Log2ScaleMin *float64 `json:"log2_scale_min,omitempty"`
	Log2ScaleMax *float64 `json:"log2_scale_max,omitempty"`
	Skipped      int      `json:"skipped,omitempty"`
}

// TelemetryStats summarizes the per-module gradient telemetry of a log
// written by the Python companion: which module's gradients began the
// overflows of the skipped steps, and which modules lose a share of their
// gradient to fp16 underflow.
type TelemetryStats struct {
	// Lines counts the telemetry lines read; FullLines those measured in
	// full (with underflow counts), SkippedLines those of skipped steps.
	Lines        int `json:"lines"`
	FullLines    int `json:"full_lines"`
	SkippedLines int `json:"skipped_lines"`
	// Modules is the number of modules the companion watched.
	Modules int `json:"modules"`
	// OverflowFrom and OverflowTo bound the steps whose skipped-step lines
	// Overflow counts: after the warm-up, before the failing NaN (when the
	// run has a collapse, its window before the NaN). OverflowLines counts
	// those lines; a skipped step whose loss was non-finite is not one
	// (every gradient of a non-finite loss is non-finite).
	OverflowFrom  int `json:"overflow_from"`
	OverflowTo    int `json:"overflow_to"`
	OverflowLines int `json:"overflow_lines"`
	// Overflow lists the modules where the overflows of those skipped steps
	// began, most often first.
	Overflow []ModuleOverflow `json:"overflow"`
	// Underflow lists the gradients that lose to fp16 underflow, measured
	// on the full lines after the warm-up and before any NaN: by the mass
	// they lose (at or above lost_mass_tolerance) where the log records
	// it, most first, then by the share of their elements flushed (at or
	// above underflow_fraction), most first.
	Underflow []ModuleUnderflow `json:"underflow"`
}

// Capture is a capture folder the recorder wrote during the run (a capture
// line of the companion's log, docs/capture.md): the state of one training
// step that `fp16audit replay` replays.
type Capture struct {
	Step int `json:"step"`
	// Trigger is what made the recorder capture: nonfinite-loss,
	// scale-collapse, pinned-plateau, loss-spike or request.
	Trigger string `json:"trigger"`
	// Path is the folder as the recorder was given it (relative to the
	// directory the run was started in, or absolute); empty when the
	// capture failed to write, and Error then says why.
	Path  string `json:"path,omitempty"`
	Error string `json:"error,omitempty"`
	// Replay is the command that replays it: fp16audit replay PATH.
	Replay string `json:"replay,omitempty"`
	// Decides is set on the capture of the failure the verdict names: its
	// replay, not the log, decides that failure's class (the verdict says
	// so). A capture of that failure that failed to write is marked too,
	// with its Error, and the log's verdict stands.
	Decides bool `json:"decides,omitempty"`
}

// ModuleOverflow is one module named as the origin of overflows: the first
// module, in backward order, whose output gradient (or, failing that,
// parameter gradient) did not fit fp16 on a skipped step.
type ModuleOverflow struct {
	Module string `json:"module"`
	Type   string `json:"type,omitempty"`
	// Steps counts the skipped steps whose overflow began here, of
	// OfSteps skipped steps with telemetry in the window.
	Steps   int `json:"steps"`
	OfSteps int `json:"of_steps"`
	// OutputSteps counts the steps, of Steps, on which the module's output
	// gradient overflowed (on the others, only its parameter gradient
	// did); Via is "output" when that is most of them, else "params".
	OutputSteps int    `json:"output_steps"`
	Via         string `json:"via"`
	FirstStep   int    `json:"first_step"`
	LastStep    int    `json:"last_step"`
	// MaxAbs is the largest finite scaled gradient the module held on
	// those steps and MaxUnscaled the largest MaxAbs / scale_used: the
	// gradient itself, which the scale cannot shrink.
	MaxAbs      float64 `json:"max_abs"`
	MaxUnscaled float64 `json:"max_unscaled"`
}

// ModuleUnderflow is one module whose gradient loses to fp16 underflow at
// the scales the run used.
type ModuleUnderflow struct {
	Module string `json:"module"`
	Type   string `json:"type,omitempty"`
	// Gradient is "output" or "params": the gradient measured.
	Gradient string `json:"gradient"`
	// Measure is what judged it: "lost_mass" (LostMass, the log records
	// it), "underflow" (elements fp16 flushes to zero, measured on a
	// gradient wider than fp16: a log without lost_mass) or "subnormal"
	// (elements already in fp16's subnormal range, where neither can be
	// measured).
	Measure string `json:"measure"`
	// LostMass, with measure lost_mass, is the share of the gradient's L2
	// norm fp16 loses, ‖fp16(g·S)/S − g‖ / ‖g‖ at each line's scale S,
	// pooled over Lines full lines: √(Σ lost² / Σ ‖g‖²), each unscaled.
	LostMass *float64 `json:"lost_mass,omitempty"`
	// Fraction is Count / Nonzero summed over Lines full lines: for
	// measure lost_mass, the elements those lines flush to zero.
	Fraction float64 `json:"fraction"`
	Count    int     `json:"count"`
	Nonzero  int     `json:"nonzero"`
	Lines    int     `json:"lines"`
	// MedianScale is the median scale_used of those lines.
	MedianScale float64 `json:"median_scale"`
}

// MaxSeverity is the highest severity among the findings, -1 when none.
func (r *ScalesReport) MaxSeverity() checks.Severity {
	s := checks.Severity(-1)
	for _, f := range r.Findings {
		s = max(s, f.Severity)
	}
	return s
}

// ScalesThresholds are the thresholds of the scales diagnosis.
type ScalesThresholds struct {
	// PlateauTolerance is the relative gap between the run's and the
	// baseline's final loss above which the run has plateaued.
	PlateauTolerance float64 `json:"plateau_tolerance"`
	// EarlySteps bounds an early NaN when the log does not say how long an
	// epoch is; otherwise the first epoch does.
	EarlySteps int `json:"early_steps"`
	// SkipRate is the lowest skip rate that counts as high; the threshold
	// is never below two skips per growth interval.
	SkipRate float64 `json:"skip_rate"`
	// LowScale is the scale at or below which a pinned scale is low.
	LowScale float64 `json:"low_scale"`
	// PinnedIntervals is how many growth intervals without growth (and with
	// as many backoffs) make a pinned scale.
	PinnedIntervals int `json:"pinned_intervals"`
	// CollapseBits is how many powers of two the scale must fall in the
	// window before a NaN for the NaN to follow a collapse.
	CollapseBits float64 `json:"collapse_bits"`
	// WarmupSkips is the smallest number of skipped steps at the start
	// that is reported as wasted warm-up.
	WarmupSkips int `json:"warmup_skips"`
	// UnderflowFraction is the share of a module's nonzero gradient
	// elements flushing to zero in fp16, in the companion's telemetry, at
	// or above which the module counts as underflowing, in a log that
	// does not record the mass lost.
	UnderflowFraction float64 `json:"underflow_fraction"`
	// LostMassTolerance is the share of a gradient's L2 norm lost to fp16
	// at or above which the module counts as underflowing, in a log that
	// records it (lost_mass).
	LostMassTolerance float64 `json:"lost_mass_tolerance"`
}

// ScalerConfig is GradScaler's configuration. Zero values mean unknown.
type ScalerConfig struct {
	InitScale      float64 `json:"init_scale,omitempty"`
	GrowthFactor   float64 `json:"growth_factor,omitempty"`
	BackoffFactor  float64 `json:"backoff_factor,omitempty"`
	GrowthInterval int     `json:"growth_interval,omitempty"`
}

// FormatScale writes a loss scale for people: a power of two as "2^16
// (65536)", anything else with four significant digits.
func FormatScale(s float64) string {
	if s <= 0 {
		return fmt.Sprint(s)
	}
	if frac, exp := math.Frexp(s); frac == 0.5 {
		if s < 1 {
			return fmt.Sprintf("2^%d (%.3g)", exp-1, s)
		}
		return fmt.Sprintf("2^%d (%g)", exp-1, s)
	}
	return fmt.Sprintf("%.4g", s)
}
