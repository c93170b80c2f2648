// Package words holds the trainers' words for the fixes: one row per
// trainer (fastai, the Hugging Face Trainer, Lightning, Accelerate, plain
// PyTorch) saying how its users switch to bf16, switch mixed precision
// off, start the GradScaler at a scale, keep modules in fp32 and
// standardize an input, and, for the fixes a replayed training step
// verifies, how they train in fp32, clip the gradients, lower the
// learning rate and leave a batch out. The verdicts, the fixes and the
// reports are the same document for every trainer; the fix texts read
// their phrases from here (fp16audit run --trainer, and the trainer that
// made a capture for fp16audit replay), so no trainer's adapter rewrites
// them.
package words

import (
	"fmt"
	"slices"
	"strings"
)

// Trainer is one row of the table: a trainer's phrases.
type Trainer struct {
	// Name is the --trainer value (and a capture's manifest.trainer).
	Name string
	// Label names the trainer where a report shows its words beside
	// PyTorch's ("Hugging Face Trainer").
	Label string
	// BF16 is how the trainer trains in bf16 ("learn.to_bf16()"); with
	// torch's row it holds a %q for the autocast device.
	BF16 string
	// MixedOff is mixed precision switched off, as the subject of "will
	// not help".
	MixedOff string
	// InitScale starts the GradScaler at 2**k: one %d, the exponent.
	InitScale string
	// KeepAutocast, under autocast, says how modules are kept in fp32:
	// %[1]s the modules ("it"/"them"), %[2]s their possessive, %[3]q the
	// autocast device.
	KeepAutocast string
	// KeepHalf, under model.half() (the half policy), says the same:
	// %[1]s the modules, %[2]s their possessive, %[3]s what they
	// return ("returns"/"return").
	KeepHalf string
	// NormalizeImage and NormalizeOther say where an input is
	// standardized: %[1]q the input's name, %[2]s fastai's call (images,
	// tables; "" otherwise), %[3]s PyTorch's. NormalizeOther without a
	// fastai call falls back to NormalizeTorch.
	NormalizeImage, NormalizeOther, NormalizeTorch string
	// FP32 trains without mixed precision (with torch's row: no
	// autocast, no GradScaler).
	FP32 string
	// Clip clips the gradients' norm: one %s, the max_norm.
	Clip string
	// LowerLR trains at a lower learning rate: one %s, the rate.
	LowerLR string
	// DropBatch leaves out a batch whose loss is not finite.
	DropBatch string
}

// Default is the trainer the texts follow when none is named: fastai,
// whose users fp16audit first served.
const Default = "fastai"

// keepAutocast is how any autocast user keeps a module in fp32.
const keepAutocast = "wrap %[1]s in torch.autocast(device_type=%[3]q, enabled=False) and cast %[2]s input with .float()"

// keepHalf is how a model.half() user keeps a module in fp32: PyTorch's
// Linear, Conv and LayerNorm refuse a float32 input beside float16
// weights, so both directions are cast.
const keepHalf = "call .float() on %[1]s and cast %[2]s input with .float(); cast what %[1]s %[3]s back with .half() where a half Linear, Conv or LayerNorm reads it"

// torchLowerLR is how a loop that builds its own optimizer lowers the
// learning rate.
const torchLowerLR = `for g in optimizer.param_groups: g["lr"] = %s`

// dropInLoop is how a loop of one's own leaves out a batch whose loss is
// not finite: before the backward, so that no gradient of it exists.
const dropInLoop = "skip it: `if not torch.isfinite(loss): optimizer.zero_grad(); continue` before %s (or remove the samples from the Dataset)"

