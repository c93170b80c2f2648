// Package scales renders the diagnosis of a training log
// (report.ScalesReport, `fp16audit scales`) as text with sparklines,
// GitHub-flavoured Markdown and a self-contained HTML page with the scale
// and loss charts. It imports only report, checks and markup.
package scales

import (
	"fmt"
	"io"
	"math"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/render/markup"
	"fp16audit/report"
)

// selected reports whether --checks switched some checks off: the report
// then says which ran.
func selected(r *report.ScalesReport) bool { return r.Checks != "" && r.Checks != "all" }

// sparkWidth is the most columns a sparkline takes.
const sparkWidth = 60

var sparkGlyphs = []rune("▁▂▃▄▅▆▇█")

// Text writes the human-readable training-log diagnosis: the verdict and fix
// first, then sparklines of log2(scale) and the loss, the reconstruction,
// the comparison with the baseline, the findings, what could not be derived
// and the notes; with color, in ANSI colours.
func Text(w io.Writer, r *report.ScalesReport, color bool) error {
	p := markup.NewWriter(w, color)
	p.Printf("%s\n", p.Style(markup.Bold, "fp16audit scales — "+r.Run.Path))
	p.Printf("run: %s\n", describeRun(r.Run))
	if g := r.GradScaler; g != nil {
		p.Printf("grad scaler: %s\n", scalerText(g))
	}
	if b := r.Baseline; b != nil {
		p.Printf("baseline: %s (%s)\n", b.Path, describeRun(*b))
	}
	if selected(r) {
		p.Printf("checks: %s\n", r.Checks)
	}
	p.Printf("\n%s — %s\n", p.Style(markup.Bold+scalesVerdictStyle(r), "verdict: "+r.Verdict), r.VerdictText)
	if r.Fix != "" {
		p.Printf("%s %s\n", p.Style(markup.Bold, "fix:"), r.Fix)
	}
	for i, line := range captureLines(r) {
		head := "captures:"
		if i > 0 {
			head = "         "
		}
		p.Printf("%s %s\n", p.Style(markup.Bold, head), line)
	}

	if lines := historyLines(r, p.Style(markup.Red, "!")); len(lines) > 0 {
		p.Printf("\n%s\n", strings.Join(lines, "\n"))
	}

	if rows := scaleRows(r); len(rows) > 0 {
		p.Printf("\nscale history:\n")
		for _, row := range rows {
			p.Printf("  %-20s %s\n", row[0], row[1])
		}
	}
	if parts := epochParts(r); len(parts) > 0 {
		for i := 0; i < len(parts); i += 6 {
			head := "  per epoch skipped    "
			if i > 0 {
				head = "                       "
			}
			p.Printf("%s%s\n", head, strings.Join(parts[i:min(i+6, len(parts))], "  "))
		}
	}
	if l := r.Losses; l != nil {
		p.Printf("\nloss: %s\n", lossSummary(r.Run, l))
	}
	if c := r.Comparison; c != nil {
		p.Printf("vs fp32 baseline: %s\n", comparisonText(c))
	}
	telemetryText(p, r)

	p.Printf("\n")
	if len(r.Findings) == 0 {
		p.Printf("findings: none\n")
	} else {
		p.Printf("findings:\n")
		for _, f := range r.Findings {
			p.Printf("  %s %s  %s\n", p.Style(markup.SeverityStyle(f.Severity), fmt.Sprintf("%-7s", f.Severity)), f.Check, f.Message)
		}
	}
	if len(r.NotDerived) > 0 {
		p.Printf("not derived:\n")
		for _, s := range r.NotDerived {
			p.Printf("  - %s\n", s)
		}
	}
	if len(r.Notes) > 0 {
		p.Printf("notes:\n")
		for _, s := range r.Notes {
			p.Printf("  - %s\n", s)
		}
	}
	return p.Err()
}

// captureLines are the captures the log points to, one a line: the step,
// the trigger and the command that replays it, or why it failed to write.
func captureLines(r *report.ScalesReport) []string {
	var lines []string
	for _, c := range r.Captures {
		s := fmt.Sprintf("step %d (%s): ", c.Step, c.Trigger)
		if c.Replay != "" {
			s += c.Replay
		} else {
			s += "failed to write: " + c.Error
		}
		if c.Decides {
			s += " — holds the failure"
		}
		lines = append(lines, s)
	}
	return lines
}

