package rewrite

import (
	"testing"

	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
)

// guardModel is T5's float16-only clamp as the TorchScript exporter
// writes it after model.half(): Clip(h, -w, w) with w = Where(any(IsInf(h)),
// 64504, 65504), beside a plain clamp of another value to fp16's range
// that is no guard (no IsInf of its own value).
func guardModel() *onnx.ModelProto {
	fl := onnx.TensorProto_FLOAT
	g := &onnx.GraphProto{
		Input:  []*onnx.ValueInfoProto{onnx.TensorValueInfo("h", fl, "N", 4), onnx.TensorValueInfo("x", fl, "N", 4)},
		Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("clamped", fl, "N", 4), onnx.TensorValueInfo("plain", fl, "N", 4)},
		Initializer: []*onnx.TensorProto{
			onnx.FloatTensor("lo", nil, []float32{64504}), onnx.FloatTensor("hi", nil, []float32{65504}),
			onnx.FloatTensor("zero", nil, []float32{0}), onnx.FloatTensor("neg", nil, []float32{-65504}),
		},
		Node: []*onnx.NodeProto{
			onnx.Node("Cast", "/Cast", []string{"h"}, []string{"h64"}, onnx.AttrInt("to", int64(onnx.TensorProto_DOUBLE))),
			onnx.Node("IsInf", "/IsInf", []string{"h64"}, []string{"inf"}),
			onnx.Node("Cast", "/Cast_1", []string{"inf"}, []string{"infl"}, onnx.AttrInt("to", int64(onnx.TensorProto_INT64))),
			onnx.Node("ReduceSum", "/ReduceSum", []string{"infl"}, []string{"n"}, onnx.AttrInt("keepdims", 0)),
			onnx.Node("Cast", "/Cast_n", []string{"n"}, []string{"nf"}, onnx.AttrInt("to", int64(fl))),
			onnx.Node("Greater", "/Greater", []string{"nf", "zero"}, []string{"any"}),
			onnx.Node("Where", "/Where", []string{"any", "lo", "hi"}, []string{"w"}),
			onnx.Node("Neg", "/Neg", []string{"w"}, []string{"negw"}),
			onnx.Node("Clip", "/Clip", []string{"h", "negw", "w"}, []string{"clamped"}),
			onnx.Node("Clip", "/Clip_plain", []string{"x", "neg", "hi"}, []string{"plain"}),
		},
	}
	return &onnx.ModelProto{IrVersion: 8, OpsetImport: []*onnx.OperatorSetIdProto{{Version: 17}}, Graph: g}
}

// TestHalfGuards: T5's float16-only clamp is found (and a plain clamp to
// fp16's range is not); the fp32 reference does not clamp (Upcast makes
// it an Identity), and an emulated pass clamps where it holds the value
// in fp16 and not where it holds it in fp32, as PyTorch's runs do.
func TestHalfGuards(t *testing.T) {
	m := guardModel()
	guards := HalfGuards(m.Graph)
	if len(guards) != 1 || !guards[8] {
		t.Fatalf("HalfGuards = %v, want only node 8 (/Clip)", guards)
	}
	up, _, err := Upcast(m, "")
	if err != nil {
		t.Fatal(err)
	}
	if n := up.Graph.Node[8]; n.OpType != "Identity" || n.Input[0] != "h" || n.Output[0] != "clamped" {
		t.Errorf("upcast: the guard is %s(%v) -> %v, want Identity(h) -> clamped", n.OpType, n.Input, n.Output)
	}
	if up.Graph.Node[9].OpType != "Clip" || m.Graph.Node[8].OpType != "Clip" {
		t.Error("upcast changed the plain clamp or the model it was given")
	}
	for _, tc := range []struct {
		held precision.Precision
		want string
	}{{precision.FP16, "Clip"}, {precision.FP32, "Identity"}} {
		a := &precision.Assignment{Value: map[string]precision.Precision{"h": tc.held, "x": tc.held}, Node: make([]precision.Precision, len(m.Graph.Node))}
		em := Emulate(up, m.Graph, a)
		var op string
		for _, n := range em.Graph.Node {
			for _, o := range n.Output {
				if o == "clamped" || o == onnx.InternalName("clamped", "raw") {
					op = n.OpType
				}
			}
		}
		if op != tc.want {
			t.Errorf("h held in %s: the guard is %s, want %s", tc.held, op, tc.want)
		}
	}
}
