package trainlog

import (
	"fmt"
	"strings"

	"fp16audit/checks"
	"fp16audit/report"
)

// Analyzer is one training-log check over the facts of one log.
type Analyzer = checks.Analyzer[*Facts]

// Analyzers returns every training-log check: the classes of the failing
// NaN first (one of them at most applies), then the comparison with the
// baseline, then the evidence any run may show. Each finds its condition in the facts
// newFacts computed; none changes them, so switching one off changes
// nothing but its finding and the verdict it would decide.
func Analyzers() []*Analyzer {
	return []*Analyzer{
		{Check: checkEarlyNaN, Requires: []*Requirement{needLossesOrScales}, Run: runEarlyNaN},
		{Check: checkGradOverflowNaN, Requires: []*Requirement{needScales}, Run: runGradOverflowNaN},
		{Check: checkForwardOverflowNaN, Requires: []*Requirement{needScales}, Run: runForwardOverflowNaN},
		{Check: checkLateNaN, Requires: []*Requirement{needLosses}, Run: runLateNaN},
		{Check: checkPlateauUnderflow, Requires: []*Requirement{needComparison, needScales}, Run: runPlateauUnderflow},
		{Check: checkPlateauUnexplained, Requires: []*Requirement{needComparison}, Run: runPlateauUnexplained},
		{Check: checkNoise, Requires: []*Requirement{needComparison}, Run: runNoise},
		{Check: checkWastedWarmup, Requires: []*Requirement{needScales}, Run: runWastedWarmup},
		{Check: checkSkipRate, Requires: []*Requirement{needScales}, Run: runSkipRate},
		{Check: checkPinnedLow, Requires: []*Requirement{needScales}, Run: runPinnedLow},
		{Check: checkMassLost, Requires: []*Requirement{needTelemetry}, Run: runMassLost},
		{Check: checkRecoveredNaN, Requires: []*Requirement{needLosses}, Run: runRecoveredNaN},
	}
}

// Requirement is a fact a training-log check needs, which the driver
// tests.
type Requirement = checks.Requirement[*Facts]

// The training-log checks' requirements.
var (
	needLosses         = &Requirement{Name: "losses", Met: func(f *Facts) bool { return f.run.Losses != nil }}
	needScales         = &Requirement{Name: "scales", Met: func(f *Facts) bool { return f.r.Scales != nil }}
	needLossesOrScales = &Requirement{Name: "losses or scales", Met: func(f *Facts) bool { return f.run.Losses != nil || f.r.Scales != nil }}
	needComparison     = &Requirement{Name: "losses and a baseline", Met: func(f *Facts) bool { return f.r.Comparison != nil }}
	needTelemetry      = &Requirement{Name: "telemetry", Met: func(f *Facts) bool { return f.r.Telemetry != nil }}
)

// one returns a single finding of c, as the analyzers' Run wants it.
func one(c *checks.Check, format string, args ...any) ([]checks.Finding, error) {
	return []checks.Finding{c.Finding(fmt.Sprintf(format, args...))}, nil
}

// lateNaN reports whether the loss went NaN after the early limit.
func (f *Facts) lateNaN() bool { return f.nanIdx >= 0 && !f.early }

// A collapse before the failing NaN decides its class whenever the NaN
// comes: gradients that overflowed fp16 step after step while the loss
// stayed finite are chronic gradient overflow, in the first epoch too.
// The early and late classes are for a NaN without one.

func runEarlyNaN(f *Facts) ([]checks.Finding, error) {
	if !f.early || f.collapse {
		return nil, nil
	}
	return one(checkEarlyNaN, "%s %s %s %d, within %s%s. The loss scaler cannot cause this; audit the exported model with 'fp16audit run model.onnx -i batch.npy'",
		f.nanWhat(), f.nanAt(), f.unit(), f.nanStep, f.limitText, f.scaleAtNaN())
}

