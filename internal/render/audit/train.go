package audit

import (
	"fmt"
	"html/template"
	"math"
	"strings"

	"fp16audit/internal/render/markup"
	"fp16audit/report"
)

// The training section of an audit report (report.TrainingReport), in
// each format: the forward mode, the backward verdict with the scaled loss
// gradient and the verified fix, the loss scales run and the gradients per
// module. Each renderer calls its function once; they compute nothing.

// quiet reports whether a training section has nothing to say: an eval
// mode audit of a model without BatchNorm or Dropout, no notes, no loss.
func quiet(tr *report.TrainingReport) bool {
	return tr == nil || (tr.Mode == report.ModeEval && len(tr.BatchNorms) == 0 && tr.Dropouts == 0 &&
		len(tr.Notes) == 0 && tr.Backward == nil)
}

// exp2 writes a loss-scale exponent as 2^e, "-" for none.
func exp2(e *int) string {
	if e == nil {
		return "-"
	}
	return fmt.Sprintf("2^%d", *e)
}

// trainingMode says how the forward passes ran, in one sentence.
func trainingMode(tr *report.TrainingReport) string {
	batch, running := 0, 0
	for _, bn := range tr.BatchNorms {
		if bn.Statistics == "batch" {
			batch++
		} else {
			running++
		}
	}
	var parts []string
	if batch > 0 {
		parts = append(parts, fmt.Sprintf("%d BatchNormalization node(s) with the batch's statistics", batch))
	}
	switch {
	case running > 0 && batch > 0:
		parts = append(parts, fmt.Sprintf("%d with running statistics", running))
	case running > 0:
		parts = append(parts, fmt.Sprintf("%d BatchNormalization node(s) with running statistics", running))
	}
	if tr.Dropouts > 0 && tr.Mode == report.ModeTrain {
		parts = append(parts, fmt.Sprintf("%d Dropout node(s) dropping (seed %d)", tr.Dropouts, tr.DropoutSeed))
	}
	if len(parts) == 0 {
		return fmt.Sprintf("forward in %s mode (no BatchNormalization or Dropout node changes with the mode)", tr.Mode)
	}
	return fmt.Sprintf("forward in %s mode: %s", tr.Mode, strings.Join(parts, ", "))
}

// seedLine says what the scaled loss gradient is at the initial scale.
func seedLine(b *report.BackwardReport) string {
	loss := "not finite"
	if b.LossValue != nil {
		loss = fmt.Sprintf("%.4g", *b.LossValue)
	}
	s := fmt.Sprintf("loss %s on %q = %s (fp32)%s", b.Loss, b.Output, loss, crossEntropyText(b.CrossEntropy))
	if b.SeedMaxAbs != nil {
		s += fmt.Sprintf("; max |dL/dpred| %.4g, × 2^%d = %.4g against fp16's 65504 (prediction held in %s)",
			*b.SeedMaxAbs, b.InitExp, math.Ldexp(*b.SeedMaxAbs, b.InitExp), b.OutputPrecision)
	}
	return s
}

// crossEntropyText says what the cross-entropy scored and how it read the
// logits, or "" for the other losses.
func crossEntropyText(ce *report.CrossEntropyReport) string {
	if ce == nil {
		return ""
	}
	axis := "axis 1"
	if ce.ClassAxis == -1 {
		axis = "the last axis"
	}
	s := fmt.Sprintf(" over %d of %d targets (%d classes on %s", ce.Scored, ce.Targets, ce.Classes, axis)
	if ce.LMShift {
		s += ", each position against the next target"
	}
	return s + fmt.Sprintf(", ignore_index %d)", ce.IgnoreIndex)
}

// flushingText lists the modules flushing at one scale, shortened.
func flushingText(s report.ScaleReport) string {
	if len(s.Flushing) == 0 {
		return "-"
	}
	if len(s.Flushing) > 4 {
		return strings.Join(s.Flushing[:4], ", ") + fmt.Sprintf(" and %d more", len(s.Flushing)-4)
	}
	return strings.Join(s.Flushing, ", ")
}