// scaleRows are the facts of the scale reconstruction, as label and value.
func scaleRows(r *report.ScalesReport) [][2]string {
	s := r.Scales
	if s == nil {
		return nil
	}
	judged := "after the warm-up"
	if l := r.Losses; l != nil && l.FailingStep != nil {
		judged = fmt.Sprintf("after the warm-up and before the failing step %d", *l.FailingStep)
	}
	rows := [][2]string{{"skipped steps", fmt.Sprintf("%d of %d (%.2f%%); %.2f%% %s",
		s.Skipped, r.Run.Steps, 100*s.SkipRate, 100*s.SkipRateAfterWarmup, judged)}}
	if s.WarmupSkipped > 0 {
		rows = append(rows, [2]string{"warm-up", fmt.Sprintf("first %d steps skipped, down to %s", s.WarmupSkipped, report.FormatScale(s.WarmupScale))})
	}
	if s.LongestBackoffRun > 0 {
		rows = append(rows, [2]string{"longest backoff run", fmt.Sprintf("%d steps from step %d", s.LongestBackoffRun, s.LongestBackoffRunStart)})
	}
	rows = append(rows, [2]string{"scale", fmt.Sprintf("min %s at step %d, max %s, final %s",
		report.FormatScale(s.MinScale), s.MinScaleStep, report.FormatScale(s.MaxScale), report.FormatScale(s.FinalScale))})
	pinned := ""
	switch {
	case s.PinnedSince != nil:
		pinned = fmt.Sprintf("; held down at %s from step %d", report.FormatScale(s.PinnedScale), *s.PinnedSince)
	case s.Pinned:
		pinned = fmt.Sprintf(": pinned at %s", report.FormatScale(s.PinnedScale))
	}
	rows = append(rows, [2]string{"growths", fmt.Sprintf("%d; longest stretch without growth %d steps from step %d, %d backoffs%s",
		s.Growths, s.LongestNoGrowth, s.LongestNoGrowthStart, s.LongestNoGrowthBackoffs, pinned)})
	if s.ScaleAtFirstNaN != nil {
		v := report.FormatScale(*s.ScaleAtFirstNaN)
		if s.CollapseBits != nil {
			v += fmt.Sprintf(", %.1f bits below its peak in the %d steps before (%d skipped", *s.CollapseBits, s.CollapseWindow, s.BackoffsBeforeNaN)
			if s.BackoffsBeforeNaN > 0 {
				v += fmt.Sprintf(", %d of them with a finite loss", s.GradientBackoffsBeforeNaN)
			}
			v += ")"
		}
		rows = append(rows, [2]string{"scale at failing NaN", v})
	}
	return rows
}

// epochParts are the skipped steps per epoch: "0: 16/50 (32.0%)".
func epochParts(r *report.ScalesReport) []string {
	var parts []string
	for _, e := range r.Epochs {
		parts = append(parts, fmt.Sprintf("%d: %d/%d (%.1f%%)", e.Epoch, e.Skipped, e.Steps, 100*e.SkipRate))
	}
	return parts
}

func comparisonText(c *report.Comparison) string {
	return fmt.Sprintf("%.4g against %.4g over the last %d of %d steps: %+.1f%% (tolerance %.1f%%)",
		c.RunLoss, c.BaselineLoss, c.Window, c.Steps, 100*c.Gap, 100*c.Tolerance)
}

// scalerText describes the GradScaler configuration and where each value
// came from.
func scalerText(g *report.ScalerInfo) string {
	return fmt.Sprintf("init_scale %s [%s], growth ×%g every %d clean steps [%s], backoff ×%g",
		report.FormatScale(g.InitScale), g.InitScaleFrom, g.GrowthFactor, g.GrowthInterval, g.GrowthIntervalFrom, g.BackoffFactor)
}

