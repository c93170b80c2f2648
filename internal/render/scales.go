package render

import (
	"fmt"
	"fp16audit/report"
	"io"
	"math"
	"strings"
)

// sparkWidth is the most columns a sparkline takes.
const sparkWidth = 60

var sparkGlyphs = []rune("▁▂▃▄▅▆▇█")

// scalesText writes the human-readable training-log diagnosis: the verdict and fix
// first, then sparklines of log2(scale) and the loss, the reconstruction,
// the comparison with the baseline, the findings, what could not be derived
// and the notes.
func scalesText(w io.Writer, r *report.ScalesReport) error {
	p := &errWriter{w: w}
	p.printf("fp16audit scales — %s\n", r.Run.Path)
	p.printf("run: %s\n", describeRun(r.Run))
	if g := r.GradScaler; g != nil {
		p.printf("grad scaler: init_scale %s [%s], growth ×%g every %d clean steps [%s], backoff ×%g\n",
			report.FormatScale(g.InitScale), g.InitScaleFrom, g.GrowthFactor, g.GrowthInterval, g.GrowthIntervalFrom, g.BackoffFactor)
	}
	if b := r.Baseline; b != nil {
		p.printf("baseline: %s (%s)\n", b.Path, describeRun(*b))
	}
	p.printf("\nverdict: %s — %s\n", r.Verdict, r.VerdictText)
	if r.Fix != "" {
		p.printf("fix: %s\n", r.Fix)
	}

	if len(r.Series) > 0 {
		cols := mergeBuckets(r.Series)
		p.printf("\nhistory, steps %d–%d (%d per column):\n", r.Series[0].From, r.Series[len(r.Series)-1].To,
			cols[0].To-cols[0].From+1)
		if r.Run.HasScales {
			line, lo, hi := sparkline(cols, func(b report.Bucket) (float64, bool) {
				if b.Log2ScaleMin == nil {
					return 0, false
				}
				return *b.Log2ScaleMin, true
			})
			p.printf("  log2(scale) %s  %+.0f … %+.0f (lowest per column)\n", line, hi, lo)
			var marks strings.Builder
			for _, b := range cols {
				switch {
				case b.Skipped == 0:
					marks.WriteRune(' ')
				case b.Skipped < 10:
					marks.WriteRune(rune('0' + b.Skipped))
				default:
					marks.WriteRune('+')
				}
			}
			p.printf("  skipped     %s  (steps per column; + is 10 or more)\n", marks.String())
		}
		if r.Run.HasLosses {
			line, lo, hi := sparkline(cols, func(b report.Bucket) (float64, bool) {
				if b.NonFinite > 0 || b.Loss == nil {
					return 0, false
				}
				return *b.Loss, true
			})
			line = markNonFinite(line, cols)
			p.printf("  loss        %s  %.4g … %.4g (! holds NaN/Inf)\n", line, hi, lo)
		}
	}

	if s := r.Scales; s != nil {
		p.printf("\nscale history:\n")
		p.printf("  skipped steps        %d of %d (%.2f%%); %.2f%% after the warm-up and before any NaN\n",
			s.Skipped, r.Run.Steps, 100*s.SkipRate, 100*s.SkipRateAfterWarmup)
		if s.WarmupSkipped > 0 {
			p.printf("  warm-up              first %d steps skipped, down to %s\n", s.WarmupSkipped, report.FormatScale(s.WarmupScale))
		}
		if s.LongestBackoffRun > 0 {
			p.printf("  longest backoff run  %d steps from step %d\n", s.LongestBackoffRun, s.LongestBackoffRunStart)
		}
		p.printf("  scale                min %s at step %d, max %s, final %s\n", report.FormatScale(s.MinScale), s.MinScaleStep, report.FormatScale(s.MaxScale), report.FormatScale(s.FinalScale))
		pinned := ""
		if s.Pinned {
			pinned = fmt.Sprintf(": pinned at %s", report.FormatScale(s.PinnedScale))
		}
		p.printf("  growths              %d; longest stretch without growth %d steps from step %d, %d backoffs%s\n",
			s.Growths, s.LongestNoGrowth, s.LongestNoGrowthStart, s.LongestNoGrowthBackoffs, pinned)
		if s.ScaleAtFirstNaN != nil {
			p.printf("  scale at first NaN   %s", report.FormatScale(*s.ScaleAtFirstNaN))
			if s.CollapseBits != nil {
				p.printf(", %.1f bits below its peak in the %d steps before (%d skipped)", *s.CollapseBits, s.CollapseWindow, s.BackoffsBeforeNaN)
			}
			p.printf("\n")
		}
	}
	if len(r.Epochs) > 0 {
		var parts []string
		for _, e := range r.Epochs {
			parts = append(parts, fmt.Sprintf("%d: %d/%d (%.1f%%)", e.Epoch, e.Skipped, e.Steps, 100*e.SkipRate))
		}
		for i := 0; i < len(parts); i += 6 {
			head := "  per epoch skipped    "
			if i > 0 {
				head = "                       "
			}
			p.printf("%s%s\n", head, strings.Join(parts[i:min(i+6, len(parts))], "  "))
		}
	}
	if l := r.Losses; l != nil {
		p.printf("\nloss: ")
		if l.FirstLoss != nil && l.FinalLoss != nil {
			p.printf("first %.4g, final %.4g (means of %d steps)", *l.FirstLoss, *l.FinalLoss, l.FinalWindow)
		}
		if l.FirstNonFiniteStep != nil {
			p.printf("; %d NaN/Inf, the first (%s) at step %d", l.NonFinite, l.FirstNonFiniteValue, *l.FirstNonFiniteStep)
		} else {
			p.printf("; no NaN/Inf")
		}
		p.printf("\n")
	}
	if c := r.Comparison; c != nil {
		p.printf("vs fp32 baseline: %.4g against %.4g over the last %d of %d steps: %+.1f%% (tolerance %.1f%%)\n",
			c.RunLoss, c.BaselineLoss, c.Window, c.Steps, 100*c.Gap, 100*c.Tolerance)
	}

	p.printf("\n")
	if len(r.Findings) == 0 {
		p.printf("findings: none\n")
	} else {
		p.printf("findings:\n")
		for _, f := range r.Findings {
			p.printf("  %-7s %s  %s\n", f.Severity, f.Check, f.Message)
		}
	}
	if len(r.NotDerived) > 0 {
		p.printf("not derived:\n")
		for _, s := range r.NotDerived {
			p.printf("  - %s\n", s)
		}
	}
	if len(r.Notes) > 0 {
		p.printf("notes:\n")
		for _, s := range r.Notes {
			p.printf("  - %s\n", s)
		}
	}
	return p.err
}

