package report

// Modes of the forward passes (Report.Training.Mode).
const (
	// ModeEval: inference, as after model.eval(): BatchNormalization
	// uses its running statistics and Dropout is the identity.
	ModeEval = "eval"
	// ModeTrain: a training step's forward, as after model.train():
	// BatchNormalization uses the batch's statistics and Dropout drops.
	ModeTrain = "train"
)

// TrainingSchema names the JSON shape of TrainingReport (its "schema"
// field). It changes only when a field is removed or changes meaning.
//
// v2: the backward is judged by mass — a loss scale is
// clean when no gradient overflows and no parameter gradient loses more
// than a tolerance of its L2 norm to fp16 (lost_mass), no longer by the
// fraction of elements flushed; the report says where a GradScaler
// settles from init_scale (settled_exp, skipped_steps) and lists the
// parameters; underflow_fraction, flush_free_exp and the per-scale
// flushing lists are gone, and the init-scale-overflow verdict with them
// (a GradScaler settling below init_scale is healthy when little is lost
// there). Reports without the field are v1.
const TrainingSchema = "fp16audit.training/v2"

// Backward verdicts (BackwardReport.Verdict), in the order they are
// tested.
const (
	// BackwardFP32Broken: the fp32 backward itself holds NaN/Inf.
	BackwardFP32Broken = "backward-fp32-broken"
	// BackwardOverflowEveryScale: a gradient overflows fp16 at every
	// scale down to 2^MinExp, or the fp16 backward is NaN/Inf at every
	// such scale (the values the fp16 forward saved) while the fp32 one
	// is finite.
	BackwardOverflowEveryScale = "backward-overflow-every-scale"
	// BackwardUnderflow: at the scale a GradScaler settles at, a
	// parameter gradient loses more than the tolerance of its norm, and
	// no scale without overflow keeps it: use bf16 or keep the module in
	// fp32.
	BackwardUnderflow = "backward-underflow"
	// BackwardInitUnderflow: at the initial scale (where the scaler
	// stays, nothing overflowing) a parameter gradient loses more than the
	// tolerance; a higher init_scale keeps it.
	BackwardInitUnderflow = "init-scale-underflow"
	// BackwardHealthy: at the scale the GradScaler settles at, no
	// parameter gradient loses more than the tolerance.
	BackwardHealthy = "healthy"
)

// Gradient kinds (GradientReport.Kind).
const (
	// GradActivation: the gradient of a node's output, held in the
	// precision of that output.
	GradActivation = "activation"
	// GradWeight and GradBias: a parameter's gradient as an autocast op
	// (Conv, Linear) computes it in fp16 before the cast back to fp32.
	GradWeight = "weight"
	GradBias   = "bias"
	// GradInput: another input an autocast op casts to fp16 and whose
	// gradient it computes in fp16 (an fp32 activation entering a Linear).
	GradInput = "input"
)

// TrainingReport is the training side of an audit: the mode the forward
// passes ran in, how BatchNormalization and Dropout ran, and, with a loss,
// the backward audit. Report.Training is nil when there is nothing to say
// (an eval-mode audit, without a loss, of a model without BatchNorm or
// Dropout) and in reports written before the training audit existed (the
// field was added within schema v1.1).
type TrainingReport struct {
	// Schema is TrainingSchema.
	Schema string `json:"schema"`
	// Mode is ModeEval or ModeTrain.
	Mode string `json:"mode"`
	// BatchNorms lists the BatchNormalization nodes.
	BatchNorms []BatchNormReport `json:"batch_norms"`
	// Dropouts counts the Dropout nodes running as in Mode; in train mode
	// they draw their masks from DropoutSeed (ONNX Runtime's generator,
	// not PyTorch's).
	Dropouts    int   `json:"dropouts"`
	DropoutSeed int64 `json:"dropout_seed,omitempty"`
	// Notes are facts about the mode a reader must know (an eval export
	// audited in train mode, Dropout without a training mode).
	Notes []string `json:"notes"`
	// Backward is the backward audit; nil without a loss.
	Backward *BackwardReport `json:"backward,omitempty"`
}