// historyLines draws the history as sparklines, one column per group of
// buckets: log2(scale) with the skipped steps under it, the loss (mark
// stands in columns that hold NaN/Inf) and the baseline's loss.
func historyLines(r *report.ScalesReport, mark string) []string {
	if len(r.Series) == 0 {
		return nil
	}
	var lines []string
	cols := mergeBuckets(r.Series)
	lines = append(lines, fmt.Sprintf("history, steps %d–%d (%d per column):", r.Series[0].From, r.Series[len(r.Series)-1].To,
		cols[0].To-cols[0].From+1))
	if r.Run.HasScales {
		scale := func(b report.Bucket) (float64, bool) {
			if b.Log2ScaleMin == nil {
				return 0, false
			}
			return *b.Log2ScaleMin, true
		}
		lo, hi := valueRange(cols, scale)
		line := sparkline(cols, scale, lo, hi)
		lines = append(lines, fmt.Sprintf("  log2(scale) %s  %+.0f … %+.0f (lowest per column)", line, hi, lo))
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
		lines = append(lines, fmt.Sprintf("  skipped     %s  (steps per column; + is 10 or more)", marks.String()))
	}
	if r.Run.HasLosses {
		// The run and the baseline share one scale, so that the gap
		// between them shows.
		runLoss := func(b report.Bucket) (float64, bool) {
			if b.NonFinite > 0 || b.Loss == nil {
				return 0, false
			}
			return *b.Loss, true
		}
		baseLoss := func(b report.Bucket) (float64, bool) {
			if b.BaselineLoss == nil {
				return 0, false
			}
			return *b.BaselineLoss, true
		}
		lo, hi := valueRange(cols, runLoss)
		if hasBaseline(cols) {
			blo, bhi := valueRange(cols, baseLoss)
			lo, hi = min(lo, blo), max(hi, bhi)
		}
		line := markNonFinite(sparkline(cols, runLoss, lo, hi), cols, mark)
		switch {
		case math.IsInf(lo, 0):
			lines = append(lines, fmt.Sprintf("  loss        %s  (! holds NaN/Inf: every column does)", line))
		case hasBaseline(cols):
			lines = append(lines, fmt.Sprintf("  loss        %s  %.4g … %.4g, both lines on this scale (! holds NaN/Inf)", line, hi, lo))
			lines = append(lines, fmt.Sprintf("  fp32 loss   %s  (the baseline)", sparkline(cols, baseLoss, lo, hi)))
		default:
			lines = append(lines, fmt.Sprintf("  loss        %s  %.4g … %.4g (! holds NaN/Inf)", line, hi, lo))
		}
	}
	return lines
}

