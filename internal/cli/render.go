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
	format      string
	output      string
	pass        string
	onlyFlagged bool
	noColor     bool
}

// cmdRender re-renders a report saved with --format json, without running
// the model again.
func cmdRender(args []string, stdout, stderr io.Writer) int {
	var o renderOptions
	fs := newFlagSet("render", "fp16audit render REPORT.json [flags]",
		"  fp16audit run model.onnx -i batch.npy --format json -o render.json\n  fp16audit render render.json --format html -o render.html", stdout)
	fs.StringVar(&o.format, "format", "text", "output format: "+strings.Join(render.Formats(report.KindAudit), ", "))
	fs.StringVarP(&o.output, "output", "o", "", "write the report to FILE instead of stdout")
	fs.StringVar(&o.pass, "pass", "", "text: the pass whose statistics the node table shows (default: the policy's emulated pass)")
	fs.BoolVar(&o.onlyFlagged, "only-flagged", false, "text: list only nodes with NaN/Inf in some pass")
	fs.BoolVar(&o.noColor, "no-color", false, "text: no colours even on a terminal (as does a set NO_COLOR)")
	if done, code := parseFlags(fs, args, stderr); done {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "fp16audit render: want exactly one REPORT.json argument, got %d\nRun 'fp16audit render --help' for usage.\n", fs.NArg())
		return exitUsage
	}
	if !render.IsFormat(o.format, report.KindAudit) {
		fmt.Fprintf(stderr, "fp16audit render: --format %q: want one of %s\n", o.format, strings.Join(render.Formats(report.KindAudit), ", "))
		return exitUsage
	}
	r, err := readReport(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "fp16audit render: %v\n", err)
		return exitUsage
	}
	if o.pass != "" && !slices.Contains(r.Passes, o.pass) {
		fmt.Fprintf(stderr, "fp16audit render: --pass %q: the report has passes %s\n", o.pass, strings.Join(r.Passes, ", "))
		return exitUsage
	}
	topt := render.TextOptions{Pass: o.pass, OnlyFlagged: o.onlyFlagged}
	if o.output == "" {
		topt.Color, topt.Width = terminalStyle(stdout, o.noColor)
	}
	if err := writeDocument(r, o.format, o.output, render.Options{Text: topt}, stdout); err != nil {
		fmt.Fprintf(stderr, "fp16audit render: %v\n", err)
		return exitUsage
	}
	return exitOK
}

// readReport decodes a JSON report and checks that it has the schema this
// build renders.
func readReport(path string) (*report.Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var head struct {
		Schema *string `json:"schema"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("read report %s: %w (want a report written by 'fp16audit run --format json')", path, err)
	}
	if head.Schema == nil || (*head.Schema != report.ReportSchema && *head.Schema != report.ReportSchemaV1) {
		found := "no schema field"
		if head.Schema != nil {
			found = fmt.Sprintf("schema %q", *head.Schema)
		}
		return nil, fmt.Errorf("read report %s: want schema %q, found %s; re-create it with this version's 'fp16audit run --format json'",
			path, report.ReportSchema, found)
	}
	var r report.Report
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("read report %s: %w", path, err)
	}
	if r.Schema == report.ReportSchemaV1 {
		upgradeV1(&r)
	}
	return &r, nil
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
