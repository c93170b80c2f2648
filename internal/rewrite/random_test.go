package rewrite_test

import (
	"math"
	"slices"
	"testing"

	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/rewrite"
	"fp16audit/internal/tensor"
	"fp16audit/internal/testutil/ortinit"
)

// randomModel draws in every way an export does: a Dropout in training
// mode with its mask, a stochastic depth's RandomUniformLike, a
// RandomNormal and a Bernoulli, over n elements.
func randomModel(n int64) *onnx.ModelProto {
	probs := make([]float32, n)
	for i := range probs {
		probs[i] = 0.25
	}
	g := &onnx.GraphProto{
		Name: "random",
		Node: []*onnx.NodeProto{
			onnx.Node("Dropout", "drop", []string{"x", "ratio", "train"}, []string{"y", "mask"}, onnx.AttrInt("seed", 3)),
			onnx.Node("RandomUniformLike", "depth", []string{"x"}, []string{"u"}, onnx.AttrFloat("low", -1), onnx.AttrFloat("high", 3)),
			onnx.Node("RandomNormal", "noise", nil, []string{"z"}, onnx.AttrInts("shape", n), onnx.AttrFloat("mean", 2), onnx.AttrFloat("scale", 0.5)),
			onnx.Node("Bernoulli", "coin", []string{"p"}, []string{"b"}),
		},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("ratio", nil, []float32{0.3}),
			{Name: "train", DataType: int32(onnx.TensorProto_BOOL), RawData: []byte{1}},
			onnx.FloatTensor("p", []int64{n}, probs)},
		Input: []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, n)},
		Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, n), onnx.TensorValueInfo("u", onnx.TensorProto_FLOAT, n),
			onnx.TensorValueInfo("z", onnx.TensorProto_FLOAT, n), onnx.TensorValueInfo("b", onnx.TensorProto_FLOAT, n)},
	}
	return onnx.NewModel(g, 17)
}

// runTwice runs m twice in one session and returns both runs' outputs.
func runTwice(t *testing.T, m *onnx.ModelProto, x *tensor.Tensor) [2][][]float32 {
	t.Helper()
	data, err := onnx.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	s, err := onnxrt.NewSession(data, []string{"x"}, []string{"y", "u", "z", "b"}, onnxrt.SessionOptions{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out [2][][]float32
	for r := range out {
		res, err := s.Run([]*tensor.Tensor{x})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range res {
			f, err := v.Float32s()
			if err != nil {
				t.Fatal(err)
			}
			out[r] = append(out[r], f)
		}
	}
	return out
}

// TestFixedRandom: ONNX Runtime draws new numbers at every run of a
// session, seed or not (which made the backward's runs, compared with one
// another, differ by their Dropout masks); after FixedRandom both runs
// draw the same, and the draws have the distributions the ops ask for.
func TestFixedRandom(t *testing.T) {
	ortinit.Init(t)
	const n = 1 << 16
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = 1 + float32(i%5)
	}
	x := tensor.FromFloat32s("x", []int64{n}, xs)
	m := randomModel(n)

	before := runTwice(t, m, x)
	if slices.Equal(before[0][0], before[1][0]) {
		t.Errorf("ONNX Runtime's Dropout drew the same mask twice: the rewrite may no longer be needed")
	}

	fixed, count, err := rewrite.FixedRandom(m)
	if err != nil {
		t.Fatal(err)
	}
	if count != 4 {
		t.Errorf("%d nodes rewritten, want 4", count)
	}
	if len(m.Graph.Node) != 4 {
		t.Errorf("the model was modified: %d nodes", len(m.Graph.Node))
	}
	after := runTwice(t, fixed, x)
	for k, name := range []string{"y", "u", "z", "b"} {
		if !slices.Equal(after[0][k], after[1][k]) {
			t.Errorf("%s differs between two runs of the fixed model", name)
		}
	}
	y, u, z, b := after[0][0], after[0][1], after[0][2], after[0][3]

	// Dropout: each element dropped, or kept and scaled by 1/(1-0.3)
	kept := 0
	for i, v := range y {
		switch {
		case v == 0:
		case math.Abs(float64(v)-float64(xs[i])/0.7) < 1e-5*float64(xs[i]):
			kept++
		default:
			t.Fatalf("y[%d] = %g, want 0 or %g", i, v, xs[i]/0.7)
		}
	}
	// binomial standard deviation of the kept fraction: sqrt(0.21/n) = 0.0018
	if f := float64(kept) / n; math.Abs(f-0.7) > 0.01 {
		t.Errorf("kept %.4f of the elements at ratio 0.3", f)
	}
	// neighbours independent: a kept element keeps its neighbour 70 % of
	// the time
	both, first := 0, 0
	for i := 0; i+1 < n; i++ {
		if y[i] != 0 {
			first++
			if y[i+1] != 0 {
				both++
			}
		}
	}
	if f := float64(both) / float64(first); math.Abs(f-0.7) > 0.015 {
		t.Errorf("after a kept element the next is kept %.4f of the time, want 0.7", f)
	}

	mean := func(v []float32) float64 {
		s := 0.0
		for _, e := range v {
			s += float64(e)
		}
		return s / float64(len(v))
	}
	sd := func(v []float32) float64 {
		mu, s := mean(v), 0.0
		for _, e := range v {
			s += (float64(e) - mu) * (float64(e) - mu)
		}
		return math.Sqrt(s / float64(len(v)))
	}
	lo, hi := slices.Min(u), slices.Max(u)
	if lo < -1 || hi > 3 || math.Abs(mean(u)-1) > 0.02 || math.Abs(sd(u)-4/math.Sqrt(12)) > 0.02 {
		t.Errorf("uniform on [-1, 3): range [%g, %g], mean %.4f, sd %.4f (want 1, %.4f)", lo, hi, mean(u), sd(u), 4/math.Sqrt(12))
	}
	if math.Abs(mean(z)-2) > 0.01 || math.Abs(sd(z)-0.5) > 0.01 {
		t.Errorf("normal(2, 0.5): mean %.4f, sd %.4f", mean(z), sd(z))
	}
	for _, v := range z {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("normal draw %g", v)
		}
	}
	ones := 0
	for _, v := range b {
		if v != 0 && v != 1 {
			t.Fatalf("Bernoulli draw %g", v)
		}
		if v == 1 {
			ones++
		}
	}
	if f := float64(ones) / n; math.Abs(f-0.25) > 0.01 {
		t.Errorf("Bernoulli(0.25) drew 1 %.4f of the time", f)
	}
}

// TestFixedRandomLeavesOthers: a Dropout in inference, or with ratio 0,
// is left as it is, and a model with nothing random is returned as given.
func TestFixedRandomLeavesOthers(t *testing.T) {
	g := &onnx.GraphProto{
		Name: "plain",
		Node: []*onnx.NodeProto{
			onnx.Node("Dropout", "eval", []string{"x", "ratio"}, []string{"h"}),
			onnx.Node("Dropout", "zero", []string{"h", "none", "train"}, []string{"y"}),
		},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("ratio", nil, []float32{0.3}), onnx.FloatTensor("none", nil, []float32{0}),
			{Name: "train", DataType: int32(onnx.TensorProto_BOOL), RawData: []byte{1}}},
		Input:  []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 4)},
		Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 4)},
	}
	m := onnx.NewModel(g, 17)
	got, count, err := rewrite.FixedRandom(m)
	if err != nil {
		t.Fatal(err)
	}
	if count != 0 || got != m {
		t.Errorf("rewrote %d nodes of a model that draws nothing", count)
	}
}
