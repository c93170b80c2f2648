package audit

import (
	"maps"
	"slices"
	"testing"

	"fp16audit/internal/onnx"
)

// TestConstantNodes marks what the exporter computes from weights alone
// and nothing that reads the batch or draws random numbers.
func TestConstantNodes(t *testing.T) {
	node := func(name, op string, in ...string) *onnx.NodeProto {
		return &onnx.NodeProto{Name: name, OpType: op, Input: in, Output: []string{name + "_out"}}
	}
	g := &onnx.GraphProto{
		Input:       []*onnx.ValueInfoProto{{Name: "x"}},
		Initializer: []*onnx.TensorProto{{Name: "w", DataType: 1, Dims: []int64{2}, FloatData: []float32{1, 2}}},
		Node: []*onnx.NodeProto{
			node("weight_copy", "Identity", "w"),                      // 0: the exporter's shared weight
			node("const", "Constant"),                                 // 1
			node("folded", "Mul", "weight_copy_out", "const_out"),     // 2: folding leftover
			node("clip", "Clip", "folded_out", "", "const_out"),       // 3: an omitted optional input
			node("matmul", "MatMul", "x", "folded_out"),               // 4: reads the batch
			node("after", "Relu", "matmul_out"),                       // 5
			node("noise", "RandomNormalLike", "const_out"),            // 6: random, never constant
			node("eye", "RandomUniform"),                              // 7: no inputs but not a Constant
			node("custom", "Identity", "w"),                           // 8: another domain
			node("from_custom", "Identity", "custom_out"),             // 9
			node("from_noise", "Add", "noise_out", "weight_copy_out"), // 10
		},
	}
	g.Node[8].Domain = "com.example"
	ix, err := onnx.NewIndex(g)
	if err != nil {
		t.Fatal(err)
	}
	got := constantNodes(g, ix, ix.Order())
	want := map[int]bool{0: true, 1: true, 2: true, 3: true}
	if !maps.Equal(got, want) {
		t.Errorf("constant nodes %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
}
