package report

import "fp16audit/checks"

// ReportSchema names the JSON shape of Report. It changes only when a field
// is removed or changes meaning; new fields may appear within a version.
//
// v1.1 (fp16audit 0.3): statistics of a value without finite elements say
// so — max_abs, min_nonzero, mean and rms are null there instead of 0, and
// "finite" counts the finite elements; rel_err is left out when no element
// is finite in both passes ("compared" counts those that are). Origins carry
// a cause (and the input and samples of a poisoned batch), values and nodes
// held in reduced precision carry their provenance, inputs have the kinds
// audio, sequence and tokens, and the summary's headroom counts only values
// held in reduced precision, against that format's limit.
//
// v1.2 (fp16audit 0.4): output_agreement compares every emulated pass's
// graph outputs with fp32's; a pass whose outputs are finite but beyond
// the tolerance fails like one whose outputs are NaN/Inf, its origins name
// the outputs they corrupted (wrong_outputs, cause precision when nothing
// overflows), and a fix works only when its rerun's outputs agree (the fix
// names that pass). Every float that is NaN or ±Inf is written as the
// string "nan", "inf" or "-inf" (earlier versions could not write such a
// report at all).
const ReportSchema = "fp16audit.report/v1.2"

// ReportSchemaV1 is the schema of reports written by fp16audit 0.2, which
// `fp16audit render` still reads.
const ReportSchemaV1 = "fp16audit.report/v1"

// ReportSchemaV11 is the schema of reports written by fp16audit 0.3, which
// `fp16audit render` still reads (they lack output_agreement).
const ReportSchemaV11 = "fp16audit.report/v1.1"

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
	// Verdict is one of the stable identifiers dtype-mismatch,
	// poisoned-input, fp32-broken,
	// explicit-half-cast, unnormalized-input, oversized-logits,
	// overflowing-op, forward-underflow, precision-loss, healthy (the
	// Verdict* constants). It follows what reaches the graph outputs;
	// an error-level finding may stand beside a healthy verdict (a
	// masked_fill PyTorch refuses, whose -Inf the softmax would absorb).
	Verdict     string           `json:"verdict"`
	VerdictText string           `json:"verdict_text"`
	Origins     []Origin         `json:"origins"`
	Fixes       []Fix            `json:"fixes"`
	Inputs      []InputReport    `json:"inputs"`
	Nodes       []NodeReport     `json:"nodes"`
	Findings    []checks.Finding `json:"findings"`
	Summary     Summary          `json:"summary"`
	// OutputAgreement compares the graph outputs of every emulated pass
	// (the policy's, bf16 beside fp16, and the rerun each fix was judged
	// by) with fp32's: what the user's loss or prediction sees. Added in
	// v1.2.
	OutputAgreement []OutputAgreement `json:"output_agreement"`
	// Training is the training audit (mode, BatchNorm, the backward
	// pass); see TrainingReport. Added within v1.1: older reports lack it.
	Training *TrainingReport `json:"training,omitempty"`

	// Blocks rolls the nodes up by module block, in the order the blocks
	// first appear in Nodes (see Block). Added within v1.1.
	Blocks []Block `json:"blocks,omitempty"`
}

// Pass names: the keys of ValueReport.Stats and the entries of
// Report.Passes. The fp32 reference is always there; an emulated pass is
// named after the precision it emulates. Fix reruns add a suffix
// ("fp16+standardized", "fp16+keep-fp32#2"). PassAsWritten is the model
// run without mixed precision but with its own half casts (plain fp32
// inference): it runs when the model casts to half itself and the
// policy's pass fails (or --passes asks for it), and an overflow there
// too is what makes a verdict explicit-half-cast.
const (
	PassFP32      = "fp32"
	PassFP16      = "fp16"
	PassBF16      = "bf16"
	PassAsWritten = "as-written"
)

