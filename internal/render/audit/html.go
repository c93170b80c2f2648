package audit

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/render/markup"
	"fp16audit/report"
)

// HTML writes r as one self-contained page: a verdict card, an SVG chart of
// log2 max|x| per node in every pass against the fp16 limits, the node
// table (sorted, filtered and paged by a little inline script from an
// embedded JSON copy of the statistics), the input statistics and the model
// summary. It loads nothing from the network. The chart draws one SVG path
// per series, so its size grows by a few bytes per node.
func HTML(w io.Writer, r *report.Report) error {
	data, err := htmlData(r)
	if err != nil {
		return err
	}
	v := htmlView{
		R:        r,
		Mood:     overallMood(r),
		Headline: headline(r),
		Chart:    template.HTML(chartSVG(r)),
		Data:     template.JS(data),
		Emulated: emulatedPasses(r),
		Hidden:   hiddenConstants(r),
		Grouped:  shownBlocks(r) != nil,
		CSS:      template.CSS(markup.PageCSS),
		Script:   template.JS(htmlScript),
	}
	v.Findings = r.Findings
	if len(v.Findings) > htmlFindings {
		v.Findings, v.FindingsCut = v.Findings[:htmlFindings], len(r.Findings)-htmlFindings
	}
	bw := markup.NewWriter(w, false)
	if err := htmlPage.Execute(bw, v); err != nil {
		return err
	}
	return bw.Err()
}

// htmlFindings is the most findings the page lists.
const htmlFindings = 1000

type htmlView struct {
	R *report.Report
	// Hidden counts the constant-only nodes the table leaves out until
	// the reader asks for them.
	Hidden int
	// Grouped says the node table groups its rows by block.
	Grouped     bool
	Findings    []checks.Finding
	FindingsCut int
	// Mood is the verdict card's look: ok, caution or fail, the worst of
	// the Headline's outcomes.
	Mood     string
	Headline []outcome
	Chart    template.HTML
	Data     template.JS
	Emulated []string
	CSS      template.CSS
	Script   template.JS
}

// num is a float written to the page's JSON with 4 significant digits,
// which is all the page shows.
type num float64

func (x num) MarshalJSON() ([]byte, error) {
	f := float64(x)
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, f, 'g', 4, 64), nil
}

// Node flags in the page's JSON.
const (
	nodeFlagged = 1 // NaN/Inf in some pass
	nodeHidden  = 2 // constant-only: out of the table until asked for
)

// htmlData is the JSON the page's script reads: the passes, the origins'
// node positions, the positions the chart plots (chartNodes), a table of
// repeated strings, and per node [index, name, op, module, precision,
// flags, outputs, provenance, block], each output [name, shape, stats per pass],
// each stats [max|x|, nan, +inf, -inf, extra] or null, where extra is the
// headroom for fp32 and the relative error against fp32 for the other
// passes (null where there is none). Op, precision, provenance and shape
// are indexes into the string table. An output name equal to the node name
// plus "_output_0" (the exporters' default) is sent as "" and rebuilt by
// the script. For a 20 000-node model this is most of the page. With
// repeated blocks the node table's rows are grouped by block: blocks holds
// [module, nodes, flagged, max|x| held in 16 bit, first NaN/Inf] per group
// and a node's block is an index into it (absent without blocks).
func htmlData(r *report.Report) (string, error) {
	type page struct {
		Passes  []string `json:"passes"`
		Origins []int    `json:"origins"`
		Chart   []int    `json:"chart"`
		Strings []string `json:"strings"`
		Nodes   [][]any  `json:"nodes"`
		// Blocks are the row groups of the node table (blockGroups).
		Blocks [][]any `json:"blocks,omitempty"`
	}
	p := page{Passes: r.Passes, Origins: append([]int{}, originPositions(r)...), Chart: append([]int{}, chartNodes(r)...),
		Strings: []string{}, Nodes: make([][]any, len(r.Nodes))}
	if p.Passes == nil {
		p.Passes = []string{}
	}
	index := map[string]int{}
	str := func(s string) int {
		i, ok := index[s]
		if !ok {
			i = len(p.Strings)
			index[s] = i
			p.Strings = append(p.Strings, s)
		}
		return i
	}
	opt := func(x *float64) any {
		if x == nil {
			return nil
		}
		return num(*x)
	}
	for i, n := range r.Nodes {
		outs := make([]any, len(n.Outputs))
		for j, o := range n.Outputs {
			stats := make([]any, len(r.Passes))
			for k, ps := range r.Passes {
				s, ok := o.Stats[ps]
				if !ok {
					continue
				}
				extra := opt(s.RelErr)
				if ps == report.PassFP32 {
					extra = nil // values held in fp32 have no headroom to lose
					if heldInHalf(n.Precision) {
						extra = opt(s.HeadroomBits)
					}
				}
				stats[k] = []any{opt(s.MaxAbs), s.NaN, s.PosInf, s.NegInf, extra}
			}
			name := o.Name
			if name == n.Name+"_output_0" {
				name = ""
			}
			outs[j] = []any{name, str(o.Shape), stats}
		}
		flags := 0
		if n.Flagged {
			flags |= nodeFlagged
		}
		if !shownNode(r, n, false) {
			flags |= nodeHidden
		}
		p.Nodes[i] = []any{n.Index, n.Name, str(n.OpType), n.Module, str(precisionLabel(n.Precision, n.Provenance, false)), flags, outs,
			str(provenanceText(n.Provenance, true))}
	}
	if groups, of := blockGroups(r); groups != nil {
		p.Blocks = groups
		for i := range p.Nodes {
			p.Nodes[i] = append(p.Nodes[i], of[i])
		}
	}
	b, err := json.Marshal(p)
	return string(b), err
}

