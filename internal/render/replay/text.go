// Package replay renders the replay of a captured training step
// (report.ReplayReport, `fp16audit replay`) as text, GitHub-flavoured
// Markdown and a self-contained HTML page with the run's timeline up to
// the capture. The step's training audit inside the report is rendered by
// package audit. It imports only report, markup and audit.
package replay

import (
	"fmt"
	"io"
	"math"
	"strings"

	"fp16audit/internal/render/audit"
	"fp16audit/internal/render/markup"
	"fp16audit/report"
)

// Text writes the replay for the terminal: the capture, the verdict and
// its culprit, the fixes in the words of the trainer that made the
// capture and in PyTorch's, the continuations, the timeline as
// sparklines, then the step's training audit (flagged nodes only).
func Text(w io.Writer, r *report.ReplayReport, opt audit.TextOptions) error {
	p := markup.NewWriter(w, opt.Color)
	c := r.Capture
	p.Printf("%s\n", p.Style(markup.Bold, "fp16audit replay — "+c.Path))
	p.Printf("capture: %s\n", captureLine(c))
	p.Printf("run: %s\n", runLine(c))
	badge, style := verdictBadge(r.Verdict)
	p.Printf("\n%s — %s\n", p.Style(markup.Bold+style, badge+" verdict: "+r.Verdict), r.VerdictText)
	if cu := r.Culprit; cu != nil {
		p.Printf("  culprit: %s\n", culpritLine(cu))
		if len(cu.Earlier) > 0 {
			p.Printf("    logged before: %s\n", earlierText(cu.Earlier))
		}
	}
	if d := r.Data; d != nil && len(d.Samples) > 0 {
		p.Printf("  samples (index in the failing batch): %s\n", int64List(d.Samples))
	}
	if g := r.Gradient; g != nil {
		p.Printf("  scales: %s\n", gradientScales(g))
	}
	if u := r.Underflow; u != nil {
		for _, m := range u.Modules {
			p.Printf("  %-24s loses %5.1f%% of its gradient norm (%s) at 2^%d\n", m.Module, 100*m.LostMass, m.Parameter, u.ScaleExp)
		}
	}
	if len(r.Fixes) > 0 {
		p.Printf("\nfixes:\n")
		for _, f := range r.Fixes {
			mark, st := fixMark(f)
			p.Printf("  %s %s (%s): %s\n", p.Style(st, mark), f.Kind, verifiedText(f), f.Summary)
			label, words := fixWords(r.Capture, f)
			if words != "" {
				p.Printf("      %s: %s\n", label, words)
			}
			if torchToo(f, words) {
				p.Printf("      PyTorch: %s\n", f.Torch)
			}
		}
	}
	if r.ClipNorm != nil {
		p.Printf("  clipping norm proposed: max_norm %.3g (the fp32 gradient norm before the failure)\n", *r.ClipNorm)
	}
	if co := r.Continuations; co != nil {
		p.Printf("\ncontinuations: %d steps from the captured state on %s (%s); the run as it was %s\n",
			co.Steps, co.Device, co.Batches, reproducedText(co.Reproduced))
		p.Printf("  %-10s %-10s %-10s %-12s %s\n", "fix", "precision", "outcome", "final loss", "vs fp32")
		for _, x := range co.Runs {
			p.Printf("  %-10s %-10s %-10s %-12s %s   %s\n", x.Fix, x.Precision, x.Outcome, optNum(x.Final), relCell(x.RelToFP32), markup.Spark(x.Losses, 40))
		}
	}
	if t := r.Timeline; t != nil && len(t.Steps) > 0 {
		p.Printf("\ntimeline, steps %d to %d (%d skipped):\n", t.Steps[0], t.Steps[len(t.Steps)-1], countTrue(t.Skipped))
		p.Printf("  loss        %s\n", markup.Spark(t.Loss, 60))
		p.Printf("  log2 scale  %s\n", markup.Spark(log2s(t.Scale), 60))
		if s := t.Culprit; s != nil {
			p.Printf("  %s of %s: %s\n", s.What, s.Module, seriesText(s))
		}
	}
	if len(r.Notes) > 0 {
		p.Printf("\nnotes:\n")
		for _, n := range r.Notes {
			p.Printf("  - %s\n", n)
		}
	}
	if err := p.Err(); err != nil {
		return err
	}
	if r.Audit != nil {
		p.Printf("\n%s\n", p.Style(markup.Bold, "the captured step's training audit:"))
		o := opt
		o.OnlyFlagged = true
		if err := audit.Text(p, r.Audit, o); err != nil {
			return err
		}
	}
	return p.Err()
}

func verdictBadge(v string) (string, string) {
	if v == report.ReplayNotReproduced {
		return "?", markup.Yellow
	}
	return "✗", markup.Red
}

func captureLine(c report.CaptureInfo) string {
	s := fmt.Sprintf("step %d", c.Step)
	if c.Epoch != nil {
		s += fmt.Sprintf(" (epoch %d)", *c.Epoch)
	}
	s += ", trigger " + c.Trigger
	if c.Detail != "" {
		s += ": " + c.Detail
	}
	if c.Created != "" {
		s += "; written " + c.Created
	}
	return s
}

func runLine(c report.CaptureInfo) string {
	parts := []string{c.Trainer, c.Policy}
	if c.AutocastDevice != "" {
		parts[1] += " on " + c.AutocastDevice
	}
	if c.Scale != nil {
		parts = append(parts, "loss scale "+report.FormatScale(*c.Scale))
	} else {
		parts = append(parts, "no GradScaler")
	}
	if c.Optimizer != "" {
		o := c.Optimizer
		if c.LR != nil {
			o += fmt.Sprintf(" lr %.3g", *c.LR)
		}
		parts = append(parts, o)
	}
	if c.LossFunction != "" {
		l := c.LossFunction
		if c.LossName != "" {
			l += " (--loss " + c.LossName + ")"
		}
		if c.Loss != nil {
			l += " = " + num(*c.Loss)
		}
		parts = append(parts, l)
	}
	if c.ModelClass != "" {
		parts = append(parts, fmt.Sprintf("model %s (%d parameters, %s export)", c.ModelClass, c.Parameters, c.Exporter))
	}
	return strings.Join(parts, ", ")
}

