package rewrite_test

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/rewrite"
	"fp16audit/internal/tensor"
	"fp16audit/internal/testutil/ortinit"
)

// nonFiniteCases are the ops fixtures/torch/nonfinite.py measured: one
// folder per exporter family, one case per PyTorch op, each with its
// model, the inputs holding ±Inf and NaN and PyTorch's outputs.
const nonFiniteCases = "../../fixtures/torch/nonfinite"

// nonFiniteFacts is the part of a family's facts.json the tests read.
type nonFiniteFacts struct {
	MadeWith map[string]string `json:"made_with"`
	Cases    map[string]struct {
		Ops      []string `json:"ops"`
		Variants map[string]struct {
			Torch       string `json:"torch"`
			OnnxRuntime string `json:"onnxruntime"`
		} `json:"variants"`
	} `json:"cases"`
}

var variants = []string{"finite", "pinf", "ninf", "nan", "mixed"}

// torchCPU are the variants where PyTorch's CPU kernel, which made the
// truth, is not what the emulation follows, with why.
var torchCPU = map[string]string{
	// torch 1.13's CPU kernel and CUDA's (x·0.5·(1 + erf(x/√2)))
	// give +Inf, as ONNX Runtime's Gelu does.
	"dynamo/gelu/pinf":  "torch 2.15's vectorized CPU gelu gives gelu(+Inf) = NaN",
	"dynamo/gelu/mixed": "torch 2.15's vectorized CPU gelu gives gelu(+Inf) = NaN",
}

// TestTorchNonFinite runs every measured case's model rewritten by
// TorchNonFinite in ONNX Runtime, on each input (finite, +Inf, -Inf, NaN,
// +Inf and -Inf), and holds its output to PyTorch's: NaN, +Inf and -Inf
// at the same elements (TopK's NaN, which PyTorch sorts first, at any
// position of its row), the finite elements within 1e-3 (relative).
func TestTorchNonFinite(t *testing.T) {
	ortinit.Init(t)
	for _, family := range []string{"torchscript", "dynamo"} {
		facts := readNonFiniteFacts(t, family)
		for name, c := range facts.Cases {
			t.Run(family+"/"+name, func(t *testing.T) {
				dir := filepath.Join(nonFiniteCases, family, name)
				m, err := onnx.Load(filepath.Join(dir, "model.onnx"))
				if err != nil {
					t.Fatal(err)
				}
				data := readArrays(t, filepath.Join(dir, "data.npz"))
				got := runNonFinite(t, rewrite.TorchNonFinite(m.Proto), data)
				ordered := slices.ContainsFunc(c.Ops, func(op string) bool {
					return ops.Lookup("", op).NonFinite == ops.NonFiniteNaNOrder
				})
				for _, v := range variants {
					if why, ok := torchCPU[family+"/"+name+"/"+v]; ok {
						t.Logf("%s: not compared: %s", v, why)
						continue
					}
					want := data["y_"+v]
					if msg := compareTorch(got[v], want, ordered); msg != "" {
						t.Errorf("%s: %s (PyTorch %s, ONNX Runtime without the rewrite %s)", v, msg, c.Variants[v].Torch, c.Variants[v].OnnxRuntime)
					}
				}
			})
		}
	}
}