// chartNodes are the positions in r.Nodes the chart plots, left to right:
// the nodes with statistics of a float output, less the constant-only ones
// the node table hides. Leaving the others out, instead of leaving gaps,
// keeps the lines continuous.
func chartNodes(r *report.Report) []int {
	var pos []int
	for i, n := range r.Nodes {
		if !shownNode(r, n, false) {
			continue
		}
		if slices.ContainsFunc(n.Outputs, func(v report.ValueReport) bool { return len(v.Stats) > 0 }) {
			pos = append(pos, i)
		}
	}
	return pos
}

// originPositions are the positions in r.Nodes of the origin nodes (an
// input origin has none).
func originPositions(r *report.Report) []int {
	var pos []int
	for _, o := range r.Origins {
		if o.Index < 0 {
			continue
		}
		for i, n := range r.Nodes {
			if n.Index == o.Index {
				pos = append(pos, i)
				break
			}
		}
	}
	return pos
}

// Chart geometry, in SVG user units.
const (
	chartW     = 1200
	chartH     = 470
	plotLeft   = 62
	plotRight  = 1040
	plotTop    = 56
	plotBottom = 420
)

// fp16 limits as log2 values.
var (
	log2FP16Max  = math.Log2(65504)
	log2FP16Norm = -14.0
	log2FP16Sub  = -24.0
)

var seriesColors = []string{"#1c4f9c", "#e8590c", "#2f9e44", "#ae3ec9", "#1098ad"}