func describeRun(ri report.RunInfo) string {
	var parts []string
	parts = append(parts, fmt.Sprintf("%d steps (%d–%d)", ri.Steps, ri.FirstStep, ri.FirstStep+ri.Steps-1))
	switch {
	case ri.StepsPerEpoch > 0:
		parts = append(parts, fmt.Sprintf("%d epochs of %d steps", ri.Epochs, ri.StepsPerEpoch))
	case ri.Epochs == 1:
		parts = append(parts, "1 epoch")
	case ri.Epochs > 0:
		parts = append(parts, fmt.Sprintf("%d epochs", ri.Epochs))
	}
	switch {
	case ri.HasLosses && ri.HasScales:
		parts = append(parts, "losses and scales")
	case ri.HasLosses:
		parts = append(parts, "losses only")
	default:
		parts = append(parts, "scales only")
	}
	return strings.Join(parts, ", ")
}

// mergeBuckets folds the series into at most sparkWidth columns.
func mergeBuckets(bs []report.Bucket) []report.Bucket {
	g := (len(bs) + sparkWidth - 1) / sparkWidth
	var out []report.Bucket
	for i := 0; i < len(bs); i += g {
		grp := bs[i:min(i+g, len(bs))]
		m := report.Bucket{From: grp[0].From, To: grp[len(grp)-1].To}
		sum, n := 0.0, 0
		for _, b := range grp {
			m.NonFinite += b.NonFinite
			m.Skipped += b.Skipped
			if b.Loss != nil {
				sum += *b.Loss
				n++
			}
			if b.Log2ScaleMin != nil && (m.Log2ScaleMin == nil || *b.Log2ScaleMin < *m.Log2ScaleMin) {
				v := *b.Log2ScaleMin
				m.Log2ScaleMin = &v
			}
		}
		if n > 0 {
			v := sum / float64(n)
			m.Loss = &v
		}
		out = append(out, m)
	}
	return out
}

// sparkline draws one glyph per bucket, scaled between the lowest and
// highest value; buckets without a value are blank.
func sparkline(bs []report.Bucket, val func(report.Bucket) (float64, bool)) (line string, lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, b := range bs {
		if v, ok := val(b); ok {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	var sb strings.Builder
	for _, b := range bs {
		v, ok := val(b)
		if !ok {
			sb.WriteRune(' ')
			continue
		}
		k := len(sparkGlyphs) - 1
		if hi > lo {
			k = int((v - lo) / (hi - lo) * float64(len(sparkGlyphs)-1))
		}
		sb.WriteRune(sparkGlyphs[k])
	}
	if math.IsInf(lo, 0) {
		lo, hi = 0, 0
	}
	return sb.String(), lo, hi
}

func markNonFinite(line string, bs []report.Bucket) string {
	rs := []rune(line)
	for i, b := range bs {
		if b.NonFinite > 0 {
			rs[i] = '!'
		}
	}
	return string(rs)
}
