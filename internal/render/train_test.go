package render

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"fp16audit/report"
)

// TestGoldenTraining renders the training audit of the deep sigmoid MLP
// (testdata/train_deep_mlp.json: fp16audit run
// fixtures/torch/train/deep_mlp.onnx --mode train --loss cross-entropy)
// in every format: the backward verdict naming the underflowing modules,
// the verified bf16 fix, the scales run and the gradients per module.
func TestGoldenTraining(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "train_deep_mlp.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r *report.Report
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	r.Tool.Version, r.Tool.ORTVersion = "0.0.0-test", "0.0.0-test"
	if r.Training == nil || r.Training.Backward == nil {
		t.Fatal("testdata/train_deep_mlp.json has no backward audit")
	}
	for _, c := range []struct{ format, ext string }{{"text", "txt"}, {"markdown", "md"}, {"html", "html"}} {
		t.Run(c.ext, func(t *testing.T) {
			var b bytes.Buffer
			if err := Render(&b, r, c.format, Options{}); err != nil {
				t.Fatal(err)
			}
			out := b.String()
			for _, want := range []string{report.BackwardUnderflow, "layers.fc0", "2^18", "bf16"} {
				if !strings.Contains(out, want) {
					t.Errorf("%s output does not mention %q", c.format, want)
				}
			}
			golden(t, "train_deep_mlp."+c.ext+".golden", b.Bytes())
		})
	}
}

// TestTrainingQuiet: an eval-mode audit of a model without BatchNorm or
// Dropout, and without a loss, adds no training section.
func TestTrainingQuiet(t *testing.T) {
	r := loadReport(t, "healthy")
	r.Training = &report.TrainingReport{Mode: report.ModeEval, BatchNorms: []report.BatchNormReport{}, Notes: []string{}}
	for _, format := range []string{"text", "markdown", "html"} {
		var b bytes.Buffer
		if err := Render(&b, r, format, Options{}); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(strings.ToLower(b.String()), "backward") || strings.Contains(b.String(), "forward in eval mode") {
			t.Errorf("%s: a training section for an eval audit with nothing to say", format)
		}
	}
}
