package audit_test

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"fp16audit/internal/audit"
	"fp16audit/internal/batch"
	"fp16audit/internal/tensor"
	"fp16audit/report"
)

// seqDynamoCases are models whose dynamo export, made with optimize=False
// and nothing folded as the CLI recipe makes it, holds sequences: chunk
// and split as SplitToSequence read by SequenceAt
// (fixtures/torch/cases_seq.py, torch 2.15, with its truth).
const seqDynamoCases = "../../fixtures/torch/cases_seq_dynamo"

// TestTorchTruthSequences: exports holding sequences audit as PyTorch
// runs them, under every policy, by verdict, module and node. ONNX
// Runtime refused every one of them while the rounding went on the
// sequence itself.
func TestTorchTruthSequences(t *testing.T) {
	torchTruth(t, seqDynamoCases, map[string]string{})
}

// TestSequenceOrigins: the NaN/Inf a sequence holds start where the
// tensor it was cut from went non-finite: the pieces SequenceAt takes out
// of it are where they spread, never an origin of their own (a sequence
// has no statistics of its own: it holds its tensors').
func TestSequenceOrigins(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	dir := filepath.Join(seqDynamoCases, "glu_proj_overflow")
	r, err := audit.Run(context.Background(), audit.Config{ModelPath: filepath.Join(dir, "model.onnx"),
		Inputs: []string{filepath.Join(dir, "batches")}, Threads: 1, NoFixes: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Origins) != 1 {
		t.Fatalf("%d origins, want the projection alone: %+v", len(r.Origins), r.Origins)
	}
	o := r.Origins[0]
	if o.Module != "proj" || !slices.Contains(o.AffectedOutputs, "output") {
		t.Errorf("origin %s (%s, module %s) reaching %v; want the projection, reaching the output through the sequence", o.Node, o.OpType, o.Module, o.AffectedOutputs)
	}
}

// TestSequencesBackward: the training audit differentiates through the
// sequences (no op left without a gradient rule), and each parameter's
// fp32 gradient of mse(output, 0) has the norm autograd gave it.
func TestSequencesBackward(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	dirs, err := filepath.Glob(filepath.Join(seqDynamoCases, "*", "truth.json"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no cases under %s: %v", seqDynamoCases, err)
	}
	for _, p := range dirs {
		dir := filepath.Dir(p)
		var tr struct {
			Extra struct {
				Norms map[string]float64 `json:"fp32_grad_norms_mse_zero"`
			} `json:"extra"`
			Policies map[string]struct {
				OutputsNonfinite bool `json:"outputs_nonfinite"`
			} `json:"policies"`
		}
		readJSON(t, p, &tr)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			in, err := filepath.Glob(filepath.Join(dir, "batches", "*.npy"))
			if err != nil || len(in) != 1 {
				t.Fatalf("want one batch: %v %v", in, err)
			}
			r, err := audit.Run(context.Background(), audit.Config{ModelPath: filepath.Join(dir, "model.onnx"), Inputs: in, Threads: 1, NoFixes: true,
				Train: audit.TrainConfig{Mode: "train", Loss: "mse", Target: zeroTarget(t, dir, in[0])}})
			if err != nil {
				t.Fatal(err)
			}
			b := r.Training.Backward
			if len(b.Unsupported) > 0 {
				t.Errorf("the backward stops at %+v", b.Unsupported)
			}
			got := map[string]float64{}
			for _, pr := range b.Parameters {
				got[pr.Name] = pr.Norm
			}
			if len(tr.Extra.Norms) == 0 {
				t.Fatal("the truth holds no gradients")
			}
			for name, want := range tr.Extra.Norms {
				g, ok := got[name]
				if !ok {
					t.Errorf("%s: no gradient (the backward has %v)", name, got)
					continue
				}
				if math.Abs(g-want) > 1e-3*want+1e-7 {
					t.Errorf("%s: gradient norm %.6g, autograd's %.6g", name, g, want)
				}
			}
			// Where PyTorch's fp16 forward is NaN/Inf, so is its loss and
			// every fp16 backward, whatever the scale; elsewhere the
			// backward is healthy.
			if tr.Policies["autocast-fp16"].OutputsNonfinite {
				if b.Verdict != report.BackwardOverflowEveryScale {
					t.Errorf("PyTorch's fp16 forward is NaN/Inf, the backward says %s (%s)", b.Verdict, b.VerdictText)
				}
			} else if b.Verdict != report.BackwardHealthy {
				t.Errorf("backward %s (%s)", b.Verdict, b.VerdictText)
			}
		})
	}
}

// zeroTarget writes a target of zeros shaped as the model's output on the
// batch at in (the audit's own forward tells the shape).
func zeroTarget(t *testing.T, dir, in string) string {
	t.Helper()
	r, err := audit.Run(context.Background(), audit.Config{ModelPath: filepath.Join(dir, "model.onnx"), Inputs: []string{in}, Threads: 1, NoFixes: true})
	if err != nil {
		t.Fatal(err)
	}
	shape := outputShape(t, r)
	data, err := batch.EncodeNPY(tensor.FromFloat32s("target", shape, make([]float32, tensor.NumElements(shape))))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "target.npy")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// outputShape is the shape of the graph output "output" in the report's
// node statistics (one batch).
func outputShape(t *testing.T, r *report.Report) []int64 {
	t.Helper()
	for _, n := range r.Nodes {
		for _, o := range n.Outputs {
			if o.Name != "output" {
				continue
			}
			var shape []int64
			for _, f := range strings.Split(strings.Trim(o.Shape, "[]"), ",") {
				d, err := strconv.ParseInt(f, 10, 64)
				if err != nil {
					t.Fatalf("output shape %q: %v", o.Shape, err)
				}
				shape = append(shape, d)
			}
			return shape
		}
	}
	t.Fatal("no value \"output\" in the report")
	return nil
}