// chartSVG draws log2 max|x| of every node in every pass. The plot is a
// nested <svg> whose user units are (node position, -log2 max|x|) and whose
// viewBox the script narrows to zoom; strokes do not scale with it.
//
// The lines and the axis follow the values held in reduced precision, the
// ones fp16's range matters to (every value when the policy holds none):
// a mask constant of -3.4e38 held in fp32, which softmax absorbs, would
// otherwise stretch the axis to 2^128 and flatten everything else. Values
// held in fp32 are grey dots at their fp32 max |x|, on the top edge when
// beyond the axis.
func chartSVG(r *report.Report) string {
	plotted := chartNodes(r)
	n := len(plotted)
	scaled, axis := chartScaled(r, plotted)
	// Per plotted node and pass: log2 of the largest max|x| over its
	// outputs, and whether an output held NaN/Inf. This is a choice of what
	// to draw, not a new statistic.
	type point struct {
		y        float64
		has      bool
		bad      bool
		overflow bool
	}
	series := make([][]point, len(r.Passes))
	lo, hi := -16.0, 17.0
	for k, ps := range r.Passes {
		series[k] = make([]point, n)
		for i, pos := range plotted {
			node := r.Nodes[pos]
			pt := point{y: math.Inf(-1)}
			for _, o := range node.Outputs {
				s, ok := o.Stats[ps]
				if !ok {
					continue
				}
				pt.has = true
				if s.NonFinite() > 0 {
					pt.bad = true
				}
				if s.AboveFP16Max > 0 {
					pt.overflow = true
				}
				if s.MaxAbs != nil && *s.MaxAbs > 0 {
					pt.y = math.Max(pt.y, math.Log2(*s.MaxAbs))
				}
			}
			if !math.IsInf(pt.y, -1) && axis[i] {
				lo = math.Min(lo, math.Floor(pt.y)-2)
				hi = math.Max(hi, math.Ceil(pt.y)+1)
			}
			series[k][i] = pt
		}
	}
	yBad := hi + 2 // the NaN/Inf band
	top := hi + 3.5
	pw, ph := float64(plotRight-plotLeft), float64(plotBottom-plotTop)
	py := func(v float64) float64 { return plotTop + (top-v)/(top-lo)*ph }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="chart" viewBox="0 0 %d %d" role="img" aria-label="log2 max|x| per node and pass against the fp16 limits" data-lo="%s" data-top="%s" data-n="%d">`,
		chartW, chartH, markup.Coord(lo), markup.Coord(top), n)
	// Legend.
	x := float64(plotLeft)
	for k, ps := range r.Passes {
		label := ps + " (emulated)"
		if ps == report.PassFP32 {
			label = "fp32 (reference)"
		}
		fmt.Fprintf(&b, `<line x1="%s" y1="18" x2="%s" y2="18" stroke="%s" stroke-width="3"%s/><text x="%s" y="22" class="lg">%s</text>`,
			markup.Coord(x), markup.Coord(x+24), seriesColor(k), dash(k), markup.Coord(x+30), template.HTMLEscapeString(label))
		x += 46 + 7.2*float64(len(label))
	}
	fmt.Fprintf(&b, `<circle cx="%s" cy="18" r="4.5" fill="#e03131"/><text x="%s" y="22" class="lg">above 65504 in fp32</text>`, markup.Coord(x+6), markup.Coord(x+16))
	x += 170
	fmt.Fprintf(&b, `<rect x="%s" y="13" width="16" height="10" fill="#fa5252"/><text x="%s" y="22" class="lg">flagged node (NaN/Inf in some pass)</text>`, markup.Coord(x), markup.Coord(x+22))
	if slices.Contains(scaled, false) {
		x += 272
		fmt.Fprintf(&b, `<circle cx="%s" cy="18" r="4" fill="#868e96"/><text x="%s" y="22" class="lg">held in fp32</text>`, markup.Coord(x+6), markup.Coord(x+16))
	}
	note := "log2 max |x| per node with float outputs, topological order"
	if slices.Contains(scaled, false) {
		note = "log2 max |x| per node, topological order; the axis follows the values held in 16 bit (top edge: beyond it)"
	}
	fmt.Fprintf(&b, `<text x="%d" y="44" class="note">%s — drag to zoom, double-click to reset, click a node for its row</text>`, plotLeft, note)

	// Horizontal grid and y labels every 8 bits.
	fmt.Fprintf(&b, `<g class="grid">`)
	for v := math.Ceil(lo/8) * 8; v <= hi; v += 8 {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%s" y2="%s"/><text x="%d" y="%s" class="yl">%s</text>`,
			plotLeft, plotRight, markup.Coord(py(v)), markup.Coord(py(v)), plotLeft-6, markup.Coord(py(v)+4), markup.Pow2(int(v)))
	}
	fmt.Fprintf(&b, `</g><rect x="%d" y="%s" width="%s" height="%s" class="badband"/>`, plotLeft, markup.Coord(py(top)), markup.Coord(pw), markup.Coord(py(hi+1)-py(top)))
	fmt.Fprintf(&b, `<text x="%d" y="%s" class="yl bad">NaN/Inf</text>`, plotLeft-6, markup.Coord(py(yBad)+4))
	limit := func(v float64, class, label, sub string) {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%s" y2="%s" class="%s"/><text x="%d" y="%s" class="rl %s">%s</text>`,
			plotLeft, plotRight, markup.Coord(py(v)), markup.Coord(py(v)), class, plotRight+6, markup.Coord(py(v)+4), class, label)
		if sub != "" {
			fmt.Fprintf(&b, `<text x="%d" y="%s" class="rl sub">%s</text>`, plotRight+6, markup.Coord(py(v)+17), sub)
		}
	}
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%s" y2="%s" class="bad"/>`, plotLeft, plotRight, markup.Coord(py(yBad)), markup.Coord(py(yBad)))
	limit(log2FP16Max, "max", "fp16 max 65504", "above: Inf in fp16")
	limit(log2FP16Norm, "uf", "2⁻¹⁴ min normal", "below: subnormal in fp16")
	if lo < log2FP16Sub {
		limit(log2FP16Sub, "uf", "2⁻²⁴ min subnormal", "below: 0 in fp16")
	}

	// The plot.
	fmt.Fprintf(&b, `<svg id="plot" x="%d" y="%d" width="%s" height="%s" viewBox="%s %s %d %s" preserveAspectRatio="none">`,
		plotLeft, plotTop, markup.Coord(pw), markup.Coord(ph), markup.Coord(-0.5), markup.Coord(-top), max(n, 1), markup.Coord(top-lo))
	// Flagged nodes: a red rug along the bottom, one rectangle per run.
	rug := (top - lo) * 0.03
	var flaggedPath strings.Builder
	flagged := func(i int) bool { return r.Nodes[plotted[i]].Flagged }
	for i := 0; i < n; {
		if !flagged(i) {
			i++
			continue
		}
		j := i
		for j+1 < n && flagged(j+1) {
			j++
		}
		fmt.Fprintf(&flaggedPath, "M%s %sH%sV%sH%sZ", markup.Coord(float64(i)-0.5), markup.Coord(-(lo + rug)), markup.Coord(float64(j)+0.5), markup.Coord(-lo), markup.Coord(float64(i)-0.5))
		i = j + 1
	}
	if flaggedPath.Len() > 0 {
		fmt.Fprintf(&b, `<path class="flagged" d="%s"/>`, flaggedPath.String())
	}
	for k := range r.Passes {
		var d strings.Builder
		pen := "M"
		for i, pt := range series[k] {
			if !pt.has || !scaled[i] {
				continue // a pass without this value, or a value held in fp32: the line goes on to the next
			}
			y := pt.y
			switch {
			case pt.bad:
				y = yBad
			case math.IsInf(y, -1):
				y = lo
			case y > hi:
				y = hi + 0.5 // off the axis: on the top edge, marked below
			}
			fmt.Fprintf(&d, "%s%d %s", pen, i, markup.Coord(-y))
			pen = " "
		}
		width := "2"
		if r.Passes[k] == report.PassFP32 {
			width = "4.5" // the reference, drawn wide under the others
		}
		fmt.Fprintf(&b, `<path class="series" d="%s" stroke="%s" stroke-width="%s" data-pass="%s"%s/>`, d.String(), seriesColor(k), width, template.HTMLEscapeString(r.Passes[k]), dash(k))
	}
	if k := passIndex(r, report.PassFP32); k >= 0 {
		var d, held, off strings.Builder
		for i, pt := range series[k] {
			switch {
			case math.IsInf(pt.y, -1):
			case pt.y > hi:
				fmt.Fprintf(&off, "M%d %sh0", i, markup.Coord(-(hi + 0.5)))
			case !scaled[i]:
				fmt.Fprintf(&held, "M%d %sh0", i, markup.Coord(-math.Max(pt.y, lo)))
			case pt.overflow:
				fmt.Fprintf(&d, "M%d %sh0", i, markup.Coord(-pt.y))
			}
		}
		for _, p := range []struct {
			class string
			d     *strings.Builder
		}{{"held", &held}, {"offscale", &off}, {"dots", &d}} {
			if p.d.Len() > 0 {
				fmt.Fprintf(&b, `<path class="%s" d="%s"/>`, p.class, p.d.String())
			}
		}
	}
	b.WriteString(`</svg>`)

	// Origins: a line and a label each, placed by the script when zoomed.
	for _, pos := range originPositions(r) {
		i := slices.Index(plotted, pos)
		if i < 0 {
			continue
		}
		o := r.Nodes[pos]
		label := "origin: " + moduleOrModel(o.Module) + " (" + o.OpType + ")"
		anchor := "start"
		if float64(i) > 0.6*float64(n) {
			anchor = "end"
		}
		xp := plotLeft + (float64(i)+0.5)/float64(max(n, 1))*pw
		fmt.Fprintf(&b, `<g class="origin" data-i="%d"><line x1="%s" x2="%s" y1="%d" y2="%d"/><text x="%s" y="%s" text-anchor="%s">%s</text></g>`,
			i, markup.Coord(xp), markup.Coord(xp), plotTop, plotBottom, markup.Coord(xp), markup.Coord(py(hi+1)+16), anchor, template.HTMLEscapeString(label))
	}
	fmt.Fprintf(&b, `<g id="xaxis"></g><text x="%s" y="%d" class="xl">node (topological order)</text>`, markup.Coord(plotLeft+pw/2), chartH-8)
	fmt.Fprintf(&b, `<line id="cursor" x1="0" x2="0" y1="%d" y2="%d" visibility="hidden"/><rect id="brush" x="0" y="%d" width="0" height="%s" visibility="hidden"/>`,
		plotTop, plotBottom, plotTop, markup.Coord(ph))
	fmt.Fprintf(&b, `<rect id="hit" x="%d" y="%d" width="%s" height="%s"/>`, plotLeft, plotTop, markup.Coord(pw), markup.Coord(ph))
	b.WriteString(`</svg>`)
	return b.String()
}

