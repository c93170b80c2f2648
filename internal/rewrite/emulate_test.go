package rewrite

import (
	"fp16audit/internal/testutil/ortinit"
	"math"
	"path/filepath"
	"testing"

	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/precision"
	"fp16audit/internal/tensor"
)

const optimization = "none"

func runModel(t *testing.T, m *onnx.ModelProto, opt onnxrt.SessionOptions, inputs []*tensor.Tensor, inNames, outNames []string) []*tensor.Tensor {
	t.Helper()
	data, err := onnx.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	s, err := onnxrt.NewSession(data, inNames, outNames, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	outs, err := s.Run(inputs)
	if err != nil {
		t.Fatal(err)
	}
	return outs
}

// TestEmulatedMatMulOverflow checks the emulation against a direct
// computation: a MatMul whose fp32 output is known exactly. Under autocast
// its output is stored in fp16, so exactly the elements whose fp32 value
// rounds beyond 65504 (|y| >= 65520) are ±Inf, and 65519 rounds to 65504.
func TestEmulatedMatMulOverflow(t *testing.T) {
	ortinit.Init(t)
	// y = A·[1,1]ᵀ; every entry of A is exact in fp16 and every sum exact in fp32.
	a := []float32{
		65504, 0, // 65504: the fp16 max, finite
		65504, 15, // 65519: rounds down to 65504
		65504, 16, // 65520: halfway, rounds to even = Inf
		65504, 4496, // 70000: Inf
		-65504, -4496, // -70000: -Inf
		100, 20, // 120
	}
	want := []float32{65504, 65504, float32(math.Inf(1)), float32(math.Inf(1)), float32(math.Inf(-1)), 120}
	g := &onnx.GraphProto{
		Name:        "matmul",
		Node:        []*onnx.NodeProto{onnx.Node("MatMul", "/fc/MatMul", []string{"x", "w"}, []string{"y"})},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("w", []int64{2, 1}, []float32{1, 1})},
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 6, 2)},
		Output:      []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 6, 1)},
	}
	m := onnx.NewModel(g, 17)
	p, _ := precision.PolicyByName("autocast-fp16")
	asg := precision.Assign(p, g, nil, nil)
	em := Emulate(m, g, asg)
	x := tensor.FromFloat32s("x", []int64{6, 2}, a)
	ref := onnxrt.Float32View(runModel(t, m, onnxrt.SessionOptions{}, []*tensor.Tensor{x}, []string{"x"}, []string{"y"})[0])
	got := onnxrt.Float32View(runModel(t, em, onnxrt.SessionOptions{}, []*tensor.Tensor{x}, []string{"x"}, []string{"y"})[0])
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("y[%d]: emulated fp16 %g, want %g (fp32 %g)", i, got[i], want[i], ref[i])
		}
		if math.IsInf(float64(ref[i]), 0) {
			t.Errorf("y[%d]: fp32 reference is %g", i, ref[i])
		}
	}
	// The same input with a value beyond 65504 overflows in the input cast:
	// the MatMul, not the rounding Cast, is where Inf appears.
	x2 := tensor.FromFloat32s("x", []int64{6, 2}, append([]float32{70000, 0}, a[2:]...))
	got2 := onnxrt.Float32View(runModel(t, em, onnxrt.SessionOptions{}, []*tensor.Tensor{x2}, []string{"x"}, []string{"y"})[0])
	if !math.IsInf(float64(got2[0]), 1) {
		t.Errorf("input 70000: emulated output %g, want +Inf", got2[0])
	}
}

// TestInstrumentKeepsOutputs: marking every intermediate as an output must
// leave the model's own outputs bit-identical to a plain run.
func TestInstrumentKeepsOutputs(t *testing.T) {
	ortinit.Init(t)
	for _, name := range []string{"mlp", "cnn", "attention", "demo_cnn", "cnn_external", "overflowing_op", "torch_resnetish", "torch_half_cast"} {
		path := filepath.Join("..", "..", "fixtures", "models", name+".onnx")
		m, err := onnx.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		specs := batch.Specs(m.Proto.Graph, m.Index)
		bs, _, err := batch.Load(specs, batch.Options{Seed: 3, Shapes: map[string][]int64{}})
		if err != nil {
			t.Fatal(err)
		}
		var outNames []string
		for _, o := range m.Proto.Graph.Output {
			outNames = append(outNames, o.Name)
		}
		var all []string
		for _, ni := range m.Index.Order() {
			for _, o := range m.Proto.Graph.Node[ni].Output {
				if onnx.IsFloatType(m.Index.ElemType(o)) {
					all = append(all, o)
				}
			}
		}
		inst, obs := Instrument(m.Proto, all, m.Index.ElemType)
		if len(obs) < len(m.Proto.Graph.Node)/2 {
			t.Errorf("%s: only %d values Observed for %d nodes", name, len(obs), len(m.Proto.Graph.Node))
		}
		opt := onnxrt.SessionOptions{ExternalDataDir: m.Dir, Optimization: optimization}
		plain := runModel(t, m.Proto, opt, bs[0].Inputs, batch.Names(specs), outNames)
		marked := runModel(t, inst, opt, bs[0].Inputs, batch.Names(specs), outNames)
		for i := range plain {
			if string(plain[i].Data) != string(marked[i].Data) {
				t.Errorf("%s: output %s differs once every intermediate is an output", name, outNames[i])
			}
		}
	}
}