func culpritLine(cu *report.Culprit) string {
	var b strings.Builder
	b.WriteString(cu.Kind)
	if cu.Node != "" {
		fmt.Fprintf(&b, " %s (%s", cu.Node, cu.OpType)
		if cu.Module != "" {
			fmt.Fprintf(&b, ", module %s", cu.Module)
		}
		b.WriteString(")")
	} else if cu.Module != "" {
		fmt.Fprintf(&b, " module %s", cu.Module)
	}
	if cu.Value != "" {
		fmt.Fprintf(&b, ", value %q", cu.Value)
	}
	if cu.Weight != "" {
		fmt.Fprintf(&b, ", weight %s", cu.Weight)
		if cu.Initializer != "" {
			fmt.Fprintf(&b, " (graph %s)", cu.Initializer)
		}
		fmt.Fprintf(&b, " max |w| %s", optNum(cu.WeightMaxAbs))
	}
	if cu.FP32MaxAbs != nil {
		fmt.Fprintf(&b, ", fp32 max |x| %s", num(*cu.FP32MaxAbs))
	}
	if len(cu.Batches) > 0 {
		fmt.Fprintf(&b, "; non-finite on the %s batch", strings.Join(cu.Batches, " and the "))
	}
	return b.String()
}

func earlierText(ms []report.Magnitude) string {
	const most = 8
	step := max(1, (len(ms)+most-1)/most)
	var parts []string
	for i := 0; i < len(ms); i += step {
		parts = append(parts, fmt.Sprintf("step %d: %s", ms[i].Step, num(ms[i].MaxAbs)))
	}
	if last := ms[len(ms)-1]; (len(ms)-1)%step != 0 {
		parts = append(parts, fmt.Sprintf("step %d: %s", last.Step, num(last.MaxAbs)))
	}
	return ms[0].What + ", " + strings.Join(parts, ", ")
}

func gradientScales(g *report.GradientFinding) string {
	s := fmt.Sprintf("captured 2^%d overflows", g.ScaleExp)
	if g.MaxCleanExp != nil {
		s += fmt.Sprintf("; largest without overflow 2^%d", *g.MaxCleanExp)
	}
	if g.Window != nil {
		s += fmt.Sprintf("; clean of overflow and underflow: 2^%d to 2^%d", g.Window.From, g.Window.To)
	} else {
		s += "; no fp16 scale is clean of both"
	}
	if g.Chronic {
		s += "; chronic (the steps before skipped too)"
	}
	return s
}

// fixWords is a fix in the words of the trainer that made the capture,
// with the trainer's name; a replay written before the fixes had such
// words gives fastai's.
func fixWords(c report.CaptureInfo, f report.ReplayFix) (string, string) {
	if f.Words == "" {
		return "fastai", f.Fastai
	}
	if c.TrainerLabel == "" {
		return c.Trainer, f.Words
	}
	return c.TrainerLabel, f.Words
}

// torchToo says whether PyTorch's words of a fix are shown beside the
// trainer's: where they say something else.
func torchToo(f report.ReplayFix, words string) bool {
	return f.Torch != "" && f.Torch != words
}

func fixMark(f report.ReplayFix) (string, string) {
	switch {
	case f.Works == nil:
		return "·", ""
	case *f.Works:
		return "✓", markup.Green
	}
	return "✗", markup.Red
}

func verifiedText(f report.ReplayFix) string {
	switch f.Verified {
	case report.VerifiedOneStep:
		return "verified by the one-step replay"
	case report.VerifiedContinuation:
		return "verified by a continuation"
	case report.VerifiedLog:
		return "from the log"
	}
	return "not verified"
}

func reproducedText(b bool) string {
	if b {
		return "failed again"
	}
	return "did not fail again within these steps (the fixes' outcomes say little)"
}

func relCell(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%+.1f%%", 100**p)
}

func optNum(p *float64) string {
	if p == nil {
		return "-"
	}
	return num(*p)
}

// num formats a magnitude.
func num(x float64) string {
	switch {
	case math.IsNaN(x):
		return "NaN"
	case math.IsInf(x, 1):
		return "Inf"
	case math.IsInf(x, -1):
		return "-Inf"
	}
	return fmt.Sprintf("%.4g", x)
}

func int64List(s []int64) string {
	parts := make([]string, len(s))
	for i, x := range s {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, ", ")
}

func countTrue(b []bool) int {
	n := 0
	for _, x := range b {
		if x {
			n++
		}
	}
	return n
}

func log2s(v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = math.Log2(x)
	}
	return out
}

func seriesText(s *report.Series) string {
	var parts []string
	step := max(1, (len(s.Steps)+7)/8)
	for i := 0; i < len(s.Steps); i += step {
		parts = append(parts, fmt.Sprintf("%d: %s", s.Steps[i], num(s.Values[i])))
	}
	if (len(s.Steps)-1)%step != 0 {
		i := len(s.Steps) - 1
		parts = append(parts, fmt.Sprintf("%d: %s", s.Steps[i], num(s.Values[i])))
	}
	out := strings.Join(parts, ", ")
	if s.Limit > 0 {
		out += fmt.Sprintf(" (limit %s)", num(s.Limit))
	}
	return out
}
