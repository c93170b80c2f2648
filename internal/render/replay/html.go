package replay

import (
	"bytes"
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"

	"fp16audit/internal/render/audit"
	"fp16audit/internal/render/markup"
	"fp16audit/report"
)

// HTML writes the replay as one self-contained page: the verdict and its
// culprit, the fixes in the words of the trainer that made the capture
// and in PyTorch's, the run's timeline to the capture (the loss, log2 of the loss scale with the skipped steps,
// the culprit's logged magnitude against fp16's 65504), the
// continuations' losses, and the step's training audit (its per-node
// picture) as the audit's own page in a frame. It loads nothing from the
// network.
func HTML(w io.Writer, r *report.ReplayReport) error {
	v := replayView{R: r, Class: "fail", Badge: "✗", CSS: template.CSS(markup.PageCSS + replayCSS), Data: template.JS("{}")}
	if r.Verdict == report.ReplayNotReproduced {
		v.Class, v.Badge = "caution", "?"
	}
	c := r.Capture
	v.CaptureLine, v.RunLine = captureLine(c), runLine(c)
	if cu := r.Culprit; cu != nil {
		v.Culprit = culpritLine(cu)
		if len(cu.Earlier) > 0 {
			v.Earlier = earlierText(cu.Earlier)
		}
	}
	if g := r.Gradient; g != nil {
		v.Scales = gradientScales(g)
	}
	for _, f := range r.Fixes {
		cls := ""
		if f.Works != nil {
			cls = map[bool]string{true: "works", false: "fails"}[*f.Works]
		}
		mark, _ := fixMark(f)
		label, words := fixWords(r.Capture, f)
		v.Fixes = append(v.Fixes, fixView{F: f, Class: cls, Mark: mark, How: verifiedText(f), Label: label, Words: words, Torch: torchToo(f, words)})
	}
	if t := r.Timeline; t != nil && len(t.Steps) > 0 {
		v.Timeline = template.HTML(timelineSVG(t, c.Step))
		if s := t.Culprit; s != nil {
			v.CulpritChart = template.HTML(seriesSVG(s, c.Step))
		}
	}
	if co := r.Continuations; co != nil {
		v.Continuations = template.HTML(continuationsSVG(co))
		for _, x := range co.Runs {
			v.Runs = append(v.Runs, [5]string{x.Fix, x.Precision, x.Outcome, optNum(x.Final), relCell(x.RelToFP32)})
		}
		v.Reproduced = reproducedText(co.Reproduced)
	}
	if r.Audit != nil {
		var b bytes.Buffer
		if err := audit.HTML(&b, r.Audit); err != nil {
			return err
		}
		v.AuditPage = b.String()
	}
	bw := markup.NewWriter(w, false)
	if err := replayPage.Execute(bw, v); err != nil {
		return err
	}
	return bw.Err()
}

type fixView struct {
	F           report.ReplayFix
	Class, Mark string
	How         string
	// Label and Words: the fix in the words of the trainer that made the
	// capture; Torch shows PyTorch's beside them.
	Label, Words string
	Torch        bool
}

type replayView struct {
	R                        *report.ReplayReport
	Class, Badge             string
	CaptureLine, RunLine     string
	Culprit, Earlier, Scales string
	Fixes                    []fixView
	Timeline, CulpritChart   template.HTML
	Continuations            template.HTML
	Runs                     [][5]string
	Reproduced               string
	AuditPage                string
	CSS                      template.CSS
	Data                     template.JS
	Script                   template.JS
}

const replayCSS = `
svg.chart{width:100%;height:auto;display:block}
svg.chart text{font-size:12px;fill:var(--ink)}
svg.chart .ax{fill:var(--mute)}
svg.chart .grid line{stroke:#eceef1}
svg.chart path{fill:none;stroke-width:1.6;stroke-linejoin:round}
svg.chart line.limit{stroke:var(--bad);stroke-dasharray:7 4}
svg.chart line.cap{stroke:#495057;stroke-dasharray:3 3}
svg.chart circle.skip{fill:#e03131}
iframe.audit{width:100%;height:80vh;border:1px solid var(--line);border-radius:6px;background:#fff}
`

