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

// finfoGraph is attention's mask fill as an fp32 trace exports
// scores.masked_fill(~keep, torch.finfo(scores.dtype).min): the fill is
// the 0-dim number -3.4028235e38. Beside it, q adds the same number to an
// fp32 value, r casts it to fp16 explicitly, and t is a 1-D tensor of it
// (a mask buffer) the scores are masked with too.
func finfoGraph() *onnx.GraphProto {
	low := float32(-math.MaxFloat32)
	eye := []float32{1, 0, 0, 0, 1, 0, 0, 0, 1}
	return &onnx.GraphProto{
		Name: "finfo",
		Node: []*onnx.NodeProto{
			onnx.Node("MatMul", "/attn/MatMul", []string{"x", "w"}, []string{"s"}),
			onnx.Node("Cast", "/attn/Cast", []string{"keepf"}, []string{"keep"}, onnx.AttrInt("to", int64(onnx.TensorProto_BOOL))),
			onnx.Node("Constant", "/attn/Constant", nil, []string{"low"}, onnx.AttrTensor("value", onnx.FloatTensor("", nil, []float32{low}))),
			onnx.Node("Where", "/attn/Where", []string{"keep", "s", "low"}, []string{"masked"}),
			onnx.Node("Softmax", "/attn/Softmax", []string{"masked"}, []string{"p"}, onnx.AttrInt("axis", -1)),
			onnx.Node("Cast", "/Cast_1", []string{"keepf"}, []string{"k32"}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT))),
			onnx.Node("Add", "/Add", []string{"k32", "low"}, []string{"q"}),
			onnx.Node("Cast", "/Cast_2", []string{"low"}, []string{"r"}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT16))),
			onnx.Node("Where", "/Where_1", []string{"keep", "s", "t"}, []string{"u"}),
		},
		Initializer: []*onnx.TensorProto{
			onnx.FloatTensor("w", []int64{3, 3}, eye),
			onnx.FloatTensor("t", []int64{1}, []float32{low}),
		},
		Input: []*onnx.ValueInfoProto{
			onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 2, 3),
			onnx.TensorValueInfo("keepf", onnx.TensorProto_FLOAT, 2, 3),
		},
		Output: []*onnx.ValueInfoProto{
			onnx.TensorValueInfo("masked", onnx.TensorProto_FLOAT, 2, 3),
			onnx.TensorValueInfo("p", onnx.TensorProto_FLOAT, 2, 3),
			onnx.TensorValueInfo("q", onnx.TensorProto_FLOAT, 2, 3),
			onnx.TensorValueInfo("u", onnx.TensorProto_FLOAT, 2, 3),
		},
	}
}

// TestFinfoFills: the number is read as the format's limit where a node
// computing in fp16 or bf16 holds it (the Where of masked_fill), not where
// the model casts it to half itself or where a tensor of it promotes the op
// to fp32; under half, where the policy holds the number in fp16, every
// reader counts, the fp32 Add reading it as exported.
func TestFinfoFills(t *testing.T) {
	g := finfoGraph()
	for _, c := range []struct {
		policy string
		want   []string
	}{
		{"autocast-fp16", []string{"/attn/Where[2] fp16 -65504"}},
		{"autocast-bf16", []string{fmt.Sprintf("/attn/Where[2] bf16 %g", -tensor.BF16Max)}},
		{"half", []string{"/attn/Where[2] fp16 -65504 source", fmt.Sprintf("/Add[1] fp32 %g source", -math.MaxFloat32), "/Cast_2[0] fp16 -65504 source"}},
		{"fp32", nil},
	} {
		p, err := precision.PolicyByName(c.policy)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, f := range FinfoFills(g, precision.Assign(p, g, nil, nil)) {
			s := fmt.Sprintf("%s[%d] %s %g", g.Node[f.Node].Name, f.Slot, f.Precision, f.Limit())
			if f.Source {
				s += " source"
			}
			if f.Constant != "low" || f.Value != -math.MaxFloat32 || f.Reduced() != (f.Precision != precision.FP32) {
				t.Errorf("%s: %s reads %s = %g, reduced %v", c.policy, s, f.Constant, f.Value, f.Reduced())
			}
			got = append(got, s)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: fills %q, want %q", c.policy, got, c.want)
		}
	}
}

// TestEmulatedFinfoFill runs the emulated graphs: a row whose keys are all
// masked holds fp16's (bf16's) own minimum and softmax makes it uniform,
// as PyTorch's finfo(scores.dtype).min does at run time, where the
// exported -3.4e38 rounded to -Inf would make it NaN; the fp32 Add that
// reads the number under half gets it as exported, not -Inf; the mask
// buffer t stays -3.4e38 under autocast (fp16 scores with an fp32 tensor
// promote) and is -Inf under half, as model.half() makes it.
func TestEmulatedFinfoFill(t *testing.T) {
	ortinit.Init(t)
	g := finfoGraph()
	m := onnx.NewModel(g, 17)
	x := tensor.FromFloat32s("x", []int64{2, 3}, []float32{0.5, -1, 2, 3, 1, -2})
	keep := tensor.FromFloat32s("keepf", []int64{2, 3}, []float32{1, 1, 0, 0, 0, 0})
	low := float32(-math.MaxFloat32)
	for _, c := range []struct {
		policy string
		fill   float32 // the masked scores
		buffer float32 // u where the buffer t masks
	}{
		{"autocast-fp16", -65504, low},
		{"autocast-bf16", -tensor.BF16Max, low},
		{"half", -65504, float32(math.Inf(-1))},
	} {
		p, _ := precision.PolicyByName(c.policy)
		em := Emulate(m, g, precision.Assign(p, g, nil, nil))
		outs := runModel(t, em, onnxrt.SessionOptions{Optimization: optimization}, []*tensor.Tensor{x, keep}, []string{"x", "keepf"}, []string{"masked", "p", "q", "u"})
		masked, probs, q, u := onnxrt.Float32View(outs[0]), onnxrt.Float32View(outs[1]), onnxrt.Float32View(outs[2]), onnxrt.Float32View(outs[3])
		if masked[2] != c.fill || masked[5] != c.fill {
			t.Errorf("%s: masked scores %v, want %g where masked", c.policy, masked, c.fill)
		}
		for i, v := range probs[3:] {
			if !(math.Abs(float64(v)-1.0/3) <= 1e-3) { // half rounds the softmax to fp16; NaN fails
				t.Errorf("%s: softmax of the fully masked row [%d] = %g, want 1/3", c.policy, i, v)
			}
		}
		if probs[2] != 0 {
			t.Errorf("%s: softmax at a masked key %g, want 0", c.policy, probs[2])
		}
		for i, v := range q {
			if v != low {
				t.Errorf("%s: fp32 keep + finfo.min [%d] = %g, want %g", c.policy, i, v, low)
			}
		}
		if u[2] != c.buffer {
			t.Errorf("%s: scores masked with the buffer %g, want %g", c.policy, u[2], c.buffer)
		}
	}
}