// chartScaled marks the plotted nodes the lines run through, those held
// in reduced precision and the origins (every node when none is held in
// reduced precision: the fp32 policy), and among them the ones that set
// the axis: the origins and the values that stay finite in every emulated
// pass. A constant beyond the format's range that the emulation turns
// into Inf (a -3.4e38 mask fill held in fp16, absorbed by softmax) is on
// its line but sets no scale: it is drawn on the top edge.
func chartScaled(r *report.Report, plotted []int) (scaled, axis []bool) {
	scaled, axis = make([]bool, len(plotted)), make([]bool, len(plotted))
	some, emulated := false, emulatedPasses(r)
	for i, pos := range plotted {
		if heldInHalf(r.Nodes[pos].Precision) {
			scaled[i], some = true, true
		}
	}
	for i, pos := range plotted {
		n := r.Nodes[pos]
		origin := isOrigin(r, n.Index)
		scaled[i] = scaled[i] || !some || origin
		axis[i] = scaled[i] && (origin || !slices.ContainsFunc(emulated, func(p string) bool { return n.NonFiniteIn(p) }))
	}
	return scaled, axis
}

func seriesColor(k int) string { return seriesColors[k%len(seriesColors)] }

// dash draws the third and later series dashed so overlapping lines stay
// distinguishable.
func dash(k int) string {
	if k >= 2 {
		return ` stroke-dasharray="6 4"`
	}
	return ""
}

func passIndex(r *report.Report, pass string) int {
	for k, p := range r.Passes {
		if p == pass {
			return k
		}
	}
	return -1
}

var htmlFuncs = template.FuncMap{
	"mag":    formatMag,
	"optMag": formatOpt,
	"opt4": func(x *float64) string {
		return optional(x, func(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) })
	},
	"statsFinite":     statsFinite,
	"headroomSummary": headroomSummary,
	"precLabel":       func(p string, prov *report.Provenance) string { return precisionLabel(p, prov, true) },
	"isInput":         func(o report.Origin) bool { return originCause(o) == report.CauseInput || atInput(o) },
	"inputShape":      inputShape,
	"originFacts":     originFacts,
	"originWhy":       originWhy,
	"originTitle":     originTitle,
	"agreements":      agreements,
	"headroom":        headroomText,
	"module":          moduleOrModel,
	"opsets":          opsetString,
	"floats":          floats,
	"join":            strings.Join,
	"f4":              func(x float64) string { return strconv.FormatFloat(x, 'g', 4, 64) },
	"sev":             func(s checks.Severity) string { return s.String() },
	"stat": func(v report.ValueReport, pass string) *report.StatsReport {
		if s, ok := v.Stats[pass]; ok {
			return &s
		}
		return nil
	},
	"secs": func(s float64) string { return strconv.FormatFloat(s, 'f', 2, 64) },

	"training": trainingHTML, // train.go
	"blocks":   blocksHTML,   // blocks.go
}

