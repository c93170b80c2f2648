package scales

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strconv"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/render/markup"
	"fp16audit/report"
)

// HTML writes the training-log diagnosis as one self-contained page,
// like the audit report: the verdict card, log2(scale) over the steps with
// the skipped steps (each one a backoff of the scale), the warm-up, a
// pinned stretch and where the loss went NaN for good marked, the loss against the fp32
// baseline, the reconstruction, the findings and what the log could not
// tell. It loads nothing from the network; a small inline script shows a
// bucket's numbers under the mouse.
func HTML(w io.Writer, r *report.ScalesReport) error {
	// A bucket may hold ±Inf (the log2 of a scale of 0): the page's data
	// writes it as the report's JSON does, as a string the script shows.
	data, err := report.MarshalNonFinite(struct {
		Series []report.Bucket `json:"series"`
	}{r.Series})
	if err != nil {
		return err
	}
	v := scalesView{
		R:      r,
		Class:  "ok",
		Badge:  "✓",
		Rows:   scaleRows(r),
		Data:   template.JS(data),
		CSS:    template.CSS(markup.PageCSS + scalesCSS),
		Script: template.JS(scalesScript),
	}
	switch r.MaxSeverity() {
	case checks.SevError:
		v.Class, v.Badge = "fail", "✗"
	case checks.SevWarning:
		v.Class, v.Badge = "caution", "!"
	}
	if r.Losses != nil {
		v.Loss = upperFirst(lossSummary(r.Run, r.Losses))
	}
	if r.Comparison != nil {
		v.Comparison = comparisonText(r.Comparison)
	}
	if r.GradScaler != nil {
		v.Scaler = scalerText(r.GradScaler)
	}
	if len(r.Series) > 0 {
		ax := newStepAxis(r.Series)
		if r.Run.HasScales {
			v.ScaleChart = template.HTML(scaleChartSVG(r, ax))
		}
		if r.Run.HasLosses {
			v.LossChart = template.HTML(lossChartSVG(r, ax))
		}
	}
	bw := markup.NewWriter(w, false)
	if err := scalesPage.Execute(bw, v); err != nil {
		return err
	}
	return bw.Err()
}

type scalesView struct {
	R                     *report.ScalesReport
	Class, Badge          string
	Rows                  [][2]string
	Loss, Comparison      string
	Scaler                string
	ScaleChart, LossChart template.HTML
	Data                  template.JS
	CSS                   template.CSS
	Script                template.JS
}

// Geometry of the scales charts, in SVG user units. Both charts share the
// x axis, so a step sits at the same place in each.
const (
	sChartW   = 1200
	sLeft     = 78
	sRight    = 1060
	sTop      = 46
	sPlotH    = 220
	sRugH     = 16 // the skipped-step rug under the scale plot
	sAxisGap  = 6
	sLabelGap = 20
)

// stepAxis maps steps to x: each bucket spans its steps, a step is one
// unit wide.
type stepAxis struct{ from, to float64 }

func newStepAxis(bs []report.Bucket) stepAxis {
	return stepAxis{from: float64(bs[0].From) - 0.5, to: float64(bs[len(bs)-1].To) + 0.5}
}

func (a stepAxis) x(step float64) float64 {
	return sLeft + (step-a.from)/(a.to-a.from)*(sRight-sLeft)
}

// xTicks writes the step axis at y: ticks at round steps, about ten.
func (a stepAxis) xTicks(b *strings.Builder, y float64) {
	span := a.to - a.from
	step := 1.0
	for _, m := range []float64{1, 2, 5} {
		for p := 1.0; p < 1e9; p *= 10 {
			if s := m * p; s*10 >= span && (step == 1 || s < step) && s >= 1 {
				step = s
			}
		}
	}
	fmt.Fprintf(b, `<g class="xaxis">`)
	for s := math.Ceil((a.from+0.5)/step) * step; s <= a.to-0.5; s += step {
		x := markup.Coord(a.x(s))
		fmt.Fprintf(b, `<line x1="%s" x2="%s" y1="%s" y2="%s"/><text x="%s" y="%s">%d</text>`, x, x, markup.Coord(y), markup.Coord(y+5), x, markup.Coord(y+18), int(s))
	}
	fmt.Fprintf(b, `<text x="%s" y="%s" class="xl">step</text></g>`, markup.Coord(sRight+12), markup.Coord(y+18))
}

