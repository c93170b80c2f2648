package trainlog

import (
	"fmt"
	"slices"
	"strings"

	"fp16audit/checks"
	"fp16audit/report"
)

// verdict walks the tree over the findings, so that a check switched off
// cannot decide it; the first that applies:
//
//  1. early-nan: the loss became NaN within the first epoch (FP5001).
//  2. late-nan: later, in a log without scales (FP5004).
//  3. gradient-overflow-nan: later, after the scale collapsed (FP5002).
//  4. forward-overflow-nan: later, with a healthy scale (FP5003).
//  5. plateau-underflow: above the baseline, with skips or a pinned scale
//     (FP5005).
//  6. plateau-unexplained: above the baseline, with a clean scale (FP5006).
//  7. wasted-warmup: the first steps were all skipped (FP5008).
//  8. fp16-noise: above the baseline within the tolerance (FP5007).
//  9. healthy: none of these; warnings may remain.
func (f *Facts) verdict(findings []checks.Finding) {
	has := func(c *checks.Check) bool {
		return slices.ContainsFunc(findings, func(x checks.Finding) bool { return x.Check == c.ID })
	}
	r, st, cmp := f.r, f.r.Scales, f.r.Comparison
	switch {
	case has(checkEarlyNaN):
		r.Verdict = report.ScalesEarlyNaN
		r.VerdictText = fmt.Sprintf("%s %s %s %d, within %s: a forward overflow or poisoned data, not the loss scaler", f.nanWhat(), f.nanAt(), f.unit(), f.nanStep, f.limitText)
		r.Fix = "export the model and a batch and run 'fp16audit run model.onnx -i batch.npy' to find the overflowing op and a verified fix (normalize inputs, to_bf16(), keep that module in fp32); lowering init_scale does not fix it"
	case has(checkLateNaN):
		r.Verdict = report.ScalesLateNaN
		r.VerdictText = fmt.Sprintf("%s %s %s %d, after %s; without scales the cause cannot be told", f.nanWhat(), f.nanAt(), f.unit(), f.nanStep, f.limitText)
		r.Fix = "record the loss scale of every step (the Python companion, python/README.md, or examples/fastai_scales_callback.py) and diagnose again"
	case has(checkGradOverflowNaN):
		r.Verdict = report.ScalesGradientOverflowNaN
		r.VerdictText = fmt.Sprintf("%s %s step %d after the loss scale collapsed to %s: chronic gradient overflow", f.nanWhat(), f.nanAt(), f.nanStep, report.FormatScale(*st.ScaleAtFirstNaN))
		r.Fix = "lower the learning rate, clip gradients (fastai GradientClip; PyTorch scaler.unscale_ then clip_grad_norm_), or train with learn.to_bf16() (Ampere or newer) or in fp32"
		if o := f.overflowModule(); o != nil {
			r.VerdictText += fmt.Sprintf("; the overflows begin in module %s", o.Module)
			r.Fix = fmt.Sprintf("module %s's gradients overflow first: lower its learning rate, clip gradients, keep it in fp32 (torch.autocast(enabled=False) around it), or train with learn.to_bf16() (Ampere or newer) or in fp32", o.Module)
		}
	case has(checkForwardOverflowNaN):
		r.Verdict = report.ScalesForwardOverflowNaN
		r.VerdictText = fmt.Sprintf("%s %s step %d with a healthy loss scale (%s): the forward pass began to overflow", f.nanWhat(), f.nanAt(), f.nanStep, report.FormatScale(*st.ScaleAtFirstNaN))
		r.Fix = fmt.Sprintf("save a checkpoint from just before step %d, export it with that step's batch and audit it with 'fp16audit run model.onnx -i batch.npy'", f.nanStep)
	case has(checkPlateauUnderflow):
		r.Verdict = report.ScalesPlateauUnderflow
		r.VerdictText = fmt.Sprintf("final loss %.4g is %.1f%% above the fp32 baseline's %.4g, with %s", cmp.RunLoss, 100*cmp.Gap, cmp.BaselineLoss, f.signsText())
		r.Fix = "train with learn.to_bf16() (Ampere or newer): no loss scaling, no skipped steps; otherwise find and clip the gradients that overflow"
		if u := f.underflowModules(); len(u) > 0 {
			r.VerdictText += "; module " + u[0].Module + " " + lossText(u[0])
		}
	case has(checkPlateauUnexplained):
		r.Verdict = report.ScalesPlateauUnexplained
		r.VerdictText = fmt.Sprintf("final loss %.4g is %.1f%% above the fp32 baseline's %.4g, but %s", cmp.RunLoss, 100*cmp.Gap, cmp.BaselineLoss, f.cleanText())
		r.Fix = "check that both runs used the same data, seed and schedule; compare a learn.to_bf16() run; audit the model for underflow with 'fp16audit run'"
	case has(checkWastedWarmup):
		r.Verdict = report.ScalesWastedWarmup
		r.VerdictText = fmt.Sprintf("the first %d steps were all skipped while the scale came down from %s to %s", f.warmup, report.FormatScale(f.cfg.InitScale), report.FormatScale(st.WarmupScale))
		r.Fix = fmt.Sprintf("learn.to_fp16(init_scale=%s) (GradScaler(init_scale=%s) in PyTorch) saves them; the last knob, not a fix for NaN", pyScale(st.WarmupScale), pyScale(st.WarmupScale))
	case has(checkNoise):
		r.Verdict = report.ScalesFP16Noise
		r.VerdictText = fmt.Sprintf("final loss %.4g is %.1f%% above the fp32 baseline's %.4g, within the %.1f%% tolerance: normal fp16 noise", cmp.RunLoss, 100*cmp.Gap, cmp.BaselineLoss, 100*cmp.Tolerance)
	default:
		r.Verdict = report.ScalesHealthy
		r.VerdictText = f.healthyText()
	}
	if f.r.Telemetry == nil {
		switch r.Verdict {
		case report.ScalesGradientOverflowNaN, report.ScalesPlateauUnderflow:
			f.notDerived("which module's gradients overflow or underflow: the log carries no per-module gradient telemetry; record the run with the Python companion (python/README.md), whose telemetry names them")
		}
	}
}