// BatchNormReport is one BatchNormalization node and how it ran.
type BatchNormReport struct {
	Node   string `json:"node"`
	Module string `json:"module"`
	// Statistics is "batch" (the batch's own mean and variance) or
	// "running" (the stored running statistics).
	Statistics string `json:"statistics"`
	// Switched is set when the export computed with the other statistics.
	Switched bool `json:"switched,omitempty"`
	// RunningStats says what the stored running statistics look like:
	// "defaults" (mean 0, variance 1: never updated), "one-step" (every
	// variance at least the momentum: one update away from the defaults,
	// what a training-mode export of an untrained model stores), "trained"
	// or "" when they are computed at run time.
	RunningStats string `json:"running_stats,omitempty"`
	// InputRMS is the RMS of the node's input over the batches (fp32
	// pass); RunningRMS the RMS the running statistics expect of it,
	// sqrt(mean over channels of var + mean²). Their ratio is how far an
	// eval-mode BatchNorm is from normalizing this batch. Zero when not
	// known.
	InputRMS   float64 `json:"input_rms,omitempty"`
	RunningRMS float64 `json:"running_rms,omitempty"`
}

// CrossEntropyReport is how the cross-entropy loss read the logits and
// the target.
type CrossEntropyReport struct {
	// ClassAxis is the logits' class axis: 1 (PyTorch's F.cross_entropy:
	// [N, C, d…] logits, [N, d…] targets) or -1 (the last: a language
	// model's [B, S, V] logits, [B, S] targets).
	ClassAxis int `json:"class_axis"`
	// Classes is the size of the class axis.
	Classes int64 `json:"classes"`
	// IgnoreIndex is the target value left out of the loss and its mean.
	IgnoreIndex int64 `json:"ignore_index"`
	// LMShift: the logits at position t were scored against target t+1,
	// as a causal language model's loss does.
	LMShift bool `json:"lm_shift"`
	// Scored counts the targets the mean ran over, of Targets in all.
	Scored  int64 `json:"scored"`
	Targets int64 `json:"targets"`
}