func overflowText(s report.ScaleReport) string {
	if !s.Overflow {
		return "-"
	}
	return "at " + s.FirstOverflow
}

func maxText(x *float64) string {
	if x == nil {
		return "nan/inf"
	}
	return formatMag(*x)
}

// training writes the text section.
func (t *textWriter) training(tr *report.TrainingReport) {
	if quiet(tr) {
		return
	}
	t.Printf("\n")
	t.para(t.Style(markup.Dim, "training: "), trainingMode(tr), 10)
	for _, n := range tr.Notes {
		t.para(t.Style(markup.Dim, "  note: "), n, 8)
	}
	b := tr.Backward
	if b == nil {
		return
	}
	mark, col := "✗", markup.Red
	if b.Verdict == report.BackwardHealthy {
		mark, col = "✓", markup.Green
	}
	t.para(t.Style(markup.Bold+col, mark+" backward: "+b.Verdict)+" — ", b.VerdictText, 2)
	t.para("  ", seedLine(b), 2)
	for _, f := range b.Fixes {
		fm := t.Style(markup.Red, "does not work")
		if f.Works {
			fm = t.Style(markup.Green, "works")
		}
		t.para(fmt.Sprintf("  fix %s (%s, verified by rerun): ", t.Style(markup.Bold, f.Kind), fm), f.Summary, 6)
	}
	if len(b.Unsupported) > 0 {
		var ops []string
		for _, u := range b.Unsupported {
			ops = append(ops, u.Node+" ("+u.OpType+")")
		}
		t.para("  no gradient rule: ", strings.Join(ops, ", "), 4)
	}
	t.para("  ", fmt.Sprintf("loss scales run (%d backward runs, %.2f s; a gradient flushes when more than %.1f%% of it does):",
		b.Runs, b.ElapsedSecs, 100*b.UnderflowFraction), 2)
	rows := [][]string{{"scale", "overflow", "flushing modules"}}
	for _, s := range b.Scales {
		rows = append(rows, []string{fmt.Sprintf("2^%d", s.Exp), overflowText(s), flushingText(s)})
	}
	t.grid(rows)
	t.para("  ", fmt.Sprintf("gradients held in 16 bits, per module (clean: the largest scale without overflow; flush-free: the smallest scale flushing at most %.1f%%):", 100*b.UnderflowFraction), 2)
	rows = [][]string{{"module", "grads", "clean up to", "flush-free from", fmt.Sprintf("max |g| at 2^%d", b.InitExp), "flushed"}}
	for _, m := range b.Modules {
		mx := maxText(m.MaxAbsAtInit)
		if m.OverflowAtInit {
			mx = "overflow"
		}
		rows = append(rows, []string{m.Module, fmt.Sprint(m.Gradients), exp2(m.MaxCleanExp), exp2(m.FlushFreeExp), mx, fmt.Sprintf("%.1f%%", 100*m.FlushedAtInit)})
	}
	t.grid(rows)
}

// grid writes rows as left-aligned columns indented by four spaces.
func (t *textWriter) grid(rows [][]string) {
	var widths []int
	for _, r := range rows {
		for k, c := range r {
			if k >= len(widths) {
				widths = append(widths, 0)
			}
			widths[k] = max(widths[k], runeLen(c))
		}
	}
	for i, r := range rows {
		var b strings.Builder
		b.WriteString("    ")
		for k, c := range r {
			if k == len(r)-1 {
				b.WriteString(c)
				break
			}
			b.WriteString(c + strings.Repeat(" ", widths[k]-runeLen(c)+2))
		}
		line := strings.TrimRight(b.String(), " ")
		if i == 0 {
			line = t.Style(markup.Dim, line)
		}
		t.Printf("%s\n", line)
	}
}