var replayPage = markup.Page("replay", template.FuncMap{
	"deref": func(p *float64) float64 { return *p },
	"pct":   func(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) },
}, `fp16audit replay — {{.R.Capture.Path}}`, `<header>
<h1>fp16audit replay — {{.R.Capture.Path}}</h1>
<p class="sub">{{.CaptureLine}}</p>
<p class="sub">{{.RunLine}}</p>
</header>`, `<section class="card {{.Class}}" id="verdict">
<h2><span class="badge">{{.Badge}}</span> <span id="verdict-id">{{.R.Verdict}}</span></h2>
<p class="vtext">{{.R.VerdictText}}</p>
{{if .Culprit}}<dl class="kv"><dt>culprit</dt><dd>{{.Culprit}}</dd>{{if .Earlier}}<dt>logged before</dt><dd>{{.Earlier}}</dd>{{end}}{{if .Scales}}<dt>scales</dt><dd>{{.Scales}}</dd>{{end}}{{if .R.Data}}<dt>samples</dt><dd>{{range $i, $s := .R.Data.Samples}}{{if $i}}, {{end}}{{$s}}{{end}} (index in the failing batch)</dd>{{end}}{{if .R.ClipNorm}}<dt>clipping norm</dt><dd>max_norm {{printf "%.3g" (deref .R.ClipNorm)}} (the fp32 gradient norm before the failure)</dd>{{end}}</dl>{{end}}
{{if .R.Underflow}}<table class="plain"><tr><th>module</th><th>parameter</th><th class="num">gradient norm lost at 2^{{.R.Underflow.ScaleExp}}</th></tr>{{range .R.Underflow.Modules}}<tr><td><code>{{.Module}}</code></td><td><code>{{.Parameter}}</code></td><td class="num">{{pct .LostMass}}</td></tr>{{end}}</table>{{end}}
</section>
{{if .Fixes}}<section class="card"><h2>Fixes</h2><ul class="fixes">{{range .Fixes}}<li class="{{.Class}}"><span class="fk">{{.Mark}} {{.F.Kind}}</span><span class="ba">{{.How}}</span><div>{{.F.Summary}}</div>{{if .Words}}<div class="snip">{{.Label}}: <code>{{.Words}}</code></div>{{end}}{{if .Torch}}<div class="snip">PyTorch: <code>{{.F.Torch}}</code></div>{{end}}</li>{{end}}</ul></section>{{end}}
{{if .Continuations}}<section class="card"><h2>Continuations</h2><p class="small">{{.R.Continuations.Steps}} steps from the captured state on {{.R.Continuations.Device}} ({{.R.Continuations.Batches}}); the run as it was {{.Reproduced}}.</p>{{.Continuations}}
<table class="plain"><tr><th>fix</th><th>precision</th><th>outcome</th><th class="num">final loss</th><th class="num">vs fp32</th></tr>{{range .Runs}}<tr><td>{{index . 0}}</td><td>{{index . 1}}</td><td>{{index . 2}}</td><td class="num">{{index . 3}}</td><td class="num">{{index . 4}}</td></tr>{{end}}</table></section>{{end}}
{{if .Timeline}}<section class="card"><h2>The run to the capture</h2><p class="small">The loss and log2 of the loss scale at every logged step (red: a skipped step), the captured step dashed.</p>{{.Timeline}}{{if .CulpritChart}}<h3>{{.R.Timeline.Culprit.What}} of {{.R.Timeline.Culprit.Module}}</h3>{{.CulpritChart}}{{end}}</section>{{end}}
{{if .R.Notes}}<section class="card"><h2>Notes</h2><ul class="notes">{{range .R.Notes}}<li>{{.}}</li>{{end}}</ul></section>{{end}}
{{if .AuditPage}}<section class="card"><h2>The captured step's training audit</h2><p class="small">The forward in fp32, under the run's policy and in bf16, and the backward at the captured scale, node by node.</p><iframe class="audit" title="training audit" srcdoc="{{.AuditPage}}"></iframe></section>{{end}}
`)

