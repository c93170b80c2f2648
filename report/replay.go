package report

// ReplaySchema names the JSON shape of ReplayReport (its "schema" field).
// It changes only when a field is removed or changes meaning.
const ReplaySchema = "fp16audit.replay/v1"

// Replay verdicts (ReplayReport.Verdict): what happened at the captured
// step, tested in this order.
const (
	// ReplayDataNonFinite: the failing batch holds NaN/Inf, or a sample
	// of it makes the fp32 forward non-finite while the previous batch
	// passes: the data, not the precision.
	ReplayDataNonFinite = "data-nonfinite"
	// ReplayDataRange: the failing batch is finite, but an input holds a
	// value beyond fp16's range that the policy casts to fp16.
	ReplayDataRange = "data-out-of-range"
	// ReplayFP32Broken: fp32 fails on every captured batch: the model's
	// state is broken (weights already non-finite, or the model itself),
	// not its precision.
	ReplayFP32Broken = "fp32-broken"
	// ReplayForwardOverflow: the forward under the run's policy overflows
	// at the captured weights: an activation, or a weight that outgrew
	// fp16 (autocast casts the fp32 master weight for the op).
	ReplayForwardOverflow = "forward-overflow"
	// ReplayGradientOverflow: the forward is finite and a gradient
	// overflows fp16 at the captured loss scale.
	ReplayGradientOverflow = "gradient-overflow"
	// ReplayUnderflow: nothing overflows at the captured scale, but
	// parameter gradients lose more than the tolerance of their norm to
	// fp16 there: the modules they belong to do not train.
	ReplayUnderflow = "underflow"
	// ReplayNotReproduced: the captured step is clean in every precision:
	// the failure depends on something the capture does not hold.
	ReplayNotReproduced = "not-reproduced"
)

// Culprit kinds (Culprit.Kind).
const (
	CulpritActivation = "activation"
	CulpritWeight     = "weight"
	CulpritInput      = "input"
	CulpritGradient   = "gradient"
)

// Replay fix kinds (ReplayFix.Kind), beyond the audit's FixBF16 and
// FixKeepFP32.
const (
	FixDropBatch = "drop-batch"
	FixClip      = "clip"
	FixLowerLR   = "lower-lr"
	FixFP32      = "fp32"
	// FixInitScale: start the GradScaler at a scale the backward audit
	// found clean (ReplayFix.Scale).
	FixInitScale = "init-scale"
)

// How a replay fix was verified (ReplayFix.Verified).
const (
	VerifiedOneStep      = "one-step"
	VerifiedContinuation = "continuation"
	VerifiedLog          = "log"
)

// ReplayReport is what `fp16audit replay` found at a captured training
// step: the class of the failure, its culprit, the fixes verified, the
// run's timeline to the capture and the training audit of the step.
type ReplayReport struct {
	Schema  string      `json:"schema"`
	Tool    ToolInfo    `json:"tool"`
	Capture CaptureInfo `json:"capture"`
	// Verdict is one of the Replay* constants; VerdictText says it with
	// the step, the culprit and the fix.
	Verdict     string `json:"verdict"`
	VerdictText string `json:"verdict_text"`
	// Culprit is where the failure starts (nil: not-reproduced).
	Culprit *Culprit `json:"culprit,omitempty"`
	// Gradient details a gradient-overflow, Underflow an underflow, Data
	// a data verdict; nil otherwise.
	Gradient  *GradientFinding  `json:"gradient,omitempty"`
	Underflow *UnderflowFinding `json:"underflow,omitempty"`
	Data      *DataFinding      `json:"data,omitempty"`
	// Fixes are the remedies, each verified where the replay could
	// (Verified), in the trainer's words.
	Fixes []ReplayFix `json:"fixes"`
	// ClipNorm is the max_norm the replay proposes for gradient clipping
	// (the fp32 gradient norm before the failure); nil without one.
	ClipNorm *float64 `json:"clip_norm,omitempty"`
	// Continuations are the short runs from the captured state that
	// verified the fixes needing steps (nil: none ran).
	Continuations *ContinuationsReport `json:"continuations,omitempty"`
	// Timeline is the run up to the capture, from its log (nil: the
	// capture holds no log).
	Timeline *Timeline `json:"timeline,omitempty"`
	// Audit is the training audit of the captured step: the forward on
	// the failing batch (and the previous one) and the backward at the
	// captured scale.
	Audit *Report  `json:"audit"`
	Notes []string `json:"notes"`
}

// Kind returns KindReplay.
func (*ReplayReport) Kind() Kind { return KindReplay }

// MarshalJSON writes the replay with NaN and ±Inf as strings.
func (r ReplayReport) MarshalJSON() ([]byte, error) { return marshalDoc(&r) }

// UnmarshalJSON reads a replay written by MarshalJSON.
func (r *ReplayReport) UnmarshalJSON(b []byte) error { return unmarshalDoc(b, r) }