// healthyText says what a run without a deciding finding showed. A fact
// that a switched-off check would have judged (a NaN, a gap to the
// baseline) is stated, with the check that --checks left out.
func (f *Facts) healthyText() string {
	var parts []string
	if st := f.r.Scales; st != nil {
		parts = append(parts, fmt.Sprintf("%s%d of %d steps skipped, final scale %s", f.atLeast(), st.Skipped, f.steps, report.FormatScale(st.FinalScale)))
	}
	switch {
	case f.nanIdx >= 0:
		parts = append(parts, fmt.Sprintf("%s %s %s %d, unjudged: %s", f.nanWhat(), f.nanAt(), f.unit(), f.nanStep, f.switchedOff(f.nanCheck())))
	case f.run.Losses != nil:
		parts = append(parts, "no NaN/Inf loss")
	}
	if cmp := f.r.Comparison; cmp != nil {
		if cmp.Gap > 0 {
			c := checkNoise
			switch {
			case f.gapOver && f.signs():
				c = checkPlateauUnderflow
			case f.gapOver:
				c = checkPlateauUnexplained
			}
			parts = append(parts, fmt.Sprintf("final loss %.4g is %.1f%% above the fp32 baseline's %.4g, unjudged: %s", cmp.RunLoss, 100*cmp.Gap, cmp.BaselineLoss, f.switchedOff(c)))
		} else {
			parts = append(parts, fmt.Sprintf("final loss %.4g at or below the fp32 baseline's %.4g", cmp.RunLoss, cmp.BaselineLoss))
		}
	}
	sel := f.opt.Checks
	if f.highSkip && sel.Enabled(checkSkipRate.ID) || f.pinnedLow && sel.Enabled(checkPinnedLow.ID) || f.massLost() && sel.Enabled(checkMassLost.ID) {
		if f.r.Comparison == nil {
			parts = append(parts, "but see the warnings: pass --baseline to tell whether they cost accuracy")
		} else {
			parts = append(parts, "but see the warnings")
		}
	}
	return strings.Join(parts, "; ")
}

// nanCheck is the check that judges the log's first NaN.
func (f *Facts) nanCheck() *checks.Check {
	switch {
	case f.early:
		return checkEarlyNaN
	case f.r.Scales == nil:
		return checkLateNaN
	case f.collapse:
		return checkGradOverflowNaN
	}
	return checkForwardOverflowNaN
}

// switchedOff names a check the selection left out.
func (f *Facts) switchedOff(c *checks.Check) string {
	return fmt.Sprintf("--checks %s switched off %s (%s)", f.opt.Checks, c.ID, c.Title)
}