func runLateNaN(f *Facts) ([]checks.Finding, error) {
	if !f.lateNaN() || f.r.Scales != nil {
		return nil, nil
	}
	return one(checkLateNaN, "%s %s %s %d, after %s; the log has no scales to tell a gradient overflow from a forward overflow",
		f.nanWhat(), f.nanAt(), f.unit(), f.nanStep, f.limitText)
}

func runGradOverflowNaN(f *Facts) ([]checks.Finding, error) {
	if f.nanIdx < 0 || !f.collapse {
		return nil, nil
	}
	fd := checkGradOverflowNaN.Finding(fmt.Sprintf("%s %s step %d%s: the gradients kept overflowing as training diverged. Lower the learning rate, clip gradients, or use to_bf16()/fp32",
		f.nanWhat(), f.nanAt(), f.nanStep, f.scaleAtNaN()))
	if o := f.overflowModule(); o != nil {
		fd.Module = o.Module
		fd.Message += ". " + f.overflowText() + ": lower the learning rate for that module (its own parameter group), clip its gradients, keep it in fp32 (torch.autocast(enabled=False) around it) or train with to_bf16()"
	}
	return []checks.Finding{fd}, nil
}

func runForwardOverflowNaN(f *Facts) ([]checks.Finding, error) {
	if !f.lateNaN() || f.collapse {
		return nil, nil
	}
	return one(checkForwardOverflowNaN, "%s %s step %d%s: the gradients fitted fp16, the forward pass did not. Audit a checkpoint from just before step %d with 'fp16audit run'",
		f.nanWhat(), f.nanAt(), f.nanStep, f.scaleAtNaN(), f.nanStep)
}

func runRecoveredNaN(f *Facts) ([]checks.Finding, error) {
	if len(f.recovered) == 0 {
		return nil, nil
	}
	s := f.recoveredSuspect()
	return one(checkRecoveredNaN, "%s. %s", f.recoveredText(), strings.ToUpper(s[:1])+s[1:])
}

func runPlateauUnderflow(f *Facts) ([]checks.Finding, error) {
	if !f.gapOver || !f.signs() {
		return nil, nil
	}
	cmp := f.r.Comparison
	fd := checkPlateauUnderflow.Finding(fmt.Sprintf("final loss %.4g (mean of the last %d of %d steps) is %.1f%% above the fp32 baseline's %.4g (tolerance %.1f%%), with %s. Prefer to_bf16()",
		cmp.RunLoss, cmp.Window, cmp.Steps, 100*cmp.Gap, cmp.BaselineLoss, 100*cmp.Tolerance, f.signsText()))
	f.nameUnderflow(&fd)
	if f.overflowModule() != nil {
		fd.Message += ". " + f.overflowText() + ", keeping the scale low"
	}
	return []checks.Finding{fd}, nil
}

func runPlateauUnexplained(f *Facts) ([]checks.Finding, error) {
	if !f.gapOver || f.signs() {
		return nil, nil
	}
	cmp := f.r.Comparison
	return one(checkPlateauUnexplained, "final loss %.4g (mean of the last %d of %d steps) is %.1f%% above the fp32 baseline's %.4g (tolerance %.1f%%), but %s",
		cmp.RunLoss, cmp.Window, cmp.Steps, 100*cmp.Gap, cmp.BaselineLoss, 100*cmp.Tolerance, f.cleanText())
}

func runNoise(f *Facts) ([]checks.Finding, error) {
	cmp := f.r.Comparison
	if !(cmp.Gap > 0) || f.gapOver || f.nanIdx >= 0 {
		return nil, nil
	}
	return one(checkNoise, "final loss %.4g (mean of the last %d of %d steps) is %.1f%% above the fp32 baseline's %.4g, within the %.1f%% tolerance: normal fp16 noise",
		cmp.RunLoss, cmp.Window, cmp.Steps, 100*cmp.Gap, cmp.BaselineLoss, 100*cmp.Tolerance)
}

