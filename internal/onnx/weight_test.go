package onnx

import "testing"

// TestWeight: the graph's one rule for a trainable weight: an initializer
// a lower-precision op takes, directly, as the dynamo exporter's own
// transposed copy (val_0), or through the TorchScript exporter's
// Transpose or a shared weight's Identity; a mask fill a Where writes, a
// value computed from an input and a weight a non-autocast op reads are
// none.
func TestWeight(t *testing.T) {
	g := &GraphProto{
		Name:  "w",
		Input: []*ValueInfoProto{TensorValueInfo("x", TensorProto_FLOAT, 2, 8)},
		Initializer: []*TensorProto{FloatTensor("fc.weight", []int64{4, 8}, make([]float32, 32)), FloatTensor("val_0", []int64{8, 4}, make([]float32, 32)),
			FloatTensor("fill", nil, []float32{-1e9}), FloatTensor("scale", []int64{4}, make([]float32, 4))},
		Node: []*NodeProto{
			Node("Gemm", "gemm", []string{"x", "fc.weight"}, []string{"a"}, AttrInt("transB", 1)),
			Node("MatMul", "dynamo", []string{"x", "val_0"}, []string{"b"}),
			Node("Transpose", "t", []string{"fc.weight"}, []string{"wt"}),
			Node("Identity", "shared", []string{"wt"}, []string{"wt2"}),
			Node("MatMul", "torchscript", []string{"x", "wt2"}, []string{"c"}),
			Node("Greater", "mask", []string{"a", "b"}, []string{"m"}),
			Node("Where", "masked", []string{"m", "fill", "a"}, []string{"d"}),
			Node("MatMul", "activation", []string{"x", "val_0"}, []string{"e"}),
			Node("Mul", "scaled", []string{"a", "scale"}, []string{"f"}),
		},
	}
	ix, err := NewIndex(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		node  int
		value string
		want  string
	}{
		{0, "fc.weight", "fc.weight"}, {1, "val_0", "val_0"}, {4, "wt2", "fc.weight"},
		{6, "fill", ""}, {0, "x", ""}, {8, "scale", ""}, {-1, "fc.weight", ""}, {99, "fc.weight", ""},
	} {
		got, ok := ix.Weight(c.node, c.value)
		if got != c.want || ok != (c.want != "") {
			t.Errorf("Weight(%d, %q) = %q %v, want %q", c.node, c.value, got, ok, c.want)
		}
	}
}
