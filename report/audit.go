package report

import "fp16audit/checks"

// ReportSchema names the JSON shape of Report. It changes only when a field
// is removed or changes meaning; new fields may appear within a version.
const ReportSchema = "fp16audit.report/v1"

// Report is the finished result of an audit. Renderers read it and compute
// nothing; `fp16audit render` re-renders one saved as JSON.
type Report struct {
	Schema  string    `json:"schema"`
	Tool    ToolInfo  `json:"tool"`
	Model   ModelInfo `json:"model"`
	Policy  string    `json:"policy"`
	Passes  []string  `json:"passes"`
	Batches []Batch   `json:"batches"`
	// Notes are facts about how the audit ran that a reader must know:
	// conversions applied to inputs, synthetic data, ops of unknown precision.
	Notes []string `json:"notes"`
	// Verdict is one of the stable identifiers poisoned-input, fp32-broken,
	// explicit-half-cast, unnormalized-input, oversized-logits,
	// overflowing-op, healthy.
	Verdict     string           `json:"verdict"`
	VerdictText string           `json:"verdict_text"`
	Origins     []Origin         `json:"origins"`
	Fixes       []Fix            `json:"fixes"`
	Inputs      []InputReport    `json:"inputs"`
	Nodes       []NodeReport     `json:"nodes"`
	Findings    []checks.Finding `json:"findings"`
	Summary     Summary          `json:"summary"`
}

// Pass names: the keys of ValueReport.Stats and the entries of
// Report.Passes. The fp32 reference is always there; an emulated pass is
// named after the precision it emulates. Fix reruns add a suffix
// ("fp16+standardized", "fp16+keep-fp32#2").
const (
	PassFP32 = "fp32"
	PassFP16 = "fp16"
	PassBF16 = "bf16"
)

// Verdict identifiers, in the order the decision tree tests them.
const (
	VerdictPoisoned     = "poisoned-input"
	VerdictFP32Broken   = "fp32-broken"
	VerdictHalfCast     = "explicit-half-cast"
	VerdictUnnormalized = "unnormalized-input"
	VerdictLogits       = "oversized-logits"
	VerdictOverflow     = "overflowing-op"
	VerdictHealthy      = "healthy"
)

// Origin is a node where NaN/Inf first appear in a pass: its output holds
// non-finite values while all of its inputs are finite.
type Origin struct {
	Pass      string `json:"pass"`
	Node      string `json:"node"`
	Index     int    `json:"index"`
	OpType    string `json:"op_type"`
	Module    string `json:"module"`
	Precision string `json:"precision"`
	Value     string `json:"value"`
	// FP32MaxAbs is the largest |x| of the value in the fp32 pass.
	FP32MaxAbs   float64  `json:"fp32_max_abs"`
	HeadroomBits *float64 `json:"headroom_bits,omitempty"`
	NonFinite    int64    `json:"nonfinite"`
	// ExplicitCast is set when the node is a Cast to FLOAT16/BFLOAT16 that
	// the model itself contains.
	ExplicitCast bool `json:"explicit_cast,omitempty"`
	// Affected lists the downstream nodes whose outputs became NaN/Inf, and
	// AffectedOutputs the graph outputs among their values.
	Affected        []string `json:"affected"`
	AffectedOutputs []string `json:"affected_outputs"`
}

// Fix kinds.
const (
	FixStandardize = "standardize-inputs"
	FixBF16        = "bf16"
	FixKeepFP32    = "keep-fp32"
)

// Fix is a remedy fp16audit tried by re-running the emulated pass.
type Fix struct {
	Kind  string `json:"kind"`
	Works bool   `json:"works"`
	// Summary says what was tried and what happened, in a sentence.
	Summary string `json:"summary"`
	// NonFiniteBefore and NonFiniteAfter count the non-finite values over
	// all node outputs of the fp16 pass before and with the fix.
	NonFiniteBefore int64 `json:"nonfinite_before"`
	NonFiniteAfter  int64 `json:"nonfinite_after"`
	// Normalize holds the per-channel statistics used (standardize-inputs).
	Normalize []NormalizeStats `json:"normalize,omitempty"`
	// Modules and Nodes are the smallest set kept in fp32 (keep-fp32).
	Modules    []string `json:"modules,omitempty"`
	Nodes      []string `json:"nodes,omitempty"`
	Iterations int      `json:"iterations,omitempty"`
}

// NormalizeStats are the statistics that standardize one input.
type NormalizeStats struct {
	Input string    `json:"input"`
	Mean  []float64 `json:"mean"`
	Std   []float64 `json:"std"`
	// Fastai is a ready-to-paste fastai call; for raw 0–255 pixels the
	// statistics are divided by 255 because fastai's IntToFloatTensor
	// scales pixels to [0,1] before Normalize.
	Fastai string `json:"fastai"`
}