// TestUpcastRemovesHalf: the fp32 reference of a model with its own half
// cast computes in fp32, so the overflow the cast causes is absent there.
func TestUpcastRemovesHalf(t *testing.T) {
	m, err := onnx.Load(filepath.Join("..", "..", "fixtures", "models", "torch_half_cast.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	up, casts, err := Upcast(m.Proto, m.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(casts) != 1 || m.Proto.Graph.Node[casts[0]].Name != "/Cast" {
		t.Fatalf("half casts %v, want the node /Cast", casts)
	}
	if to := up.Graph.Node[casts[0]].Attribute[0].I; to != int64(onnx.TensorProto_FLOAT) {
		t.Errorf("upcast Cast to=%d, want FLOAT", to)
	}
	if to := m.Proto.Graph.Node[casts[0]].Attribute[0].I; to != int64(onnx.TensorProto_FLOAT16) {
		t.Errorf("the loaded model was modified: Cast to=%d", to)
	}
}

// TestEmulatedSequence: torch.chunk of an fp16 Linear's output, as the
// dynamo exporter writes it without its optimizer (SplitToSequence read
// by SequenceAt): the sequence holds the rounded tensor and is never
// rounded or cast itself (ONNX Runtime refuses a Cast of a sequence);
// the pieces SequenceAt takes out are fp16, as chunk's views are, so
// their product overflows in fp16 where each piece fits.
func TestEmulatedSequence(t *testing.T) {
	ortinit.Init(t)
	g := &onnx.GraphProto{
		Name: "chunk",
		Node: []*onnx.NodeProto{
			onnx.Node("MatMul", "up", []string{"x", "w"}, []string{"h"}),
			onnx.Node("SplitToSequence", "chunk", []string{"h", "two"}, []string{"seq"}, onnx.AttrInt("axis", 1)),
			onnx.Node("SequenceAt", "gate", []string{"seq", "zero"}, []string{"a"}),
			onnx.Node("SequenceAt", "value", []string{"seq", "one"}, []string{"b"}),
			onnx.Node("Mul", "mul", []string{"a", "b"}, []string{"y"}),
		},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("w", []int64{1, 4}, []float32{1, 1, 1, 1}), onnx.Int64Tensor("two", nil, []int64{2}),
			onnx.Int64Tensor("zero", nil, []int64{0}), onnx.Int64Tensor("one", nil, []int64{1})},
		Input:  []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 2, 1)},
		Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 2, 2)},
	}
	m := onnx.NewModel(g, 18)
	p, _ := precision.PolicyByName("autocast-fp16")
	ix, err := onnx.NewIndex(g)
	if err != nil {
		t.Fatal(err)
	}
	asg := precision.Assign(p, g, nil, ix.ElemType)
	for _, v := range []string{"h", "seq", "a", "b", "y"} {
		if asg.Value[v] != precision.FP16 {
			t.Errorf("%s held in %s, want fp16", v, asg.Value[v])
		}
	}
	em := Emulate(m, g, asg)
	eix, err := onnx.NewIndex(em.Graph)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range em.Graph.Node {
		for _, in := range n.Input {
			if !eix.Tensor(in) && n.OpType != "SequenceAt" {
				t.Errorf("node %s (%s) reads the sequence %s", eix.NodeLabel(i), n.OpType, in)
			}
		}
	}
	// 250 × 300 = 75000 > 65504: Inf in fp16; 100 × 100 fits
	x := tensor.FromFloat32s("x", []int64{2, 1}, []float32{100, 273.861})
	got := onnxrt.Float32View(runModel(t, em, onnxrt.SessionOptions{}, []*tensor.Tensor{x}, []string{"x"}, []string{"y"})[0])
	if got[0] != 10000 || !math.IsInf(float64(got[2]), 1) {
		t.Errorf("emulated fp16 y = %v, want 10000 first and +Inf in the second row", got)
	}
}