// nanStep is the step where the loss went NaN/Inf for good, read or
// inferred, and what to call it; the NaN/Inf losses the run went on from
// show in the loss chart's buckets.
func nanStep(r *report.ScalesReport) (step int, label string, ok bool) {
	switch {
	case r.Losses != nil && failing(r.Losses) != nil:
		return *failing(r.Losses), fmt.Sprintf("loss NaN/Inf for good, step %d", *failing(r.Losses)), true
	case r.Scales != nil && r.Scales.InferredNaNStep != nil:
		return *r.Scales.InferredNaNStep, fmt.Sprintf("NaN inferred from the scale, step %d", *r.Scales.InferredNaNStep), true
	}
	return 0, "", false
}

// span shades the steps from..to (both included) of a plot and returns
// its label, to be drawn over everything else: inside the shading's top
// left corner, or its top right with right set (so that a span starting
// where another ends keeps its label apart), at line (0 the first) from
// the top.
func span(b *strings.Builder, ax stepAxis, from, to int, top, height float64, class, label string, right bool, line int) string {
	x0, x1 := ax.x(float64(from)-0.5), ax.x(float64(to)+0.5)
	fmt.Fprintf(b, `<rect class="%s" x="%s" y="%s" width="%s" height="%s"/>`, class, markup.Coord(x0), markup.Coord(top), markup.Coord(max(x1-x0, 1)), markup.Coord(height))
	x, anchor := x0+4, "start"
	if right {
		x, anchor = x1-4, "end"
	}
	return fmt.Sprintf(`<text class="%s-l" x="%s" y="%s" text-anchor="%s">%s</text>`, class, markup.Coord(x), markup.Coord(top+14+15*float64(line)), anchor, template.HTMLEscapeString(label))
}

// nanLine draws where the loss went NaN for good across a plot, labelled at labelY.
func nanLine(b *strings.Builder, r *report.ScalesReport, ax stepAxis, top, bottom, labelY float64) {
	step, label, ok := nanStep(r)
	if !ok {
		return
	}
	x := ax.x(float64(step) - 0.5)
	// The label goes to the side of the line with room for it.
	anchor, dx := "start", 5.0
	if x > sLeft+0.7*(sRight-sLeft) {
		anchor, dx = "end", -5
	}
	fmt.Fprintf(b, `<line class="nan" x1="%s" x2="%s" y1="%s" y2="%s"/><text class="nan-l" x="%s" y="%s" text-anchor="%s">%s</text>`,
		markup.Coord(x), markup.Coord(x), markup.Coord(top), markup.Coord(bottom), markup.Coord(x+dx), markup.Coord(labelY), anchor, template.HTMLEscapeString(label))
}

// legend writes legend entries from x at y; each is an SVG snippet of the
// mark (drawn at 0,0 to 24,0) and its label.
func legend(b *strings.Builder, y float64, entries ...[2]string) {
	x := float64(sLeft)
	for _, e := range entries {
		fmt.Fprintf(b, `<g transform="translate(%s %s)">%s</g><text x="%s" y="%s" class="lg">%s</text>`, markup.Coord(x), markup.Coord(y), e[0], markup.Coord(x+30), markup.Coord(y+4), template.HTMLEscapeString(e[1]))
		x += 44 + 6.9*float64(len([]rune(e[1])))
	}
}

