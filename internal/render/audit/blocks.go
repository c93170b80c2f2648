package audit

import (
	"fmt"
	"html/template"
	"math"
	"strings"

	"fp16audit/internal/render/markup"
	"fp16audit/report"
)

// The block roll-up (report.Block): a table of the blocks in every format
// and, in HTML, the growth of the residual stream block after block. The
// section shows only for models with repeated blocks of some size
// (transformer layers, ResNet stages), where a node table of thousands of
// rows needs it; a Sequential of single layers would only repeat the node
// table.

// minBlockNodes is the size two repeated blocks must reach for the
// roll-up to show.
const minBlockNodes = 8

// shownBlocks are the blocks the roll-up lists: those with a value to
// show (weights-only groups, such as the exporter's scattered Constants,
// have none). It returns nil when fewer than two repeated blocks hold
// minBlockNodes nodes.
func shownBlocks(r *report.Report) []report.Block {
	big := 0
	var out []report.Block
	for _, b := range r.Blocks {
		if b.Repeated && b.Nodes >= minBlockNodes {
			big++
		}
		if b.Output != nil || b.MaxAbs != nil || b.Flagged > 0 {
			out = append(out, b)
		}
	}
	if big < 2 {
		return nil
	}
	return out
}

// growthBlocks are the repeated blocks with an output: the points of the
// growth plot.
func growthBlocks(r *report.Report) []report.Block {
	var out []report.Block
	for _, b := range r.Blocks {
		if b.Repeated && b.Output != nil {
			out = append(out, b)
		}
	}
	return out
}

// blockModule names a block as the tables write it.
func blockModule(b report.Block) string { return moduleOrModel(b.Module) }

// blockFirst describes the block's first NaN/Inf: the node, and whether it
// is an origin or carried in from upstream.
func blockFirst(b report.Block) string {
	switch {
	case b.FirstOverflow == "":
		return "-"
	case b.Origin:
		return b.FirstOverflow + " (origin)"
	}
	return b.FirstOverflow
}

// blockOut is the max |x| of the block's output in pass, "NaN/Inf" when
// it holds some, "-" when there is none.
func blockOut(b report.Block, pass string) string {
	if b.Output == nil {
		return "-"
	}
	s, ok := b.Output.Stats[pass]
	switch {
	case !ok:
		return "-"
	case s.NonFinite() > 0:
		return fmt.Sprintf("%s + %d NaN/Inf", formatOpt(s.MaxAbs), s.NonFinite())
	}
	return formatOpt(s.MaxAbs)
}

// blockColumns are the roll-up's column heads and one row per block:
// nodes, flagged nodes, the largest value held in reduced precision and
// its headroom, the output in fp32 and in pass, the first NaN/Inf.
func blockColumns(r *report.Report, pass string) ([]string, [][]string) {
	head := []string{"block", "nodes", "flagged", "max|x| held in 16 bit", "headroom", "output fp32 max|x|"}
	if pass != report.PassFP32 {
		head = append(head, "output "+pass+" max|x|", "first NaN/Inf ("+pass+")")
	}
	var rows [][]string
	for _, b := range shownBlocks(r) {
		held := "-"
		if b.MaxAbs != nil {
			held = formatMag(*b.MaxAbs)
		}
		row := []string{blockModule(b), fmt.Sprint(b.Nodes), fmt.Sprint(b.Flagged), held, headroomBits(b.HeadroomBits), blockOut(b, report.PassFP32)}
		if pass != report.PassFP32 {
			row = append(row, blockOut(b, pass), blockFirst(b))
		}
		rows = append(rows, row)
	}
	return head, rows
}

// heldInHalf reports whether a node's precision is a 16-bit one: only
// such values have a headroom against the format's largest value.
func heldInHalf(precision string) bool { return precision == "fp16" || precision == "bf16" }

func headroomBits(h *float64) string {
	if h == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f", *h)
}

// blocksText writes the roll-up as a text table, the last column (the
// first NaN/Inf's node) shortened to fit the width.
func (t *textWriter) blocksText(r *report.Report, pass string) {
	head, rows := blockColumns(r, pass)
	if len(rows) == 0 {
		return
	}
	t.Printf("\n")
	t.para("", fmt.Sprintf("blocks (%d; output: the last value each hands on, the residual stream after a repeated block; headroom against 65504 from fp32, over values held in 16 bit):", len(rows)), 0)
	widths := make([]int, len(head))
	for i, h := range head {
		widths[i] = runeLen(h)
	}
	for _, row := range rows {
		for i, c := range row {
			widths[i] = max(widths[i], runeLen(c))
		}
	}
	last := len(head) - 1
	if t.width > 0 {
		used := 0
		for _, w := range widths[:last] {
			used += w + 2
		}
		widths[last] = max(min(widths[last], t.width-used), 12)
	}
	for ri, row := range append([][]string{head}, rows...) {
		var b strings.Builder
		for i, c := range row {
			c = shorten(c, widths[i])
			style := ""
			switch {
			case ri == 0:
				style = markup.Bold
			case i == 4 && strings.HasPrefix(c, "-") && c != "-", i == 7 && c != "-":
				style = markup.Red
			}
			b.WriteString(t.Style(style, c))
			if i < len(row)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-runeLen(c)+2))
			}
		}
		t.Printf("%s\n", strings.TrimRight(b.String(), " "))
	}
}

