package report_test

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"fp16audit/checks"
	"fp16audit/report"
)

// TestNonFiniteRoundTrip: every document writes NaN and ±Inf as strings in
// whichever float field holds them (plain, pointer, map value, nested,
// embedded) and reads them back; encoding/json alone refuses them.
func TestNonFiniteRoundTrip(t *testing.T) {
	inf, ninf, nan := math.Inf(1), math.Inf(-1), math.NaN()
	r := &report.Report{
		Schema:  report.ReportSchema,
		Verdict: report.VerdictFP32Broken,
		Origins: []report.Origin{{Node: "/mask/Where", FP32MaxAbs: inf, ConstantValue: &ninf}},
		Inputs: []report.InputReport{{ValueReport: report.ValueReport{Name: "x", Stats: map[string]report.StatsReport{
			"fp32": {Count: 3, MaxAbs: &inf, Mean: &nan}}}, Channels: []report.ChannelReport{{Mean: nan, Std: inf, Min: ninf}}}},
		Summary:  report.Summary{MinHeadroomBits: &ninf, HeadroomLimit: 65504},
		Findings: []checks.Finding{},
		Training: &report.TrainingReport{},
	}
	if _, err := json.Marshal(struct{ X float64 }{nan}); err == nil {
		t.Fatal("encoding/json wrote NaN: the test no longer tests anything")
	}
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"fp32_max_abs":"inf"`, `"constant_value":"-inf"`, `"mean":"nan"`, `"max_abs":"inf"`,
		`"std":"inf"`, `"min":"-inf"`, `"min_headroom_bits":"-inf"`, `"headroom_limit":65504`, `"training":{`} {
		if !strings.Contains(string(data), want) {
			t.Errorf("JSON lacks %s:\n%s", want, data)
		}
	}
	var back report.Report
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	o := back.Origins[0]
	st := back.Inputs[0].Stats["fp32"]
	ch := back.Inputs[0].Channels[0]
	if !math.IsInf(o.FP32MaxAbs, 1) || !math.IsInf(*o.ConstantValue, -1) || !math.IsInf(*st.MaxAbs, 1) || !math.IsNaN(*st.Mean) ||
		!math.IsNaN(ch.Mean) || !math.IsInf(ch.Std, 1) || !math.IsInf(ch.Min, -1) || !math.IsInf(*back.Summary.MinHeadroomBits, -1) ||
		back.Summary.HeadroomLimit != 65504 || back.Inputs[0].Name != "x" || back.Training == nil || back.Verdict != report.VerdictFP32Broken {
		t.Errorf("read back %+v", back)
	}
	again, err := json.Marshal(&back)
	if err != nil || string(again) != string(data) {
		t.Errorf("second write differs (%v):\n%s\n%s", err, data, again)
	}

	for _, doc := range []any{
		&report.ScalesReport{Schema: report.ScalesSchema, Scales: &report.ScaleStats{FinalScale: inf, MinScale: nan}},
		&report.LintReport{Schema: report.LintSchema},
		&report.TrainingReport{},
	} {
		if _, err := json.Marshal(doc); err != nil {
			t.Errorf("%T: %v", doc, err)
		}
	}
	var s report.ScalesReport
	if err := json.Unmarshal([]byte(`{"scales":{"final_scale":"inf","min_scale":"nan","max_scale":2}}`), &s); err != nil ||
		!math.IsInf(s.Scales.FinalScale, 1) || !math.IsNaN(s.Scales.MinScale) || s.Scales.MaxScale != 2 {
		t.Errorf("scales read back %+v, %v", s.Scales, err)
	}
	err = json.Unmarshal([]byte(`{"summary":{"headroom_limit":"lots"}}`), &back)
	if err == nil || !strings.Contains(err.Error(), `"lots"`) {
		t.Errorf("a string that is no number: %v", err)
	}
}

// TestFiniteFloatsAsEncodingJSON: finite floats are written byte for byte
// as encoding/json writes them, float32 fields included.
func TestFiniteFloatsAsEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	vals := []float64{0, math.Copysign(0, -1), 1, -1, 1e-6, 9.99e-7, 1e21, 9.99e20, 1e-9, 123456789, math.MaxFloat64, math.SmallestNonzeroFloat64, 65504, 1.0 / 3}
	for range 2000 {
		vals = append(vals, math.Float64frombits(rng.Uint64()))
	}
	for _, v := range vals {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		want, _ := json.Marshal(report.Summary{HeadroomLimit: v})
		got, err := report.MarshalNonFinite(report.Summary{HeadroomLimit: v})
		if err != nil || string(got) != string(want) {
			t.Fatalf("%v: got %s, encoding/json %s (%v)", v, got, want, err)
		}
		f := float32(v)
		if math.IsInf(float64(f), 0) {
			continue
		}
		want32, _ := json.Marshal(struct{ F float32 }{f})
		got32, err := report.MarshalNonFinite(struct{ F float32 }{f})
		if err != nil || string(got32) != string(want32) {
			t.Fatalf("float32 %v: got %s, encoding/json %s (%v)", f, got32, want32, err)
		}
	}
}