var table = []Trainer{
	{
		Name:           "fastai",
		Label:          "fastai",
		BF16:           "learn.to_bf16()",
		MixedOff:       "switching to_fp16() off",
		InitScale:      "learn.to_fp16(init_scale=2.**%d)",
		KeepAutocast:   keepAutocast,
		KeepHalf:       keepHalf,
		NormalizeImage: "for %[1]q add %[2]s to the DataLoaders' batch_tfms (fastai) or use %[3]s (PyTorch)",
		NormalizeOther: "for %[1]q use %[2]s (fastai) or %[3]s (PyTorch)",
		NormalizeTorch: "for %[1]q: %[3]s",
		FP32:           "learn.to_fp32()",
		Clip:           "learn.fit_one_cycle(..., cbs=GradientClip(max_norm=%s))",
		LowerLR:        "learn.fit_one_cycle(..., lr_max=%s)",
		DropBatch:      "skip it: a callback whose after_loss raises CancelBatchException() when the loss is not finite (or remove the samples from the Dataset)",
	},
	{
		// The Trainer runs fp16=True as torch.autocast with a GradScaler
		// (Accelerate's); a model loaded with from_pretrained(dtype=
		// torch.float16) trains as model.half() does. transformers keeps
		// a class's _keep_in_fp32_modules in fp32 only when loading in
		// float16 (PreTrainedModel._get_dtype_plan): autocast runs a
		// float32 Linear in fp16 all the same, and model.half() casts
		// those modules too.
		Name:      "transformers",
		Label:     "Hugging Face Trainer",
		BF16:      "bf16=True in TrainingArguments",
		MixedOff:  "fp16=False in TrainingArguments",
		InitScale: `trainer.accelerator.scaler = torch.amp.GradScaler("cuda", init_scale=2.**%d) before trainer.train() (TrainingArguments has no init_scale)`,
		KeepAutocast: keepAutocast + " (a forward pre-hook or a subclass of the module); listing %[1]s in _keep_in_fp32_modules does not do it under fp16=True, " +
			"where autocast runs a float32 Linear in fp16 all the same",
		KeepHalf: "list %[1]s in the model class's _keep_in_fp32_modules and load it with from_pretrained(..., dtype=torch.float16), which keeps " +
			"those modules in float32 (model.half() ignores the list), with %[2]s input cast to the weights' dtype as T5's wo does",
		NormalizeImage: "for %[1]q let the image processor rescale and normalize it (do_rescale=True, do_normalize=True), or apply %[3]s in the data collator",
		NormalizeOther: "for %[1]q scale it in the data collator: %[3]s",
		NormalizeTorch: "for %[1]q scale it in the data collator: %[3]s",
		FP32:           "fp16=False and bf16=False in TrainingArguments",
		// The Trainer clips at max_grad_norm (1.0 by default) after
		// Accelerate unscales the gradients.
		Clip:    "max_grad_norm=%s in TrainingArguments",
		LowerLR: "learning_rate=%s in TrainingArguments",
		// The Trainer has no switch that skips a batch; the data can be
		// filtered before it.
		DropBatch: "remove the samples from the training dataset (datasets' Dataset.filter, or the collator)",
	},
	{
		Name:           "lightning",
		Label:          "Lightning",
		BF16:           `Trainer(precision="bf16-mixed")`,
		MixedOff:       `Trainer(precision="32-true")`,
		InitScale:      `Trainer(plugins=[MixedPrecision("16-mixed", "cuda", scaler=torch.amp.GradScaler("cuda", init_scale=2.**%d))])`,
		KeepAutocast:   keepAutocast + " in the LightningModule",
		KeepHalf:       keepHalf,
		NormalizeImage: "for %[1]q use %[3]s in the LightningDataModule's transforms",
		NormalizeOther: "for %[1]q in the LightningDataModule: %[3]s",
		NormalizeTorch: "for %[1]q in the LightningDataModule: %[3]s",
		FP32:           `Trainer(precision="32-true")`,
		// The precision plugin unscales the gradients before it clips.
		Clip:    "Trainer(gradient_clip_val=%s)",
		LowerLR: "lr=%s for the optimizer configure_optimizers returns",
		// automatic optimization skips a batch whose training_step
		// returns None
		DropBatch: "return None from training_step when the loss is not finite (Lightning then skips the batch), or remove the samples from the Dataset",
	},
	{
		Name:           "accelerate",
		Label:          "Accelerate",
		BF16:           `Accelerator(mixed_precision="bf16")`,
		MixedOff:       `Accelerator(mixed_precision="no")`,
		InitScale:      `Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=2.**%d)])`,
		KeepAutocast:   keepAutocast + " (Accelerator.autocast(AutocastKwargs(enabled=False)) does the same)",
		KeepHalf:       keepHalf,
		NormalizeImage: "for %[1]q use %[3]s in the dataset's transform",
		NormalizeOther: "for %[1]q: %[3]s",
		NormalizeTorch: "for %[1]q: %[3]s",
		FP32:           `Accelerator(mixed_precision="no")`,
		// Accelerator.clip_grad_norm_ unscales fp16's gradients first.
		Clip:      "accelerator.clip_grad_norm_(model.parameters(), max_norm=%s) between accelerator.backward(loss) and optimizer.step()",
		LowerLR:   torchLowerLR,
		DropBatch: fmt.Sprintf(dropInLoop, "accelerator.backward(loss)"),
	},
	{
		Name:           "torch",
		Label:          "PyTorch",
		BF16:           "torch.autocast(device_type=%q, dtype=torch.bfloat16) without a GradScaler",
		MixedOff:       "switching torch.autocast off",
		InitScale:      "torch.amp.GradScaler(init_scale=2.**%d)",
		KeepAutocast:   keepAutocast,
		KeepHalf:       keepHalf,
		NormalizeImage: "for %[1]q use %[3]s",
		NormalizeOther: "for %[1]q: %[3]s",
		NormalizeTorch: "for %[1]q: %[3]s",
		FP32:           "train without torch.autocast and without the GradScaler",
		// GradScaler's gradients are scaled until unscale_: clipping
		// them before would clip at max_norm times the scale.
		Clip:      "scaler.unscale_(optimizer); torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=%s) before scaler.step(optimizer)",
		LowerLR:   torchLowerLR,
		DropBatch: fmt.Sprintf(dropInLoop, "the backward"),
	},
}