// trainingMarkdown writes the Markdown section.
func trainingMarkdown(b *strings.Builder, tr *report.TrainingReport) {
	if quiet(tr) {
		return
	}
	fmt.Fprintf(b, "\n### Training\n\n%s.\n", markup.MDText(trainingMode(tr)))
	for _, n := range tr.Notes {
		fmt.Fprintf(b, "\n> **Note:** %s\n", markup.MDText(n))
	}
	bw := tr.Backward
	if bw == nil {
		return
	}
	mark := "❌"
	if bw.Verdict == report.BackwardHealthy {
		mark = "✅"
	}
	fmt.Fprintf(b, "\n**Backward: %s `%s`** — %s\n\n%s.\n", mark, bw.Verdict, markup.MDText(bw.VerdictText), markup.MDText(seedLine(bw)))
	for _, f := range bw.Fixes {
		res := "❌ does not work"
		if f.Works {
			res = "✅ works"
		}
		fmt.Fprintf(b, "\nFix `%s` (verified by rerun): %s — %s\n", f.Kind, res, markup.MDText(f.Summary))
	}
	b.WriteString("\n| scale | overflow | flushing modules |\n|--:|---|---|\n")
	for _, s := range bw.Scales {
		fmt.Fprintf(b, "| 2^%d | %s | %s |\n", s.Exp, markup.MDText(overflowText(s)), markup.MDText(flushingText(s)))
	}
	fmt.Fprintf(b, "\n| module | gradients | clean up to | flush-free from | max \\|g\\| at 2^%d | flushed |\n|---|--:|--:|--:|--:|--:|\n", bw.InitExp)
	for _, m := range bw.Modules {
		mx := maxText(m.MaxAbsAtInit)
		if m.OverflowAtInit {
			mx = "overflow"
		}
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %.1f%% |\n", markup.MDCode(m.Module), m.Gradients, exp2(m.MaxCleanExp), exp2(m.FlushFreeExp), mx, 100*m.FlushedAtInit)
	}
}

// trainingHTML renders the HTML section (a card), or nothing.
func trainingHTML(tr *report.TrainingReport) (template.HTML, error) {
	if quiet(tr) {
		return "", nil
	}
	var b strings.Builder
	err := trainingCard.Execute(&b, tr)
	return template.HTML(b.String()), err
}

var trainingCard = template.Must(template.New("training").Funcs(template.FuncMap{
	"mode": trainingMode, "seed": seedLine, "exp2": exp2, "maxText": maxText,
	"over": overflowText, "flushing": flushingText,
	"pct": func(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) },
}).Parse(`<section class="card" id="training">
<h2>Training</h2>
<p>{{mode .}}.</p>
{{range .Notes}}<p class="small">Note: {{.}}</p>{{end}}
{{with .Backward}}<div class="{{if eq .Verdict "healthy"}}ok{{else}}fail{{end}}">
<h3><span class="badge">{{if eq .Verdict "healthy"}}✓{{else}}✗{{end}}</span> backward: {{.Verdict}}</h3>
<p class="vtext">{{.VerdictText}}</p></div>
<p>{{seed .}}.</p>
{{range .Fixes}}<p>Fix <b>{{.Kind}}</b> ({{if .Works}}works{{else}}does not work{{end}}, verified by rerun): {{.Summary}}</p>{{end}}
<table class="plain"><thead><tr><th>scale</th><th>overflow</th><th>flushing modules</th></tr></thead><tbody>
{{range .Scales}}<tr><td>2^{{.Exp}}</td><td>{{over .}}</td><td>{{flushing .}}</td></tr>
{{end}}</tbody></table>
<table class="plain"><thead><tr><th>module</th><th>gradients</th><th>clean up to</th><th>flush-free from</th><th>max |g| at 2^{{.InitExp}}</th><th>flushed</th></tr></thead><tbody>
{{range .Modules}}<tr><td><code>{{.Module}}</code></td><td>{{.Gradients}}</td><td>{{exp2 .MaxCleanExp}}</td><td>{{exp2 .FlushFreeExp}}</td><td>{{if .OverflowAtInit}}overflow{{else}}{{maxText .MaxAbsAtInit}}{{end}}</td><td>{{pct .FlushedAtInit}}</td></tr>
{{end}}</tbody></table>
{{end}}</section>`))
