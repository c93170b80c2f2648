package trainlog

import (
	"fmt"
	"sort"
	"strings"

	"fp16audit/report"
)

// maxUnderflowModules caps the modules the report lists as underflowing.
const maxUnderflowModules = 10

// telemetry reads the companion's per-module gradient telemetry: on the
// skipped steps after the warm-up and before the first NaN (the collapse
// window, when the scale collapsed), which module's gradient overflowed
// fp16 first; on the fully measured lines, which modules lose a share of
// their gradient to fp16 underflow. It then names those modules in the
// findings they explain.
func (a *analysis) telemetry() {
	l := a.run
	if l.TelemetryModules == 0 && len(l.Telemetry) == 0 {
		switch a.r.Verdict {
		case report.ScalesGradientOverflowNaN, report.ScalesPlateauUnderflow:
			a.notDerived("which module's gradients overflow or underflow: the log carries no per-module gradient telemetry; record the run with the Python companion (python/README.md), whose telemetry names them")
		}
		return
	}
	ts := &report.TelemetryStats{Modules: l.TelemetryModules, Overflow: []report.ModuleOverflow{}, Underflow: []report.ModuleUnderflow{}}
	for _, t := range l.Telemetry {
		ts.Lines++
		if t.Full {
			ts.FullLines++
		}
		if t.Skip {
			ts.SkippedLines++
		}
	}
	from, end := a.step(0), a.step(a.n-1)
	if a.r.Scales != nil {
		from = a.warmupEnd
	}
	if a.nanStep >= 0 {
		end = a.nanStep - 1
	}
	underFrom := from
	if st := a.r.Scales; a.collapse && st != nil && st.CollapseWindow > 0 {
		from = max(from, a.nanStep-st.CollapseWindow)
	}
	ts.OverflowFrom, ts.OverflowTo = from, end

	byName := map[string]*report.ModuleOverflow{}
	var order []string
	skipped := 0
	for _, t := range l.Telemetry {
		if !t.Skip || t.Step < from || t.Step > end {
			continue
		}
		skipped++
		m, via, g := overflowOrigin(t)
		if m == nil {
			continue
		}
		mo := byName[m.Name]
		if mo == nil {
			mo = &report.ModuleOverflow{Module: m.Name, Type: m.Type, FirstStep: t.Step}
			byName[m.Name] = mo
			order = append(order, m.Name)
		}
		mo.Steps++
		mo.LastStep = t.Step
		if via == "output" {
			mo.OutputSteps++
		}
		if isFinite(g.MaxAbs) {
			mo.MaxAbs = max(mo.MaxAbs, g.MaxAbs)
			if t.Scale > 0 {
				mo.MaxUnscaled = max(mo.MaxUnscaled, g.MaxAbs/t.Scale)
			}
		}
	}
	for _, name := range order {
		mo := byName[name]
		mo.OfSteps, mo.Via = skipped, "params"
		if 2*mo.OutputSteps >= mo.Steps {
			mo.Via = "output"
		}
		ts.Overflow = append(ts.Overflow, *mo)
	}
	sort.SliceStable(ts.Overflow, func(i, j int) bool { return ts.Overflow[i].Steps > ts.Overflow[j].Steps })
	if skipped > 0 && len(ts.Overflow) == 0 {
		a.note("the telemetry of the %d skipped steps in steps %d–%d names no module: the overflow arose outside the watched modules", skipped, from, end)
	}

	ts.Underflow = a.underflow(underFrom, end)
	if ts.FullLines == 0 {
		a.notDerived("which modules underflow: the telemetry has no fully measured lines (the companion writes them every `every` steps)")
	}
	a.r.Telemetry = ts
	a.nameModules(ts)
}

// overflowOrigin is the module where a skipped step's overflow began: the
// first module, in backward order, whose output gradient overflowed fp16
// here rather than arriving non-finite; else the companion's
// first_nonfinite_output; else the same for parameter gradients.
func overflowOrigin(t TelemetryLine) (*ModuleGrads, string, *GradSummary) {
	pick := func(which string, get func(*ModuleGrads) *GradSummary, named string) (*ModuleGrads, string, *GradSummary) {
		for i := range t.Modules {
			if g := get(&t.Modules[i]); g != nil && g.NonFinite > 0 && g.NonFiniteSrc == 0 {
				return &t.Modules[i], which, g
			}
		}
		for i := range t.Modules {
			if t.Modules[i].Name == named {
				if g := get(&t.Modules[i]); g != nil {
					return &t.Modules[i], which, g
				}
			}
		}
		return nil, "", nil
	}
	if m, via, g := pick("output", func(m *ModuleGrads) *GradSummary { return m.Output }, t.FirstNonFiniteOutput); m != nil {
		return m, via, g
	}
	return pick("params", func(m *ModuleGrads) *GradSummary { return m.Params }, t.FirstNonFiniteParams)
}

