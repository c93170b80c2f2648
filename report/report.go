// Package report turns a finished audit.Report into bytes: a text table for
// the terminal and a JSON document. Renderers compute nothing; everything
// they print is in the Report.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"

	"fp16audit/audit"
)

// Options are the rendering choices the command line passes through.
type Options struct {
	Text TextOptions
}

// Formats lists the --format values Render accepts.
func Formats() []string { return []string{"text", "json"} }

// Render writes r in the named format.
func Render(w io.Writer, r *audit.Report, format string, opt Options) error {
	switch format {
	case "text":
		return Text(w, r, opt.Text)
	case "json":
		return JSON(w, r)
	}
	return fmt.Errorf("unknown format %q (want %s)", format, strings.Join(Formats(), ", "))
}

// JSON writes r as indented JSON in the documented schema.
func JSON(w io.Writer, r *audit.Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// TextOptions controls the text report.
type TextOptions struct {
	// Pass selects the statistics shown per node; "" means the policy's
	// emulated pass when there is one, else fp32.
	Pass string
	// OnlyFlagged lists only nodes with non-finite values or findings.
	OnlyFlagged bool
}

// Text writes the human-readable report: the verdict, the origins and the
// verified fixes first, then the findings, then one row per node output in
// topological order (flagged rows only with OnlyFlagged).
func Text(w io.Writer, r *audit.Report, opt TextOptions) error {
	pass := opt.Pass
	if pass == "" {
		pass = r.Passes[len(r.Passes)-1]
		if len(r.Passes) > 2 {
			pass = r.Passes[1]
		}
	}
	bw := &errWriter{w: w}
	bw.printf("fp16audit %s — %s\n", r.Tool.Version, r.Model.Path)
	bw.printf("model: %d nodes, producer %q %s, IR %d, opsets %s\n", r.Model.NodeCount,
		r.Model.Producer, r.Model.ProducerVersion, r.Model.IRVersion, opsetString(r.Model.Opsets))
	bw.printf("policy: %s   passes: %s   batches: %d   ONNX Runtime %s on %s\n", r.Policy, strings.Join(r.Passes, ", "),
		len(r.Batches), r.Tool.ORTVersion, r.Tool.Device)
	for _, n := range r.Notes {
		bw.printf("note: %s\n", n)
	}
	bw.printf("\nverdict: %s — %s\n", r.Verdict, r.VerdictText)
	for _, o := range r.Origins {
		mod := o.Module
		if mod == "" {
			mod = "(model)"
		}
		head := "-"
		if o.HeadroomBits != nil {
			head = fmt.Sprintf("%.1f bits", *o.HeadroomBits)
		}
		bw.printf("origin (%s pass): %s  op %s  module %s  precision %s\n", o.Pass, o.Node, o.OpType, mod, o.Precision)
		bw.printf("  value %q: fp32 max |x| %s (fp16 max 65504, headroom %s), %d non-finite\n", o.Value, formatMag(o.FP32MaxAbs), head, o.NonFinite)
		if len(o.Affected) > 0 || len(o.AffectedOutputs) > 0 {
			bw.printf("  reached %d downstream node(s); graph outputs: %s\n", len(o.Affected), listOrNone(o.AffectedOutputs))
		}
	}
	for _, f := range r.Fixes {
		mark := "does not work"
		if f.Works {
			mark = "works"
		}
		bw.printf("fix %s (%s, verified by rerun): %s\n", f.Kind, mark, f.Summary)
		for _, n := range f.Normalize {
			bw.printf("  input %q: mean %s std %s\n", n.Input, floats(n.Mean), floats(n.Std))
		}
		if f.Kind == audit.FixKeepFP32 && len(f.Nodes) > 0 {
			bw.printf("  modules: %s\n  ONNX nodes (node_block_list): %s\n", strings.Join(f.Modules, ", "), strings.Join(f.Nodes, ", "))
		}
	}
	bw.printf("\n")
	if len(r.Findings) == 0 {
		bw.printf("findings: none\n")
	} else {
		bw.printf("findings:\n")
		for _, f := range r.Findings {
			bw.printf("  %-7s %s  %s\n", f.Severity, f.Check, f.Message)
		}
	}
	if r.Summary.MinHeadroomBits != nil {
		bw.printf("smallest fp32 headroom: %.1f bits at %q\n", *r.Summary.MinHeadroomBits, r.Summary.MinHeadroomValue)
	}
	bw.printf("\nper-node statistics (%s pass; headroom against 65504 from fp32):\n", pass)

	tw := tabwriter.NewWriter(bw, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "#\tnode\top\tprec\toutput\tshape\tfp32 max|x|\theadroom\tmax|x|\tnan\t+inf\t-inf\t\n")
	if !opt.OnlyFlagged {
		for _, in := range r.Inputs {
			writeRow(tw, "in", in.Name, "input", "", in.ValueReport, pass)
		}
	}
	nodes := r.Nodes
	if opt.OnlyFlagged {
		nodes = nil
		for _, n := range r.Nodes {
			if n.Flagged {
				nodes = append(nodes, n)
			}
		}
	}
	for _, n := range nodes {
		name := n.Name
		if name == "" {
			name = fmt.Sprintf("%s#%d", n.OpType, n.Index)
		}
		if len(n.Outputs) == 0 {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t-\t\t\t\t\t\t\t\t\n", n.Index, shorten(name, 60), n.OpType, n.Precision)
			continue
		}
		for _, o := range n.Outputs {
			writeRow(tw, fmt.Sprint(n.Index), name, n.OpType, n.Precision, o, pass)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return bw.err
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

func writeRow(w io.Writer, index, node, op, prec string, v audit.ValueReport, pass string) {
	ref, hasRef := v.Stats["fp32"]
	s, ok := v.Stats[pass]
	if !ok {
		s, ok = ref, hasRef
	}
	if !ok {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t\t\t\t\t\t\t\n", index, shorten(node, 60), op, prec, shorten(v.Name, 40), v.Shape)
		return
	}
	head := "-"
	if ref.HeadroomBits != nil {
		head = fmt.Sprintf("%.1f", *ref.HeadroomBits)
	}
	fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t\n", index, shorten(node, 60), op, prec,
		shorten(v.Name, 40), v.Shape, formatMag(ref.MaxAbs), head, formatMag(s.MaxAbs), s.NaN, s.PosInf, s.NegInf)
}

// formatMag prints a magnitude compactly: 3 significant digits.
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
	if len(r) <= max {
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

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) { fmt.Fprintf(e, format, args...) }