// chart geometry
const (
	cw, ch   = 900.0, 200.0
	padL     = 86.0
	padR     = 20.0
	padT     = 22.0
	padB     = 26.0
	plotW    = cw - padL - padR
	plotH    = ch - padT - padB
	nTickY   = 4
	colorA   = "#1971c2"
	colorB   = "#2b8a3e"
	colorBad = "#c92a2a"
)

type axis struct{ lo, hi float64 }

func (a axis) at(v float64) float64 {
	if a.hi == a.lo {
		return 0.5
	}
	return (v - a.lo) / (a.hi - a.lo)
}

func span(vs ...[]float64) axis {
	a := axis{math.Inf(1), math.Inf(-1)}
	for _, v := range vs {
		for _, x := range v {
			if !math.IsNaN(x) && !math.IsInf(x, 0) {
				a.lo, a.hi = math.Min(a.lo, x), math.Max(a.hi, x)
			}
		}
	}
	if math.IsInf(a.lo, 1) {
		return axis{0, 1}
	}
	if a.lo == a.hi {
		a.lo, a.hi = a.lo-1, a.hi+1
	}
	return a
}

// path draws ys over xs; a non-finite value breaks the line.
func path(xs []float64, ys []float64, xa, ya axis) string {
	var b strings.Builder
	pen := false
	for i := range xs {
		y := ys[i]
		if math.IsNaN(y) || math.IsInf(y, 0) {
			pen = false
			continue
		}
		cmd := "L"
		if !pen {
			cmd = "M"
			pen = true
		}
		fmt.Fprintf(&b, "%s%s %s", cmd, markup.Coord(padL+xa.at(xs[i])*plotW), markup.Coord(padT+(1-ya.at(y))*plotH))
	}
	return b.String()
}

func frame(b *strings.Builder, xa, ya axis, label string, format func(float64) string) {
	b.WriteString(`<g class="grid">`)
	for i := 0; i <= nTickY; i++ {
		v := ya.lo + (ya.hi-ya.lo)*float64(i)/nTickY
		y := padT + (1-ya.at(v))*plotH
		fmt.Fprintf(b, `<line x1="%s" x2="%s" y1="%s" y2="%s"/>`, markup.Coord(padL), markup.Coord(cw-padR), markup.Coord(y), markup.Coord(y))
		fmt.Fprintf(b, `<text class="ax" x="%s" y="%s" text-anchor="end">%s</text>`, markup.Coord(padL-6), markup.Coord(y+4), template.HTMLEscapeString(format(v)))
	}
	b.WriteString(`</g>`)
	for i := 0; i <= 4; i++ {
		v := xa.lo + (xa.hi-xa.lo)*float64(i)/4
		fmt.Fprintf(b, `<text class="ax" x="%s" y="%s" text-anchor="middle">%d</text>`, markup.Coord(padL+xa.at(v)*plotW), markup.Coord(ch-6), int(math.Round(v)))
	}
	fmt.Fprintf(b, `<text x="4" y="12">%s</text>`, template.HTMLEscapeString(label))
}

func capLine(b *strings.Builder, xa axis, step int) {
	x := markup.Coord(padL + xa.at(float64(step))*plotW)
	fmt.Fprintf(b, `<line class="cap" x1="%s" x2="%s" y1="%s" y2="%s"/>`, x, x, markup.Coord(padT), markup.Coord(padT+plotH))
}

func floats(s []int) []float64 {
	out := make([]float64, len(s))
	for i, x := range s {
		out[i] = float64(x)
	}
	return out
}