// scaleChartSVG draws log2(scale) over the steps: the lowest scale of each
// bucket as a step line, the range within the bucket as a band, a tick
// under the plot for every skipped step, the warm-up and a pinned stretch
// shaded, and where the loss went NaN for good.
func scaleChartSVG(r *report.ScalesReport, ax stepAxis) string {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, bk := range r.Series {
		if bk.Log2ScaleMin != nil && bk.Log2ScaleMax != nil {
			lo, hi = min(lo, *bk.Log2ScaleMin), max(hi, *bk.Log2ScaleMax)
		}
	}
	if math.IsInf(lo, 0) {
		return ""
	}
	lo, hi = math.Floor(lo)-1, math.Ceil(hi)+1
	bottom := float64(sTop + sPlotH)
	y := func(v float64) float64 { return sTop + (hi-v)/(hi-lo)*sPlotH }
	rugTop := bottom + sAxisGap
	height := rugTop + sRugH + sAxisGap + sLabelGap + 12

	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="scale-chart" class="schart" viewBox="0 0 %d %s" role="img" aria-label="log2 of the loss scale over the steps, skipped steps marked">`, sChartW, markup.Coord(height))
	entries := [][2]string{
		{`<line x2="24" class="scale"/>`, "log2(scale), lowest in the bucket"},
		{`<rect y="-5" width="24" height="10" class="band"/>`, "range in the bucket"},
		{`<line x1="12" x2="12" y1="-7" y2="7" class="skip"/>`, "skipped step (the scale backed off)"}}
	if _, _, ok := nanStep(r); ok {
		entries = append(entries, [2]string{`<line x2="24" class="nan"/>`, "NaN for good"})
	}
	legend(&b, 18, entries...)

	// Grid every 2^k bits, about eight lines.
	gridStep := 1.0
	for (hi-lo)/gridStep > 8 {
		gridStep *= 2
	}
	fmt.Fprintf(&b, `<g class="grid">`)
	for v := math.Ceil(lo/gridStep) * gridStep; v <= hi; v += gridStep {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%s" y2="%s"/><text x="%d" y="%s" class="yl">%s</text>`,
			sLeft, sRight, markup.Coord(y(v)), markup.Coord(y(v)), sLeft-6, markup.Coord(y(v)+4), markup.Pow2(int(v)))
	}
	b.WriteString(`</g>`)

	var labels strings.Builder
	if s := r.Scales; s != nil {
		if s.WarmupSkipped > 0 {
			// Below the top line, where the scale starts.
			labels.WriteString(span(&b, ax, r.Run.FirstStep, r.Run.FirstStep+s.WarmupSkipped-1, sTop, sPlotH, "warmup", fmt.Sprintf("warm-up: %d skipped", s.WarmupSkipped), false, 2))
		}
		switch {
		case s.PinnedSince != nil:
			// Held down from PinnedSince to the end of the judged steps.
			end := r.Run.FirstStep + r.Run.Steps - 1
			if l := r.Losses; l != nil && l.FailingStep != nil {
				end = *l.FailingStep - 1
			}
			labels.WriteString(span(&b, ax, *s.PinnedSince, end, sTop, sPlotH, "pinned",
				"held down at "+report.FormatScale(s.PinnedScale)+" from step "+strconv.Itoa(*s.PinnedSince), true, 0))
		case s.Pinned:
			labels.WriteString(span(&b, ax, s.LongestNoGrowthStart, s.LongestNoGrowthStart+s.LongestNoGrowth-1, sTop, sPlotH, "pinned",
				"pinned at "+report.FormatScale(s.PinnedScale)+", no growth for "+strconv.Itoa(s.LongestNoGrowth)+" steps", true, 0))
		}
	}

	var band, line strings.Builder
	pen := "M"
	for _, bk := range r.Series {
		if bk.Log2ScaleMin == nil || bk.Log2ScaleMax == nil {
			pen = "M"
			continue
		}
		x0, x1 := ax.x(float64(bk.From)-0.5), ax.x(float64(bk.To)+0.5)
		if *bk.Log2ScaleMax > *bk.Log2ScaleMin {
			fmt.Fprintf(&band, "M%s %sH%sV%sH%sZ", markup.Coord(x0), markup.Coord(y(*bk.Log2ScaleMax)), markup.Coord(x1), markup.Coord(y(*bk.Log2ScaleMin)), markup.Coord(x0))
		}
		if pen == "M" {
			fmt.Fprintf(&line, "M%s %s", markup.Coord(x0), markup.Coord(y(*bk.Log2ScaleMin)))
		} else {
			fmt.Fprintf(&line, "V%s", markup.Coord(y(*bk.Log2ScaleMin)))
		}
		fmt.Fprintf(&line, "H%s", markup.Coord(x1))
		pen = "L"
	}
	if band.Len() > 0 {
		fmt.Fprintf(&b, `<path class="band" d="%s"/>`, band.String())
	}
	fmt.Fprintf(&b, `<path class="scale" d="%s"/>`, line.String())

	// The rug: one tick per skipped step when the report lists them all,
	// else a bar per bucket as high as the share of its steps skipped.
	fmt.Fprintf(&b, `<text x="%d" y="%s" class="yl">skipped</text>`, sLeft-6, markup.Coord(rugTop+sRugH-3))
	var rug strings.Builder
	if s := r.Scales; s != nil && !s.SkippedAtTruncated {
		for _, st := range s.SkippedAt {
			x := markup.Coord(ax.x(float64(st)))
			fmt.Fprintf(&rug, "M%s %sV%s", x, markup.Coord(rugTop), markup.Coord(rugTop+sRugH))
		}
		fmt.Fprintf(&b, `<path class="skip" d="%s"/>`, rug.String())
	} else {
		for _, bk := range r.Series {
			if bk.Skipped == 0 {
				continue
			}
			h := sRugH * float64(bk.Skipped) / float64(bk.To-bk.From+1)
			x0, x1 := ax.x(float64(bk.From)-0.5), ax.x(float64(bk.To)+0.5)
			fmt.Fprintf(&rug, "M%s %sH%sV%sH%sZ", markup.Coord(x0), markup.Coord(rugTop+sRugH-h), markup.Coord(x1), markup.Coord(rugTop+sRugH), markup.Coord(x0))
		}
		fmt.Fprintf(&b, `<path class="skipbar" d="%s"/>`, rug.String())
	}
	// On the second line from the top: the first is the pinned stretch's.
	nanLine(&b, r, ax, sTop, rugTop+sRugH, sTop+29)
	b.WriteString(labels.String())
	ax.xTicks(&b, rugTop+sRugH+sAxisGap)
	fmt.Fprintf(&b, `<line class="cursor" x1="0" x2="0" y1="%d" y2="%s" visibility="hidden"/>`, sTop, markup.Coord(rugTop+sRugH))
	fmt.Fprintf(&b, `<rect class="hit" x="%d" y="%d" width="%d" height="%s"/>`, sLeft, sTop, sRight-sLeft, markup.Coord(rugTop+sRugH-sTop))
	b.WriteString(`</svg>`)
	return b.String()
}