// Names lists the trainers the table has, for --trainer's help.
func Names() []string {
	var out []string
	for _, t := range table {
		out = append(out, t.Name)
	}
	return out
}

// Lookup returns the row of a trainer by name ("" is Default); ok is
// false for a name the table does not have.
func Lookup(name string) (*Trainer, bool) {
	if name == "" {
		name = Default
	}
	i := slices.IndexFunc(table, func(t Trainer) bool { return t.Name == name })
	if i < 0 {
		return nil, false
	}
	return &table[i], true
}

// For returns the row of a trainer by name, Default's for "" or a name
// the table does not have (the command line refuses those first).
func For(name string) *Trainer {
	if t, ok := Lookup(name); ok {
		return t
	}
	t, _ := Lookup(Default)
	return t
}

// device is the autocast device the texts name, cuda by default.
func device(d string) string {
	if d == "" {
		return "cuda"
	}
	return d
}

// BF16For is how to train in bf16, on the autocast device d ("" is cuda).
func (t *Trainer) BF16For(d string) string {
	if strings.Contains(t.BF16, "%q") {
		return fmt.Sprintf(t.BF16, device(d))
	}
	return t.BF16
}

// StartScale is how to start the GradScaler at 2**k.
func (t *Trainer) StartScale(k int) string {
	return fmt.Sprintf(t.InitScale, k)
}

// Keep says how to keep modules in fp32: half under model.half() (the
// half policy), else under autocast on device d. it, its and returns
// name the modules ("it", "its", "returns" or "them", "their",
// "return").
func (t *Trainer) Keep(half bool, d, it, its, returns string) string {
	if half {
		return fmt.Sprintf(t.KeepHalf, it, its, returns)
	}
	return fmt.Sprintf(t.KeepAutocast, it, its, device(d))
}

// ClipAt is how to clip the gradients' norm at maxNorm (a number, or a
// name such as "C" where the replay found none).
func (t *Trainer) ClipAt(maxNorm string) string {
	return fmt.Sprintf(t.Clip, maxNorm)
}

// LowerLRTo is how to train at the learning rate lr (a number, or words
// such as "a tenth of it").
func (t *Trainer) LowerLRTo(lr string) string {
	return fmt.Sprintf(t.LowerLR, lr)
}

// Normalize says how to standardize one input: image tells an image
// input, fastai is fastai's call for it ("" where fastai has none),
// torch PyTorch's.
func (t *Trainer) Normalize(input string, image bool, fastai, torch string) string {
	switch {
	case image:
		return fmt.Sprintf(t.NormalizeImage, input, fastai, torch)
	case fastai != "":
		return fmt.Sprintf(t.NormalizeOther, input, fastai, torch)
	default:
		return fmt.Sprintf(t.NormalizeTorch, input, fastai, torch)
	}
}