// Verdict identifiers, in the order the decision tree tests them.
const (
	// VerdictDtypeMismatch: under model.half() an op gets a float32 value
	// the model cast itself beside its half weights, and PyTorch raises
	// there: the model cannot run in half at all (policy half only).
	// Added within v1.2.
	VerdictDtypeMismatch = "dtype-mismatch"
	// VerdictPoisoned: the batch itself holds NaN or Inf; no precision
	// is to blame (FP1001).
	VerdictPoisoned = "poisoned-input"
	// VerdictFP32Broken: the truly-fp32 reference pass produces NaN or
	// Inf: fix the model or the data before mixed precision (FP2002).
	VerdictFP32Broken = "fp32-broken"
	// VerdictHalfCast: the value that overflows is in fp16 because of a
	// cast the model makes itself (x.half(), an fp16 weight), and the
	// run that keeps those casts with autocast off overflows too
	// (FP4001).
	VerdictHalfCast = "explicit-half-cast"
	// VerdictUnnormalized: the inputs look raw (0-255 pixels, unscaled
	// columns) and the rerun with standardized inputs is clean.
	VerdictUnnormalized = "unnormalized-input"
	// VerdictLogits: the overflow starts at the model's final layer, an
	// unscaled head (FP2003).
	VerdictLogits = "oversized-logits"
	// VerdictOverflow: one op overflows fp16 on normalized inputs
	// (FP2001); the fix keeps it in fp32 or uses bf16.
	VerdictOverflow = "overflowing-op"
	// VerdictUnderflow: nothing overflows, but the outputs are lost to
	// values the format cannot hold (flushed to zero or subnormal). Added
	// within v1.2.
	VerdictUnderflow = "forward-underflow"
	// VerdictPrecision: nothing overflows and nothing underflows, but
	// rounding to the format's significant bits makes the outputs wrong:
	// the values stay in range and lose digits (a sum of large and small
	// terms, a difference of close ones), where forward-underflow loses
	// values below the range. Added within v1.2.
	VerdictPrecision = "precision-loss"
	// VerdictHealthy: nothing that reaches the outputs overflows or is
	// lost; warnings (little headroom, heavy underflow) may remain.
	VerdictHealthy = "healthy"
)

// Origin causes, the reason NaN/Inf start where an origin is.
const (
	// CauseInput: the batch itself holds NaN/Inf (Input names it).
	CauseInput = "input"
	// CauseOverflow: an op's result leaves the range of the format it is
	// held in.
	CauseOverflow = "overflow"
	// CauseConstant: a constant beyond the format's range is written into
	// a value held in reduced precision (a mask fill, an additive mask).
	CauseConstant = "constant"
	// CauseFP32: the fp32 reference itself produces NaN/Inf.
	CauseFP32 = "fp32"
	// CausePrecision: nothing overflows, yet the outputs are wrong; the
	// origin is the first value that differs from fp32 beyond the
	// tolerance while what it reads agrees (rounding loses too much).
	CausePrecision = "precision"
	// CauseDtype: PyTorch raises at the op, which reads a float32 value
	// the model cast itself beside its half weights (dtype-mismatch).
	CauseDtype = "dtype-mismatch"
)