// TestNonFiniteRegistry holds the registry to the measurements: every op
// a measured model uses has its NonFinite fact (control flow aside), and
// every op with a rule has a case where ONNX Runtime's kernel, without
// the rewrite, differs from PyTorch (the fact is still true), while an op
// measured as PyTorch's is in a case where nothing differs.
func TestNonFiniteRegistry(t *testing.T) {
	differs := map[string]bool{}
	agrees := map[string]bool{}
	for _, family := range []string{"torchscript", "dynamo"} {
		facts := readNonFiniteFacts(t, family)
		for name, c := range facts.Cases {
			same := true
			for _, v := range c.Variants {
				same = same && v.Torch == v.OnnxRuntime
			}
			for _, op := range c.Ops {
				o := ops.Lookup("", op)
				if o == nil || o.Subgraphs {
					continue
				}
				if o.NonFinite == ops.NonFiniteUnknown {
					t.Errorf("%s/%s: %s has no NonFinite fact in the registry", family, name, op)
				}
				if same {
					agrees[op] = true
				} else {
					differs[op] = true
				}
			}
		}
	}
	for _, o := range ops.All() {
		switch o.NonFinite {
		case ops.NonFiniteUnknown:
		case ops.NonFiniteAsTorch:
			if !agrees[o.Name] {
				t.Errorf("%s: measured as PyTorch's, but no case where ONNX Runtime agrees with PyTorch uses it", o.Name)
			}
		default:
			if !differs[o.Name] {
				t.Errorf("%s: has a rule, but no case where ONNX Runtime differs from PyTorch uses it", o.Name)
			}
		}
	}
}

func readNonFiniteFacts(t *testing.T, family string) nonFiniteFacts {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(nonFiniteCases, family, "facts.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f nonFiniteFacts
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Cases) < 70 {
		t.Fatalf("%s: %d cases: the measurement lost some", family, len(f.Cases))
	}
	return f
}

func readArrays(t *testing.T, path string) map[string]*tensor.Tensor {
	t.Helper()
	ts, err := batch.ReadNPZ(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*tensor.Tensor{}
	for _, x := range ts {
		out[strings.TrimSuffix(x.Name, ".npy")] = x
	}
	return out
}

// runNonFinite runs m on each variant's input x_<variant> and returns
// its output y.
func runNonFinite(t *testing.T, m *onnx.ModelProto, data map[string]*tensor.Tensor) map[string]*tensor.Tensor {
	t.Helper()
	bytes, err := onnx.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	s, err := onnxrt.NewSession(bytes, []string{"x"}, []string{"y"}, onnxrt.SessionOptions{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	out := map[string]*tensor.Tensor{}
	for _, v := range variants {
		x := *data["x_"+v]
		x.Name = "x"
		res, err := s.Run([]*tensor.Tensor{&x})
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		out[v] = res[0]
	}
	return out
}

// compareTorch says how got differs from PyTorch's want ("" when it does
// not): the non-finite elements by kind, the finite ones by value. With
// ordered, a row's (last axis') non-finite elements are compared as a
// set.
func compareTorch(got, want *tensor.Tensor, ordered bool) string {
	g, err1 := got.Float32s()
	w, err2 := want.Float32s()
	if err1 != nil || err2 != nil || len(g) != len(w) {
		return "the outputs differ in size or type"
	}
	kind := func(v float32) byte {
		switch f := float64(v); {
		case math.IsNaN(f):
			return 'n'
		case math.IsInf(f, 1):
			return '+'
		case math.IsInf(f, -1):
			return '-'
		}
		return '.'
	}
	row := 1
	if ordered && len(want.Shape) > 0 {
		row = int(want.Shape[len(want.Shape)-1])
	}
	for start := 0; start < len(w); start += row {
		var gk, wk []byte
		for i := start; i < start+row; i++ {
			gk, wk = append(gk, kind(g[i])), append(wk, kind(w[i]))
			if gk[len(gk)-1] == '.' && wk[len(wk)-1] == '.' {
				if d := math.Abs(float64(g[i] - w[i])); d > 1e-3*math.Max(1, math.Abs(float64(w[i]))) {
					if !ordered {
						return fmt.Sprintf("element %d is %g, PyTorch's %g", i, g[i], w[i])
					}
				}
			}
		}
		if ordered {
			slices.Sort(gk)
			slices.Sort(wk)
		}
		if string(gk) != string(wk) {
			return fmt.Sprintf("elements %d..%d are %s, PyTorch's %s ('.' finite, n NaN, +/- Inf)", start, start+row-1, gk, wk)
		}
	}
	return ""
}