// lossChartSVG draws the mean of the finite losses per bucket and the fp32
// baseline's on one scale, marks the buckets that hold NaN/Inf, shades the
// window the final losses were compared over, and where the loss went NaN for good.
func lossChartSVG(r *report.ScalesReport, ax stepAxis) string {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, bk := range r.Series {
		for _, v := range []*float64{bk.Loss, bk.BaselineLoss} {
			if v != nil {
				lo, hi = min(lo, *v), max(hi, *v)
			}
		}
	}
	nanTop := float64(sTop)
	plotTop := nanTop + 22
	bottom := plotTop + sPlotH
	height := bottom + sAxisGap + sLabelGap + 12
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="loss-chart" class="schart" viewBox="0 0 %d %s" role="img" aria-label="loss over the steps against the fp32 baseline, NaN/Inf marked">`, sChartW, markup.Coord(height))
	entries := [][2]string{{`<line x2="24" class="loss"/>`, "loss, mean of the finite ones in the bucket"}}
	if r.Baseline != nil {
		entries = append(entries, [2]string{`<line x2="24" class="base"/>`, "fp32 baseline"})
	}
	for _, bk := range r.Series {
		if bk.NonFinite > 0 {
			entries = append(entries, [2]string{`<rect y="-5" width="24" height="10" class="nanbar"/>`, "NaN/Inf in the bucket"})
			break
		}
	}
	legend(&b, 18, entries...)
	if math.IsInf(lo, 0) {
		fmt.Fprintf(&b, `<text x="%d" y="%s" class="note">no bucket holds a finite loss</text>`, sLeft+10, markup.Coord(plotTop+40))
		lo, hi = 0, 1
	}
	if hi == lo {
		lo, hi = lo-0.5, hi+0.5
	}
	pad := (hi - lo) * 0.06
	lo, hi = lo-pad, hi+pad
	y := func(v float64) float64 { return plotTop + (hi-v)/(hi-lo)*sPlotH }

	fmt.Fprintf(&b, `<g class="grid">`)
	for _, v := range niceTicks(lo, hi, 5) {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%s" y2="%s"/><text x="%d" y="%s" class="yl">%s</text>`,
			sLeft, sRight, markup.Coord(y(v)), markup.Coord(y(v)), sLeft-6, markup.Coord(y(v)+4), strconv.FormatFloat(v, 'g', 4, 64))
	}
	b.WriteString(`</g>`)
	label := ""
	if c := r.Comparison; c != nil && c.Window > 0 {
		end := r.Run.FirstStep + c.Steps - 1
		label = span(&b, ax, end-c.Window+1, end, plotTop, sPlotH, "final", fmt.Sprintf("compared: %+.1f%% vs fp32", 100*c.Gap), true, 0)
	}
	var nan strings.Builder
	for _, bk := range r.Series {
		if bk.NonFinite > 0 {
			x0, x1 := ax.x(float64(bk.From)-0.5), ax.x(float64(bk.To)+0.5)
			fmt.Fprintf(&nan, "M%s %sH%sV%sH%sZ", markup.Coord(x0), markup.Coord(nanTop+4), markup.Coord(x1), markup.Coord(nanTop+16), markup.Coord(x0))
		}
	}
	if nan.Len() > 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%s" class="yl bad">NaN/Inf</text><path class="nanbar" d="%s"/>`, sLeft-6, markup.Coord(nanTop+14), nan.String())
	}
	path := func(val func(report.Bucket) *float64) string {
		var d strings.Builder
		pen := "M"
		for _, bk := range r.Series {
			v := val(bk)
			if v == nil {
				pen = "M" // no finite loss here: a gap, not a line across it
				continue
			}
			fmt.Fprintf(&d, "%s%s %s", pen, markup.Coord(ax.x(float64(bk.From+bk.To)/2)), markup.Coord(y(*v)))
			pen = "L"
		}
		return d.String()
	}
	if r.Baseline != nil {
		fmt.Fprintf(&b, `<path class="base" d="%s"/>`, path(func(bk report.Bucket) *float64 { return bk.BaselineLoss }))
	}
	fmt.Fprintf(&b, `<path class="loss" d="%s"/>`, path(func(bk report.Bucket) *float64 { return bk.Loss }))
	nanLine(&b, r, ax, nanTop, bottom, bottom-8)
	b.WriteString(label)
	ax.xTicks(&b, bottom+sAxisGap)
	fmt.Fprintf(&b, `<line class="cursor" x1="0" x2="0" y1="%s" y2="%s" visibility="hidden"/>`, markup.Coord(nanTop), markup.Coord(bottom))
	fmt.Fprintf(&b, `<rect class="hit" x="%d" y="%s" width="%d" height="%s"/>`, sLeft, markup.Coord(nanTop), sRight-sLeft, markup.Coord(bottom-nanTop))
	b.WriteString(`</svg>`)
	return b.String()
}

