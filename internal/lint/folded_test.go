package lint_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"fp16audit/checks"
	"fp16audit/internal/lint"
	"fp16audit/internal/onnx"
)

// foldedBN are one CNN with trained BatchNorm statistics as each exporter
// writes it (fixtures/torch/folded_bn.py), with PyTorch's execution order.
const foldedBN = "../../fixtures/torch/folded_bn"

// TestFoldedBatchNorm: FP4009 names every BatchNorm the export folded
// (PyTorch's execution order says which layer each follows; the export
// says which it kept), says how to export without the fold, and says
// nothing where every BatchNorm is its own node.
func TestFoldedBatchNorm(t *testing.T) {
	for _, family := range []string{"torchscript", "torchscript_training", "momentum0", "torchscript2", "dynamo", "dynamo_unoptimized"} {
		t.Run(family, func(t *testing.T) {
			dir := filepath.Join(foldedBN, family)
			var truth struct {
				After map[string]string `json:"batchnorm_after"`
				Nodes []string          `json:"batchnorm_nodes"`
			}
			data, err := os.ReadFile(filepath.Join(dir, "truth.json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(data, &truth); err != nil {
				t.Fatal(err)
			}
			m, err := onnx.Load(filepath.Join(dir, "model.onnx"))
			if err != nil {
				t.Fatal(err)
			}
			fds := foldedFindings(t, m)
			folded := len(truth.After) - len(truth.Nodes)
			if folded == 0 {
				if len(fds) != 0 {
					t.Fatalf("every BatchNorm is its own node, yet: %v", fds)
				}
				return
			}
			if len(fds) != 1 || fds[0].Severity != checks.SevWarning {
				t.Fatalf("want one FP4009 warning, got %v", fds)
			}
			msg := fds[0].Message
			if !strings.Contains(msg, "optimize=False") {
				t.Errorf("%q says nothing of how to export without the fold", msg)
			}
			if strings.HasPrefix(family, "dynamo") {
				// the metadata names each BatchNorm and its layer
				for bn, layer := range truth.After {
					if !strings.Contains(msg, bn+" into "+layer) {
						t.Errorf("%q does not say that %s was folded into %s", msg, bn, layer)
					}
				}
				return
			}
			// TorchScript: the Conv nodes whose weights the exporter
			// computed, one per folded BatchNorm
			if n := strings.Count(msg, "onnx::Conv_") / 2; n != folded {
				t.Errorf("%q names %d folded layer(s), PyTorch's model has %d BatchNorm(s) the export does not keep", msg, n, folded)
			}
		})
	}
}

// TestFoldedBatchNormUntold: an export without metadata (torch 1.13's ViT,
// its patch embedding a Conv) whose
// convolutions keep their weights' names and no BatchNormalization node
// cannot tell; FP4009 says so once, as information.
func TestFoldedBatchNormUntold(t *testing.T) {
	m, err := onnx.Load("../../fixtures/torch/cases/vit_tiny/model.onnx")
	if err != nil {
		t.Fatal(err)
	}
	fds := foldedFindings(t, m)
	if len(fds) != 1 || fds[0].Severity != checks.SevInfo || !strings.Contains(fds[0].Message, "cannot be told") {
		t.Fatalf("want one FP4009 information saying it cannot be told, got %v", fds)
	}
}

func foldedFindings(t *testing.T, m *onnx.Model) []checks.Finding {
	t.Helper()
	sel, err := checks.ParseSelection("FP4009")
	if err != nil {
		t.Fatal(err)
	}
	fds, err := lint.Run(m, lint.Options{Checks: sel})
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(fds, func(f checks.Finding) bool { return f.Check != "FP4009" })
}
