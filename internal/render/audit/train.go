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

// settleLine says where the GradScaler settles and what that costs.
func settleLine(b *report.BackwardReport) string {
	if b.SettledExp == nil {
		return fmt.Sprintf("no scale from 2^%d down to 2^%d keeps the fp16 backward finite", b.InitExp, b.MinExp)
	}
	s := fmt.Sprintf("GradScaler from 2^%d settles at 2^%d", b.InitExp, *b.SettledExp)
	if b.SkippedSteps > 0 {
		s += fmt.Sprintf(" after %d skipped step(s)", b.SkippedSteps)
	} else {
		s += " (no step skipped)"
	}
	if b.LostMass != nil {
		s += fmt.Sprintf("; there fp16 loses at most %s of a parameter gradient's norm (%s; tolerance %s)", pctText(*b.LostMass), b.WorstParameter, pctText(b.Tolerance))
	}
	if b.Window != nil {
		s += fmt.Sprintf("; clean from 2^%d to 2^%d", b.Window.From, b.Window.To)
	} else if b.MaxCleanExp != nil {
		s += fmt.Sprintf("; no overflow up to 2^%d, but no clean scale", *b.MaxCleanExp)
	}
	return s
}

// pctText writes a share as a percentage with two significant decimals
// below 1%.
func pctText(x float64) string {
	if x < 0.01 {
		return fmt.Sprintf("%.3f%%", 100*x)
	}
	return fmt.Sprintf("%.1f%%", 100*x)
}

func overflowText(s report.ScaleReport) string {
	if !s.Overflow {
		return "-"
	}
	if s.FirstOverflow == "" {
		return "yes"
	}
	return "at " + s.FirstOverflow
}

// lostText is a scale's worst loss, "-" where it overflows.
func lostText(s report.ScaleReport) string {
	if s.Overflow {
		return "-"
	}
	if s.WorstModule == "" {
		return pctText(s.LostMass)
	}
	return pctText(s.LostMass) + " (" + s.WorstModule + ")"
}

// scaleMark says what a scale is: settled, the window's ends.
func scaleMark(b *report.BackwardReport, s report.ScaleReport) string {
	var marks []string
	if s.Exp == b.InitExp {
		marks = append(marks, "initial")
	}
	if b.SettledExp != nil && s.Exp == *b.SettledExp {
		marks = append(marks, "settled")
	}
	if b.Window != nil && s.Exp == b.Window.From {
		marks = append(marks, "clean from")
	}
	if b.MaxCleanExp != nil && s.Exp == *b.MaxCleanExp {
		marks = append(marks, "largest without overflow")
	}
	if s.Measured {
		marks = append(marks, "measured")
	}
	return strings.Join(marks, ", ")
}

func maxText(x *float64) string {
	if x == nil {
		return "nan/inf"
	}
	return formatMag(*x)
}

func lostPtr(x *float64) string {
	if x == nil {
		return "-"
	}
	return pctText(*x)
}

// band is the picture's axis: the exponents it spans and where fp16's
// band lies, with every module's range shifted by the settled scale.
type band struct {
	lo, hi   int // axis, exponents (columns lo..hi-1)
	shift    int // the settled exponent
	min, max int // fp16: smallest subnormal 2^-24, overflow from 2^16
}

func pictureBand(b *report.BackwardReport) band {
	bd := band{lo: -32, hi: 18, min: -24, max: 16}
	if b.SettledExp != nil {
		bd.shift = *b.SettledExp
	} else {
		bd.shift = b.InitExp
	}
	for _, m := range b.Modules {
		if m.Log2Min == nil {
			continue
		}
		bd.lo = min(bd.lo, int(math.Floor(*m.Log2Min))+bd.shift-1)
		bd.hi = max(bd.hi, int(math.Floor(*m.Log2Max))+bd.shift+2)
	}
	bd.lo = max(bd.lo, -60)
	bd.hi = min(bd.hi, 40)
	return bd
}