// niceTicks returns about n round values between lo and hi.
func niceTicks(lo, hi float64, n int) []float64 {
	raw := (hi - lo) / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	step := p
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			step = m * p
			break
		}
	}
	var out []float64
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		out = append(out, math.Round(v/step)*step)
	}
	return out
}

var scalesFuncs = template.FuncMap{
	"sev":     func(s checks.Severity) string { return s.String() },
	"pct":     func(x float64) string { return strconv.FormatFloat(100*x, 'f', 1, 64) + "%" },
	"run":     describeRun,
	"scale":   report.FormatScale,
	"barpct":  func(x float64) string { return strconv.FormatFloat(math.Min(100, 100*x), 'f', 1, 64) },
	"hasRows": func(rows [][2]string) bool { return len(rows) > 0 },
}

var scalesPage = markup.Page("scales", scalesFuncs, `fp16audit scales: {{.R.Verdict}} — {{.R.Run.Path}}`,
	`<header><h1>fp16audit training-log report</h1><p class="sub"><code>{{.R.Run.Path}}</code> · {{run .R.Run}}{{with .R.Baseline}} · fp32 baseline <code>{{.Path}}</code>{{end}}</p></header>`,
	`<section id="verdict" class="card {{.Class}}">
<h2><span class="badge">{{.Badge}}</span> <span id="verdict-id">{{.R.Verdict}}</span></h2>
<p class="vtext">{{.R.VerdictText}}</p>
{{with .R.Fix}}<p><b>Fix:</b> {{.}}</p>{{end}}{{with .R.Captures}}<ul class="captures">{{range .}}<li>{{if .Decides}}<b>{{end}}capture of step {{.Step}} ({{.Trigger}}){{if .Decides}}</b>{{end}}: {{if .Replay}}<code>{{.Replay}}</code>{{else}}failed to write: {{.Error}}{{end}}</li>{{end}}</ul>{{end}}
{{with .Loss}}<p class="small">{{.}}.</p>{{end}}
{{with .Comparison}}<p class="small">Against the fp32 baseline: {{.}}.</p>{{end}}
</section>

{{if .ScaleChart}}<section class="card">
<h2>Loss scale</h2>
<div class="chartbox">{{.ScaleChart}}</div>
</section>{{else}}<section class="card"><h2>Loss scale</h2><p class="small">The log has no scales: skipped steps, backoffs and the scale before a NaN cannot be shown.</p></section>{{end}}

{{if .LossChart}}<section class="card">
<h2>Loss{{if .R.Baseline}} against the fp32 baseline{{end}}</h2>
<div class="chartbox">{{.LossChart}}</div>
</section>{{end}}
<div id="tip" hidden></div>

{{if .R.Findings}}<section class="card">
<h2>Findings ({{len .R.Findings}})</h2>
<table class="plain"><thead><tr><th>severity</th><th>check</th><th>message</th></tr></thead><tbody>
{{range .R.Findings}}<tr class="sev-{{sev .Severity}}"><td>{{sev .Severity}}</td><td><code>{{.Check}}</code></td><td>{{.Message}}</td></tr>
{{end}}</tbody></table>
</section>{{end}}

{{if hasRows .Rows}}<section class="card">
<h2>Scale history</h2>
<dl class="kv">{{range .Rows}}<dt>{{index . 0}}</dt><dd>{{index . 1}}</dd>
{{end}}</dl>
{{if .R.Epochs}}<h3>Skipped steps per epoch</h3>
<table class="plain epochs"><thead><tr><th class="num">epoch</th><th class="num">steps</th><th class="num">skipped</th><th class="num">rate</th><th></th></tr></thead><tbody>
{{range .R.Epochs}}<tr><td class="num">{{.Epoch}}</td><td class="num">{{.Steps}}</td><td class="num">{{.Skipped}}</td><td class="num">{{pct .SkipRate}}</td><td class="barcell"><span class="bar" style="width:{{barpct .SkipRate}}%"></span></td></tr>
{{end}}</tbody></table>{{end}}
</section>{{end}}

{{if or .R.NotDerived .R.Notes}}<section class="card">
<h2>What the log could not tell</h2>
{{if .R.NotDerived}}<ul class="notes">{{range .R.NotDerived}}<li>{{.}}</li>{{end}}</ul>{{else}}<p class="small">Nothing: every part of the diagnosis was derived.</p>{{end}}
{{if .R.Notes}}<h3>Notes</h3><ul class="notes">{{range .R.Notes}}<li>{{.}}</li>{{end}}</ul>{{end}}
</section>{{end}}

<section class="card">
<h2>Logs and thresholds</h2>
<dl class="kv">
<dt>run</dt><dd><code>{{.R.Run.Path}}</code>: {{run .R.Run}}</dd>
{{with .R.Baseline}}<dt>fp32 baseline</dt><dd><code>{{.Path}}</code>: {{run .}}</dd>
{{end}}{{with .Scaler}}<dt>GradScaler</dt><dd>{{.}}</dd>
{{end}}<dt>thresholds</dt><dd>plateau tolerance {{pct .R.Thresholds.PlateauTolerance}}, early NaN within {{.R.Thresholds.EarlySteps}} steps (or the first epoch), skip rate {{pct .R.Thresholds.SkipRate}}, low scale {{scale .R.Thresholds.LowScale}}, pinned after {{.R.Thresholds.PinnedIntervals}} growth intervals, collapse {{.R.Thresholds.CollapseBits}} bits, warm-up {{.R.Thresholds.WarmupSkips}} skips{{with .R.Thresholds.LostMassTolerance}}, gradient mass lost {{pct .}}{{end}}</dd>
{{if and .R.Checks (ne .R.Checks "all")}}<dt>checks</dt><dd><code>{{.R.Checks}}</code></dd>
{{end}}<dt>schema</dt><dd>{{.R.Schema}}</dd>
</dl>
</section>
`)