func describeRun(ri report.RunInfo) string {
	var parts []string
	parts = append(parts, fmt.Sprintf("%d steps (%d–%d)", ri.Steps, ri.FirstStep, ri.FirstStep+ri.Steps-1))
	switch {
	case ri.StepsPerEpoch > 0 && ri.Epochs == 1:
		parts = append(parts, fmt.Sprintf("1 epoch of %d steps", ri.StepsPerEpoch))
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

// mergeBuckets folds the series into at most sparkWidth columns: the
// means of the buckets' means, which is a choice of drawing, not a
// statistic of the log.
func mergeBuckets(bs []report.Bucket) []report.Bucket {
	g := (len(bs) + sparkWidth - 1) / sparkWidth
	var out []report.Bucket
	for i := 0; i < len(bs); i += g {
		grp := bs[i:min(i+g, len(bs))]
		m := report.Bucket{From: grp[0].From, To: grp[len(grp)-1].To}
		sum, n, bsum, bn := 0.0, 0, 0.0, 0
		for _, b := range grp {
			m.NonFinite += b.NonFinite
			m.Skipped += b.Skipped
			if b.Loss != nil {
				sum += *b.Loss
				n++
			}
			if b.BaselineLoss != nil {
				bsum += *b.BaselineLoss
				bn++
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
		if bn > 0 {
			v := bsum / float64(bn)
			m.BaselineLoss = &v
		}
		out = append(out, m)
	}
	return out
}

// valueRange is the lowest and highest finite value over the buckets that
// have one; lo is +Inf when none has.
func valueRange(bs []report.Bucket, val func(report.Bucket) (float64, bool)) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, b := range bs {
		if v, ok := val(b); ok && !math.IsInf(v, 0) && !math.IsNaN(v) {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	return lo, hi
}

// sparkline draws one glyph per bucket, scaled between lo and hi; buckets
// without a finite value are blank (the log2 of a scale of 0 is -Inf).
func sparkline(bs []report.Bucket, val func(report.Bucket) (float64, bool), lo, hi float64) string {
	var sb strings.Builder
	for _, b := range bs {
		v, ok := val(b)
		if !ok || math.IsInf(v, 0) || math.IsNaN(v) {
			sb.WriteRune(' ')
			continue
		}
		k := len(sparkGlyphs) - 1
		if hi > lo {
			k = int((v - lo) / (hi - lo) * float64(len(sparkGlyphs)-1))
		}
		sb.WriteRune(sparkGlyphs[k])
	}
	return sb.String()
}

// markNonFinite puts mark (a styled "!") in the columns that hold NaN/Inf.
func markNonFinite(line string, bs []report.Bucket, mark string) string {
	var b strings.Builder
	for i, r := range []rune(line) {
		if bs[i].NonFinite > 0 {
			b.WriteString(mark)
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

func hasBaseline(bs []report.Bucket) bool {
	for _, b := range bs {
		if b.BaselineLoss != nil {
			return true
		}
	}
	return false
}

// scalesVerdictStyle colours a verdict by the worst finding: red for
// errors, yellow for warnings, green otherwise.
func scalesVerdictStyle(r *report.ScalesReport) string {
	switch r.MaxSeverity() {
	case checks.SevError:
		return markup.Red
	case checks.SevWarning:
		return markup.Yellow
	}
	return markup.Green
}

// steps writes a window of steps: "step 4" or "steps 30–39".
func steps(sr *report.StepRange) string {
	if sr.From == sr.To {
		return fmt.Sprintf("step %d", sr.From)
	}
	return fmt.Sprintf("steps %d–%d", sr.From, sr.To)
}

// lossSummary says what the loss did: the first and final windows with the
// steps they span, the NaN/Inf losses (those the run went on from apart
// from where it went NaN for good), and — so that a run which ended in
// NaN does not read as ending at its final window — how many of the last
// steps are NaN/Inf and where the last finite loss is.
func lossSummary(run report.RunInfo, l *report.LossStats) string {
	var parts []string
	if l.FirstLoss != nil && l.FinalLoss != nil && l.FirstSteps != nil && l.FinalSteps != nil {
		final := fmt.Sprintf("final %.4g (%s)", *l.FinalLoss, windowText(l.FinalSteps))
		if failing(l) != nil {
			final = fmt.Sprintf("last before the loss went NaN/Inf %.4g (%s)", *l.FinalLoss, windowText(l.FinalSteps))
		}
		parts = append(parts, fmt.Sprintf("first %.4g (%s), %s", *l.FirstLoss, windowText(l.FirstSteps), final))
	} else if l.FirstLoss != nil && l.FinalLoss != nil {
		// A report from before the windows were recorded.
		parts = append(parts, fmt.Sprintf("first %.4g, final %.4g (means of %d steps)", *l.FirstLoss, *l.FinalLoss, l.FinalWindow))
	}
	if l.FirstNonFiniteStep == nil {
		return strings.Join(append(parts, "no NaN/Inf"), "; ")
	}
	parts = append(parts, fmt.Sprintf("%d NaN/Inf, the first (%s) at step %d", l.NonFinite, l.FirstNonFiniteValue, *l.FirstNonFiniteStep))
	if l.Recovered > 0 {
		parts = append(parts, fmt.Sprintf("%d the run went on from", l.Recovered))
	}
	fail := failing(l)
	last := run.FirstStep + run.Steps - 1
	switch {
	case l.LastFiniteStep == nil && run.Steps > 0:
		parts = append(parts, "no loss is finite")
	case fail != nil && l.TrailingNonFinite > 0 && l.TrailingNonFinite == last-*fail+1:
		parts = append(parts, fmt.Sprintf("every loss from step %d on is NaN/Inf: the last %d steps (%d–%d)", *fail, l.TrailingNonFinite, *fail, last))
	case fail != nil:
		parts = append(parts, fmt.Sprintf("it went NaN/Inf for good at step %d: most losses from there on are NaN/Inf, the last %d steps (%d–%d) all", *fail, l.TrailingNonFinite, last-l.TrailingNonFinite+1, last))
	case l.TrailingNonFinite > 0:
		parts = append(parts, fmt.Sprintf("the last %d steps (%d–%d) are NaN/Inf; the last finite loss is at step %d", l.TrailingNonFinite, last-l.TrailingNonFinite+1, last, *l.LastFiniteStep))
	case l.LastFiniteStep != nil:
		parts = append(parts, fmt.Sprintf("finite again at the end of the log (step %d)", *l.LastFiniteStep))
	}
	return strings.Join(parts, "; ")
}

// failing is the step where the loss went NaN/Inf for good. A report
// written before v1.2 has no failing step: there, as then, the first
// NaN/Inf was the failure whenever the log ended in NaN/Inf.
func failing(l *report.LossStats) *int {
	if l.FailingStep != nil || l.Recovered > 0 || l.TrailingNonFinite == 0 {
		return l.FailingStep
	}
	return l.FirstNonFiniteStep
}

// windowText writes a loss window: "at step 4" or "mean of steps 30–39".
func windowText(sr *report.StepRange) string {
	if sr.From == sr.To {
		return "at " + steps(sr)
	}
	return "mean of " + steps(sr)
}
