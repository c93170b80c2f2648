package rewrite

import (
	"fmt"
	"fp16audit/internal/testutil/ortinit"
	"math"
	"slices"
	"testing"

	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/precision"
	"fp16audit/internal/tensor"
)

// emulateOps are the ops fuzzed models chain; every one maps [2,4] floats
// (and a second [2,4] operand) to [2,4] floats.
var emulateOps = []string{"Add", "Mul", "Sub", "MatMul", "Relu", "Sigmoid", "Tanh", "Softmax", "Neg", "Abs", "Exp", "HalfCast", "Gemm", "Sqrt", "Div1"}

// FuzzEmulate builds small fp32 models from bytes — chains of the ops
// above, with the model's own x.half().float() casts and Linear biases — and
// checks the rewrites every audit runs: the upcast model, each policy's
// emulation and the instrumented graphs load in ONNX Runtime; the upcast
// model gives the original's outputs bit for bit when the model has no
// half casts; the fp32 policy's emulation (which restores the model's own
// half casts) gives the original's outputs bit for bit; and instrumenting
// a graph never changes its outputs.
func FuzzEmulate(f *testing.F) {
	f.Add([]byte{4, 0, 1, 3, 2, 11, 0, 7, 1}, float32(1))
	f.Add([]byte{6, 3, 0, 12, 1, 11, 2, 10, 0, 13, 0, 14, 1}, float32(300))
	f.Add([]byte{2, 11, 0, 11, 0}, float32(7e4))
	f.Fuzz(func(t *testing.T, data []byte, scale float32) {
		ortinit.Init(t)
		x := scaledInput(scale)
		mp, halfCasts := emulateModel(data)
		var own []string
		for _, o := range mp.Graph.Output {
			own = append(own, o.Name)
		}
		want := runFuzzModel(t, x, "original", mp, own, nil)
		m, err := onnx.LoadBytes(mustMarshal(t, mp), "/nonexistent-fp16audit-fuzz/model.onnx")
		if err != nil {
			t.Fatalf("generated model does not load: %v", err)
		}
		up, _, err := Upcast(m.Proto, m.Dir)
		if err != nil {
			t.Fatal(err)
		}
		got := runFuzzModel(t, x, "upcast", up, own, nil)
		if !halfCasts {
			sameOutputs(t, "upcast", got, want)
		}
		upIdx, err := onnx.NewIndex(up.Graph)
		if err != nil {
			t.Fatalf("upcast graph: %v", err)
		}
		var names []string
		for _, ni := range m.Index.Order() {
			names = append(names, m.Proto.Graph.Node[ni].Output...)
		}
		inst, obs := Instrument(up, names, upIdx.ElemType)
		sameOutputs(t, "instrumented upcast", runFuzzModel(t, x, "instrumented upcast", inst, own, obs), got)
		for _, p := range precision.Policies() {
			a := precision.Assign(p, m.Proto.Graph, m.Index.Order(), m.Index.ElemType)
			em := Emulate(up, m.Proto.Graph, a)
			out := runFuzzModel(t, x, p.Name, em, own, nil)
			if p.Lower == precision.FP32 {
				sameOutputs(t, p.Name, out, want)
			}
			inst, obs := Instrument(em, names, upIdx.ElemType)
			sameOutputs(t, p.Name+" instrumented", runFuzzModel(t, x, p.Name+" instrumented", inst, own, obs), out)
		}
	})
}

