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

// Backward verdicts (BackwardReport.Verdict), in the order they are
// tested.
const (
	// BackwardFP32Broken: the fp32 backward itself holds NaN/Inf.
	BackwardFP32Broken = "backward-fp32-broken"
	// BackwardOverflowEveryScale: a gradient overflows fp16 even at the
	// smallest scale searched; no loss scale trains this model in fp16.
	BackwardOverflowEveryScale = "backward-overflow-every-scale"
	// BackwardUnderflow: a module's gradients flush to zero at every scale
	// that keeps the backward finite: use bf16 or keep the module in fp32.
	BackwardUnderflow = "backward-underflow"
	// BackwardInitOverflow: the first backward at the initial loss scale
	// overflows; a lower init_scale is clean.
	BackwardInitOverflow = "init-scale-overflow"
	// BackwardInitUnderflow: at the initial loss scale a module's
	// gradients flush to zero; a higher init_scale is clean.
	BackwardInitUnderflow = "init-scale-underflow"
	// BackwardHealthy: the initial loss scale lies in the clean window.
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

// BackwardReport is the backward audit: the loss, its scaled gradient and
// every fp16 gradient at the loss scales searched, and what init_scale a
// GradScaler should start from. Exponents e stand for loss scale 2^e.
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
	// MinExp and MaxExp bound the exponents searched.
	MinExp int `json:"min_exp"`
	MaxExp int `json:"max_exp"`
	// UnderflowFraction: a gradient flushing more than this fraction of
	// its nonzero elements to zero counts as underflowing.
	UnderflowFraction float64 `json:"underflow_fraction"`
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
	// MaxCleanExp is the largest exponent at which no fp16 gradient
	// overflows (null: even MinExp overflows); FlushFreeExp the smallest
	// from which no gradient flushes more than UnderflowFraction (null:
	// not even MaxExp).
	MaxCleanExp  *int `json:"max_clean_exp"`
	FlushFreeExp *int `json:"flush_free_exp"`
	// Window is the range of exponents where neither happens; null when
	// there is none.
	Window *ScaleWindow `json:"window"`
	// InitScaleAdvice is the init_scale to pass to learn.to_fp16() or
	// GradScaler when InitScale is outside the window; null otherwise.
	InitScaleAdvice *float64 `json:"init_scale_advice"`
	// FirstOverflow is the gradient that overflows first, in backward
	// order, at InitScale; null when none does.
	FirstOverflow *GradientReport `json:"first_overflow"`
	// Underflowing lists the modules whose gradients flush beyond
	// UnderflowFraction at every exponent up to MaxCleanExp.
	Underflowing []string `json:"underflowing"`
	// Scales lists the exponents run, in order.
	Scales []ScaleReport `json:"scales"`
	// Modules summarizes the gradients per module, in forward order.
	Modules []ModuleGradientReport `json:"modules"`
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
	// Runs counts the backward runs, and ElapsedSecs their time with the
	// graph generation.
	Runs        int     `json:"runs"`
	ElapsedSecs float64 `json:"elapsed_seconds"`
}

// ScaleWindow is a range of loss-scale exponents, ends included.
type ScaleWindow struct {
	From int `json:"from"`
	To   int `json:"to"`
}

// ScaleReport is the backward at one loss scale 2^Exp.
type ScaleReport struct {
	Exp int `json:"exp"`
	// Overflow is set when a gradient holds Inf/NaN; FirstOverflow names
	// the first one in backward order (its module, or value).
	Overflow      bool   `json:"overflow"`
	FirstOverflow string `json:"first_overflow,omitempty"`
	// Flushing lists the modules with a gradient flushing beyond the
	// threshold.
	Flushing []string `json:"flushing"`
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
	// not finite).
	FP32MaxAbs *float64 `json:"fp32_max_abs"`
	// AtInit is the gradient at the initial scale: max |gradient| before
	// rounding (null: not finite), whether it overflowed, and the
	// fraction of its nonzero elements flushed to zero.
	MaxAbsAtInit   *float64 `json:"max_abs_at_init"`
	OverflowAtInit bool     `json:"overflow_at_init"`
	FlushedAtInit  float64  `json:"flushed_at_init"`
	// MaxCleanExp is the largest exponent at which it is finite (null:
	// none); FlushFreeExp the smallest from which it flushes at most the
	// threshold (null: none up to MaxExp).
	MaxCleanExp  *int `json:"max_clean_exp"`
	FlushFreeExp *int `json:"flush_free_exp"`
	// Partial is set when the gradient misses the share of an op without
	// a gradient rule.
	Partial bool `json:"partial,omitempty"`
}

// ModuleGradientReport summarizes the reduced-precision gradients of one
// module: the smallest MaxCleanExp, the largest FlushFreeExp and the
// worst values at the initial scale among them.
type ModuleGradientReport struct {
	Module         string   `json:"module"`
	Gradients      int      `json:"gradients"`
	MaxCleanExp    *int     `json:"max_clean_exp"`
	FlushFreeExp   *int     `json:"flush_free_exp"`
	MaxAbsAtInit   *float64 `json:"max_abs_at_init"`
	OverflowAtInit bool     `json:"overflow_at_init"`
	FlushedAtInit  float64  `json:"flushed_at_init"`
}

// UnsupportedOp is a node the backward pass could not differentiate.
type UnsupportedOp struct {
	Node   string `json:"node"`
	OpType string `json:"op_type"`
	Reason string `json:"reason"`
}
