package replay

import (
	"fmt"
	"math"
	"strings"

	"fp16audit/report"
)

// words says a fix in fastai's and in PyTorch's words: one table for the
// replay's fixes, the trainer's wording chosen from it.
type words struct {
	// device is torch.autocast's device_type of the run.
	device string
}

func wordsFor(_ string, device string) words {
	if device == "" {
		device = "cuda"
	}
	return words{device: device}
}

// say returns (fastai, torch) for a fix of kind.
func (w words) say(kind string, modules []string, clip, lr *float64) (string, string) {
	switch kind {
	case report.FixBF16:
		return "learn.to_bf16()",
			fmt.Sprintf("torch.autocast(device_type=%q, dtype=torch.bfloat16), without a GradScaler", w.device)
	case report.FixFP32:
		return "learn.to_fp32()", "train without torch.autocast and without the GradScaler"
	case report.FixKeepFP32:
		mods := "the module"
		if len(modules) > 0 {
			mods = strings.Join(modules, ", ")
		}
		s := fmt.Sprintf("run %s under torch.autocast(device_type=%q, enabled=False) with its input cast by .float()", mods, w.device)
		return s, s
	case report.FixDropBatch:
		return "skip it: a callback whose after_loss raises CancelBatchException() when the loss is not finite (or remove the samples from the Dataset)",
			"skip it: `if not torch.isfinite(loss): optimizer.zero_grad(); continue` before the backward (or remove the samples from the Dataset)"
	case report.FixClip:
		c := "C"
		if clip != nil {
			c = fmt.Sprintf("%.3g", *clip)
		}
		return fmt.Sprintf("learn.fit_one_cycle(..., cbs=GradientClip(max_norm=%s))", c),
			fmt.Sprintf("scaler.unscale_(optimizer); torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=%s) before scaler.step(optimizer)", c)
	case report.FixLowerLR:
		l := "a tenth of it"
		if lr != nil {
			l = fmt.Sprintf("%.3g", *lr)
		}
		return fmt.Sprintf("learn.fit_one_cycle(..., lr_max=%s)", l),
			fmt.Sprintf("for g in optimizer.param_groups: g[\"lr\"] = %s", l)
	}
	return "", ""
}

// initScale says starting the GradScaler at scale s.
func (w words) initScale(s float64) (string, string) {
	e := fmt.Sprintf("2**%d", exponentOf(s))
	return fmt.Sprintf("learn.to_fp16(init_scale=%s)", e),
		fmt.Sprintf("torch.amp.GradScaler(%q, init_scale=%s)", w.device, e)
}

func exponentOf(s float64) int {
	_, e := math.Frexp(s)
	return e - 1
}