// blocksMarkdown writes the roll-up as a Markdown table within budget
// bytes of b.
func blocksMarkdown(b *strings.Builder, r *report.Report, budget int) {
	passes := emulatedPasses(r)
	pass := report.PassFP32
	if len(passes) > 0 {
		pass = passes[0]
	}
	head, rows := blockColumns(r, pass)
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(b, "\n### Blocks (%d)\n\nOutput: the last value a block hands on — after a repeated block, the residual stream. Headroom: against 65504 from fp32, over the values held in 16 bit.\n\n", len(rows))
	var h strings.Builder
	h.WriteString("|")
	for _, c := range head {
		h.WriteString(" " + markup.MDText(c) + " |")
	}
	h.WriteString("\n|")
	for i := range head {
		if i == 0 || i == 7 {
			h.WriteString("---|")
		} else {
			h.WriteString("--:|")
		}
	}
	h.WriteString("\n")
	var lines []string
	for _, row := range rows {
		var l strings.Builder
		for i, c := range row {
			switch {
			case i == 0:
				c = markup.MDCode(c)
			case i == 7 && c != "-":
				node, origin := strings.CutSuffix(c, " (origin)")
				c = markup.MDCode(node)
				if origin {
					c += " (origin)"
				}
			default:
				c = markup.MDText(c)
			}
			l.WriteString("| " + c + " ")
		}
		lines = append(lines, l.String()+"|\n")
	}
	writeRows(b, h.String(), lines, budget, "block rows")
}

// growthSVG draws the max |x| of each repeated block's output, block after
// block, in every pass against fp16's largest value: where a massive
// activation enters the residual stream and how it is carried on. An
// output with NaN/Inf in a pass is drawn in the band above the plot.
func growthSVG(r *report.Report) string {
	if shownBlocks(r) == nil {
		return ""
	}
	blocks := growthBlocks(r)
	n := len(blocks)
	if n < 2 {
		return ""
	}
	const (
		w, h                   = 1200, 300
		left, right, top, base = 62, 1040, 40, 250
	)
	lo, hi := -4.0, 17.0
	for _, b := range blocks {
		for _, s := range b.Output.Stats {
			if s.MaxAbs != nil && *s.MaxAbs > 0 {
				v := math.Log2(*s.MaxAbs)
				lo, hi = math.Min(lo, math.Floor(v)-1), math.Max(hi, math.Ceil(v)+1)
			}
		}
	}
	bad := hi + 1.5
	ceil := hi + 2.5
	px := func(i int) float64 { return left + (float64(i)+0.5)/float64(n)*(right-left) }
	py := func(v float64) float64 { return top + (ceil-v)/(ceil-lo)*(base-top) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="growth" viewBox="0 0 %d %d" role="img" aria-label="max |x| of each block's output, block after block, per pass">`, w, h)
	fmt.Fprintf(&b, `<g class="grid">`)
	step := math.Max(4, math.Ceil((hi-lo)/6/4)*4)
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%s" y2="%s"/><text x="%d" y="%s" class="yl">%s</text>`,
			left, right, markup.Coord(py(v)), markup.Coord(py(v)), left-6, markup.Coord(py(v)+4), markup.Pow2(int(v)))
	}
	fmt.Fprintf(&b, `</g><rect x="%d" y="%s" width="%d" height="%s" class="badband"/><text x="%d" y="%s" class="yl bad">NaN/Inf</text>`,
		left, markup.Coord(py(ceil)), right-left, markup.Coord(py(hi+1)-py(ceil)), left-6, markup.Coord(py(bad)+4))
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%s" y2="%s" class="max"/><text x="%d" y="%s" class="rl max">fp16 max 65504</text>`,
		left, right, markup.Coord(py(log2FP16Max)), markup.Coord(py(log2FP16Max)), right+6, markup.Coord(py(log2FP16Max)+4))
	for k, pass := range r.Passes {
		var d, dots strings.Builder
		pen := "M"
		for i, blk := range blocks {
			s, ok := blk.Output.Stats[pass]
			if !ok {
				continue
			}
			y := lo
			switch {
			case s.NonFinite() > 0:
				y = bad
			case s.MaxAbs != nil && *s.MaxAbs > 0:
				y = math.Log2(*s.MaxAbs)
			}
			fmt.Fprintf(&d, "%s%s %s", pen, markup.Coord(px(i)), markup.Coord(py(y)))
			fmt.Fprintf(&dots, "M%s %sh0", markup.Coord(px(i)), markup.Coord(py(y)))
			pen = " L"
		}
		width := "2"
		if pass == report.PassFP32 {
			width = "4.5"
		}
		fmt.Fprintf(&b, `<path class="series" d="%s" stroke="%s" stroke-width="%s" data-pass="%s"%s/><path d="%s" stroke="%s" stroke-width="%s" stroke-linecap="round" fill="none"/>`,
			d.String(), seriesColor(k), width, template.HTMLEscapeString(pass), dash(k), dots.String(), seriesColor(k), map[bool]string{true: "10", false: "7"}[pass == report.PassFP32])
	}
	// x labels: every block when they fit, else every k-th.
	every := max(1, (n+23)/24)
	for i, blk := range blocks {
		if i%every != 0 && i != n-1 {
			continue
		}
		label := blk.Module
		if j := strings.LastIndexByte(label, '.'); j >= 0 && j+1 < len(label) && n > 8 {
			label = label[j+1:] // the number alone when many
		}
		fmt.Fprintf(&b, `<text x="%s" y="%d" class="xl" text-anchor="middle"><title>%s</title>%s</text>`,
			markup.Coord(px(i)), base+18, template.HTMLEscapeString(blk.Module), template.HTMLEscapeString(label))
	}
	x := float64(left)
	for k, pass := range r.Passes {
		label := pass
		if pass == report.PassFP32 {
			label = "fp32 (reference)"
		}
		fmt.Fprintf(&b, `<line x1="%s" y1="%d" x2="%s" y2="%d" stroke="%s" stroke-width="3"%s/><text x="%s" y="%d" class="lg">%s</text>`,
			markup.Coord(x), h-12, markup.Coord(x+24), h-12, seriesColor(k), dash(k), markup.Coord(x+30), h-8, template.HTMLEscapeString(label))
		x += 46 + 7.2*float64(len(label))
	}
	fmt.Fprintf(&b, `<text x="%s" y="%d" class="note">max |x| of the output of each %s block (the residual stream), block after block</text>`, markup.Coord(x+10), h-8,
		template.HTMLEscapeString(containerName(blocks)))
	b.WriteString(`</svg>`)
	return b.String()
}

