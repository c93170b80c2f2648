package audit_test

import (
	"context"
	"path/filepath"
	"testing"

	"fp16audit/checks"
	"fp16audit/internal/audit"
	"fp16audit/internal/lint"
)

// TestFinfoToldByItsLine: fp16audit run judges the dtype-aware mask fill
// as lint does: a warning where the export cannot tell it from a
// hard-coded torch.finfo(torch.float32).min (TorchScript), information
// where the dynamo export's line of Python asks the dtype; healthy and
// passing the default gate either way, as PyTorch runs it.
func TestFinfoToldByItsLine(t *testing.T) {
	for _, c := range []struct {
		root string
		want checks.Severity
	}{{torchCases, checks.SevWarning}, {torchDynamoCases, checks.SevInfo}} {
		t.Run(filepath.Base(c.root), func(t *testing.T) {
			dir := filepath.Join(c.root, "gpt_mask_finfo_dtype")
			r, err := audit.Run(context.Background(), audit.Config{ModelPath: filepath.Join(dir, "model.onnx"),
				Inputs: []string{filepath.Join(dir, "batches")}, Threads: 1, NoFixes: true})
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, f := range r.Findings {
				if f.Check == lint.CheckConstRange.ID {
					n++
					if f.Severity != c.want {
						t.Errorf("%s at %s: %s, want %s: %s", f.Check, f.Node, f.Severity, c.want, f.Message)
					}
				}
			}
			if n == 0 || r.MaxSeverity() >= checks.SevError {
				t.Errorf("%d FP4004 findings, worst severity %s: want some, below error", n, r.MaxSeverity())
			}
		})
	}
}
