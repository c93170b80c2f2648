package vjp

// Loss is the loss applied to the prediction output, computed as fastai's
// flat losses compute it, with mean reduction.
type Loss string

// Supported losses.
const (
	// CrossEntropy is F.cross_entropy (fastai's CrossEntropyLossFlat):
	// the output holds logits with a class axis (axis 1, PyTorch's
	// convention, or the last, a language model's and fastai's) and the
	// target int64 class indices shaped like the logits without it; the
	// mean runs over the positions whose target is not the ignored index
	// (see CrossEntropyOptions). Class weights and label smoothing are not
	// modelled.
	CrossEntropy Loss = "cross-entropy"
	// BCE is BCEWithLogitsLossFlat (F.binary_cross_entropy_with_logits),
	// fastai's default multi-label loss: the output holds logits and the
	// target float 0/1 labels with as many elements.
	BCE Loss = "bce"
	// MSE is MSELossFlat: mean((pred - target)²) over all elements.
	MSE Loss = "mse"
	// L1 is L1LossFlat: mean(|pred - target|) over all elements.
	L1 Loss = "l1"
	// ModelOutput means the output already is the loss (a model that
	// returns its loss): the seed is scale × ones, so a non-scalar output
	// is treated as summed.
	ModelOutput Loss = "output"
)

// Losses lists the losses Loss accepts, in the order a help text shows
// them.
func Losses() []Loss { return []Loss{CrossEntropy, BCE, MSE, L1, ModelOutput} }

// Names the generated graph adds. Gradient outputs are named after the
// forward value: value + GradSuffix, and value + GradSuffix + RawSuffix for
// the unrounded gradient of a rounded one.
const (
	// GradSuffix is appended to a forward value's name to name the graph
	// output holding scale × dL/dvalue.
	GradSuffix = "::grad"
	// RawSuffix is appended to a gradient's name to name its value before
	// rounding to 16 bits.
	RawSuffix = "::raw"
	// LossOutput is the graph output holding the (unscaled) mean loss.
	LossOutput = "loss::fp16audit"
	// SeedOutput is the graph output holding scale × dL/dpred in fp32,
	// before any rounding.
	SeedOutput = "seed::fp16audit"
	// ScaleInput is the scalar float graph input holding the loss scale.
	ScaleInput = "loss_scale::fp16audit"
	// TargetInput is the graph input holding the target of the loss.
	TargetInput = "target::fp16audit"
)
