package trainlog

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"fp16audit/checks"
	"fp16audit/report"
)

// maxUnderflowModules caps the modules the report lists as underflowing.
const maxUnderflowModules = 10

// telemetry reads the companion's per-module gradient telemetry: on the
// skipped steps after the warm-up and before the failing NaN (the
// collapse window, when the scale collapsed) whose loss was finite, which
// module's gradient overflowed fp16 first (a non-finite loss makes every
// gradient non-finite: its step says nothing of where gradients
// overflow); on the fully measured lines, which modules lose their
// gradient to fp16 underflow. The analyzers name those modules in the
// findings they explain.
func (f *Facts) telemetry() {
	l := f.run
	if l.TelemetryModules == 0 && len(l.Telemetry) == 0 {
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
	from, end := f.step(0), f.step(f.n-1)
	if f.r.Scales != nil {
		from = f.warmupEnd
	}
	if f.nanStep >= 0 {
		end = f.nanStep - 1
	}
	underFrom := from
	if st := f.r.Scales; f.collapse && st != nil && st.CollapseWindow > 0 {
		from = max(from, f.nanStep-st.CollapseWindow)
	}
	ts.OverflowFrom, ts.OverflowTo = from, end

	nonfiniteLoss := map[int]bool{}
	for _, i := range f.recovered {
		nonfiniteLoss[f.step(i)] = true
	}
	byName := map[string]*report.ModuleOverflow{}
	var order []string
	skipped := 0
	for _, t := range l.Telemetry {
		if !t.Skip || t.Step < from || t.Step > end || nonfiniteLoss[t.Step] {
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
	ts.OverflowLines = skipped
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
		f.note("the telemetry of the %d skipped steps in steps %d–%d names no module: the overflow arose outside the watched modules", skipped, from, end)
	}

	ts.Underflow = f.underflow(underFrom, end)
	if ts.FullLines == 0 {
		f.notDerived("which modules underflow: the telemetry has no fully measured lines (the companion writes them every `every` steps)")
	}
	f.r.Telemetry = ts
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

// Underflow measures, in the order a module's gradient is judged by the
// first its lines hold.
const (
	// MeasureLostMass is the share of the gradient's L2 norm fp16 loses,
	// lost(S) = ‖fp16(g·S)/S − g‖ / ‖g‖ at the scale S the step used:
	// flushing and subnormal rounding together (the companion's
	// lost_mass, the training audit's lost_mass).
	MeasureLostMass = "lost_mass"
	// MeasureUnderflow is the share of the nonzero elements fp16 flushes
	// to zero: logs written before the companion recorded lost_mass.
	MeasureUnderflow = "underflow"
	// MeasureSubnormal is the share of the nonzero elements in fp16's
	// subnormal range, for a gradient that arrived in fp16 already, where
	// neither loss can be seen.
	MeasureSubnormal = "subnormal"
)

// underflow pools, per module and gradient, the fully measured lines of
// steps from..end by the best measure they hold: the mass lost (the sums
// of squares of the gradient and of what fp16 loses of it, each divided
// by the square of the line's scale, so that every step counts by its
// unscaled gradient), else the elements flushed to zero, else the
// elements in fp16's subnormal range. It keeps the gradients at or above
// their measure's threshold, those judged by mass first.
func (f *Facts) underflow(from, end int) []report.ModuleUnderflow {
	type acc struct {
		report.ModuleUnderflow
		// per measure: lines, and the pooled numerator and denominator
		lines          [3]int
		num, den       [3]float64
		count, nonzero [3]int
		scales         [3][]float64
	}
	measures := [3]string{MeasureLostMass, MeasureUnderflow, MeasureSubnormal}
	byKey := map[string]*acc{}
	var order []string
	for _, t := range f.run.Telemetry {
		if !t.Full || t.Step < from || t.Step > end {
			continue
		}
		s2 := 1.0
		if t.Scale > 0 && isFinite(t.Scale) {
			s2 = t.Scale * t.Scale
		}
		for _, m := range t.Modules {
			for _, g := range []struct {
				which string
				s     *GradSummary
			}{{"output", m.Output}, {"params", m.Params}} {
				if g.s == nil || g.s.Nonzero == nil || *g.s.Nonzero == 0 {
					continue
				}
				key := m.Name + "\x00" + g.which
				u := byKey[key]
				if u == nil {
					u = &acc{ModuleUnderflow: report.ModuleUnderflow{Module: m.Name, Type: m.Type, Gradient: g.which}}
					byKey[key] = u
					order = append(order, key)
				}
				add := func(k int, num, den float64, count int) {
					u.lines[k]++
					u.num[k] += num
					u.den[k] += den
					u.count[k] += count
					u.nonzero[k] += *g.s.Nonzero
					if t.Scale > 0 {
						u.scales[k] = append(u.scales[k], t.Scale)
					}
				}
				if g.s.SumSq != nil && g.s.LostSumSq != nil && *g.s.SumSq > 0 {
					cnt := 0
					if g.s.Underflow != nil {
						cnt = *g.s.Underflow
					}
					add(0, *g.s.LostSumSq/s2, *g.s.SumSq/s2, cnt)
				}
				if g.s.Underflow != nil {
					add(1, 0, 0, *g.s.Underflow)
				} else if g.s.Subnormal != nil {
					add(2, 0, 0, *g.s.Subnormal)
				}
			}
		}
	}
	out := []report.ModuleUnderflow{}
	for _, key := range order {
		u := byKey[key]
		k := 0
		for k < len(measures) && u.lines[k] == 0 {
			k++
		}
		if k == len(measures) {
			continue
		}
		mu := u.ModuleUnderflow
		mu.Measure, mu.Lines, mu.Count, mu.Nonzero = measures[k], u.lines[k], u.count[k], u.nonzero[k]
		mu.Fraction = float64(mu.Count) / float64(mu.Nonzero)
		if k == 0 {
			lost := math.Sqrt(u.num[0] / u.den[0])
			mu.LostMass = &lost
			if lost < f.opt.LostMassTolerance || lost == 0 {
				continue
			}
		} else if mu.Fraction < f.opt.UnderflowFraction || mu.Fraction == 0 {
			continue
		}
		if sc := u.scales[k]; len(sc) > 0 {
			sort.Float64s(sc)
			mu.MedianScale = sc[len(sc)/2]
		}
		out = append(out, mu)
	}
	sort.SliceStable(out, func(i, j int) bool {
		mi, mj := out[i].LostMass != nil, out[j].LostMass != nil
		switch {
		case mi && mj:
			return *out[i].LostMass > *out[j].LostMass
		case mi != mj:
			return mi
		}
		return out[i].Fraction > out[j].Fraction
	})
	if len(out) > maxUnderflowModules {
		out = out[:maxUnderflowModules]
	}
	return out
}

// overflowModule is the module where most overflows began, nil without
// telemetry or when it names none.
func (f *Facts) overflowModule() *report.ModuleOverflow {
	if ts := f.r.Telemetry; ts != nil && len(ts.Overflow) > 0 {
		return &ts.Overflow[0]
	}
	return nil
}

// underflowModules are the gradients the telemetry shows losing to
// underflow, nil without telemetry.
func (f *Facts) underflowModules() []report.ModuleUnderflow {
	if ts := f.r.Telemetry; ts != nil {
		return ts.Underflow
	}
	return nil
}

// massLost reports whether the telemetry shows a gradient losing mass to
// fp16 beyond the tolerance.
func (f *Facts) massLost() bool {
	return slices.ContainsFunc(f.underflowModules(), func(u report.ModuleUnderflow) bool { return u.Measure == MeasureLostMass })
}

// overflowText says where the overflows began.
func (f *Facts) overflowText() string {
	ts, o := f.r.Telemetry, f.overflowModule()
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

// nameUnderflow names the underflowing gradients in fd, with the measure
// each was judged by.
func (f *Facts) nameUnderflow(fd *checks.Finding) {
	us := f.underflowModules()
	if len(us) == 0 {
		return
	}
	var parts []string
	for i, u := range us {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(us)-3))
			break
		}
		var what string
		switch u.Measure {
		case MeasureLostMass:
			what = fmt.Sprintf("%.1f%% of its %s's mass (L2 norm) lost to fp16", 100**u.LostMass, gradientWord(u.Gradient))
		case MeasureSubnormal:
			what = fmt.Sprintf("%.0f%% of its %s's nonzero elements are fp16 subnormals", 100*u.Fraction, gradientWord(u.Gradient))
		default:
			what = fmt.Sprintf("%.0f%% of its %s's nonzero elements flush to zero", 100*u.Fraction, gradientWord(u.Gradient))
		}
		parts = append(parts, fmt.Sprintf("%s%s (%s at a median scale %s)", u.Module, typeText(u.Type), what, report.FormatScale(u.MedianScale)))
	}
	fd.Module = us[0].Module
	fd.Message += ". The telemetry shows the modules losing gradient to fp16 underflow: " + strings.Join(parts, ", ")
}

// lossText says what one gradient loses, for the verdict.
func lossText(u report.ModuleUnderflow) string {
	if u.Measure == MeasureLostMass {
		return fmt.Sprintf("loses %.1f%% of its %s's mass to fp16", 100**u.LostMass, gradientWord(u.Gradient))
	}
	return fmt.Sprintf("loses %.0f%% of its %s to underflow", 100*u.Fraction, gradientWord(u.Gradient))
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