// Origin is where NaN/Inf first appear in a pass: a node whose output holds
// non-finite values while all of its inputs are finite, or a graph input
// whose batch already holds them (Index -1, Input set).
type Origin struct {
	Pass string `json:"pass"`
	// Cause is one of the Cause constants.
	Cause string `json:"cause"`
	Node  string `json:"node"`
	Index int    `json:"index"`
	// Input and Samples name a poisoned graph input and where its NaN/Inf
	// are (at most 20 samples). An fp32 origin at a node (fp32-broken: a
	// softmax over a row that is -inf everywhere) has Samples too, found
	// by rerunning the reference on parts of the batch.
	Input     string   `json:"input,omitempty"`
	Samples   []Sample `json:"samples,omitempty"`
	OpType    string   `json:"op_type"`
	Module    string   `json:"module"`
	Precision string   `json:"precision"`
	Value     string   `json:"value"`
	// FP32MaxAbs is the largest |x| of the value in the fp32 pass.
	FP32MaxAbs   float64  `json:"fp32_max_abs"`
	HeadroomBits *float64 `json:"headroom_bits,omitempty"`
	NonFinite    int64    `json:"nonfinite"`
	// ExplicitCast is set when the value is in reduced precision because of
	// a Cast to FLOAT16/BFLOAT16 the model itself contains (Provenance
	// names them).
	ExplicitCast bool        `json:"explicit_cast,omitempty"`
	Provenance   *Provenance `json:"provenance,omitempty"`
	// Constant names the out-of-range constant written into the value
	// (cause constant) and ConstantValue is its most extreme element.
	Constant      string   `json:"constant,omitempty"`
	ConstantValue *float64 `json:"constant_value,omitempty"`
	// Weight names the initializer a constant origin's constant is when
	// it is a trainable weight, not a value the model writes: an
	// initializer an op autocast computes in lower precision takes,
	// directly or through the exporter's Identity or Transpose (the
	// exporter's own transposed copy, val_N, is named as it is). A
	// parameter that outgrew fp16 in training. Added within v1.2.
	Weight string `json:"weight,omitempty"`
	// Affected lists the downstream nodes whose outputs became NaN/Inf, and
	// AffectedOutputs the graph outputs among their values.
	Affected        []string `json:"affected"`
	AffectedOutputs []string `json:"affected_outputs"`
	// WrongOutputs are the graph outputs that stay finite but differ from
	// fp32's beyond the tolerance because of this origin: its NaN/Inf were
	// absorbed (rsqrt(inf) = 0, x / inf) and what came out is wrong. Cause
	// precision origins have only these. Added in v1.2.
	WrongOutputs []string `json:"wrong_outputs,omitempty"`
}

// Outcomes of a pass's graph output against fp32.
const (
	// OutputAgrees: finite, and every sample within the tolerance.
	OutputAgrees = "agrees"
	// OutputWrong: finite, but some sample beyond the tolerance.
	OutputWrong = "wrong"
	// OutputNonFinite: NaN/Inf where fp32's output is finite.
	OutputNonFinite = "nonfinite"
	// OutputChosen: a graph output a data-dependent selection chose
	// (NonMaxSuppression, TopK, ArgMax, NonZero): compared for
	// information only (KeptItems, CommonItems); the values the
	// selection ranked are judged instead (role "ranked"). Added within
	// v1.2.
	OutputChosen = "chosen"
)

// Roles of an output agreement. Added within v1.2; absent means
// RoleOutput.
const (
	// RoleOutput: a graph output, judged against the tolerance.
	RoleOutput = "output"
	// RoleRanked: a value a selection ranks or gathers from, judged as
	// the output PyTorch compares before the selection.
	RoleRanked = "ranked"
	// RoleChosen: a graph output a selection chose; see OutputChosen.
	RoleChosen = "chosen"
)

