package scales

import (
	"bytes"
	"strings"
	"testing"

	"fp16audit/internal/render/markup"
	"fp16audit/report"
)

func TestTelemetryText(t *testing.T) {
	most, lost := 143, 0.125
	r := &report.ScalesReport{
		Run:    report.RunInfo{Path: "run.csv", Format: "csv", Steps: 1000, Samples: 100, SampleEvery: 10},
		Scales: &report.ScaleStats{Skipped: 43, SkippedLowerBound: true, SkippedMax: &most},
		Telemetry: &report.TelemetryStats{Lines: 92, FullLines: 38, SkippedLines: 58, Modules: 3, OverflowFrom: 311, OverflowTo: 350,
			Overflow: []report.ModuleOverflow{{Module: "planted", Type: "Linear", Via: "params", Steps: 20, OutputSteps: 1, OfSteps: 21, MaxAbs: 2.2e6, MaxUnscaled: 4.4e6}, {Module: "head", Type: "Linear", Via: "output", Steps: 1, OutputSteps: 1, OfSteps: 21}},
			Underflow: []report.ModuleUnderflow{
				{Module: "quiet", Type: "Linear", Gradient: "params", Measure: "lost_mass", LostMass: &lost, Fraction: 0.5, MedianScale: 0.125, Lines: 20},
				{Module: "tiny", Type: "Linear", Gradient: "output", Measure: "underflow", Fraction: 0.6, MedianScale: 0.125, Lines: 20}}},
	}
	var b bytes.Buffer
	p := markup.NewWriter(&b, false)
	telemetryText(p, r)
	for _, want := range []string{
		"log: csv, 100 samples, every 10 steps; the scales prove at least 43 skipped steps and allow at most 143\n",
		"gradient telemetry: 92 lines (38 measured in full, 58 of skipped steps), 3 modules watched\n",
		"  overflow begins in   planted (Linear), output gradient on 1, parameter gradient alone on 19: 20 of 21 skipped steps in 311–350, largest scaled 2.2e+06 (4.4e+06 unscaled)\n",
		"                       head (Linear), output gradient: 1 of 21 skipped steps in 311–350\n",
		"  underflow            quiet (Linear), parameter gradient: 12.5% of its mass (L2 norm) lost to fp16; 50.0% of its nonzero elements flush to zero (median scale 2^-3 (0.125), 20 lines)\n",
		"                       tiny (Linear), output gradient: 60.0% of its nonzero elements flush to zero (median scale 2^-3 (0.125), 20 lines)\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in:\n%s", want, b.String())
		}
	}
	b.Reset()
	telemetryText(p, &report.ScalesReport{Run: report.RunInfo{Path: "run.json", Steps: 10}})
	if b.Len() != 0 {
		t.Errorf("a log of every step without telemetry printed %q", b.String())
	}
}