var htmlPage = markup.Page("page", htmlFuncs, `fp16audit: {{.R.Verdict}} — {{.R.Model.Path}}`,
	`<header><h1>fp16audit report</h1><p class="sub"><code>{{.R.Model.Path}}</code> · policy <b>{{.R.Policy}}</b> · fp16audit {{.R.Tool.Version}}</p></header>`,
	`<section id="verdict" class="card {{.Mood}}">
{{if eq (len .Headline) 1}}<h2><span class="badge">{{(index .Headline 0).Mark}}</span> <span id="verdict-id">{{.R.Verdict}}</span></h2>
<p class="vtext">{{.R.VerdictText}}</p>
{{else}}{{range .Headline}}<h2 class="{{.Mood}}"><span class="badge">{{.Mark}}</span> {{.Label}}: <span{{if eq .Label "forward"}} id="verdict-id"{{end}}>{{.Verdict}}</span></h2>
<p class="vtext">{{.Text}}</p>
{{end}}{{end}}{{range .R.Origins}}<div class="origin-box">
<h3>{{originTitle .}}</h3>
<dl class="kv">
{{if isInput .}}<dt>input</dt><dd><code>{{.Input}}</code>{{inputShape $.R .Input}}</dd>
{{else}}<dt>node</dt><dd><code>{{.Node}}</code> ({{.OpType}}, computes in {{precLabel .Precision .Provenance}}, {{.Pass}} pass)</dd>
<dt>module</dt><dd><code>{{module .Module}}</code></dd>
{{end}}<dt>cause</dt><dd>{{originFacts $.R .}}</dd>
{{with originWhy .}}<dt>precision</dt><dd><b>{{.}}</b></dd>
{{end}}<dt>reached</dt><dd>{{len .Affected}} downstream node(s); graph outputs: {{if .AffectedOutputs}}{{range $i, $o := .AffectedOutputs}}{{if $i}}, {{end}}<code>{{$o}}</code>{{end}}{{else}}none{{end}}{{if .WrongOutputs}}; finite but wrong: {{range $i, $o := .WrongOutputs}}{{if $i}}, {{end}}<code>{{$o}}</code>{{end}}{{end}}</dd>
</dl></div>{{end}}
{{if .R.Fixes}}<h3>Fixes, verified by rerun</h3>
<ul class="fixes">{{range .R.Fixes}}
<li class="{{if .Works}}works{{else}}fails{{end}}"><span class="fk">{{if .Works}}✓{{else}}✗{{end}} {{.Kind}}</span> <span class="ba">NaN/Inf values {{.NonFiniteBefore}} → {{.NonFiniteAfter}}</span><br>{{.Summary}}
{{range .Normalize}}<div class="snip">input <code>{{.Input}}</code>: mean {{floats .Mean}}, std {{floats .Std}}{{if .Fastai}}<pre># fastai
{{.Fastai}}</pre>{{end}}{{if .Torch}}<pre># PyTorch
{{.Torch}}</pre>{{end}}</div>{{end}}
{{if .Modules}}<div class="snip">modules kept in fp32: {{range $i, $m := .Modules}}{{if $i}}, {{end}}<code>{{$m}}</code>{{end}}<br>ONNX nodes (node_block_list): {{range $i, $m := .Nodes}}{{if $i}}, {{end}}<code>{{$m}}</code>{{end}}</div>{{end}}
</li>{{end}}
</ul>{{end}}
{{with agreements .R}}<h3>Outputs against fp32</h3>
<table class="plain"><thead><tr><th>pass</th><th>output</th><th>outcome</th><th class="num" title="relative L2 error ‖y − y32‖/‖y32‖ of the worst sample; the tolerance judges it">worst sample</th><th>where</th><th class="num">all samples</th><th class="num" title="max |y − y32| / max |y32|">max error</th><th class="num" title="rows of class scores whose top class is fp32's">top-1</th><th class="num">NaN/Inf</th></tr></thead><tbody>
{{range .}}<tr{{if .Bad}} class="sev-error"{{end}}><td>{{.Pass}}</td><td><code>{{.Output}}</code></td><td>{{.Outcome}}</td><td class="num">{{.Worst}}</td><td>{{.Where}}</td><td class="num">{{.Overall}}</td><td class="num">{{.MaxRel}}</td><td class="num">{{.Top1}}</td><td class="num">{{.NonFinite}}</td></tr>
{{end}}</tbody></table>{{end}}
{{with headroomSummary .R.Summary}}<p class="small">{{.}}.</p>{{end}}
</section>

<section class="card">
<h2>Magnitudes per node</h2>
<div id="chartbox">{{.Chart}}<div id="tip" hidden></div></div>
</section>
{{blocks .R}}

{{training .R.Training}}{{if .R.Findings}}<section class="card">
<h2>Findings ({{len .R.Findings}})</h2>
<table class="plain"><thead><tr><th>severity</th><th>check</th><th>message</th></tr></thead><tbody>
{{range .Findings}}<tr class="sev-{{sev .Severity}}"><td>{{sev .Severity}}</td><td><code>{{.Check}}</code></td><td>{{.Message}}</td></tr>
{{end}}</tbody></table>
{{with .FindingsCut}}<p class="small">{{.}} more findings are in the JSON and text reports.</p>{{end}}
</section>{{end}}

<section class="card">
<h2>Nodes</h2>
<div class="controls">
<label>op type <select id="f-op"><option value="">all</option></select></label>
<label><input type="checkbox" id="f-flagged"> flagged only</label>
{{with .Hidden}}<label title="nodes that compute only from initializers and constants: the exporter's Identity of a shared weight, constant folding leftovers"><input type="checkbox" id="f-const"> constant-only nodes ({{.}})</label>
{{end}}{{if .Grouped}}<label title="rows under a line per module block, closed until clicked; sorting or filtering lists the rows alone"><input type="checkbox" id="f-group" checked> group by block</label>
{{end}}<label>name or module <input type="search" id="f-text" placeholder="filter"></label>
<span id="count"></span>
</div>
<noscript><p>The node table needs JavaScript; <code>fp16audit render REPORT.json --format text</code> prints it.</p></noscript>
<div class="tablebox"><table id="nodes"><thead><tr>
<th data-k="0" class="num">#</th><th data-k="1">node</th><th data-k="2">op</th><th data-k="4">prec</th><th data-k="7" class="num">fp32 max|x|</th><th data-k="8" class="num" title="log2(65504 / fp32 max|x|)">headroom (bits)</th>{{range $i, $p := .Emulated}}<th data-k="{{$i}}m" class="num">{{$p}} max|x|</th><th data-k="{{$i}}n" class="num">{{$p}} NaN/Inf</th>{{end}}<th data-k="3">module</th><th data-k="5">output</th><th data-k="6">shape</th>
</tr></thead><tbody></tbody></table></div>
<p><button id="more" hidden>show more rows</button></p>
</section>

{{if .R.Inputs}}<section class="card">
<h2>Inputs</h2>
{{range .R.Inputs}}<h3><code>{{.Name}}</code> <span class="small">{{.Kind}}, {{.DType}} {{.Shape}}{{if .RawPixels}}, <b class="warn">raw 0–255 pixels</b>{{end}}</span></h3>
{{with stat .ValueReport "fp32"}}<p class="small">max |x| {{optMag .MaxAbs}}, mean {{opt4 .Mean}}, rms {{opt4 .RMS}}, NaN {{.NaN}}, +Inf {{.PosInf}}, −Inf {{.NegInf}}{{with statsFinite .}} ({{.}}){{end}}</p>{{end}}
{{if .Channels}}<table class="plain"><thead><tr><th>{{if eq .Kind "image"}}channel{{else}}column{{end}}</th><th class="num">mean</th><th class="num">std</th><th class="num">min</th><th class="num">max</th><th></th></tr></thead><tbody>
{{range .Channels}}<tr{{if .Flagged}} class="sev-warning"{{end}}><td>{{.Index}}</td><td class="num">{{f4 .Mean}}</td><td class="num">{{f4 .Std}}</td><td class="num">{{f4 .Min}}</td><td class="num">{{f4 .Max}}</td><td>{{if .Flagged}}far from standardized{{end}}</td></tr>
{{end}}</tbody></table>{{end}}
{{end}}</section>{{end}}

<section class="card">
<h2>Model and run</h2>
<dl class="kv">
<dt>model</dt><dd><code>{{.R.Model.Path}}</code></dd>
<dt>producer</dt><dd>{{.R.Model.Producer}} {{.R.Model.ProducerVersion}}, IR version {{.R.Model.IRVersion}}, opsets {{opsets .R.Model.Opsets}}</dd>
<dt>nodes</dt><dd>{{.R.Model.NodeCount}}</dd>
<dt>inputs</dt><dd>{{range $i, $x := .R.Model.Inputs}}{{if $i}}, {{end}}<code>{{$x.Name}}</code> {{$x.DType}} {{$x.Shape}}{{end}}</dd>
<dt>outputs</dt><dd>{{range $i, $x := .R.Model.Outputs}}{{if $i}}, {{end}}<code>{{$x.Name}}</code> {{$x.DType}} {{$x.Shape}}{{end}}</dd>
<dt>policy</dt><dd>{{.R.Policy}}; passes {{join .R.Passes ", "}}</dd>
<dt>ONNX Runtime</dt><dd>{{.R.Tool.ORTVersion}} on {{.R.Tool.Device}}{{if .R.Tool.ORTThreads}}, {{.R.Tool.ORTThreads}} threads{{end}}</dd>
<dt>fp16audit</dt><dd>{{.R.Tool.Version}}, {{secs .R.Tool.ElapsedSecs}} s</dd>
<dt>batches</dt><dd>{{len .R.Batches}}<ul class="batches">{{range .R.Batches}}<li><code>{{.Source}}</code> {{join .Shapes ", "}}{{if .Synthetic}} (synthetic){{end}}</li>{{end}}</ul></dd>
</dl>
{{if .R.Notes}}<ul class="notes">{{range .R.Notes}}<li>{{.}}</li>{{end}}</ul>{{end}}
</section>
`)

