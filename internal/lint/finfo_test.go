package lint_test

import (
	"path/filepath"
	"testing"

	"fp16audit/checks"
	"fp16audit/internal/lint"
	"fp16audit/internal/onnx"
)

// TestFinfoToldByItsLine: the same GPT-style decoder masking its scores
// with masked_fill(mask, torch.finfo(att.dtype).min), as the TorchScript
// exporter writes it (no line of Python recorded: the number could be a
// hard-coded finfo(torch.float32).min, a warning) and as the dynamo
// exporter does (the line recorded asks the dtype: information). PyTorch
// says both are healthy (their truth.json).
func TestFinfoToldByItsLine(t *testing.T) {
	for _, c := range []struct {
		dir  string
		want checks.Severity
	}{
		{"../../fixtures/torch/cases/gpt_mask_finfo_dtype", checks.SevWarning},
		{"../../fixtures/torch/cases_dynamo/gpt_mask_finfo_dtype", checks.SevInfo},
	} {
		t.Run(filepath.Base(filepath.Dir(c.dir)), func(t *testing.T) {
			m, err := onnx.Load(filepath.Join(c.dir, "model.onnx"))
			if err != nil {
				t.Fatal(err)
			}
			fs, err := lint.Run(m, lint.Options{Policy: "autocast-fp16"})
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, f := range fs {
				if f.Check != lint.CheckConstRange.ID {
					continue
				}
				n++
				if f.Severity != c.want {
					t.Errorf("%s at %s: %s, want %s", f.Check, f.Node, f.Severity, c.want)
				}
			}
			if n != 2 {
				t.Errorf("%d FP4004 findings, want one per attention layer: %v", n, fs)
			}
		})
	}
}
