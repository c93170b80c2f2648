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
//  1. gradient-overflow-nan: the loss went NaN after the scale collapsed,
//     whenever (FP5002).
//  2. early-nan: within the first epoch, without a collapse (FP5001).
//  3. late-nan: later, in a log without scales (FP5004).
//  4. forward-overflow-nan: later, with a healthy scale (FP5003).
//  5. plateau-underflow: above the baseline, with skips, a pinned scale
//     or gradients losing mass (FP5005).
//  6. plateau-unexplained: above the baseline, with a clean scale (FP5006).
//  7. recovered-nan: non-finite losses the run went on from (FP5012).
//  8. wasted-warmup: the first steps were all skipped (FP5008).
//  9. fp16-noise: above the baseline within the tolerance (FP5007).
//  10. healthy: none of these; warnings may remain.
//
// A capture the log points to of the failure the verdict names then
// takes the class over (captures).
func (f *Facts) verdict(findings []checks.Finding) {
	has := func(c *checks.Check) bool {
		return slices.ContainsFunc(findings, func(x checks.Finding) bool { return x.Check == c.ID })
	}
	r, st, cmp := f.r, f.r.Scales, f.r.Comparison
	switch {
	case has(checkGradOverflowNaN):
		r.Verdict = report.ScalesGradientOverflowNaN
		r.VerdictText = fmt.Sprintf("%s %s step %d%s, after the loss scale collapsed to %s (%d backoffs of finite losses before it): chronic gradient overflow",
			f.nanWhat(), f.nanAt(), f.nanStep, f.inFirstEpoch(), report.FormatScale(*st.ScaleAtFirstNaN), st.GradientBackoffsBeforeNaN)
		r.Fix = "lower the learning rate, clip gradients (fastai GradientClip; PyTorch scaler.unscale_ then clip_grad_norm_), or train with learn.to_bf16() (Ampere or newer) or in fp32"
		if o := f.overflowModule(); o != nil {
			r.VerdictText += fmt.Sprintf("; the overflows begin in module %s", o.Module)
			r.Fix = fmt.Sprintf("module %s's gradients overflow first: lower its learning rate, clip gradients, keep it in fp32 (torch.autocast(enabled=False) around it), or train with learn.to_bf16() (Ampere or newer) or in fp32", o.Module)
		}
	case has(checkEarlyNaN):
		r.Verdict = report.ScalesEarlyNaN
		r.VerdictText = fmt.Sprintf("%s %s %s %d, within %s, without a collapse of the scale before it: a forward overflow or poisoned data, not the loss scaler", f.nanWhat(), f.nanAt(), f.unit(), f.nanStep, f.limitText)
		r.Fix = "export the model and a batch and run 'fp16audit run model.onnx -i batch.npy' to find the overflowing op and a verified fix (normalize inputs, to_bf16(), keep that module in fp32); lowering init_scale does not fix it"
	case has(checkLateNaN):
		r.Verdict = report.ScalesLateNaN
		r.VerdictText = fmt.Sprintf("%s %s %s %d, after %s; without scales the cause cannot be told", f.nanWhat(), f.nanAt(), f.unit(), f.nanStep, f.limitText)
		r.Fix = "record the loss scale of every step (the Python companion, python/README.md, or examples/fastai_scales_callback.py) and diagnose again"
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
	case has(checkRecoveredNaN):
		r.Verdict = report.ScalesRecoveredNaN
		r.VerdictText = f.recoveredText() + "; " + f.recoveredSuspect()
		others := ""
		if len(f.recovered) > 1 {
			others = " (and of the others)"
		}
		r.Fix = fmt.Sprintf("look at the batch of step %d%s: drop or clean samples holding NaN/Inf, normalize inputs that reach 65504; 'fp16audit run model.onnx -i batch.npy' on it tells data from an overflowing op", f.step(f.recovered[0]), others)
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
	f.captures()
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
	case len(f.recovered) > 0:
		parts = append(parts, fmt.Sprintf("%d NaN/Inf losses the run went on from, unjudged: %s", len(f.recovered), f.switchedOff(checkRecoveredNaN)))
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

// nanCheck is the check that judges the log's failing NaN.
func (f *Facts) nanCheck() *checks.Check {
	switch {
	case f.collapse:
		return checkGradOverflowNaN
	case f.early:
		return checkEarlyNaN
	case f.r.Scales == nil:
		return checkLateNaN
	}
	return checkForwardOverflowNaN
}

// inFirstEpoch says so of a failing NaN in the first epoch: the class
// follows the collapse, not the time.
func (f *Facts) inFirstEpoch() string {
	if f.early {
		return ", within " + f.limitText
	}
	return ""
}

// listSteps writes steps, the first five and the last when there are
// more.
func listSteps(steps []int) string {
	if len(steps) <= 6 {
		parts := make([]string, len(steps))
		for i, s := range steps {
			parts[i] = fmt.Sprint(s)
		}
		return strings.Join(parts, ", ")
	}
	return listSteps(steps[:5]) + ", …, " + fmt.Sprint(steps[len(steps)-1])
}

// recoveredText says how many non-finite losses the run went on from,
// when, and what GradScaler did with them.
func (f *Facts) recoveredText() string {
	steps := make([]int, len(f.recovered))
	for i, k := range f.recovered {
		steps[i] = f.step(k)
	}
	what := "a NaN/Inf loss at 1 step"
	if len(steps) > 1 {
		what = fmt.Sprintf("NaN/Inf losses at %d steps", len(steps))
	}
	s := fmt.Sprintf("%s (%s %s) that the run went on from: finite losses followed", what, f.unit(), listSteps(steps))
	if len(steps) > 1 {
		s += " each"
	}
	if f.nanIdx >= 0 {
		s += fmt.Sprintf(", before the loss went NaN/Inf for good at %s %d", f.unit(), f.nanStep)
	}
	if f.kind != nil {
		backoffs := 0
		for _, k := range f.recovered {
			if f.kind[k] == stepBackoff {
				backoffs++
			}
		}
		switch {
		case len(steps) == 1 && backoffs == 1:
			s += "; GradScaler skipped it, halving the scale"
		case backoffs == len(steps):
			s += fmt.Sprintf("; GradScaler skipped all %d, halving the scale each time", backoffs)
		default:
			s += fmt.Sprintf("; GradScaler skipped %d of them, halving the scale each time", backoffs)
		}
	}
	return s
}

// recoveredSuspect names the suspect of recovered non-finite losses.
func (f *Facts) recoveredSuspect() string {
	whose := "the batch of each"
	if len(f.recovered) == 1 {
		whose = "its batch"
	}
	s := whose + " is the suspect (a NaN/Inf in its data, a value beyond fp16's 65504, or an activation such a batch pushes past it), not the training"
	// Recurring to the end, they may be a forward overflow appearing: an
	// activation that grows with the weights passes 65504 on the batches
	// that push it furthest, then on more of them.
	end := f.n
	if f.nanIdx >= 0 {
		end = f.nanIdx
	}
	w := finalWindow(end)
	late := 0
	for _, i := range f.recovered {
		if i >= end-w {
			late++
		}
	}
	if late > 0 && len(f.recovered) > 1 {
		s += fmt.Sprintf("; they keep coming to the end (%d in the last %d %ss): if they come more often as training goes on, an activation growing with the weights may be passing 65504 on the batches that push it furthest (a forward overflow appearing)", late, w, f.unit())
	}
	if st := f.r.Scales; st != nil && f.pinnedLow {
		s += fmt.Sprintf("; the halvings stay: the scale is held at %s, where small gradients underflow", report.FormatScale(st.PinnedScale))
	}
	return s
}

// switchedOff names a check the selection left out.
func (f *Facts) switchedOff(c *checks.Check) string {
	return fmt.Sprintf("--checks %s switched off %s (%s)", f.opt.Checks, c.ID, c.Title)
}

// captures lists the capture folders the log points to, each with the
// command that replays it, and hands the class of the failure the verdict
// names to the capture of that failure: the earliest written capture
// among those that hold it (for a NaN, the captures between the warm-up,
// or the last NaN/Inf loss the run went on from, and the failing step: a
// capture at the onset of a collapse comes before the one of the NaN,
// and clipping still saves the run there; for a plateau, a capture of the
// pinned scale or of its collapse, else any after the warm-up; for
// NaN/Inf losses the run went on from, a capture of one of those steps).
// The replay names the op, the module and the fix at that state; the log
// does not. A capture of that failure that failed to write is said, and
// the log's verdict stands.
func (f *Facts) captures() {
	cs := f.run.Captures
	if len(cs) == 0 {
		return
	}
	r := f.r
	r.Captures = make([]report.Capture, len(cs))
	for i, c := range cs {
		r.Captures[i] = report.Capture{Step: c.Step, Trigger: c.Trigger, Path: c.Path, Error: c.Error}
		if c.Path != "" && c.Error == "" {
			r.Captures[i].Replay = "fp16audit replay " + shellQuote(c.Path)
		}
	}
	holds := f.captureHolds()
	if holds == nil {
		// The log alone names no failure, but a trigger of the recorder
		// fired (a pinned scale with a flat loss and a gradient fp16 does
		// not hold, a loss spike, a collapse): it saw what the log cannot
		// judge (a plateau without its fp32 baseline), and the replay of
		// its first capture decides.
		for i, c := range cs {
			if rc := &r.Captures[i]; rc.Replay != "" && c.Trigger != "request" {
				rc.Decides = true
				r.VerdictText = fmt.Sprintf("the recorder captured step %d (%s): its replay decides the class ('%s'); from the log alone: %s", c.Step, c.Trigger, rc.Replay, r.VerdictText)
				r.Fix = fmt.Sprintf("run '%s': it replays step %d in fp32, fp16 and bf16 and says whether and where it fails%s", rc.Replay, c.Step, fixAfter(r.Fix))
				return
			}
		}
		return
	}
	pick, failed := -1, -1
	for _, pref := range []bool{true, false} {
		for i, c := range cs {
			if !holds(c, pref) {
				continue
			}
			switch {
			case r.Captures[i].Replay != "" && pick < 0:
				pick = i
			case r.Captures[i].Replay == "" && failed < 0:
				failed = i
			}
		}
		if pick >= 0 {
			break
		}
	}
	switch {
	case pick >= 0:
		c := &r.Captures[pick]
		c.Decides = true
		r.VerdictText = fmt.Sprintf("the capture of step %d (%s) holds this failure: its replay decides the class ('%s'); from the log alone: %s", c.Step, c.Trigger, c.Replay, r.VerdictText)
		r.Fix = fmt.Sprintf("run '%s': it replays step %d in fp32, fp16 and bf16, names the op and the module, and verifies the fixes from that state (from the log alone: %s)", c.Replay, c.Step, r.Fix)
	case failed >= 0:
		c := &r.Captures[failed]
		c.Decides = true
		r.VerdictText += fmt.Sprintf("; the capture of step %d (%s) failed to write (%s), so the log decides", c.Step, c.Trigger, c.Error)
	}
}

func fixAfter(fix string) string {
	if fix == "" {
		return ""
	}
	return " (from the log alone: " + fix + ")"
}

// captureHolds says which captures hold the failure the verdict names;
// with preferred set, only those whose trigger fits it best (a capture on
// request is the user's, of whatever step they chose). nil: the verdict
// names no failure.
func (f *Facts) captureHolds() func(c Capture, preferred bool) bool {
	r := f.r
	switch r.Verdict {
	case report.ScalesGradientOverflowNaN, report.ScalesEarlyNaN, report.ScalesLateNaN, report.ScalesForwardOverflowNaN:
		from := f.warmupEnd
		for _, i := range f.recovered {
			from = max(from, f.step(i)+1)
		}
		return func(c Capture, preferred bool) bool {
			if preferred && c.Trigger == "request" {
				return false
			}
			return c.Step >= from && c.Step <= f.nanStep
		}
	case report.ScalesPlateauUnderflow:
		return func(c Capture, preferred bool) bool {
			if preferred {
				return c.Step >= f.warmupEnd && (c.Trigger == "pinned-plateau" || c.Trigger == "scale-collapse")
			}
			return c.Step >= f.warmupEnd
		}
	case report.ScalesRecoveredNaN:
		return func(c Capture, _ bool) bool {
			return slices.ContainsFunc(f.recovered, func(i int) bool { return f.step(i) == c.Step })
		}
	}
	return nil
}

// shellQuote quotes a path for a POSIX shell where it needs it.
func shellQuote(s string) string {
	safe := s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-./:@%+=,", r))
	}) < 0
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
