package scales

import (
	"fmt"

	"fp16audit/internal/render/markup"
	"fp16audit/report"
)

// telemetryText writes what the scales report holds beyond one loss
// and one scale per step: how the log was read when it is not one entry
// per optimizer step (sampled, per epoch), with the bounds on the skipped
// steps, and the per-module gradient telemetry of the Python companion's
// log: where the overflows began, which modules underflow. It writes
// nothing for a log of every step without telemetry.
func telemetryText(p *markup.Writer, r *report.ScalesReport) {
	ri := r.Run
	switch {
	case ri.PerEpoch:
		p.Printf("\nlog: %s, one entry per epoch (step numbers are epochs)\n", ri.Format)
	case ri.Samples > 0:
		p.Printf("\nlog: %s, %d samples, every %d steps", ri.Format, ri.Samples, ri.SampleEvery)
		if s := r.Scales; s != nil && s.SkippedLowerBound {
			p.Printf("; the scales prove at least %d skipped steps", s.Skipped)
			if s.SkippedMax != nil {
				p.Printf(" and allow at most %d", *s.SkippedMax)
			}
		}
		p.Printf("\n")
	}
	t := r.Telemetry
	if t == nil {
		return
	}
	p.Printf("\ngradient telemetry: %d lines (%d measured in full, %d of skipped steps), %d modules watched\n",
		t.Lines, t.FullLines, t.SkippedLines, t.Modules)
	if len(t.Overflow) == 0 && t.OverflowLines > 0 {
		p.Printf("  overflow begins in   no module, in the skipped steps %d–%d\n", t.OverflowFrom, t.OverflowTo)
	}
	for i, o := range t.Overflow {
		head := "  overflow begins in   "
		if i > 0 {
			head = "                       "
		}
		which := fmt.Sprintf("output gradient on %d, parameter gradient alone on %d", o.OutputSteps, o.Steps-o.OutputSteps)
		switch o.OutputSteps {
		case o.Steps:
			which = "output gradient"
		case 0:
			which = "parameter gradient"
		}
		p.Printf("%s%s (%s), %s: %d of %d skipped steps in %d–%d", head, o.Module, o.Type, which, o.Steps, o.OfSteps, t.OverflowFrom, t.OverflowTo)
		if o.MaxAbs > 0 {
			p.Printf(", largest scaled %.3g (%.3g unscaled)", o.MaxAbs, o.MaxUnscaled)
		}
		p.Printf("\n")
	}
	for i, u := range t.Underflow {
		head := "  underflow            "
		if i > 0 {
			head = "                       "
		}
		which := "output gradient"
		if u.Gradient == "params" {
			which = "parameter gradient"
		}
		var what string
		switch {
		case u.Measure == "lost_mass" && u.LostMass != nil:
			what = fmt.Sprintf("%.1f%% of its mass (L2 norm) lost to fp16; %.1f%% of its nonzero elements flush to zero", 100**u.LostMass, 100*u.Fraction)
		case u.Measure == "subnormal":
			what = fmt.Sprintf("%.1f%% of its nonzero elements are fp16 subnormals", 100*u.Fraction)
		default:
			what = fmt.Sprintf("%.1f%% of its nonzero elements flush to zero", 100*u.Fraction)
		}
		p.Printf("%s%s (%s), %s: %s (median scale %s, %d lines)\n",
			head, u.Module, u.Type, which, what, report.FormatScale(u.MedianScale), u.Lines)
	}
}
