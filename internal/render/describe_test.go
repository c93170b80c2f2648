package render

import (
	"bytes"
	"html"
	"regexp"
	"strings"
	"testing"

	"fp16audit/checks"
	"fp16audit/report"
)

// schemaReport is a small report that uses what schema v1.1 added and the
// audit of the fixtures may not show yet: values without finite elements
// (null magnitudes, no rel_err), origins with each cause, provenance, and
// constant-only nodes, one of them flagged.
func schemaReport() *report.Report {
	f := func(x float64) *float64 { return &x }
	finite := func(mx float64) report.StatsReport {
		return report.StatsReport{Count: 64, Finite: 64, MaxAbs: f(mx), Mean: f(mx / 4), RMS: f(mx / 2), HeadroomBits: f(10)}
	}
	allNaN := report.StatsReport{Count: 64, NaN: 64}
	value := func(name string, s map[string]report.StatsReport) []report.ValueReport {
		return []report.ValueReport{{Name: name, DType: "float32", Shape: "[8,8]", Stats: s}}
	}
	emulated := finite(3)
	emulated.Compared, emulated.RelErr = 64, f(2e-4)
	cast := &report.Provenance{Reasons: []string{report.ReasonExplicitCast}, Casts: []string{"/Cast"}}
	return &report.Report{
		Schema: report.ReportSchema,
		Tool:   report.ToolInfo{Version: "0.0.0-test", ORTVersion: "0.0.0-test", Device: "cpu"},
		Model: report.ModelInfo{Path: "schema.onnx", NodeCount: 6, Opsets: map[string]int64{"ai.onnx": 17},
			Inputs: []report.IOInfo{{Name: "x", DType: "float32", Shape: "[8,8]"}}},
		Policy: "autocast-fp16", Passes: []string{"fp32", "fp16"},
		Batches: []report.Batch{{Source: "batch.npy", Shapes: []string{"x[8,8]"}}},
		Verdict: report.VerdictPoisoned, VerdictText: "the batch already holds NaN/Inf",
		Origins: []report.Origin{
			{Pass: "fp16", Cause: report.CauseInput, Index: -1, Input: "x", NonFinite: 5,
				Samples: []report.Sample{{Batch: 0, Index: 2, NonFinite: 3}, {Batch: 0, Index: 6, NonFinite: 2}}, AffectedOutputs: []string{"y"}},
			{Pass: "fp16", Cause: report.CauseConstant, Node: "/attn/Where", Index: 4, OpType: "Where", Module: "attn", Precision: "fp16",
				Value: "/attn/Where_output_0", FP32MaxAbs: 1e9, NonFinite: 64, Constant: "/attn/Constant_output_0", ConstantValue: f(-1e9),
				Affected: []string{}, AffectedOutputs: []string{}},
			{Pass: "fp16", Cause: report.CauseOverflow, Node: "/Mul", Index: 5, OpType: "Mul", Precision: "fp16", Value: "/Mul_output_0",
				FP32MaxAbs: 2e5, NonFinite: 64, Provenance: cast, ExplicitCast: true, Affected: []string{}, AffectedOutputs: []string{"y"}},
		},
		Fixes: []report.Fix{},
		Inputs: []report.InputReport{{Kind: report.KindTabular, ValueReport: report.ValueReport{Name: "x", DType: "float32", Shape: "[8,8]",
			Stats: map[string]report.StatsReport{"fp32": allNaN}}}},
		Nodes: []report.NodeReport{
			{Index: 0, Name: "/Identity", OpType: "Identity", Precision: "fp32", Constant: true,
				Outputs: value("shared.weight.copy", map[string]report.StatsReport{"fp32": finite(0.5), "fp16": finite(0.5)})},
			{Index: 1, Name: "/Shape", OpType: "Shape", Precision: "fp32", Outputs: []report.ValueReport{}},
			{Index: 2, Name: "/Gemm", OpType: "Gemm", Precision: "fp16",
				Outputs: value("/Gemm_output_0", map[string]report.StatsReport{"fp32": finite(3), "fp16": emulated})},
			{Index: 3, Name: "/Relu", OpType: "Relu", Precision: "fp16", Flagged: true,
				Outputs: value("/Relu_output_0", map[string]report.StatsReport{"fp32": finite(3), "fp16": allNaN})},
			{Index: 4, Name: "/attn/Where", OpType: "Where", Module: "attn", Precision: "fp16", Constant: true, Flagged: true,
				Outputs: value("/attn/Where_output_0", map[string]report.StatsReport{"fp32": finite(1e9), "fp16": allNaN})},
			{Index: 5, Name: "/Mul", OpType: "Mul", Precision: "fp16", Provenance: cast, Flagged: true,
				Outputs: value("/Mul_output_0", map[string]report.StatsReport{"fp32": finite(2e5), "fp16": allNaN})},
		},
		Findings: []checks.Finding{{Check: "FP1001", Severity: checks.SevError, Message: "input \"x\" holds NaN"}},
	}
}