// OutputAgreement is one graph output of one emulated pass against the
// same output of the fp32 pass, over every batch. Errors are taken over
// the elements finite in both passes. The tolerance judges the worst
// sample's relative L2 error: one corrupted sample must not hide among
// healthy ones.
type OutputAgreement struct {
	Pass   string `json:"pass"`
	Output string `json:"output"`
	// Outcome is one of the Output constants.
	Outcome string `json:"outcome"`
	// Elements counts the elements compared; NonFinite those NaN/Inf in
	// this pass where fp32's are finite.
	Elements  int64 `json:"elements"`
	NonFinite int64 `json:"nonfinite"`
	// MaxAbsErr is max |y − y32|; MaxRelErr is that over max |y32| (an
	// element-wise ratio would be ruled by elements near zero).
	MaxAbsErr float64 `json:"max_abs_err"`
	MaxRelErr float64 `json:"max_rel_err"`
	// RelErr is ‖y − y32‖/‖y32‖ over every sample; null when no element
	// is finite in both passes.
	RelErr *float64 `json:"rel_err"`
	// Samples counts the samples (slices along the first axis, per
	// batch); WorstRelErr is the largest per-sample relative L2 error, in
	// sample WorstSample of batch WorstBatch (positions in Report.Batches).
	Samples     int64    `json:"samples"`
	WorstRelErr *float64 `json:"worst_rel_err"`
	WorstBatch  int      `json:"worst_batch"`
	WorstSample int64    `json:"worst_sample"`
	// Top1Agreement is the fraction of class-score rows (last axis, rank
	// >= 2, more than one class) whose argmax is fp32's, over Rows rows;
	// absent for other outputs.
	Top1Agreement *float64 `json:"top1_agreement,omitempty"`
	Rows          int64    `json:"rows,omitempty"`
	// Tolerance is the largest worst-sample relative error the pass's
	// format is allowed (--output-tolerance).
	Tolerance float64 `json:"tolerance"`
	// Role is RoleOutput, RoleRanked or RoleChosen. Added within v1.2.
	Role string `json:"role,omitempty"`
	// KeptItems counts, for a chosen output, the items (rows along its
	// first axis, over every batch; along its second, sample by sample,
	// when its first axis is the batch's and it has rank 3 or more) fp32 kept, and CommonItems those
	// this pass kept too (boxes [K,4] matched by IoU >= 0.5, other rows
	// within 5 %). Added within v1.2.
	KeptItems   int64 `json:"kept_items,omitempty"`
	CommonItems int64 `json:"common_items,omitempty"`
}

// Sample is one sample of a batch that holds NaN/Inf: its batch (in the
// order of Report.Batches), its index along the batch dimension, and how
// many of its elements are non-finite.
type Sample struct {
	Batch     int   `json:"batch"`
	Index     int64 `json:"index"`
	NonFinite int64 `json:"nonfinite"`
}

// Provenance reasons: why a value is held in reduced precision.
const (
	// ReasonAutocast: an op on autocast's lower-precision list (Conv,
	// MatMul, Linear...) produced it, or it inherits that precision.
	ReasonAutocast = "autocast"
	// ReasonHalfPolicy: the half policy (model.half()) holds it in fp16.
	ReasonHalfPolicy = "half-policy"
	// ReasonExplicitCast: the model's own Cast/CastLike to half made it, or
	// made an input that it inherits its precision from.
	ReasonExplicitCast = "explicit-cast"
	// ReasonHalfModel: the model's file holds the value's source in half
	// beside fp32 weights. A checkpoint stored in half (exported after
	// model.half() or model.bfloat16()) is audited as its weights under the
	// policy instead: fp32 under autocast, half-policy under half.
	ReasonHalfModel = "fp16-model"
)

// Provenance says why a value is held in reduced precision: the reasons
// that made it so (several when its inputs differ), and the model's own
// half casts among them.
type Provenance struct {
	Reasons []string `json:"reasons"`
	Casts   []string `json:"casts,omitempty"`
}

// Fix kinds.
const (
	FixStandardize = "standardize-inputs"
	FixBF16        = "bf16"
	FixKeepFP32    = "keep-fp32"
	// FixRemoveCast verifies that removing the model's own half casts
	// removes the overflow.
	FixRemoveCast = "remove-cast"
	// FixConstant verifies that constants within the format's range
	// (torch.finfo(dtype).min) remove the NaN/Inf.
	FixConstant = "finfo-constant"
	// FixEpsilon verifies, on an fp32-broken model, that an epsilon
	// inside the square root a normalization divides by removes the
	// NaN/Inf of the fp32 pass. Added within v1.2.
	FixEpsilon = "epsilon"
)

