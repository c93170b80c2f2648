// Package audit renders the report of `fp16audit run` (report.Report, with
// its training audit) as text for the terminal, GitHub-flavoured Markdown
// and a self-contained HTML page. Everything it shows is in the report; it
// imports only report, checks and markup.
package audit

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"unicode/utf8"

	"fp16audit/internal/render/markup"
	"fp16audit/report"
)

// TextOptions controls the text of an audit report.
type TextOptions struct {
	// Pass selects the statistics shown per node; "" means the policy's
	// emulated pass when there is one, else fp32.
	Pass string
	// OnlyFlagged lists only nodes with non-finite values or findings.
	OnlyFlagged bool
	// ConstantNodes lists the nodes that compute only from initializers
	// and constants (report.NodeReport.Constant), which the table
	// otherwise leaves out unless they are flagged.
	ConstantNodes bool
	// Color adds ANSI colours. The command line sets it only when stdout is
	// a terminal, NO_COLOR is unset and --no-color is not given.
	Color bool
	// Width is the number of columns the report should fit (the terminal's
	// width): prose is wrapped and the node table's name columns shortened
	// in the middle. 0 means no limit; names are then cut at 60 and 40
	// characters.
	Width int
}

// textWriter writes the text report: prose wrapped to width (0: no limit).
type textWriter struct {
	*markup.Writer
	width int
}

// para writes prose: first is printed, then text wrapped to the width with
// continuation lines indented by indent spaces.
func (t *textWriter) para(first, text string, indent int) {
	t.Printf("%s%s\n", first, wrap(text, t.width, utf8.RuneCountInString(stripANSI(first)), indent))
}

// defaultPass is the pass whose statistics the node listings show by
// default: the policy's emulated pass, else the only one.
func defaultPass(r *report.Report) string {
	if len(r.Passes) == 0 {
		return report.PassFP32
	}
	if len(r.Passes) > 2 {
		return r.Passes[1]
	}
	return r.Passes[len(r.Passes)-1]
}