// bar draws one module's range as text: one column per binary exponent,
// █ where fp16 holds it, ░ below its smallest subnormal (flushed), ▲ at
// and above 2^16 (overflow); · marks fp16's band where the module has
// nothing, | its ends.
func (bd band) bar(m report.ModuleGradientReport) string {
	var sb strings.Builder
	lo, hi := math.Inf(1), math.Inf(-1)
	if m.Log2Min != nil {
		lo, hi = *m.Log2Min+float64(bd.shift), *m.Log2Max+float64(bd.shift)
	}
	for x := bd.lo; x < bd.hi; x++ {
		in := float64(x+1) > lo && float64(x) <= hi
		switch {
		case in && x < bd.min:
			sb.WriteString("░")
		case in && x >= bd.max:
			sb.WriteString("▲")
		case in:
			sb.WriteString("█")
		case x == bd.min || x == bd.max:
			sb.WriteString("|")
		case x > bd.min && x < bd.max:
			sb.WriteString("·")
		default:
			sb.WriteString(" ")
		}
	}
	return sb.String()
}

// axis labels the picture's columns at fp16's band ends.
func (bd band) axis() string {
	cols := make([]rune, bd.hi-bd.lo)
	for i := range cols {
		cols[i] = ' '
	}
	put := func(x int, s string) {
		for i, r := range s {
			if k := x - bd.lo + i; k >= 0 && k < len(cols) {
				cols[k] = r
			}
		}
	}
	put(bd.min, "2^-24")
	put(bd.max-4, "2^16")
	put(bd.lo, fmt.Sprintf("2^%d", bd.lo))
	return strings.TrimRight(string(cols), " ")
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
	t.para("  ", settleLine(b), 2)
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
	t.para("  ", fmt.Sprintf("loss scales (%d backward runs, %.2f s: the fp32 backward's mass by exponent, measured by an emulated fp16 backward where marked; lost: the largest share of a parameter gradient's norm):",
		b.Runs, b.ElapsedSecs), 2)
	rows := [][]string{{"scale", "overflow", "lost", ""}}
	for _, s := range b.Scales {
		rows = append(rows, []string{fmt.Sprintf("2^%d", s.Exp), overflowText(s), lostText(s), scaleMark(b, s)})
	}
	t.grid(rows)
	bd := pictureBand(b)
	t.para("  ", fmt.Sprintf("gradients per module × the settled scale 2^%d against fp16 (█ held, ░ flushed below 2^-24, ▲ overflow from 2^16; held lost: the share of the module's 16-bit gradients' mass fp16 cannot hold; params lost: its worst parameter gradient):", bd.shift), 2)
	rows = [][]string{{"module", bd.axis(), "held lost", "params lost"}}
	for _, m := range b.Modules {
		rows = append(rows, []string{m.Module, bd.bar(m), pctText(m.HeldLost), lostPtr(m.LostMass)})
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
	fmt.Fprintf(b, "\n**Backward: %s `%s`** — %s\n\n%s.\n\n%s.\n", mark, bw.Verdict, markup.MDText(bw.VerdictText), markup.MDText(seedLine(bw)), markup.MDText(settleLine(bw)))
	for _, f := range bw.Fixes {
		res := "❌ does not work"
		if f.Works {
			res = "✅ works"
		}
		fmt.Fprintf(b, "\nFix `%s` (verified by rerun): %s — %s\n", f.Kind, res, markup.MDText(f.Summary))
	}
	b.WriteString("\n| scale | overflow | lost | |\n|--:|---|---|---|\n")
	for _, s := range bw.Scales {
		fmt.Fprintf(b, "| 2^%d | %s | %s | %s |\n", s.Exp, markup.MDText(overflowText(s)), markup.MDText(lostText(s)), markup.MDText(scaleMark(bw, s)))
	}
	bd := pictureBand(bw)
	fmt.Fprintf(b, "\nGradients per module × the settled scale 2^%d against fp16 (█ held, ░ flushed below 2^-24, ▲ overflow from 2^16):\n\n| module | range | held lost | params lost |\n|---|---|--:|--:|\n", bd.shift)
	for _, m := range bw.Modules {
		fmt.Fprintf(b, "| %s | `%s` | %s | %s |\n", markup.MDCode(m.Module), bd.bar(m), pctText(m.HeldLost), lostPtr(m.LostMass))
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

// Picture geometry, in SVG user units: one row per module.
const (
	picLabel = 180
	picW     = 900
	picRow   = 18
	picTop   = 22
)

// pictureSVG draws every module's gradient range × the settled scale
// against fp16's band: grey the band, blue the part fp16 holds, orange
// the part below its smallest subnormal (flushed), red the part at and
// above 2^16 (overflow).
func pictureSVG(b *report.BackwardReport) template.HTML {
	bd := pictureBand(b)
	span := float64(bd.hi - bd.lo)
	x := func(e float64) string {
		return markup.Coord(picLabel + (e-float64(bd.lo))/span*float64(picW-picLabel-10))
	}
	h := picTop + picRow*len(b.Modules) + 20
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg class="gradpic" viewBox="0 0 %d %d" role="img" aria-label="gradient range per module against fp16 at the settled scale">`, picW, h)
	fmt.Fprintf(&sb, `<rect x="%s" y="%d" width="%s" height="%d" fill="#e8e8e8"/>`, x(float64(bd.min)), picTop-4,
		markup.Coord(float64(bd.max-bd.min)/span*float64(picW-picLabel-10)), picRow*len(b.Modules)+8)
	for _, e := range []int{bd.min, bd.max} {
		fmt.Fprintf(&sb, `<text x="%s" y="14" font-size="11" text-anchor="middle">2^%d</text>`, x(float64(e)), e)
	}
	for i, m := range b.Modules {
		y := picTop + i*picRow
		fmt.Fprintf(&sb, `<text x="%d" y="%d" font-size="11" text-anchor="end"><title>%s</title>%s</text>`, picLabel-6, y+11,
			template.HTMLEscapeString(m.Module), template.HTMLEscapeString(shorten(m.Module, 28)))
		if m.Log2Min == nil {
			continue
		}
		lo, hi := *m.Log2Min+float64(bd.shift), *m.Log2Max+float64(bd.shift)
		seg := func(a, c float64, color, what string) {
			a, c = math.Max(a, float64(bd.lo)), math.Min(c, float64(bd.hi))
			if c <= a {
				return
			}
			fmt.Fprintf(&sb, `<rect x="%s" y="%d" width="%s" height="%d" fill="%s"><title>%s: %s</title></rect>`, x(a), y+2,
				markup.Coord((c-a)/span*float64(picW-picLabel-10)), picRow-6, color, template.HTMLEscapeString(m.Module), what)
		}
		seg(lo, math.Min(hi, float64(bd.min)), "#e69138", "below fp16's smallest subnormal: flushed")
		seg(math.Max(lo, float64(bd.min)), math.Min(hi, float64(bd.max)), "#3d85c6", "held by fp16")
		seg(math.Max(lo, float64(bd.max)), hi, "#cc0000", "overflows fp16")
	}
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String())
}

var trainingCard = template.Must(template.New("training").Funcs(template.FuncMap{
	"mode": trainingMode, "seed": seedLine, "settle": settleLine, "exp2": exp2, "maxText": maxText,
	"over": overflowText, "lost": lostText, "mark": scaleMark, "pct": pctText, "lostPtr": lostPtr,
	"picture": pictureSVG,
}).Parse(`<section class="card" id="training">
<h2>Training</h2>
<p>{{mode .}}.</p>
{{range .Notes}}<p class="small">Note: {{.}}</p>{{end}}
{{with .Backward}}{{$b := .}}<div class="{{if eq .Verdict "healthy"}}ok{{else}}fail{{end}}">
<h3><span class="badge">{{if eq .Verdict "healthy"}}✓{{else}}✗{{end}}</span> backward: {{.Verdict}}</h3>
<p class="vtext">{{.VerdictText}}</p></div>
<p>{{seed .}}.</p>
<p>{{settle .}}.</p>
{{range .Fixes}}<p>Fix <b>{{.Kind}}</b> ({{if .Works}}works{{else}}does not work{{end}}, verified by rerun): {{.Summary}}</p>{{end}}
<h3>Gradients per module against fp16 at the settled scale</h3>
{{picture .}}
<table class="plain"><thead><tr><th>module</th><th>gradients</th><th>parameters</th><th>clean up to</th><th>held lost</th><th>params lost</th></tr></thead><tbody>
{{range .Modules}}<tr><td><code>{{.Module}}</code></td><td>{{.Gradients}}</td><td>{{.Parameters}}</td><td>{{exp2 .MaxCleanExp}}</td><td>{{pct .HeldLost}}</td><td>{{lostPtr .LostMass}}</td></tr>
{{end}}</tbody></table>
<table class="plain"><thead><tr><th>scale</th><th>overflow</th><th>lost</th><th></th></tr></thead><tbody>
{{range .Scales}}<tr><td>2^{{.Exp}}</td><td>{{over .}}</td><td>{{lost .}}</td><td>{{mark $b .}}</td></tr>
{{end}}</tbody></table>
{{end}}</section>`))