func runWastedWarmup(f *Facts) ([]checks.Finding, error) {
	if !f.longWarmup {
		return nil, nil
	}
	st := f.r.Scales
	return one(checkWastedWarmup, "%sthe first %d steps were all skipped while the scale halved from %s to %s, the first scale that worked. learn.to_fp16(init_scale=%s) saves them; this is the last knob, not a fix for NaN",
		f.sampledWarmup(), f.warmup, report.FormatScale(f.cfg.InitScale), report.FormatScale(st.WarmupScale), pyScale(st.WarmupScale))
}

func runSkipRate(f *Facts) ([]checks.Finding, error) {
	if !f.highSkip {
		return nil, nil
	}
	fd := checkSkipRate.Finding(fmt.Sprintf("%s%d of the %d steps after the warm-up%s were skipped (%s%.2f%%, threshold %.2f%%): each one an optimizer step thrown away",
		f.atLeast(), f.judgedSkips, f.judged, beforeNaN(f.nanIdx >= 0), f.atLeast(), 100*f.r.Scales.SkipRateAfterWarmup, 100*f.skipThreshold))
	if o := f.overflowModule(); o != nil {
		fd.Module = o.Module
		fd.Message += ". " + f.overflowText()
	}
	return []checks.Finding{fd}, nil
}

func runPinnedLow(f *Facts) ([]checks.Finding, error) {
	if !f.pinnedLow {
		return nil, nil
	}
	st := f.r.Scales
	if st.PinnedSince != nil {
		end := "to the end"
		if f.nanIdx >= 0 {
			end = fmt.Sprintf("until the loss went NaN at step %d", f.nanStep)
		}
		fd := checkPinnedLow.Finding(fmt.Sprintf("the scale fell to %s, %.0f halvings below its %s after the warm-up, and stayed at or below %s (threshold) from step %d %s: GradScaler grows it back one doubling per %d clean steps",
			report.FormatScale(st.PinnedScale), collapseBits(f.heldFrom, st.PinnedScale), report.FormatScale(f.heldFrom), report.FormatScale(f.opt.LowScale), *st.PinnedSince, end, f.cfg.GrowthInterval))
		f.nameUnderflow(&fd)
		return []checks.Finding{fd}, nil
	}
	fd := checkPinnedLow.Finding(fmt.Sprintf("the scale did not grow for %d steps (%.1f growth intervals of %d) from step %d, with %d backoffs, and ended that stretch at %s (threshold %s)",
		st.LongestNoGrowth, float64(st.LongestNoGrowth)/float64(f.cfg.GrowthInterval), f.cfg.GrowthInterval,
		st.LongestNoGrowthStart, st.LongestNoGrowthBackoffs, report.FormatScale(st.PinnedScale), report.FormatScale(f.opt.LowScale)))
	f.nameUnderflow(&fd)
	return []checks.Finding{fd}, nil
}

func runMassLost(f *Facts) ([]checks.Finding, error) {
	var parts []string
	var top *report.ModuleUnderflow
	us := f.underflowModules()
	for i := range us {
		u := &us[i]
		if u.Measure != MeasureLostMass {
			continue
		}
		if top == nil {
			top = u
		}
		if len(parts) == 3 {
			parts = append(parts, "and more")
			break
		}
		parts = append(parts, fmt.Sprintf("%s%s's %s loses %.1f%% of its mass (L2 norm) to fp16 at a median scale %s over %d lines",
			u.Module, typeText(u.Type), gradientWord(u.Gradient), 100**u.LostMass, report.FormatScale(u.MedianScale), u.Lines))
	}
	if top == nil {
		return nil, nil
	}
	fd := checkMassLost.Finding(fmt.Sprintf("the telemetry shows %s (tolerance %.1f%%): that part of the gradient does not train the module; a larger loss scale, to_bf16() or the module in fp32 keeps it",
		strings.Join(parts, "; "), 100*f.opt.LostMassTolerance))
	fd.Module = top.Module
	return []checks.Finding{fd}, nil
}

// judge settles the conditions several analyzers and the verdict share.
func (f *Facts) judge() {
	limit, text := f.earlyLimit()
	f.limitText = text
	f.early = f.nanIdx >= 0 && f.nanStep-f.step(0) < limit
	cmp := f.r.Comparison
	f.gapOver = cmp != nil && cmp.Gap > cmp.Tolerance
	f.longWarmup = f.r.Scales != nil && f.warmup >= f.opt.WarmupSkips && f.warmup < f.steps
}