// InputReport is one graph input: its statistics over all batches and, for
// image and tabular inputs, per channel or column.
type InputReport struct {
	ValueReport
	Kind      string          `json:"kind"`
	RawPixels bool            `json:"raw_pixels,omitempty"`
	Channels  []ChannelReport `json:"channels,omitempty"`
}

// ChannelReport summarises one channel (images) or column (tables).
type ChannelReport struct {
	Index int     `json:"index"`
	Mean  float64 `json:"mean"`
	Std   float64 `json:"std"`
	Min   float64 `json:"min"`
	Max   float64 `json:"max"`
	// Flagged marks a column far from standardized.
	Flagged bool `json:"flagged,omitempty"`
}

// ToolInfo identifies the programs that produced a report.
type ToolInfo struct {
	Version     string  `json:"version"`
	ORTVersion  string  `json:"onnxruntime_version"`
	Device      string  `json:"device"`
	ORTThreads  int     `json:"onnxruntime_threads"`
	ElapsedSecs float64 `json:"elapsed_seconds"`
}

// ModelInfo describes the audited model file.
type ModelInfo struct {
	Path            string           `json:"path"`
	Producer        string           `json:"producer"`
	ProducerVersion string           `json:"producer_version"`
	IRVersion       int64            `json:"ir_version"`
	Opsets          map[string]int64 `json:"opsets"`
	NodeCount       int              `json:"node_count"`
	Inputs          []IOInfo         `json:"inputs"`
	Outputs         []IOInfo         `json:"outputs"`
}

// IOInfo is a graph input or output as declared in the model.
type IOInfo struct {
	Name  string `json:"name"`
	DType string `json:"dtype"`
	Shape string `json:"shape"`
}

// Batch records one batch fed to the model.
type Batch struct {
	Source    string   `json:"source"`
	Synthetic bool     `json:"synthetic"`
	Shapes    []string `json:"shapes"`
}

// NodeReport is one node of the graph, in topological order.
type NodeReport struct {
	Index  int    `json:"index"`
	Name   string `json:"name"`
	OpType string `json:"op_type"`
	Domain string `json:"domain,omitempty"`
	Module string `json:"module"`
	// Precision is what the node computes in under the report's policy.
	Precision string `json:"precision"`
	// Flagged marks an origin or a node with non-finite outputs in any pass.
	Flagged bool          `json:"flagged,omitempty"`
	Outputs []ValueReport `json:"outputs"`
}

// ValueReport is one float value (a node output or a graph input) with its
// statistics in each pass, keyed by pass name ("fp32", "fp16", ...).
type ValueReport struct {
	Name  string                 `json:"name"`
	DType string                 `json:"dtype"`
	Shape string                 `json:"shape"`
	Stats map[string]StatsReport `json:"stats"`
}

// StatsReport is the JSON form of Stats. Fields that would be infinite are
// omitted (HeadroomBits of an all-zero tensor).
type StatsReport struct {
	Count         int64    `json:"count"`
	MaxAbs        float64  `json:"max_abs"`
	ArgMaxBatch   int      `json:"argmax_batch"`
	ArgMax        int64    `json:"argmax"`
	MinNonzero    float64  `json:"min_nonzero"`
	Mean          float64  `json:"mean"`
	RMS           float64  `json:"rms"`
	HeadroomBits  *float64 `json:"headroom_bits,omitempty"`
	NaN           int64    `json:"nan"`
	PosInf        int64    `json:"pos_inf"`
	NegInf        int64    `json:"neg_inf"`
	Zeros         int64    `json:"zeros"`
	AboveFP16Max  int64    `json:"above_fp16_max"`
	FP16Subnormal int64    `json:"fp16_subnormal"`
	FP16Flush     int64    `json:"fp16_flush"`
	// Comparison with the fp32 pass, for emulated passes only.
	RelErr          *float64 `json:"rel_err,omitempty"`
	NewNonFinite    int64    `json:"new_nonfinite,omitempty"`
	FlushedFraction float64  `json:"flushed_fraction,omitempty"`
}

// NonFinite is the number of NaN and infinite elements.
func (s StatsReport) NonFinite() int64 { return s.NaN + s.PosInf + s.NegInf }

// Summary condenses the per-node statistics.
type Summary struct {
	FloatValues   int `json:"float_values"`
	NonFiniteFP32 int `json:"nonfinite_values_fp32"`
	// MinHeadroomBits is the smallest fp32 headroom over all node outputs;
	// omitted when every value is zero.
	MinHeadroomBits  *float64 `json:"min_headroom_bits,omitempty"`
	MinHeadroomValue string   `json:"min_headroom_value,omitempty"`
}

// MaxSeverity returns the highest severity among the findings, or -1 when
// there are none.
func (r *Report) MaxSeverity() checks.Severity {
	max := checks.Severity(-1)
	for _, f := range r.Findings {
		if f.Severity > max {
			max = f.Severity
		}
	}
	return max
}