const scalesCSS = `
.chartbox{position:relative}
.schart{width:100%;height:auto;display:block}
.schart text{font-size:12px;fill:var(--ink)}
.schart .lg{font-size:13px}
.schart .note{fill:var(--mute)}
.schart .yl{text-anchor:end;fill:var(--mute)}
.schart .yl.bad{fill:var(--bad);font-weight:600}
.schart .xl{fill:var(--mute)}
.schart .grid line{stroke:#eceef1}
.schart .xaxis line{stroke:#9aa0a6}
.schart .xaxis text{text-anchor:middle;fill:var(--mute)}
.schart .scale{fill:none;stroke:#1c4f9c;stroke-width:2.5}
.schart .band{fill:#a5c8ff;opacity:.55;stroke:none}
.schart .skip{stroke:#e03131;stroke-width:1.5}
.schart .skipbar,.schart .nanbar{fill:#e03131}
.schart .loss{fill:none;stroke:#e8590c;stroke-width:2.5}
.schart .base{fill:none;stroke:#2f9e44;stroke-width:2;stroke-dasharray:7 4}
.schart .nan{stroke:var(--bad);stroke-width:1.5;stroke-dasharray:5 3}
.schart .nan-l{fill:var(--bad);font-weight:700}
.schart .warmup{fill:#fff3bf;opacity:.8}
.schart .warmup-l{fill:#946200}
.schart .pinned{fill:#ffe3e3;opacity:.7}
.schart .pinned-l{fill:var(--bad)}
.schart .final{fill:#e6fcf5}
.schart .final-l{fill:#087f5b}
.schart .cursor{stroke:#495057;stroke-width:1}
.schart .hit{fill:transparent;cursor:crosshair}
#tip{position:absolute;background:#fff;border:1px solid #adb5bd;border-radius:6px;box-shadow:0 2px 10px rgba(0,0,0,.15);padding:6px 10px;font-size:12.5px;pointer-events:none}
#tip td{padding:0 6px}
#tip td:last-child{text-align:right}
table.epochs{width:auto}
.barcell{width:220px}
.bar{display:inline-block;height:10px;background:#e03131;vertical-align:middle}
`