// containerName is the repeated container the growth plot follows
// (model.layers), or "repeated" when the blocks come from several.
func containerName(blocks []report.Block) string {
	name := ""
	for _, b := range blocks {
		c := b.Module
		if j := strings.LastIndexByte(c, '.'); j >= 0 {
			c = c[:j]
		}
		if name != "" && c != name {
			return "repeated"
		}
		name = c
	}
	return name
}

// blocksHTML is the page's block card: the growth plot and the roll-up
// table; empty for models without repeated blocks.
func blocksHTML(r *report.Report) template.HTML {
	pass := report.PassFP32
	if ps := emulatedPasses(r); len(ps) > 0 {
		pass = ps[0]
	}
	head, rows := blockColumns(r, pass)
	if len(rows) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(`<section class="card" id="blocks"><h2>Blocks and the residual stream</h2>`)
	b.WriteString(growthSVG(r))
	b.WriteString(`<p class="small">Output: the last value a block hands on — after a repeated block, the residual stream. Headroom: against 65504 from fp32, over the values the block holds in 16 bit (values held in fp32 have none). The node table below groups its rows by these blocks.</p>`)
	b.WriteString(`<div class="tablebox"><table class="plain" id="blocktable"><thead><tr>`)
	for i, c := range head {
		cls := ""
		if i > 0 && i < 7 {
			cls = ` class="num"`
		}
		fmt.Fprintf(&b, `<th%s>%s</th>`, cls, template.HTMLEscapeString(c))
	}
	b.WriteString(`</tr></thead><tbody>`)
	for _, row := range rows {
		cls := ""
		if row[2] != "0" {
			cls = ` class="sev-error"`
		}
		fmt.Fprintf(&b, `<tr%s>`, cls)
		for i, c := range row {
			switch {
			case i == 0 || i == 7:
				fmt.Fprintf(&b, `<td><code>%s</code></td>`, template.HTMLEscapeString(c))
			default:
				fmt.Fprintf(&b, `<td class="num">%s</td>`, template.HTMLEscapeString(c))
			}
		}
		b.WriteString(`</tr>`)
	}
	b.WriteString(`</tbody></table></div></section>`)
	return template.HTML(b.String())
}

// blockGroups are the node table's row groups in the page's JSON: per
// block [module, nodes, flagged, max|x| held in 16 bit or null, first
// NaN/Inf or ""], and per node (in r.Nodes order) its group's index. Both
// are nil without repeated blocks.
func blockGroups(r *report.Report) ([][]any, []int) {
	if shownBlocks(r) == nil {
		return nil, nil
	}
	at := map[string]int{}
	groups := make([][]any, len(r.Blocks))
	for i, b := range r.Blocks {
		at[b.Module] = i
		var held any
		if b.MaxAbs != nil {
			held = num(*b.MaxAbs)
		}
		groups[i] = []any{moduleOrModel(b.Module), b.Nodes, b.Flagged, held, b.FirstOverflow}
	}
	of := make([]int, len(r.Nodes))
	for i, n := range r.Nodes {
		of[i] = at[n.Block]
	}
	return groups, of
}