// timelineSVG draws the loss and log2(scale) panels over the logged
// steps, the skipped steps marked.
func timelineSVG(t *report.Timeline, capStep int) string {
	xs := floats(t.Steps)
	xa := span(append(xs, float64(capStep)))
	var b strings.Builder
	loss := t.Loss
	ya := span(loss)
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" role="img" aria-label="loss">`, int(cw), int(ch))
	frame(&b, xa, ya, "loss", num)
	capLine(&b, xa, capStep)
	fmt.Fprintf(&b, `<path d="%s" stroke="%s"/>`, path(xs, loss, xa, ya), colorA)
	b.WriteString(`</svg>`)
	ls := log2s(t.Scale)
	sa := span(ls)
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" role="img" aria-label="log2 of the loss scale">`, int(cw), int(ch))
	frame(&b, xa, sa, "log2 scale", func(v float64) string { return fmt.Sprintf("%.3g", v) })
	capLine(&b, xa, capStep)
	fmt.Fprintf(&b, `<path d="%s" stroke="%s"/>`, path(xs, ls, xa, sa), colorB)
	for i, sk := range t.Skipped {
		if sk && !math.IsNaN(ls[i]) && !math.IsInf(ls[i], 0) {
			fmt.Fprintf(&b, `<circle class="skip" r="3" cx="%s" cy="%s"><title>step %d skipped</title></circle>`,
				markup.Coord(padL+xa.at(xs[i])*plotW), markup.Coord(padT+(1-sa.at(ls[i]))*plotH), t.Steps[i])
		}
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// seriesSVG draws the culprit's logged magnitude on a log10 axis, with
// fp16's limit.
func seriesSVG(s *report.Series, capStep int) string {
	xs := floats(s.Steps)
	xa := span(append(xs, float64(capStep)))
	ys := make([]float64, len(s.Values))
	for i, v := range s.Values {
		ys[i] = math.Log10(v)
	}
	all := ys
	if s.Limit > 0 {
		all = append(append([]float64{}, ys...), math.Log10(s.Limit))
	}
	ya := span(all)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" role="img" aria-label="%s">`, int(cw), int(ch), template.HTMLEscapeString(s.What))
	frame(&b, xa, ya, "log10", func(v float64) string { return fmt.Sprintf("%.1f", v) })
	capLine(&b, xa, capStep)
	if s.Limit > 0 {
		y := markup.Coord(padT + (1-ya.at(math.Log10(s.Limit)))*plotH)
		fmt.Fprintf(&b, `<line class="limit" x1="%s" x2="%s" y1="%s" y2="%s"/><text x="%s" y="%s" fill="%s">fp16 max %s</text>`,
			markup.Coord(padL), markup.Coord(cw-padR), y, y, markup.Coord(padL+4), y, colorBad, num(s.Limit))
	}
	fmt.Fprintf(&b, `<path d="%s" stroke="%s"/>`, path(xs, ys, xa, ya), colorBad)
	for i := range xs {
		if !math.IsNaN(ys[i]) && !math.IsInf(ys[i], 0) {
			fmt.Fprintf(&b, `<circle r="3" cx="%s" cy="%s" fill="%s"><title>step %d: %s</title></circle>`,
				markup.Coord(padL+xa.at(xs[i])*plotW), markup.Coord(padT+(1-ya.at(ys[i]))*plotH), colorBad, s.Steps[i], num(s.Values[i]))
		}
	}
	b.WriteString(`</svg>`)
	return b.String()
}

var runColors = []string{"#c92a2a", "#495057", "#1971c2", "#2b8a3e", "#e8590c", "#7048e8"}

// continuationsSVG draws each continuation's loss (log10) over its steps.
func continuationsSVG(co *report.ContinuationsReport) string {
	var all [][]float64
	for _, x := range co.Runs {
		l := make([]float64, len(x.Losses))
		for i, v := range x.Losses {
			l[i] = math.Log10(math.Abs(v))
		}
		all = append(all, l)
	}
	ya := span(all...)
	xa := axis{0, math.Max(float64(co.Steps-1), 1)}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" role="img" aria-label="continuation losses">`, int(cw), int(ch))
	frame(&b, xa, ya, "log10 loss", func(v float64) string { return fmt.Sprintf("%.1f", v) })
	for i, x := range co.Runs {
		xs := make([]float64, len(all[i]))
		for k := range xs {
			xs[k] = float64(k)
		}
		c := runColors[i%len(runColors)]
		fmt.Fprintf(&b, `<path d="%s" stroke="%s"><title>%s</title></path>`, path(xs, all[i], xa, ya), c, template.HTMLEscapeString(x.Fix))
		fmt.Fprintf(&b, `<text x="%s" y="%s" fill="%s">%s</text>`, markup.Coord(cw-padR-90), markup.Coord(padT+14+float64(i)*14), c, template.HTMLEscapeString(x.Fix))
	}
	b.WriteString(`</svg>`)
	return b.String()
}