// BackwardReport is the backward audit: the loss, its scaled gradient,
// where a GradScaler starting at InitScale settles (the largest scale
// without overflow, halving from InitScale) and how much of each
// parameter gradient's L2 norm fp16 loses there (lost mass, ‖fp16(g·S)/S
// − g‖ / ‖g‖, flushing and rounding together, measured by an emulated
// backward against the backward at the values the fp16 forward saved,
// the fp32 one where the forward holds nothing in 16 bits). Exponents e
// stand for loss scale 2^e.
type BackwardReport struct {
	// Loss is cross-entropy, bce, mse, l1 or output (the model returns
	// its loss), applied to the graph output Output; Target is the file
	// the target came from.
	Loss   string `json:"loss"`
	Output string `json:"output"`
	Target string `json:"target,omitempty"`
	// CrossEntropy says how the cross-entropy loss read the logits and
	// the target; absent for the other losses.
	CrossEntropy *CrossEntropyReport `json:"cross_entropy,omitempty"`
	// Batch is the batch (index into Report.Batches) the backward ran on.
	Batch int `json:"batch"`
	// LossValue is the fp32 loss; null when not finite.
	LossValue *float64 `json:"loss_value"`
	// InitScale is the GradScaler's initial scale, 2^InitExp.
	InitScale float64 `json:"init_scale"`
	InitExp   int     `json:"init_exp"`
	// MinExp and MaxExp bound the exponents judged.
	MinExp int `json:"min_exp"`
	MaxExp int `json:"max_exp"`
	// Tolerance: a loss scale is clean when no parameter gradient loses
	// more than this share of its L2 norm.
	Tolerance float64 `json:"tolerance"`
	// Verdict is one of the Backward* constants; VerdictText says it with
	// the module, the scales and the fix.
	Verdict     string `json:"verdict"`
	VerdictText string `json:"verdict_text"`
	// OutputPrecision is the precision the policy holds the prediction
	// in: when half, scale × dL/dpred enters the backward in fp16.
	OutputPrecision string `json:"output_precision"`
	// SeedMaxAbs is max |dL/dpred| in fp32 at scale 1: × the scale it is
	// the scaled loss gradient; null when not finite.
	SeedMaxAbs *float64 `json:"seed_max_abs"`
	// MaxCleanExp is the largest exponent at which no gradient overflows
	// (null: none down to MinExp).
	MaxCleanExp *int `json:"max_clean_exp"`
	// SettledExp is where a GradScaler starting at InitScale settles: the
	// largest exponent ≤ InitExp without overflow (null: none), reached
	// after SkippedSteps skipped steps (each overflow halves the scale).
	SettledExp   *int `json:"settled_exp"`
	SkippedSteps int  `json:"skipped_steps"`
	// LostMass is the largest share of a parameter gradient's norm lost at
	// SettledExp (null: no settled scale), WorstParameter that parameter.
	LostMass       *float64 `json:"lost_mass"`
	WorstParameter string   `json:"worst_parameter,omitempty"`
	// CleanFromExp is the smallest exponent from which every scale up to
	// MaxCleanExp loses at most Tolerance (null: not even MaxCleanExp):
	// measured where Scales marks the exponent measured, else by the
	// estimate, counted clean only when four times it is within Tolerance.
	CleanFromExp *int `json:"clean_from_exp"`
	// Window is the range of clean exponents, CleanFromExp to
	// MaxCleanExp; null when there is none.
	Window *ScaleWindow `json:"window"`
	// InitScaleAdvice is the init_scale to pass to learn.to_fp16() or
	// GradScaler when a different start helps; null otherwise.
	InitScaleAdvice *float64 `json:"init_scale_advice"`
	// FirstOverflow is the gradient that overflows first, in backward
	// order, at InitScale; null when none does.
	FirstOverflow *GradientReport `json:"first_overflow"`
	// Underflowing lists the modules with a parameter gradient losing
	// more than Tolerance at SettledExp.
	Underflowing []string `json:"underflowing"`
	// Scales lists the exponents around the settled scale and the
	// window, in order.
	Scales []ScaleReport `json:"scales"`
	// Modules summarizes the gradients per module, in forward order.
	Modules []ModuleGradientReport `json:"modules"`
	// Parameters lists every parameter gradient, in forward order.
	Parameters []ParameterReport `json:"parameters"`
	// Gradients lists every gradient held in reduced precision, in
	// forward order.
	Gradients []GradientReport `json:"gradients"`
	// FP32NonFinite names the gradients that hold NaN/Inf in the fp32
	// backward at scale 1.
	FP32NonFinite []string `json:"fp32_nonfinite"`
	// Unsupported lists the nodes without a gradient rule: the backward
	// stops there, and the audit covers the rest of the graph.
	Unsupported []UnsupportedOp `json:"unsupported"`
	// Fixes are remedies verified by a rerun (bf16).
	Fixes []Fix `json:"fixes"`
	// Runs counts the backward runs (the fp32 one, the one at the values
	// the fp16 forward saved, and the emulated ones at the exponents
	// Scales marks measured), and ElapsedSecs their time with the graph
	// generation.
	Runs        int     `json:"runs"`
	ElapsedSecs float64 `json:"elapsed_seconds"`
}

// ScaleWindow is a range of loss-scale exponents, ends included.
type ScaleWindow struct {
	From int `json:"from"`
	To   int `json:"to"`
}