// htmlScript builds the node table from the embedded JSON and makes the
// chart interactive. It marks <body> with data-ready="1" when it finished
// without an exception, and data-error otherwise; the browser test checks
// both.
const htmlScript = `
(function () {
  "use strict";
  var body = document.body, t0 = performance.now();
  window.addEventListener("error", function (e) { body.setAttribute("data-error", String(e.message)); });
  try {
    main();
    body.setAttribute("data-ready", "1");
  } catch (e) {
    body.setAttribute("data-error", String((e && e.stack) || e));
    throw e;
  }
  // Milliseconds in the script, and since navigation started (parsing the
  // page included): the numbers the size measurements in the tests log.
  body.setAttribute("data-script-ms", String(Math.round(performance.now() - t0)));
  body.setAttribute("data-ready-ms", String(Math.round(performance.now())));

  function main() {
    var D = JSON.parse(document.getElementById("fp16audit-data").textContent);
    var P = D.passes, N = D.nodes, S = D.strings, C = D.chart, ref = P.indexOf("fp32"), emu = [];
    var FLAGGED = 1, HIDDEN = 2;
    N.forEach(function (nd) {
      nd[2] = S[nd[2]];
      nd[4] = S[nd[4]];
      nd[7] = S[nd[7]];
      nd[6].forEach(function (o) { o[1] = S[o[1]]; });
    });
    P.forEach(function (p, k) { if (p !== "fp32") emu.push(k); });
    var origins = {};
    D.origins.forEach(function (i) { origins[i] = true; });

    function esc(s) {
      return String(s).replace(/[&<>"]/g, function (c) { return {"&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;"}[c]; });
    }
    // mag writes a magnitude; null is a value without finite elements.
    function mag(x) {
      if (x === null || x === undefined) return "none";
      if (x === 0) return "0";
      var a = Math.abs(x);
      if (a >= 1e5 || a < 1e-3) return x.toExponential(2).replace(/e([+-])(\d)$/, function (m, sg, d) { return "e" + sg + "0" + d; });
      return String(+x.toPrecision(4));
    }
    function outName(nd, o) { return o === null ? "-" : (o[0] === "" ? nd[1] + "_output_0" : o[0]); }
    function st(o, k) { return o === null || k < 0 ? null : o[2][k]; }
    function nonfin(s) { return s ? s[1] + s[2] + s[3] : null; }

    // Table rows: one per node output, in topological order.
    var rows = [];
    N.forEach(function (nd, pos) {
      if (!nd[6].length) rows.push({pos: pos, o: null});
      nd[6].forEach(function (o) { rows.push({pos: pos, o: o}); });
    });
    function key(r, k) {
      var nd = N[r.pos], s;
      switch (k) {
      case "0": return nd[0];
      case "1": return nd[1];
      case "2": return nd[2];
      case "3": return nd[3];
      case "4": return nd[4];
      case "5": return outName(nd, r.o);
      case "6": return r.o ? r.o[1] : "";
      case "7": s = st(r.o, ref); return s ? s[0] : null;
      case "8": s = st(r.o, ref); return s ? s[4] : null;
      }
      var e = emu[parseInt(k, 10)];
      s = st(r.o, e);
      return k.slice(-1) === "m" ? (s ? s[0] : null) : nonfin(s);
    }

    var tbody = document.querySelector("#nodes tbody"), count = document.getElementById("count");
    var more = document.getElementById("more"), fop = document.getElementById("f-op");
    var ffl = document.getElementById("f-flagged"), ftx = document.getElementById("f-text");
    var fco = document.getElementById("f-const"), fgr = document.getElementById("f-group");
    // Row groups: with repeated blocks the rows sit under a line per
    // block, closed until clicked, unless a sort or a filter is on.
    var B = D.blocks || [], open = {}, COLS = 9 + 2 * emu.length;
    function grouped() { return !!fgr && fgr.checked && sortKey === null && !fop.value && !ffl.checked && !ftx.value; }
    function groupRow(g) {
      var b = B[g], o = open[g];
      return "<tr class=\"blk" + (b[2] ? " fl" : "") + "\" data-blk=\"" + g + "\"><td colspan=\"" + COLS + "\">" + (o ? "▾ " : "▸ ") + esc(b[0]) +
        " — " + b[1] + (b[1] === 1 ? " node" : " nodes") + (b[2] ? ", " + b[2] + " flagged, first NaN/Inf at " + esc(b[4]) : "") +
        (b[3] !== null ? ", max |x| held in 16 bit " + mag(b[3]) : "") + "</td></tr>";
    }
    var ops = {};
    N.forEach(function (nd) { ops[nd[2]] = (ops[nd[2]] || 0) + 1; });
    Object.keys(ops).sort().forEach(function (op) {
      var opt = document.createElement("option");
      opt.value = op;
      opt.textContent = op + " (" + ops[op] + ")";
      fop.appendChild(opt);
    });
    var PAGE = 500, shown = PAGE, sortKey = null, sortDir = 1, view = rows, hl = -1;

    function refilter() {
      var op = fop.value, fl = ffl.checked, tx = ftx.value.toLowerCase(), co = fco ? fco.checked : true;
      view = rows.filter(function (r) {
        var nd = N[r.pos];
        if (op && nd[2] !== op) return false;
        if (fl && !(nd[5] & FLAGGED)) return false;
        if (!co && (nd[5] & HIDDEN)) return false;
        if (tx && (nd[1] + " " + nd[3] + " " + outName(nd, r.o)).toLowerCase().indexOf(tx) < 0) return false;
        return true;
      });
      if (sortKey !== null) {
        var k = sortKey, d = sortDir;
        view = view.map(function (r, i) { return {r: r, v: key(r, k), i: i}; });
        view.sort(function (a, b) {
          var x = a.v, y = b.v;
          if (x === y) return a.i - b.i;
          if (x === null) return 1;
          if (y === null) return -1;
          return (x < y ? -1 : 1) * d;
        });
        view = view.map(function (e) { return e.r; });
      }
      shown = PAGE;
      draw();
    }
    function draw() {
      var h = [], n = 0, i = 0, grp = grouped(), last = -1, groups = 0;
      for (; i < view.length && n < shown; i++) {
        var r = view[i], nd = N[r.pos], s = st(r.o, ref);
        if (grp) {
          if (nd[8] !== last) {
            last = nd[8];
            groups++;
            h.push(groupRow(last));
          }
          if (!open[last]) continue;
        }
        n++;
        var cls = origins[r.pos] ? "orig" : (nd[5] & FLAGGED ? "fl" : "");
        if (r.pos === hl) cls += " hl";
        // The numbers come right after the node's name and op, so that
        // they stay in view on a narrow screen; the long names are cut.
        h.push("<tr data-pos=\"" + r.pos + "\" class=\"" + cls + "\"><td class=\"num\">" + nd[0] + "</td><td><div class=\"nm\" title=\"" +
          esc(nd[1]) + "\">" + esc(nd[1]) + "</div></td><td>" + esc(nd[2]) + "</td><td" + (nd[7] ? " title=\"" + esc(nd[7]) + "\"" : "") + ">" +
          esc(nd[4]) + "</td><td class=\"num\">" + (s ? mag(s[0]) : "") + "</td><td class=\"num" + (s && s[4] !== null && s[4] < 0 ? " neg" : "") + "\">" +
          (s && s[4] !== null ? s[4].toFixed(1) : "") + "</td>");
        emu.forEach(function (k) {
          var e = st(r.o, k), nf = nonfin(e);
          h.push("<td class=\"num\">" + (e ? mag(e[0]) : "") + "</td><td class=\"num" + (nf ? " nf" : "") + "\">" + (e ? nf : "") + "</td>");
        });
        h.push("<td><div class=\"aux\" title=\"" + esc(nd[3]) + "\">" + esc(nd[3]) + "</div></td><td><div class=\"aux\" title=\"" +
          esc(outName(nd, r.o)) + "\">" + esc(outName(nd, r.o)) + "</div></td><td>" + esc(r.o ? r.o[1] : "") + "</td></tr>");
      }
      tbody.innerHTML = h.join("");
      count.textContent = grp ? groups + " block lines, " + n + " of " + view.length + " rows open (click a block to open or close it)" :
        "showing " + n + " of " + view.length + " rows" + (view.length < rows.length ? " (" + rows.length + " in all)" : "");
      more.hidden = i >= view.length;
      more.textContent = "show " + Math.min(PAGE * 4, view.length - n) + " more rows";
    }
    more.addEventListener("click", function () { shown += PAGE * 4; draw(); });
    tbody.addEventListener("click", function (ev) {
      var tr = ev.target.closest ? ev.target.closest("tr.blk") : null;
      if (!tr) return;
      var g = +tr.getAttribute("data-blk");
      open[g] = !open[g];
      draw();
    });
    [fop, ffl, fco, fgr].forEach(function (el) { if (el) el.addEventListener("change", refilter); });
    ftx.addEventListener("input", refilter);
    Array.prototype.forEach.call(document.querySelectorAll("#nodes th"), function (th) {
      th.addEventListener("click", function () {
        var k = th.getAttribute("data-k");
        sortDir = sortKey === k ? -sortDir : 1;
        sortKey = k;
        Array.prototype.forEach.call(document.querySelectorAll("#nodes th"), function (o) { o.className = o.className.replace(/ ?(asc|desc)/, ""); });
        th.className += sortDir > 0 ? " asc" : " desc";
        refilter();
      });
    });
    function jump(pos) {
      fop.value = ""; ffl.checked = false; ftx.value = ""; sortKey = null;
      if (fco && (N[pos][5] & HIDDEN)) fco.checked = true;
      refilter();
      hl = pos;
      if (B.length) open[N[pos][8]] = true;
      var at = 0;
      while (at < view.length && view[at].pos !== pos) at++;
      shown = Math.max(PAGE, at + 50);
      draw();
      var tr = tbody.querySelector("tr[data-pos=\"" + pos + "\"]");
      if (tr) tr.scrollIntoView({block: "center"});
    }
    refilter();

    // Chart: hover shows a node, drag zooms, double-click resets, click
    // jumps to the node's row.
    var svg = document.getElementById("chart"), plot = document.getElementById("plot");
    var hit = document.getElementById("hit"), cur = document.getElementById("cursor");
    var brush = document.getElementById("brush"), tip = document.getElementById("tip");
    var box = document.getElementById("chartbox"), xaxis = document.getElementById("xaxis");
    // The chart's x is a position in C, the nodes it plots.
    var n = C.length, lo = +svg.getAttribute("data-lo"), top = +svg.getAttribute("data-top");
    var L = +hit.getAttribute("x"), W = +hit.getAttribute("width");
    var Y0 = +hit.getAttribute("y"), Y1 = Y0 + +hit.getAttribute("height");
    var x0 = -0.5, xw = Math.max(n, 1), NS = "http://www.w3.org/2000/svg";

    function px(i) { return L + (i + 0 - x0) / xw * W; }
    function svgX(ev) {
      var p = svg.createSVGPoint();
      p.x = ev.clientX; p.y = ev.clientY;
      return p.matrixTransform(svg.getScreenCTM().inverse()).x;
    }
    function posAt(sx) { return Math.max(0, Math.min(n - 1, Math.round(x0 + (sx - L) / W * xw))); }
    function el(name, attrs, text) {
      var e = document.createElementNS(NS, name);
      for (var a in attrs) e.setAttribute(a, attrs[a]);
      if (text !== undefined) e.textContent = text;
      return e;
    }
    function ticks() {
      while (xaxis.firstChild) xaxis.removeChild(xaxis.firstChild);
      var raw = xw / 10, mag10 = Math.pow(10, Math.floor(Math.log(raw) / Math.LN10)), step = mag10;
      [1, 2, 5, 10].forEach(function (m) { if (m * mag10 <= raw * 1.5) step = Math.max(1, m * mag10); });
      for (var i = Math.ceil(x0 / step) * step; i <= x0 + xw; i += step) {
        if (i < 0 || i > n - 1) continue;
        var x = px(i);
        xaxis.appendChild(el("line", {x1: x, x2: x, y1: Y1, y2: Y1 + 5}));
        xaxis.appendChild(el("text", {x: x, y: Y1 + 18}, String(N[C[i]][0])));
      }
    }
    function place() {
      plot.setAttribute("viewBox", x0 + " " + (-top) + " " + xw + " " + (top - lo));
      Array.prototype.forEach.call(svg.querySelectorAll(".origin"), function (g) {
        var i = +g.getAttribute("data-i"), x = px(i), inside = x >= L && x <= L + W;
        g.setAttribute("visibility", inside ? "visible" : "hidden");
        var line = g.querySelector("line"), text = g.querySelector("text");
        line.setAttribute("x1", x); line.setAttribute("x2", x); text.setAttribute("x", x);
        text.setAttribute("text-anchor", x > L + 0.6 * W ? "end" : "start");
      });
      ticks();
    }
    function showTip(i, ev) {
      var nd = N[C[i]], h = ["<b>#" + nd[0] + " " + esc(nd[1]) + "</b><br>" + esc(nd[2]) + " · module " + esc(nd[3] || "(model)") + " · computes in " + esc(nd[4]) +
        (nd[7] ? " (" + esc(nd[7]) + ")" : "") + (nd[5] & FLAGGED ? " · <span style=\"color:#c92a2a\">flagged</span>" : "")];
      nd[6].forEach(function (o) {
        h.push("<table><tr><th>" + esc(outName(nd, o)) + " " + esc(o[1]) + "</th><th>max|x|</th><th>NaN</th><th>+Inf</th><th>−Inf</th><th>headroom / rel. err.</th></tr>");
        P.forEach(function (p, k) {
          var s = o[2][k], x;
          if (!s) return;
          // fp32 carries the headroom; the other passes their error
          // against fp32, null when no element is finite in both.
          if (k === ref) x = s[4] === null ? "-" : s[4].toFixed(1) + " bits";
          else x = s[4] === null ? "n/a (nothing comparable)" : s[4].toExponential(1);
          h.push("<tr><td>" + esc(p) + "</td><td>" + mag(s[0]) + "</td><td>" + s[1] + "</td><td>" + s[2] + "</td><td>" + s[3] + "</td><td>" + x + "</td></tr>");
        });
        h.push("</table>");
      });
      tip.innerHTML = h.join("");
      tip.hidden = false;
      var b = box.getBoundingClientRect(), x = ev.clientX - b.left + 14, y = ev.clientY - b.top + 14;
      if (x + tip.offsetWidth > b.width) x = Math.max(0, ev.clientX - b.left - tip.offsetWidth - 14);
      tip.style.left = x + "px";
      tip.style.top = y + "px";
    }
    var dragFrom = null;
    hit.addEventListener("mousemove", function (ev) {
      var sx = svgX(ev);
      if (dragFrom !== null) {
        brush.setAttribute("x", Math.min(dragFrom, sx));
        brush.setAttribute("width", Math.abs(sx - dragFrom));
        brush.setAttribute("visibility", "visible");
        return;
      }
      if (!n) return;
      var i = posAt(sx), x = px(i);
      cur.setAttribute("x1", x); cur.setAttribute("x2", x);
      cur.setAttribute("visibility", "visible");
      showTip(i, ev);
    });
    hit.addEventListener("mouseleave", function () { cur.setAttribute("visibility", "hidden"); tip.hidden = true; });
    hit.addEventListener("mousedown", function (ev) { dragFrom = svgX(ev); ev.preventDefault(); });
    window.addEventListener("mouseup", function (ev) {
      if (dragFrom === null) return;
      var sx = svgX(ev), a = Math.min(dragFrom, sx), b = Math.max(dragFrom, sx);
      dragFrom = null;
      brush.setAttribute("visibility", "hidden");
      if (!n) return;
      if (b - a < 4) { jump(C[posAt(sx)]); return; }
      var i0 = posAt(a), i1 = posAt(b);
      if (i1 - i0 < 2) return;
      x0 = i0 - 0.5; xw = i1 - i0 + 1;
      place();
    });
    hit.addEventListener("dblclick", function () { x0 = -0.5; xw = Math.max(n, 1); place(); });
    place();
  }
})();
`