// scalesScript shows a bucket's numbers under the mouse in either chart,
// with a cursor in both. It marks <body> with data-ready="1" when it
// finished without an exception, and data-error otherwise.
const scalesScript = `
(function () {
  "use strict";
  var body = document.body;
  window.addEventListener("error", function (e) { body.setAttribute("data-error", String(e.message)); });
  try {
    main();
    body.setAttribute("data-ready", "1");
  } catch (e) {
    body.setAttribute("data-error", String((e && e.stack) || e));
    throw e;
  }

  function main() {
    var S = JSON.parse(document.getElementById("fp16audit-data").textContent).series;
    var tip = document.getElementById("tip");
    var charts = Array.prototype.slice.call(document.querySelectorAll("svg.schart"));
    if (!S.length) return;
    var from = S[0].from - 0.5, to = S[S.length - 1].to + 0.5;
    function f4(x) { return x === undefined || x === null ? "–" : typeof x === "string" ? x : String(+x.toPrecision(4)); }
    function pow2(x) { return "2^" + (typeof x === "string" ? x : Math.round(x * 100) / 100); }
    function bucketAt(step) {
      for (var i = 0; i < S.length; i++) if (step <= S[i].to + 0.5) return S[i];
      return S[S.length - 1];
    }
    charts.forEach(function (svg) {
      var hit = svg.querySelector(".hit");
      if (!hit) return;
      var L = +hit.getAttribute("x"), W = +hit.getAttribute("width");
      hit.addEventListener("mousemove", function (ev) {
        var p = svg.createSVGPoint();
        p.x = ev.clientX; p.y = ev.clientY;
        var sx = p.matrixTransform(svg.getScreenCTM().inverse()).x;
        var b = bucketAt(from + (sx - L) / W * (to - from));
        charts.forEach(function (c) {
          var cur = c.querySelector(".cursor");
          if (!cur) return;
          cur.setAttribute("x1", sx); cur.setAttribute("x2", sx); cur.setAttribute("visibility", "visible");
        });
        var rows = [["steps", b.from === b.to ? String(b.from) : b.from + "–" + b.to]];
        if (b.log2_scale_min !== undefined) rows.push(["scale", b.log2_scale_min === b.log2_scale_max ? pow2(b.log2_scale_min) : pow2(b.log2_scale_min) + " … " + pow2(b.log2_scale_max)]);
        if (b.log2_scale_min !== undefined) rows.push(["skipped", String(b.skipped || 0)]);
        if (b.loss !== undefined || b.nonfinite) rows.push(["loss", f4(b.loss)]);
        if (b.baseline_loss !== undefined) rows.push(["fp32 loss", f4(b.baseline_loss)]);
        if (b.nonfinite) rows.push(["NaN/Inf losses", String(b.nonfinite)]);
        tip.innerHTML = "<table>" + rows.map(function (r) { return "<tr><td>" + r[0] + "</td><td>" + r[1] + "</td></tr>"; }).join("") + "</table>";
        tip.hidden = false;
        tip.style.left = (ev.pageX + 14) + "px";
        tip.style.top = (ev.pageY + 14) + "px";
      });
      hit.addEventListener("mouseleave", function () {
        tip.hidden = true;
        charts.forEach(function (c) { var cur = c.querySelector(".cursor"); if (cur) cur.setAttribute("visibility", "hidden"); });
      });
    });
  }
})();
`