// CaptureInfo is what the capture's manifest says of the step.
type CaptureInfo struct {
	// Path is the capture folder as given; Format its format version.
	Path   string `json:"path"`
	Format string `json:"format"`
	// Trigger is the trigger kind, Detail the recorder's words.
	Trigger string `json:"trigger"`
	Detail  string `json:"detail"`
	Step    int    `json:"step"`
	Epoch   *int   `json:"epoch"`
	Created string `json:"created"`
	// Trainer is who trained (the capture's manifest.trainer: torch,
	// fastai, transformers, lightning, accelerate); the fixes' Words
	// are in its words.
	Trainer string `json:"trainer"`
	// TrainerLabel names that trainer in a report ("Hugging Face
	// Trainer"); a trainer the words table lacks is said as PyTorch.
	TrainerLabel string `json:"trainer_label"`
	// Policy and AutocastDevice are the run's --policy and
	// torch.autocast device_type; Device and DeviceName where it ran.
	Policy         string `json:"policy"`
	AutocastDevice string `json:"autocast_device"`
	Device         string `json:"device"`
	DeviceName     string `json:"device_name"`
	// Scale is the loss scale the step's backward used, 2^ScaleExp (nil:
	// no GradScaler); ScaleNote says when it is not a power of two.
	Scale     *float64 `json:"scale"`
	ScaleExp  *int     `json:"scale_exp"`
	ScaleNote string   `json:"scale_note,omitempty"`
	// StepApplied: the weights are one update after the failing step's
	// forward (the trigger came after the optimizer).
	StepApplied bool `json:"step_applied"`
	// Loss is the step's unscaled loss as the run computed it;
	// LossFunction the loss the run used and LossName fp16audit's --loss
	// ("" when it has no counterpart: the backward is not replayed).
	Loss         *float64 `json:"loss"`
	LossFunction string   `json:"loss_function"`
	LossName     string   `json:"loss_name"`
	Optimizer    string   `json:"optimizer"`
	LR           *float64 `json:"lr"`
	ModelClass   string   `json:"model_class"`
	Parameters   int64    `json:"parameters"`
	Exporter     string   `json:"exporter"`
	// ManifestSHA256 is the sha256 of the capture's manifest.json: the
	// continuations name the capture they ran from by it.
	ManifestSHA256 string `json:"manifest_sha256"`
	// PreviousStep is the step of the previous batch (nil: none kept).
	PreviousStep *int              `json:"previous_step"`
	Versions     map[string]string `json:"versions"`
}

// Culprit is where the failure starts.
type Culprit struct {
	// Kind is one of the Culprit* constants.
	Kind string `json:"kind"`
	// Node, OpType and Module name the ONNX node and its PyTorch module;
	// Value the tensor that goes non-finite.
	Node   string `json:"node"`
	OpType string `json:"op_type"`
	Module string `json:"module"`
	Value  string `json:"value"`
	// FP32MaxAbs is max |x| of Value in fp32 at the captured weights.
	FP32MaxAbs *float64 `json:"fp32_max_abs"`
	// Weight is the parameter past fp16's range for a weight culprit,
	// named as the capture's state names it (model.state_dict()) where
	// the state holds it, else as the graph does; Initializer is the
	// graph's initializer where it is another (the exporter's transposed
	// copy, val_N: added within v1); WeightMaxAbs its largest |w|.
	Weight       string   `json:"weight,omitempty"`
	Initializer  string   `json:"initializer,omitempty"`
	WeightMaxAbs *float64 `json:"weight_max_abs,omitempty"`
	// Batches lists the captured batches on which it goes non-finite:
	// "failing", "previous".
	Batches []string `json:"batches"`
	// Earlier is the module's magnitude at the steps the log's telemetry
	// measured it (how it grew), oldest first.
	Earlier []Magnitude `json:"earlier"`
}

// Magnitude is one logged measure of a module at a step: its forward
// output, its weights, or its output gradient unscaled.
type Magnitude struct {
	Step   int     `json:"step"`
	What   string  `json:"what"`
	MaxAbs float64 `json:"max_abs"`
}

// GradientFinding is a gradient overflow at the captured scale.
type GradientFinding struct {
	// Module and Value name the first gradient that overflows, in
	// backward order, at 2^ScaleExp.
	Module   string `json:"module"`
	Value    string `json:"value"`
	Node     string `json:"node"`
	ScaleExp int    `json:"scale_exp"`
	// MaxCleanExp is the largest scale exponent at which no gradient
	// overflows (nil: none down to the smallest judged).
	MaxCleanExp *int `json:"max_clean_exp"`
	// Window is the range of scales clean of both overflow and the
	// underflow tolerance (nil: no fp16 scale is: bf16 or fp32).
	Window    *ScaleWindow `json:"window"`
	Tolerance float64      `json:"tolerance"`
	// Chronic is set when the log shows the steps before the capture
	// skipped too (the scale collapsing), not one batch.
	Chronic bool `json:"chronic"`
}