// emulateModel decodes a model: input x [2,4], weights w [4,4] and b [4],
// and a chain of ops each reading the previous value and one earlier value.
// It reports whether the model casts to half itself.
func emulateModel(data []byte) (*onnx.ModelProto, bool) {
	next := func() int {
		if len(data) == 0 {
			return 0
		}
		b := int(data[0])
		data = data[1:]
		return b
	}
	w := make([]float32, 16)
	for i := range w {
		w[i] = float32(i%5) - 1.5
	}
	g := &onnx.GraphProto{
		Name:  "fuzz",
		Input: []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 2, 4)},
		Initializer: []*onnx.TensorProto{
			onnx.FloatTensor("w", []int64{4, 4}, w),
			onnx.FloatTensor("b", []int64{4}, []float32{0.5, -1, 2, 0}),
			onnx.FloatTensor("one", []int64{1}, []float32{1}),
		},
	}
	values := []string{"x"}
	half := false
	n := next()%12 + 1
	for k := range n {
		op := emulateOps[next()%len(emulateOps)]
		prev := values[len(values)-1]
		other := values[next()%len(values)]
		out := fmt.Sprintf("v%d", k)
		name := fmt.Sprintf("/n%d/%s", k, op)
		switch op {
		case "Add", "Mul", "Sub":
			g.Node = append(g.Node, onnx.Node(op, name, []string{prev, other}, []string{out}))
		case "MatMul":
			mm := out + "_mm"
			g.Node = append(g.Node, onnx.Node("MatMul", name, []string{prev, "w"}, []string{mm}),
				onnx.Node("Add", name+"_bias", []string{mm, "b"}, []string{out}))
		case "Gemm":
			g.Node = append(g.Node, onnx.Node("Gemm", name, []string{prev, "w", "b"}, []string{out}, onnx.AttrInt("transB", 1)))
		case "HalfCast":
			h := out + "_h"
			half = true
			g.Node = append(g.Node, onnx.Node("Cast", name, []string{prev}, []string{h}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT16))),
				onnx.Node("Cast", name+"_back", []string{h}, []string{out}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT))))
		case "Sqrt":
			a := out + "_abs"
			g.Node = append(g.Node, onnx.Node("Abs", name+"_abs", []string{prev}, []string{a}),
				onnx.Node("Sqrt", name, []string{a}, []string{out}))
		case "Div1":
			// The exporter's torch.rsqrt: Div(1, Sqrt(x)).
			a, s := out+"_abs", out+"_sqrt"
			g.Node = append(g.Node, onnx.Node("Abs", name+"_abs", []string{prev}, []string{a}),
				onnx.Node("Sqrt", name+"_sqrt", []string{a}, []string{s}),
				onnx.Node("Div", name, []string{"one", s}, []string{out}))
		case "Softmax":
			g.Node = append(g.Node, onnx.Node(op, name, []string{prev}, []string{out}, onnx.AttrInt("axis", -1)))
		default:
			g.Node = append(g.Node, onnx.Node(op, name, []string{prev}, []string{out}))
		}
		values = append(values, out)
	}
	g.Output = []*onnx.ValueInfoProto{onnx.TensorValueInfo(values[len(values)-1], onnx.TensorProto_FLOAT, 2, 4)}
	if o := values[next()%len(values)]; o != "x" && o != values[len(values)-1] {
		g.Output = append(g.Output, onnx.TensorValueInfo(o, onnx.TensorProto_FLOAT, 2, 4))
	}
	return onnx.NewModel(g, 17), half
}

// scaledInput is the batch a fuzzed model runs on: fixed values times
// scale, so that some chains overflow or underflow fp16.
func scaledInput(scale float32) *tensor.Tensor {
	v := []float32{-3, 0.5, 120, 1e-5, 7, -60, 0, 2}
	for i := range v {
		v[i] *= scale
	}
	return tensor.FromFloat32s("x", []int64{2, 4}, v)
}

func mustMarshal(t *testing.T, mp *onnx.ModelProto) []byte {
	t.Helper()
	data, err := onnx.Marshal(mp)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// runFuzzModel runs mp on fuzzInput and returns the outputs named own (the
// original model's outputs, which every rewrite keeps). The outputs obs
// adds are requested too, so that instrumentation is exercised.
func runFuzzModel(t *testing.T, x *tensor.Tensor, what string, mp *onnx.ModelProto, own []string, obs []Observed) []*tensor.Tensor {
	t.Helper()
	names := slices.Clone(own)
	for _, o := range obs {
		if !slices.Contains(names, o.Output) {
			names = append(names, o.Output)
		}
	}
	sess, err := onnxrt.NewSession(mustMarshal(t, mp), []string{"x"}, names, onnxrt.SessionOptions{Threads: 1, Optimization: optimization})
	if err != nil {
		t.Fatalf("%s: ONNX Runtime refuses the model: %v", what, err)
	}
	defer sess.Close()
	out, err := sess.Run([]*tensor.Tensor{x})
	if err != nil {
		t.Fatalf("%s: run: %v", what, err)
	}
	return out[:len(own)]
}

// sameOutputs fails unless got and want hold the same bits (NaN payloads
// aside).
func sameOutputs(t *testing.T, what string, got, want []*tensor.Tensor) {
	t.Helper()
	if len(got) < len(want) {
		t.Fatalf("%s: %d outputs, want %d", what, len(got), len(want))
	}
	for i := range want {
		g, w := onnxrt.Float32View(got[i]), onnxrt.Float32View(want[i])
		if len(g) != len(w) {
			t.Fatalf("%s: output %d has %d elements, want %d", what, i, len(g), len(w))
		}
		for k := range g {
			if g[k] != w[k] && !(math.IsNaN(float64(g[k])) && math.IsNaN(float64(w[k]))) {
				t.Fatalf("%s: output %d element %d: %g, want %g", what, i, k, g[k], w[k])
			}
		}
	}
}