// Text writes the human-readable audit report: a concise summary first
// (verdict, origins, verified fixes), then the model and run, the findings,
// and one row per node output in topological order (flagged rows only with
// OnlyFlagged).
func Text(w io.Writer, r *report.Report, opt TextOptions) error {
	pass := opt.Pass
	if pass == "" {
		pass = defaultPass(r)
	}
	t := &textWriter{Writer: markup.NewWriter(w, opt.Color), width: opt.Width}
	t.Printf("%s\n\n", t.Style(markup.Bold, fmt.Sprintf("fp16audit %s — %s", r.Tool.Version, r.Model.Path)))

	for _, o := range headline(r) {
		col := map[string]string{"ok": markup.Green, "caution": markup.Yellow, "fail": markup.Red}[o.Mood]
		t.para(t.Style(markup.Bold+col, o.Mark()+" "+o.Label+": "+o.Verdict)+" — ", o.Text, 2)
	}
	for _, o := range r.Origins {
		switch {
		case originCause(o) == report.CauseInput:
			t.para("  origin (the batch): ", fmt.Sprintf("input %s%s", t.Style(markup.Bold, fmt.Sprintf("%q", o.Input)), inputShape(r, o.Input)), 10)
		case atInput(o):
			t.para(fmt.Sprintf("  origin (%s pass): ", o.Pass), fmt.Sprintf("input %s%s, held in %s", t.Style(markup.Bold, fmt.Sprintf("%q", o.Input)),
				inputShape(r, o.Input), precisionLabel(o.Precision, o.Provenance, false)), 10)
		default:
			t.para(fmt.Sprintf("  origin (%s pass): ", o.Pass), fmt.Sprintf("%s (%s, module %s, computes in %s)",
				t.Style(markup.Bold, o.Node), o.OpType, moduleOrModel(o.Module), precisionLabel(o.Precision, o.Provenance, false)), 10)
		}
		t.para("          ", originFacts(r, o), 10)
		if why := originWhy(o); why != "" {
			t.para("          ", why, 10)
		}
		if len(o.Affected) > 0 || len(o.AffectedOutputs) > 0 || len(o.WrongOutputs) > 0 {
			t.para("          ", fmt.Sprintf("reached %d downstream node(s); graph outputs: %s%s", len(o.Affected), listOrNone(o.AffectedOutputs), wrongOutputsText(o)), 10)
		}
	}
	for _, f := range r.Fixes {
		fm := t.Style(markup.Red, "does not work")
		if f.Works {
			fm = t.Style(markup.Green, "works")
		}
		t.para(fmt.Sprintf("  fix %s (%s, verified by rerun): ", t.Style(markup.Bold, f.Kind), fm),
			fmt.Sprintf("%s (NaN/Inf values %d → %d)", f.Summary, f.NonFiniteBefore, f.NonFiniteAfter), 6)
		for _, n := range f.Normalize {
			t.para("      ", fmt.Sprintf("input %q: mean %s std %s", n.Input, floats(n.Mean), floats(n.Std)), 8)
			if n.Fastai != "" {
				t.para("      fastai: ", n.Fastai, 8)
			}
			if n.Torch != "" {
				// Code is printed as it is: wrapping would break it.
				t.Printf("      PyTorch:\n")
				for _, line := range strings.Split(n.Torch, "\n") {
					t.Printf("        %s\n", line)
				}
			}
		}
		if f.Kind == report.FixKeepFP32 && len(f.Nodes) > 0 {
			t.para("      modules: ", strings.Join(f.Modules, ", "), 8)
			t.para("      ONNX nodes (node_block_list): ", strings.Join(f.Nodes, ", "), 8)
		}
	}

	if rows := agreements(r); len(rows) > 0 {
		t.Printf("  outputs against fp32 (relative L2 error of the worst sample; all samples; max |error| / max |fp32|):\n")
		for _, a := range rows {
			style := markup.Green
			if a.Bad {
				style = markup.Red
			}
			txt := fmt.Sprintf("worst %s", a.Worst)
			if a.Where != "" {
				txt += " in " + a.Where
			}
			txt += fmt.Sprintf("; all %s; max %s", a.Overall, a.MaxRel)
			if a.Chosen {
				txt = a.Worst
			}
			if a.Top1 != "" {
				txt += "; top-1 " + a.Top1
			}
			if a.NonFinite != "0" {
				txt += "; NaN/Inf " + a.NonFinite
			}
			t.para(fmt.Sprintf("    %s %s %s: ", a.Pass, a.Output, t.Style(style, a.Outcome)), txt, 8)
		}
	}

	t.training(r.Training)
	t.Printf("\n")
	t.para(t.Style(markup.Dim, "model: "), fmt.Sprintf("%d nodes, producer %q %s, IR %d, opsets %s", r.Model.NodeCount,
		r.Model.Producer, r.Model.ProducerVersion, r.Model.IRVersion, opsetString(r.Model.Opsets)), 7)
	t.para(t.Style(markup.Dim, "run: "), fmt.Sprintf("policy %s, passes %s, %d batch(es), ONNX Runtime %s on %s", r.Policy,
		strings.Join(r.Passes, ", "), len(r.Batches), r.Tool.ORTVersion, r.Tool.Device), 5)
	for _, n := range r.Notes {
		t.para(t.Style(markup.Dim, "note: "), n, 6)
	}

	t.Printf("\n")
	if len(r.Findings) == 0 {
		t.Printf("findings: none\n")
	} else {
		t.Printf("findings:\n")
		for _, f := range r.Findings {
			t.para(fmt.Sprintf("  %s %s  ", t.Style(markup.SeverityStyle(f.Severity), fmt.Sprintf("%-7s", f.Severity)), f.Check), f.Message, 18)
		}
	}
	if h := headroomSummary(r.Summary); h != "" {
		t.para("", h, 2)
	}
	t.blocksText(r, pass)
	t.Printf("\n")
	t.para("", fmt.Sprintf("per-node statistics (%s pass; headroom against 65504 from fp32, of values held in 16 bit):", pass), 0)
	t.nodeTable(r, pass, opt)
	if !opt.ConstantNodes && !opt.OnlyFlagged {
		if note := hiddenNote(hiddenConstants(r)); note != "" {
			t.para("", t.Style(markup.Dim, note+"; 'fp16audit render REPORT.json --constant-nodes' lists them"), 0)
		}
	}
	return t.Err()
}

// cell is one table cell: its plain text and the style it is shown in.
type cell struct {
	text  string
	style string
}

// Columns of the text node table whose contents may be shortened.
const (
	colNode   = 1
	colOp     = 2
	colPrec   = 3
	colOutput = 4
	colShape  = 5
)