// UnderflowFinding is gradient mass lost at the captured scale.
type UnderflowFinding struct {
	ScaleExp  int            `json:"scale_exp"`
	Tolerance float64        `json:"tolerance"`
	Modules   []ModuleLoss   `json:"modules"`
	Window    *ScaleWindow   `json:"window"`
	MaxClean  *int           `json:"max_clean_exp"`
	Pinned    *PinnedStretch `json:"pinned,omitempty"`
}

// ModuleLoss is one module's worst parameter gradient and the share of
// its norm fp16 loses.
type ModuleLoss struct {
	Module    string  `json:"module"`
	Parameter string  `json:"parameter"`
	LostMass  float64 `json:"lost_mass"`
}

// PinnedStretch is what the log says of the scale before the capture.
type PinnedStretch struct {
	// Steps is how long the scale has not grown, Backoffs the backoffs in
	// that stretch.
	Steps    int `json:"steps"`
	Backoffs int `json:"backoffs"`
}

// DataFinding names the input and the samples at fault.
type DataFinding struct {
	// Input is the model input; Samples the indexes in the failing batch.
	Input   string  `json:"input"`
	Samples []int64 `json:"samples"`
	// NonFinite counts its NaN/Inf elements (data-nonfinite from the
	// batch itself); MaxAbs is its largest finite |x|.
	NonFinite int64   `json:"nonfinite"`
	MaxAbs    float64 `json:"max_abs"`
	// InFP32 is set when the batch is finite but the fp32 forward goes
	// non-finite on these samples.
	InFP32 bool `json:"in_fp32,omitempty"`
}

// ReplayFix is one remedy and whether it held.
type ReplayFix struct {
	// Kind is FixBF16, FixKeepFP32, FixDropBatch, FixClip, FixLowerLR or
	// FixFP32.
	Kind string `json:"kind"`
	// Verified is VerifiedOneStep, VerifiedContinuation, VerifiedLog or
	// "" (proposed, not verified); Works is its outcome (nil: not
	// verified).
	Verified string `json:"verified"`
	Works    *bool  `json:"works"`
	Summary  string `json:"summary"`
	// Words says the fix in the words of the trainer that made the
	// capture (CaptureInfo.Trainer, named by TrainerLabel).
	Words string `json:"words"`
	// Fastai says it in fastai's words.
	Fastai string `json:"fastai"`
	// Torch says it in PyTorch's words.
	Torch string `json:"torch"`
	// Modules are the modules a keep-fp32 fix keeps.
	Modules []string `json:"modules,omitempty"`
	// ClipNorm and LR are a clipping fix's max_norm and a lower
	// learning rate; Scale an init-scale fix's scale.
	ClipNorm *float64 `json:"clip_norm,omitempty"`
	LR       *float64 `json:"lr,omitempty"`
	Scale    *float64 `json:"scale,omitempty"`
}

// ContinuationsReport is the short runs from the captured state, judged
// against the fp32 one.
type ContinuationsReport struct {
	Steps int `json:"steps"`
	// Device is where they ran; Batches says which batches they took.
	Device  string `json:"device"`
	Batches string `json:"batches"`
	// Reproduced is set when the run as it was (its policy, its scaler)
	// failed again within Steps: non-finite, or above fp32's loss.
	Reproduced bool              `json:"reproduced"`
	Runs       []ContinuationRun `json:"runs"`
}

// ContinuationRun is one continuation.
type ContinuationRun struct {
	// Fix is "as-run", FixFP32, FixBF16, FixClip or FixLowerLR.
	Fix       string   `json:"fix"`
	Precision string   `json:"precision"`
	Scaler    bool     `json:"scaler"`
	ClipNorm  *float64 `json:"clip_norm,omitempty"`
	LR        *float64 `json:"lr,omitempty"`
	// Losses are the unscaled losses of every step; Skipped the steps
	// the scaler skipped.
	Losses  []float64 `json:"losses"`
	Skipped []bool    `json:"skipped"`
	// NonFinite counts the non-finite losses; Final is the mean loss of
	// the last steps (nil: non-finite), RelToFP32 its gap to fp32's.
	NonFinite int      `json:"nonfinite"`
	Final     *float64 `json:"final"`
	RelToFP32 *float64 `json:"rel_to_fp32"`
	// Outcome is "finite" (every loss finite), "recovered" (non-finite
	// steps skipped, the run finite at the end) or "diverged".
	Outcome string `json:"outcome"`
	Error   string `json:"error,omitempty"`
}

// Timeline is the run up to the capture, from its log.
type Timeline struct {
	Steps   []int     `json:"steps"`
	Loss    []float64 `json:"loss"`
	Scale   []float64 `json:"scale"`
	Skipped []bool    `json:"skipped"`
	// Culprit is the culprit module's logged magnitude (nil: the log has
	// none of it).
	Culprit *Series `json:"culprit,omitempty"`
}

// Series is one logged quantity over steps.
type Series struct {
	Module string    `json:"module"`
	What   string    `json:"what"`
	Steps  []int     `json:"steps"`
	Values []float64 `json:"values"`
	// Limit is the value it must stay below (fp16's 65504), 0 when none.
	Limit float64 `json:"limit"`
}