// underflow sums, per module and gradient, the elements that flush to zero
// in fp16 (or, where that cannot be measured because the gradient arrived
// in fp16 already, those in fp16's subnormal range) over the fully
// measured lines of steps from..end, and keeps those at or above the
// threshold.
func (a *analysis) underflow(from, end int) []report.ModuleUnderflow {
	type acc struct {
		report.ModuleUnderflow
		scales []float64
	}
	byKey := map[string]*acc{}
	var order []string
	for _, t := range a.run.Telemetry {
		if !t.Full || t.Step < from || t.Step > end {
			continue
		}
		for _, m := range t.Modules {
			for _, g := range []struct {
				which string
				s     *GradSummary
			}{{"output", m.Output}, {"params", m.Params}} {
				if g.s == nil || g.s.Nonzero == nil || *g.s.Nonzero == 0 {
					continue
				}
				measure, cnt := "underflow", g.s.Underflow
				if cnt == nil {
					measure, cnt = "subnormal", g.s.Subnormal
				}
				if cnt == nil {
					continue
				}
				key := m.Name + "\x00" + g.which
				u := byKey[key]
				if u == nil {
					u = &acc{ModuleUnderflow: report.ModuleUnderflow{Module: m.Name, Type: m.Type, Gradient: g.which, Measure: measure}}
					byKey[key] = u
					order = append(order, key)
				}
				if u.Measure != measure {
					continue
				}
				u.Count += *cnt
				u.Nonzero += *g.s.Nonzero
				u.Lines++
				if t.Scale > 0 {
					u.scales = append(u.scales, t.Scale)
				}
			}
		}
	}
	out := []report.ModuleUnderflow{}
	for _, key := range order {
		u := byKey[key]
		u.Fraction = float64(u.Count) / float64(u.Nonzero)
		if u.Fraction < a.opt.UnderflowFraction || u.Fraction == 0 {
			continue
		}
		if n := len(u.scales); n > 0 {
			sort.Float64s(u.scales)
			u.MedianScale = u.scales[n/2]
		}
		out = append(out, u.ModuleUnderflow)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Fraction > out[j].Fraction })
	if len(out) > maxUnderflowModules {
		out = out[:maxUnderflowModules]
	}
	return out
}

// nameModules puts the telemetry's modules into the findings they explain:
// the module where the overflows began into FP5002 (NaN after a collapse)
// and FP5009 (many skipped steps), the underflowing modules into FP5005
// (plateau) and FP5010 (scale pinned low).
func (a *analysis) nameModules(ts *report.TelemetryStats) {
	r := a.r
	var over *report.ModuleOverflow
	if len(ts.Overflow) > 0 {
		over = &ts.Overflow[0]
	}
	overText := func() string {
		o := over
		which := "gradients"
		switch o.OutputSteps {
		case o.Steps:
			which = gradientWord("output")
		case 0:
			which = gradientWord("params")
		}
		s := fmt.Sprintf("The telemetry names module %s%s: its %s overflowed fp16 first on %d of the %d skipped steps with telemetry in steps %d–%d",
			o.Module, typeText(o.Type), which, o.Steps, o.OfSteps, ts.OverflowFrom, ts.OverflowTo)
		if which == "gradients" {
			s += fmt.Sprintf(" (the output gradient on %d, the parameter gradient alone on %d)", o.OutputSteps, o.Steps-o.OutputSteps)
		}
		if o.MaxAbs > 0 {
			s += fmt.Sprintf("; largest finite scaled gradient %.3g (%.3g unscaled)", o.MaxAbs, o.MaxUnscaled)
		}
		return s
	}
	underText := func() string {
		var parts []string
		for i, u := range ts.Underflow {
			if i == 3 {
				parts = append(parts, fmt.Sprintf("and %d more", len(ts.Underflow)-3))
				break
			}
			what := "flush to zero"
			if u.Measure == "subnormal" {
				what = "are fp16 subnormals"
			}
			parts = append(parts, fmt.Sprintf("%s%s (%.0f%% of its %s's nonzero elements %s at a median scale %s)",
				u.Module, typeText(u.Type), 100*u.Fraction, gradientWord(u.Gradient), what, report.FormatScale(u.MedianScale)))
		}
		return "The telemetry shows the modules losing gradient to fp16 underflow: " + strings.Join(parts, ", ")
	}
	for i := range r.Findings {
		f := &r.Findings[i]
		switch f.Check {
		case checkGradOverflowNaN.ID:
			if over == nil {
				continue
			}
			f.Module = over.Module
			f.Message += ". " + overText() + ": lower the learning rate for that module (its own parameter group), clip its gradients, keep it in fp32 (torch.autocast(enabled=False) around it) or train with to_bf16()"
		case checkSkipRate.ID:
			if over == nil {
				continue
			}
			f.Module = over.Module
			f.Message += ". " + overText()
		case checkPlateauUnderflow.ID, checkPinnedLow.ID:
			if len(ts.Underflow) > 0 {
				f.Module = ts.Underflow[0].Module
				f.Message += ". " + underText()
			}
			if over != nil && f.Check == checkPlateauUnderflow.ID {
				f.Message += ". " + overText() + ", keeping the scale low"
			}
		}
	}
	if over != nil && r.Verdict == report.ScalesGradientOverflowNaN {
		r.VerdictText += fmt.Sprintf("; the overflows begin in module %s", over.Module)
		r.Fix = fmt.Sprintf("module %s's gradients overflow first: lower its learning rate, clip gradients, keep it in fp32 (torch.autocast(enabled=False) around it), or train with learn.to_bf16() (Ampere or newer) or in fp32", over.Module)
	}
	if len(ts.Underflow) > 0 && r.Verdict == report.ScalesPlateauUnderflow {
		r.VerdictText += fmt.Sprintf("; module %s loses %.0f%% of its %s to underflow", ts.Underflow[0].Module, 100*ts.Underflow[0].Fraction, gradientWord(ts.Underflow[0].Gradient))
	}
}

// gradientWord names a telemetry gradient ("output", "params") in prose.
func gradientWord(which string) string {
	if which == "params" {
		return "parameter gradient"
	}
	return "output gradient"
}

func typeText(t string) string {
	if t == "" {
		return ""
	}
	return " (" + t + ")"
}