// earlyLimit is the number of steps in which a NaN counts as early: the
// first epoch when known (where the epochs change, else the log's
// steps_per_epoch), else EarlySteps.
func (f *Facts) earlyLimit() (int, string) {
	if f.run.PerEpoch {
		return 1, "the first epoch"
	}
	if ep := f.run.Epochs; len(ep) > 0 {
		n := 0
		for n < len(ep) && ep[n] == ep[0] {
			n++
		}
		if n < len(ep) {
			steps := f.step(n) - f.step(0)
			return steps, fmt.Sprintf("the first epoch (%d steps)", steps)
		}
	}
	if spe := f.run.StepsPerEpoch; spe > 0 {
		return spe, fmt.Sprintf("the first epoch (%d steps)", spe)
	}
	return f.opt.EarlySteps, fmt.Sprintf("the first %d steps", f.opt.EarlySteps)
}

// signs reports whether the log shows underflow's trouble: many skipped
// steps, a scale pinned low, or telemetry of gradients losing mass to
// fp16.
func (f *Facts) signs() bool { return f.highSkip || f.pinnedLow || f.massLost() }

// nanAt is "at", or "by" where the NaN lies between the sample that shows
// it and the one before.
func (f *Facts) nanAt() string {
	if f.run.Sampled() || f.sampled && f.run.Losses == nil {
		return "by"
	}
	return "at"
}

// nanWhat says what became non-finite at the failing step.
func (f *Facts) nanWhat() string {
	switch r := f.r; {
	case r.Losses != nil && r.Losses.FailingValue != "":
		return "the loss became " + r.Losses.FailingValue
	case f.nanIdx >= 0:
		return "every step's gradients became non-finite (inferred NaN loss)"
	}
	return "the loss became NaN/Inf"
}

// scaleAtNaN describes the scale at the first NaN and its fall before it,
// "" without scales.
func (f *Facts) scaleAtNaN() string {
	st := f.r.Scales
	if st == nil || st.ScaleAtFirstNaN == nil {
		return ""
	}
	s := fmt.Sprintf("; the scale was %s", report.FormatScale(*st.ScaleAtFirstNaN))
	if st.CollapseBits != nil {
		s += fmt.Sprintf(", %.1f bits below its peak in the %d steps before, with %d skipped steps in them",
			*st.CollapseBits, st.CollapseWindow, st.BackoffsBeforeNaN)
	}
	return s
}

func beforeNaN(nan bool) string {
	if nan {
		return " and before the loss went NaN"
	}
	return ""
}

func (f *Facts) signsText() string {
	st := f.r.Scales
	var parts []string
	if f.highSkip {
		parts = append(parts, fmt.Sprintf("%s%.1f%% of the steps after the warm-up skipped (%d)", f.atLeast(), 100*st.SkipRateAfterWarmup, f.judgedSkips))
	}
	switch {
	case f.pinnedLow && st.PinnedSince != nil:
		parts = append(parts, fmt.Sprintf("the scale held down at %s from step %d to the end", report.FormatScale(st.PinnedScale), *st.PinnedSince))
	case f.pinnedLow:
		parts = append(parts, fmt.Sprintf("the scale pinned at %s for %d steps without growth", report.FormatScale(st.PinnedScale), st.LongestNoGrowth))
	}
	if u := f.underflowModules(); len(parts) == 0 && len(u) > 0 {
		parts = append(parts, "gradients losing mass to fp16 (module "+u[0].Module+")")
	}
	return strings.Join(parts, " and ")
}

func (f *Facts) cleanText() string {
	st := f.r.Scales
	if st == nil {
		return "the log has no scales to explain it"
	}
	return fmt.Sprintf("the loss scale is healthy (%.2f%% of the steps after the warm-up skipped, final scale %s)", 100*st.SkipRateAfterWarmup, report.FormatScale(st.FinalScale))
}