// Fix is a remedy fp16audit tried by re-running the emulated pass.
type Fix struct {
	Kind string `json:"kind"`
	// Works is set when nothing the fix's rerun makes decides a failure:
	// no NaN/Inf and no overflow reach an output, and every output is
	// finite and within the tolerance of fp32's (OutputAgreement, pass
	// Pass).
	Works bool `json:"works"`
	// Pass names the pass the fix was judged by: a rerun
	// ("fp16+standardized", the last "fp16+keep-fp32#N") or the bf16 pass.
	// Added in v1.2.
	Pass string `json:"pass,omitempty"`
	// Summary says what was tried and what happened, in a sentence.
	Summary string `json:"summary"`
	// NonFiniteBefore and NonFiniteAfter count the non-finite values over
	// all node outputs of the fp16 pass before and with the fix.
	NonFiniteBefore int64 `json:"nonfinite_before"`
	NonFiniteAfter  int64 `json:"nonfinite_after"`
	// Normalize holds the per-channel statistics used (standardize-inputs).
	Normalize []NormalizeStats `json:"normalize,omitempty"`
	// Inputs names the inputs standardized (standardize-inputs).
	Inputs []string `json:"inputs,omitempty"`
	// Modules and Nodes are the smallest set kept in fp32 (keep-fp32), the
	// casts removed (remove-cast) or the constants' readers (finfo-constant).
	Modules    []string `json:"modules,omitempty"`
	Nodes      []string `json:"nodes,omitempty"`
	Iterations int      `json:"iterations,omitempty"`
}

// NormalizeStats are the statistics that standardize one input.
type NormalizeStats struct {
	Input string    `json:"input"`
	Mean  []float64 `json:"mean"`
	Std   []float64 `json:"std"`
	// Fastai is a ready-to-paste fastai call for the input's kind: for
	// images Normalize.from_stats (for raw 0–255 pixels the statistics are
	// divided by 255, because fastai's IntToFloatTensor scales pixels to
	// [0,1] before Normalize), for tables procs=[Normalize]; empty for
	// other kinds, which fastai does not normalize for you.
	Fastai string `json:"fastai"`
	// Torch is the plain PyTorch standardization of the input.
	Torch string `json:"torch"`
}

// Input kinds, decided once per input from its dtype, shape and name; the
// advice for an input uses its kind's API.
const (
	KindImage    = "image"    // rank 4, NCHW with 1–4 channels (or NHWC)
	KindTabular  = "tabular"  // rank 2 float: rows × columns
	KindAudio    = "audio"    // float waveforms: rank 2 or 3 with a long last axis
	KindSequence = "sequence" // float sequence features: rank 3 (batch, time, features)
	KindTokens   = "tokens"   // integer ids fed to an embedding
	KindInteger  = "integer"  // other integers (masks, indices)
	KindOther    = "other"    // any other float input
)

// InputReport is one graph input: its statistics over all batches and, for
// image and tabular inputs, per channel or column.
type InputReport struct {
	ValueReport
	// Kind is one of the Kind constants.
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
	// Timing says where the elapsed time went (nil in documents written
	// before it existed).
	Timing *Timing `json:"timing,omitempty"`
}

// Timing is where one audit's time went, in seconds of the wall clock.
type Timing struct {
	// LoadSecs is reading the model, its batches and ONNX Runtime, up
	// to the plan of the passes.
	LoadSecs float64 `json:"load_seconds"`
	// Runs are the engine's runs in order: the main passes, each
	// what-if pass and fix rerun.
	Runs []RunTiming `json:"runs"`
	// SessionSecs is the time all runs spent creating ONNX Runtime
	// sessions (the weights are mapped once per audit, so this is the
	// graphs), Sessions how many they created.
	SessionSecs float64 `json:"session_seconds"`
	Sessions    int     `json:"sessions"`
	// BackwardSecs is the training audit's backward (its graph, its
	// session and its runs); 0 without one.
	BackwardSecs float64 `json:"backward_seconds,omitempty"`
}

