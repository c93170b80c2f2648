package render

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"fp16audit/checks"
	"fp16audit/report"
)

// TestNonFiniteEveryFormat: a document holding +Inf, -Inf and NaN in
// several float fields renders in every format of its kind; its JSON
// carries them as "inf", "-inf" and "nan" and reads back (as `fp16audit
// render` reads a saved report) into a document that renders the same in
// every format.
func TestNonFiniteEveryFormat(t *testing.T) {
	inf, ninf, nan := math.Inf(1), math.Inf(-1), math.NaN()
	r := schemaReport()
	r.Origins[1].ConstantValue = &ninf
	r.Origins[2].FP32MaxAbs = inf
	st := r.Nodes[2].Outputs[0].Stats["fp16"]
	st.RelErr, st.FlushedFraction = &inf, nan
	r.Nodes[2].Outputs[0].Stats["fp16"] = st
	r.Summary = report.Summary{FloatValues: 6, MinHeadroomBits: &ninf, MinHeadroomValue: "/Mul_output_0", HeadroomLimit: 65504}
	r.Inputs[0].Channels = []report.ChannelReport{{Index: 0, Mean: nan, Std: inf, Min: ninf, Max: inf, Flagged: true}}
	r.OutputAgreement = []report.OutputAgreement{{Pass: "fp16", Output: "y", Outcome: report.OutputWrong, Elements: 64,
		MaxAbsErr: inf, MaxRelErr: inf, RelErr: &nan, Samples: 8, WorstRelErr: &inf, Tolerance: 0.05}}
	r.Training = &report.TrainingReport{Mode: report.ModeTrain, Notes: []string{},
		BatchNorms: []report.BatchNormReport{{Node: "/bn/BatchNormalization", Statistics: "batch", InputRMS: inf, RunningRMS: nan}}}

	sr := scalesReport(t, scalesCases[len(scalesCases)-1])
	sr.Scales.FinalScale, sr.Scales.MinScale, sr.Scales.MaxScale = ninf, nan, inf
	if len(sr.Series) > 0 {
		sr.Series[0].Log2ScaleMin = &ninf
	}
	lr := &report.LintReport{Schema: report.LintSchema, Tool: report.LintTool{Name: "fp16audit", Version: "0.0.0-test"},
		Models: []report.LintModel{{Path: "m.onnx", Findings: []checks.Finding{}}}}

	for _, doc := range []report.Document{r, sr, lr} {
		renders := map[string]string{}
		for _, format := range Formats(doc.Kind()) {
			var b bytes.Buffer
			if err := Render(&b, doc, format, Options{}); err != nil {
				t.Fatalf("%s as %s: %v", doc.Kind(), format, err)
			}
			renders[format] = b.String()
		}
		js := renders["json"]
		if doc.Kind() != report.KindLint {
			for _, want := range []string{`"inf"`, `"-inf"`, `"nan"`} {
				if !strings.Contains(js, want) {
					t.Errorf("%s JSON lacks %s", doc.Kind(), want)
				}
			}
		}
		var back report.Document
		switch doc.Kind() {
		case report.KindAudit:
			back = &report.Report{}
		case report.KindScales:
			back = &report.ScalesReport{}
		default:
			back = &report.LintReport{}
		}
		if err := json.Unmarshal([]byte(js), back); err != nil {
			t.Fatalf("%s: reading its JSON back: %v", doc.Kind(), err)
		}
		if lb, ok := back.(*report.LintReport); ok {
			lb.Rules = lr.Rules // not part of the JSON document
		}
		for format, want := range renders {
			var b bytes.Buffer
			if err := Render(&b, back, format, Options{}); err != nil {
				t.Fatalf("%s read back, as %s: %v", doc.Kind(), format, err)
			}
			if b.String() != want {
				t.Errorf("%s read back renders otherwise as %s", doc.Kind(), format)
			}
		}
	}
	for _, want := range []string{"∞", "n/a"} {
		var b bytes.Buffer
		if err := Render(&b, r, "text", Options{}); err != nil || !strings.Contains(b.String(), want) {
			t.Errorf("text of the output agreement lacks %q (%v)", want, err)
		}
	}
}