// ScaleReport is the backward at one loss scale 2^Exp: from the fp32
// backward's mass by exponent, or measured by an emulated run (Measured).
type ScaleReport struct {
	Exp int `json:"exp"`
	// Measured is set when an emulated backward ran at this scale.
	Measured bool `json:"measured"`
	// Overflow is set when a gradient holds Inf/NaN; FirstOverflow names
	// the first one in backward order (its module, or value).
	Overflow      bool   `json:"overflow"`
	FirstOverflow string `json:"first_overflow,omitempty"`
	// LostMass is the largest share of a parameter gradient's norm lost,
	// in the module WorstModule; 0 where the scale overflows.
	LostMass    float64 `json:"lost_mass"`
	WorstModule string  `json:"worst_module,omitempty"`
}

// GradientReport is one gradient held in reduced precision.
type GradientReport struct {
	// Value is the forward value (a node output, or the parameter of a
	// weight or bias gradient) and Node the node that produces it (for a
	// weight or bias: the op computing the gradient).
	Value  string `json:"value"`
	Node   string `json:"node"`
	OpType string `json:"op_type"`
	Module string `json:"module"`
	// Kind is one of the Grad* constants; Precision the 16-bit type.
	Kind      string `json:"kind"`
	Precision string `json:"precision"`
	// FP32MaxAbs is max |gradient| of the fp32 backward at scale 1 (null:
	// not finite), Log2Min log2 of its smallest nonzero |element| (null:
	// none).
	FP32MaxAbs *float64 `json:"fp32_max_abs"`
	Log2Min    *float64 `json:"log2_min"`
	// MaxCleanExp is the largest exponent at which it is finite (null:
	// none).
	MaxCleanExp *int `json:"max_clean_exp"`
	// LostMass is the share of its norm its own rounding loses at the
	// settled scale (from the fp32 backward's mass by exponent).
	LostMass float64 `json:"lost_mass"`
	// Partial is set when the gradient misses the share of an op without
	// a gradient rule.
	Partial bool `json:"partial,omitempty"`
}

// ModuleGradientReport is one module's gradients: the range of its
// reduced-precision gradients in the fp32 backward at scale 1 — × the
// settled scale against fp16's band it shows what overflows and what
// flushes — and what its parameters lose at the settled scale.
type ModuleGradientReport struct {
	Module string `json:"module"`
	// Gradients counts its reduced-precision gradients, Parameters its
	// parameter gradients.
	Gradients  int `json:"gradients"`
	Parameters int `json:"parameters"`
	// Log2Min and Log2Max are log2 of the smallest nonzero and the
	// largest |element| of its reduced-precision gradients (null: none).
	Log2Min *float64 `json:"log2_min"`
	Log2Max *float64 `json:"log2_max"`
	// MaxCleanExp is the largest exponent at which none of them overflows.
	MaxCleanExp *int `json:"max_clean_exp"`
	// HeldLost is the share of their mass fp16 cannot hold at the settled
	// scale (their own rounding); LostMass the largest share of one of
	// its parameter gradients' norm lost there, rounding compounded
	// through the backward (null: no parameter or no settled scale).
	HeldLost float64  `json:"held_lost_mass"`
	LostMass *float64 `json:"lost_mass"`
}

// ParameterReport is one parameter's gradient.
type ParameterReport struct {
	Name   string `json:"name"`
	Module string `json:"module"`
	// Norm is the L2 norm of its fp32 gradient at scale 1.
	Norm float64 `json:"norm"`
	// LostMass is the share of that norm lost at the settled scale (null:
	// none), Measured whether an emulated run measured it (else it is
	// estimated from the mass by exponent of the gradients it is computed
	// from).
	LostMass *float64 `json:"lost_mass"`
	Measured bool     `json:"measured"`
	// Noise is set when the fp32 gradient is zero up to rounding (below
	// 2^-16 of the norm of a gradient it is computed from, a sum that
	// cancels such as an attention key's bias gradient): its relative
	// loss measures noise, and the verdict does not judge it.
	Noise bool `json:"noise,omitempty"`
}

// UnsupportedOp is a node the backward pass could not differentiate.
type UnsupportedOp struct {
	Node   string `json:"node"`
	OpType string `json:"op_type"`
	Reason string `json:"reason"`
}