// TestSchemaFieldsRendered: every format says what v1.1 documents, and
// none prints a magnitude of 0 for a value without finite elements.
func TestSchemaFieldsRendered(t *testing.T) {
	r := schemaReport()
	render := func(format string, opt Options) string {
		var b bytes.Buffer
		if err := Render(&b, r, format, opt); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	common := []string{
		"sample 2 ×3, sample 6 ×2", // the poisoned input's samples
		"Constant_output_0",        // the constant an origin writes
		"-1e+09",
		"explicit cast /Cast", // provenance at the origin
	}
	for _, c := range []struct {
		format  string
		want    []string
		notWant []string
	}{
		{"text", []string{`origin (the batch): input "x" (float32 [8,8], tabular)`, "fp16 (explicit cast)", "not listed: 1 node(s) that compute only from weights and constants"}, []string{"/Identity", "shared.weight.copy"}},
		{"markdown", []string{"input `x`", "NaN/Inf already in the batch", "| none | **64** |"}, []string{"/Identity"}},
		{"html", []string{`<dt>input</dt><dd><code>x</code> (float32 [8,8], tabular)</dd>`, "Origin: NaN/Inf already in the batch",
			"Origin: a constant beyond fp16's range", "max |x| none, mean none, rms none", "(0 of 64 finite)",
			`id="f-const"> constant-only nodes (1)`, `"chart":[2,3,4,5]`}, nil},
	} {
		out := render(c.format, Options{})
		if c.format == "html" {
			out = html.UnescapeString(out)
		}
		for _, w := range append(c.want, common...) {
			if !strings.Contains(out, w) {
				t.Errorf("%s lacks %q", c.format, w)
			}
		}
		for _, w := range c.notWant {
			if strings.Contains(out, w) {
				t.Errorf("%s shows %q, a constant-only node it should hide", c.format, w)
			}
		}
	}
	// The all-NaN /Relu output: its fp16 max |x| is "none", never 0.
	if !regexp.MustCompile(`/Relu_output_0 +\[8,8\] +3 +10\.0 +none +64 `).MatchString(render("text", Options{})) {
		t.Errorf("text does not print max|x| none for a value without finite elements")
	}
	all := render("text", Options{Text: TextOptions{ConstantNodes: true}})
	if !strings.Contains(all, "shared.weight.copy") || strings.Contains(all, "computing only from weights") {
		t.Errorf("ConstantNodes does not list the constant-only node:\n%s", all)
	}
}

// TestChartSkipsNodesWithoutFloats: a node without float outputs between
// two plotted ones leaves no gap; each series is one continuous line.
func TestChartSkipsNodesWithoutFloats(t *testing.T) {
	var page bytes.Buffer
	if err := Render(&page, schemaReport(), "html", Options{}); err != nil {
		t.Fatal(err)
	}
	svg := page.String()
	series := regexp.MustCompile(`class="series" d="([^"]*)"`).FindAllStringSubmatch(svg, -1)
	if len(series) != 2 {
		t.Fatalf("%d series, want 2", len(series))
	}
	for _, m := range series {
		if n := strings.Count(m[1], "M"); n != 1 {
			t.Errorf("series %q has %d segments, want one line", m[1], n)
		}
		if n := len(regexp.MustCompile(`-?\d+(\.\d+)? -?\d+(\.\d+)?`).FindAllString(m[1], -1)); n != 4 {
			t.Errorf("series %q has %d points, want the 4 shown nodes with float outputs", m[1], n)
		}
	}
}