// nodeTable writes the per-node table, fitted to the width.
func (t *textWriter) nodeTable(r *report.Report, pass string, opt TextOptions) {
	onlyFlagged := opt.OnlyFlagged
	head := []string{"#", "node", "op", "prec", "output", "shape", "fp32 max|x|", "headroom", "max|x|", "nan", "+inf", "-inf"}
	var rows [][]cell
	var full [][]string // unshortened node and output names per row
	if !onlyFlagged {
		for _, in := range r.Inputs {
			rows = append(rows, valueCells("in", in.Name, "input", "", in.ValueReport, pass, false, true))
			full = append(full, []string{in.Name, in.Name})
		}
	}
	for _, n := range r.Nodes {
		if onlyFlagged && !n.Flagged || !shownNode(r, n, opt.ConstantNodes) {
			continue
		}
		name := n.Name
		if name == "" {
			name = fmt.Sprintf("%s#%d", n.OpType, n.Index)
		}
		prec := precisionLabel(n.Precision, n.Provenance, false)
		if len(n.Outputs) == 0 {
			row := valueCells(fmt.Sprint(n.Index), name, n.OpType, prec, report.ValueReport{Name: "-"}, pass, n.Flagged, false)
			rows = append(rows, row)
			full = append(full, []string{name, "-"})
			continue
		}
		for _, o := range n.Outputs {
			rows = append(rows, valueCells(fmt.Sprint(n.Index), name, n.OpType, prec, o, pass, n.Flagged, heldInHalf(n.Precision)))
			full = append(full, []string{name, o.Name})
		}
	}

	widths := make([]int, len(head))
	for i, h := range head {
		widths[i] = runeLen(h)
	}
	for _, row := range rows {
		for i, c := range row {
			widths[i] = max(widths[i], runeLen(c.text))
		}
	}
	hidden := make([]bool, len(head))
	gap := 2
	if t.width > 0 {
		gap = fitTable(widths, hidden, t.width)
	} else {
		widths[colNode] = min(widths[colNode], 60)
		widths[colOutput] = min(widths[colOutput], 40)
	}
	for ri, row := range rows {
		row[colNode].text = shorten(full[ri][0], widths[colNode])
		row[colOutput].text = shorten(full[ri][1], widths[colOutput])
		row[colOp].text = shorten(row[colOp].text, widths[colOp])
	}

	line := func(cells []cell) {
		var b strings.Builder
		for i, c := range cells {
			if hidden[i] {
				continue
			}
			pad := widths[i] - runeLen(c.text)
			b.WriteString(t.Style(c.style, c.text))
			b.WriteString(strings.Repeat(" ", pad+gap))
		}
		t.Printf("%s\n", strings.TrimRight(b.String(), " "))
	}
	hc := make([]cell, len(head))
	for i, h := range head {
		hc[i] = cell{h, markup.Bold}
	}
	line(hc)
	for _, row := range rows {
		line(row)
	}
}

// fitTable narrows and hides columns until the table fits in width, giving
// up first what matters least: the output name (it usually repeats the
// node name), the shape, the op type's full spelling. Columns are set apart
// by the gap it returns: one space instead of two when the table is still
// too wide, which also lets the node name shrink to 12 characters and drops
// the precision column.
func fitTable(widths []int, hidden []bool, width int) (gap int) {
	gap = 2
	total := func() int {
		n := -gap
		for i, w := range widths {
			if !hidden[i] {
				n += w + gap
			}
		}
		return n
	}
	shrink := func(col, least int) {
		if excess := total() - width; excess > 0 && widths[col] > least {
			widths[col] -= min(excess, widths[col]-least)
		}
	}
	hide := func(col int) {
		if total() > width {
			hidden[col] = true
		}
	}
	shrink(colOutput, 16)
	shrink(colNode, 40)
	hide(colShape)
	shrink(colNode, 28)
	hide(colOutput)
	shrink(colNode, 24)
	shrink(colOp, 10)
	shrink(colNode, 16)
	if total() > width {
		gap = 1
		shrink(colNode, 12)
		hide(colPrec)
	}
	return gap
}