// RunTiming is one run of the engine: the passes that ran side by side,
// its whole time and the part of it spent creating its sessions.
type RunTiming struct {
	Passes      []string `json:"passes"`
	Secs        float64  `json:"seconds"`
	SessionSecs float64  `json:"session_seconds"`
	Sessions    int      `json:"sessions"`
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
	// Precision is what the node computes in under the report's policy, and
	// Provenance why, when that is a reduced precision.
	Precision  string      `json:"precision"`
	Provenance *Provenance `json:"provenance,omitempty"`
	// Flagged marks an origin or a node with non-finite outputs in any pass.
	Flagged bool `json:"flagged,omitempty"`
	// Constant marks a node that computes only from initializers and
	// constants (the exporter's Identity of a shared weight, constant
	// folding leftovers): every input is an initializer, a Constant's
	// output or the output of another such node. Renderers hide these rows
	// unless they are flagged.
	Constant bool          `json:"constant,omitempty"`
	Outputs  []ValueReport `json:"outputs"`

	// Block is the module of the Block the node belongs to (Report.Blocks;
	// "" for the model's own forward). Added within v1.1.
	Block string `json:"block,omitempty"`
}

// ValueReport is one float value (a node output or a graph input) with its
// statistics in each pass, keyed by pass name ("fp32", "fp16", ...).
type ValueReport struct {
	Name  string                 `json:"name"`
	DType string                 `json:"dtype"`
	Shape string                 `json:"shape"`
	Stats map[string]StatsReport `json:"stats"`
}

// StatsReport is the statistics of one value in one pass. Magnitudes are
// null where the value has no finite element (max_abs, mean, rms) or no
// nonzero finite one (min_nonzero); headroom_bits is left out where it
// would be infinite (no nonzero finite element) and is measured against
// fp16's 65504 in every pass.
type StatsReport struct {
	Count int64 `json:"count"`
	// Finite counts the finite elements, zeros included.
	Finite        int64    `json:"finite"`
	MaxAbs        *float64 `json:"max_abs"`
	ArgMaxBatch   int      `json:"argmax_batch"`
	ArgMax        int64    `json:"argmax"`
	MinNonzero    *float64 `json:"min_nonzero"`
	Mean          *float64 `json:"mean"`
	RMS           *float64 `json:"rms"`
	HeadroomBits  *float64 `json:"headroom_bits,omitempty"`
	NaN           int64    `json:"nan"`
	PosInf        int64    `json:"pos_inf"`
	NegInf        int64    `json:"neg_inf"`
	Zeros         int64    `json:"zeros"`
	AboveFP16Max  int64    `json:"above_fp16_max"`
	FP16Subnormal int64    `json:"fp16_subnormal"`
	FP16Flush     int64    `json:"fp16_flush"`
	// Comparison with the fp32 pass, for emulated passes only: Compared
	// counts the elements finite in both passes, RelErr is ‖y − y32‖/‖y32‖
	// over them (left out when there are none).
	Compared        int64    `json:"compared,omitempty"`
	RelErr          *float64 `json:"rel_err,omitempty"`
	NewNonFinite    int64    `json:"new_nonfinite,omitempty"`
	FlushedFraction float64  `json:"flushed_fraction,omitempty"`
}

// NonFinite is the number of NaN and infinite elements.
func (s StatsReport) NonFinite() int64 { return s.NaN + s.PosInf + s.NegInf }

// NonFiniteIn reports whether an output of the node holds NaN/Inf in pass.
func (n *NodeReport) NonFiniteIn(pass string) bool {
	for _, o := range n.Outputs {
		if s, ok := o.Stats[pass]; ok && s.NonFinite() > 0 {
			return true
		}
	}
	return false
}

// Summary condenses the per-node statistics.
type Summary struct {
	FloatValues   int `json:"float_values"`
	NonFiniteFP32 int `json:"nonfinite_values_fp32"`
	// MinHeadroomBits is the smallest headroom, log2(limit/fp32 max |x|),
	// over the node outputs the policy holds in reduced precision, against
	// that format's largest value (HeadroomLimit: 65504 for fp16, about
	// 3.39e38 for bf16); omitted when no such value has a nonzero finite
	// element.
	MinHeadroomBits  *float64 `json:"min_headroom_bits,omitempty"`
	MinHeadroomValue string   `json:"min_headroom_value,omitempty"`
	HeadroomLimit    float64  `json:"headroom_limit,omitempty"`
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
