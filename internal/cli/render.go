package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"fp16audit/internal/render"
	"fp16audit/report"
)

// renderOptions are the flags of `fp16audit render`.
type renderOptions struct {
	format        string
	output        string
	pass          string
	onlyFlagged   bool
	constantNodes bool
	noColor       bool
}

// cmdRender re-renders a document saved with --format json (an audit
// report, a training-log diagnosis or lint findings) without running
// anything again.
func cmdRender(args []string, stdout, stderr io.Writer) int {
	var o renderOptions
	fs := newFlagSet("render", "fp16audit render REPORT.json [flags]",
		"  fp16audit run model.onnx -i batch.npy --format json -o render.json\n  fp16audit render render.json --format html -o render.html\n"+
			"  fp16audit scales run.csv --format json -o scales.json\n  fp16audit render scales.json --format markdown >> \"$GITHUB_STEP_SUMMARY\"", stdout)
	fs.StringVar(&o.format, "format", "text", "output format: "+strings.Join(renderFormats(), ", ")+" (sarif for lint findings)")
	fs.StringVarP(&o.output, "output", "o", "", "write the report to FILE instead of stdout")
	fs.StringVar(&o.pass, "pass", "", "audit text: the pass whose statistics the node table shows (default: the policy's emulated pass)")
	fs.BoolVar(&o.onlyFlagged, "only-flagged", false, "audit text: list only nodes with NaN/Inf in some pass")
	fs.BoolVar(&o.constantNodes, "constant-nodes", false, "audit text: also list the nodes that compute only from weights and constants")
	fs.BoolVar(&o.noColor, "no-color", false, "text: no colours even on a terminal (as does a set NO_COLOR)")
	if done, code := parseFlags(fs, args, stderr); done {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "fp16audit render: want exactly one REPORT.json argument, got %d\nRun 'fp16audit render --help' for usage.\n", fs.NArg())
		return exitUsage
	}
	if !slices.Contains(renderFormats(), o.format) && !render.IsFormat(o.format, report.KindLint) {
		fmt.Fprintf(stderr, "fp16audit render: --format %q: want one of %s\n", o.format, strings.Join(renderFormats(), ", "))
		return exitUsage
	}
	doc, err := readDocument(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "fp16audit render: %v\n", err)
		return exitUsage
	}
	r, audit := doc.(*report.Report)
	switch {
	case !audit && (o.pass != "" || o.onlyFlagged || o.constantNodes):
		fmt.Fprintf(stderr, "fp16audit render: --pass, --only-flagged and --constant-nodes apply to audit reports; %s is a %s document\n", fs.Arg(0), doc.Kind())
		return exitUsage
	case audit && o.pass != "" && !slices.Contains(r.Passes, o.pass):
		fmt.Fprintf(stderr, "fp16audit render: --pass %q: the report has passes %s\n", o.pass, strings.Join(r.Passes, ", "))
		return exitUsage
	}
	topt := render.TextOptions{Pass: o.pass, OnlyFlagged: o.onlyFlagged, ConstantNodes: o.constantNodes}
	if o.output == "" {
		topt.Color, topt.Width = terminalStyle(stdout, o.noColor)
	}
	if err := writeDocument(doc, o.format, o.output, render.Options{Text: topt}, stdout); err != nil {
		fmt.Fprintf(stderr, "fp16audit render: %v\n", err)
		return exitUsage
	}
	return exitOK
}

// renderFormats are the formats of both audit reports and training-log
// diagnoses, in --help's order.
func renderFormats() []string {
	names := render.Formats(report.KindAudit)
	for _, k := range []report.Kind{report.KindScales, report.KindReplay} {
		for _, f := range render.Formats(k) {
			if !slices.Contains(names, f) {
				names = append(names, f)
			}
		}
	}
	return names
}

// readDocument decodes a saved JSON document by its schema: an audit
// report (this version's or v1, which it upgrades), a training-log
// diagnosis (v1.1, or v1, whose fields v1.1 keeps) or lint findings.
func readDocument(path string) (report.Document, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var head struct {
		Schema *string `json:"schema"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("read report %s: %w (want a report written by 'fp16audit run --format json' or 'fp16audit scales --format json')", path, err)
	}
	var doc report.Document
	switch {
	case head.Schema == nil:
	case *head.Schema == report.ReportSchema || *head.Schema == report.ReportSchemaV11 || *head.Schema == report.ReportSchemaV1:
		doc = &report.Report{}
	case *head.Schema == report.ScalesSchema || *head.Schema == report.ScalesSchemaV11 || *head.Schema == report.ScalesSchemaV1:
		doc = &report.ScalesReport{}
	case *head.Schema == report.LintSchema:
		doc = &report.LintReport{}
	case *head.Schema == report.ReplaySchema:
		doc = &report.ReplayReport{}
	}
	if doc == nil {
		found := "no schema field"
		if head.Schema != nil {
			found = fmt.Sprintf("schema %q", *head.Schema)
		}
		return nil, fmt.Errorf("read report %s: want schema %q (fp16audit run), %q (fp16audit scales), %q (fp16audit replay) or %q (fp16audit lint), found %s; re-create it with this version's --format json",
			path, report.ReportSchema, report.ScalesSchema, report.ReplaySchema, report.LintSchema, found)
	}
	if err := json.Unmarshal(data, doc); err != nil {
		return nil, fmt.Errorf("read report %s: %w", path, err)
	}
	if r, ok := doc.(*report.Report); ok && r.Schema == report.ReportSchemaV1 {
		upgradeV1(r)
	}
	return doc, nil
}

// upgradeV1 reads a v1 report's statistics as v1.1 says them: v1 wrote 0
// for the magnitudes of a value without finite elements, and had no count
// of finite elements.
func upgradeV1(r *report.Report) {
	fix := func(vs []report.ValueReport) {
		for _, v := range vs {
			for p, s := range v.Stats {
				s.Finite = s.Count - s.NonFinite()
				if s.Finite == 0 {
					s.MaxAbs, s.Mean, s.RMS = nil, nil, nil
				}
				if s.MinNonzero != nil && *s.MinNonzero == 0 {
					s.MinNonzero = nil
				}
				v.Stats[p] = s
			}
		}
	}
	for _, n := range r.Nodes {
		fix(n.Outputs)
	}
	for _, in := range r.Inputs {
		fix([]report.ValueReport{in.ValueReport})
	}
	r.Schema = report.ReportSchema
}

// terminalStyle decides the text report's colour and width for w: colour
// only on a terminal, never with --no-color or a non-empty NO_COLOR
// (https://no-color.org); the width from $COLUMNS or the terminal itself.
func terminalStyle(w io.Writer, noColor bool) (color bool, width int) {
	if !isTerminal(w) {
		return false, 0
	}
	return !noColor && os.Getenv("NO_COLOR") == "", terminalWidth(w)
}