// valueCells is one row of the node table. headroom says whether the
// value has a headroom to show: graph inputs (an fp16 op casts them) and
// values held in 16 bit, not values held in fp32.
func valueCells(index, node, op, prec string, v report.ValueReport, pass string, flagged, headroom bool) []cell {
	nodeStyle := ""
	if flagged {
		nodeStyle = markup.Red
	}
	row := []cell{{index, markup.Dim}, {node, nodeStyle}, {op, ""}, {prec, ""}, {v.Name, ""}, {v.Shape, markup.Dim}}
	ref, hasRef := v.Stats[report.PassFP32]
	s, ok := v.Stats[pass]
	if !ok {
		s, ok = ref, hasRef
	}
	if !ok {
		for len(row) < 12 {
			row = append(row, cell{})
		}
		return row
	}
	head, headStyle := "-", ""
	if ref.HeadroomBits != nil && headroom {
		head = fmt.Sprintf("%.1f", *ref.HeadroomBits)
		if *ref.HeadroomBits < 0 {
			headStyle = markup.Red
		}
	}
	count := func(n int64) cell {
		if n > 0 {
			return cell{fmt.Sprint(n), markup.Red + markup.Bold}
		}
		return cell{"0", markup.Dim}
	}
	return append(row, cell{formatOpt(ref.MaxAbs), ""}, cell{head, headStyle}, cell{formatOpt(s.MaxAbs), ""},
		count(s.NaN), count(s.PosInf), count(s.NegInf))
}

// wrap breaks s into lines of at most width runes at spaces, the first
// line starting at column first and the others indented by indent spaces.
// Width 0 leaves s alone; a word longer than a line is not broken.
func wrap(s string, width, first, indent int) string {
	if width <= 0 || first+runeLen(stripANSI(s)) <= width {
		return s
	}
	var b strings.Builder
	col := first
	for i, word := range strings.Fields(s) {
		// A word longer than a whole line (a long node name) is broken.
		for room := width - indent; room > 0 && runeLen(word) > room && !strings.Contains(word, "\x1b"); {
			head := []rune(word)[:max(1, min(room, width-col-1))]
			if i > 0 || col > first {
				b.WriteByte(' ')
			}
			b.WriteString(string(head) + "\n" + strings.Repeat(" ", indent))
			word, col, i = string([]rune(word)[len(head):]), indent, 0
		}
		n := runeLen(stripANSI(word))
		switch {
		case i == 0:
		case col+1+n > width && col > indent:
			b.WriteString("\n" + strings.Repeat(" ", indent))
			col = indent
		default:
			b.WriteByte(' ')
			col++
		}
		b.WriteString(word)
		col += n
	}
	return b.String()
}

func runeLen(s string) int { return utf8.RuneCountInString(s) }

// stripANSI removes colour escapes, for measuring styled text.
func stripANSI(s string) string {
	if !strings.Contains(s, "\x1b[") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '[' {
			for i < len(s) && s[i] != 'm' {
				i++
			}
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// inputShape is " (float32 [8,16], tabular)" for a graph input the report
// describes, else "".
func inputShape(r *report.Report, name string) string {
	for _, in := range r.Inputs {
		if in.Name == name {
			return fmt.Sprintf(" (%s %s, %s)", in.DType, in.Shape, in.Kind)
		}
	}
	return ""
}

func moduleOrModel(m string) string {
	if m == "" {
		return "(model)"
	}
	return m
}

func headroomText(h *float64) string {
	if h == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f bits", *h)
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func floats(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.4g", x)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// formatOpt writes a magnitude that may be absent: "none" when the value
// had no finite element.
func formatOpt(x *float64) string { return optional(x, formatMag) }

// formatMag prints a magnitude compactly: 3 significant digits in
// exponent notation for large and small ones, else 4.
func formatMag(x float64) string {
	switch {
	case x == 0:
		return "0"
	case math.Abs(x) >= 1e5 || math.Abs(x) < 1e-3:
		return fmt.Sprintf("%.3g", x)
	}
	return fmt.Sprintf("%.4g", x)
}

// shorten keeps the start and end of a long name, which carry the module
// path and the op.
func shorten(s string, max int) string {
	r := []rune(s)
	if len(r) <= max || max < 3 {
		return s
	}
	half := (max - 1) / 2
	return string(r[:half]) + "…" + string(r[len(r)-(max-1-half):])
}

func opsetString(m map[string]int64) string {
	var parts []string
	if v, ok := m["ai.onnx"]; ok {
		parts = append(parts, fmt.Sprintf("ai.onnx %d", v))
	}
	var others []string
	for d := range m {
		if d != "ai.onnx" {
			others = append(others, d)
		}
	}
	sort.Strings(others)
	for _, d := range others {
		parts = append(parts, fmt.Sprintf("%s %d", d, m[d]))
	}
	return strings.Join(parts, ", ")
}
