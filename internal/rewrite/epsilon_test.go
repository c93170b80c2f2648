package rewrite

import (
	"strings"
	"testing"

	"fp16audit/internal/onnx"
)

// TestAddEpsilon: the Sqrt of the named value reads value + eps through an
// Add placed before it, the model handed in is unchanged, and a value no
// Sqrt reads is refused by name.
func TestAddEpsilon(t *testing.T) {
	g := &onnx.GraphProto{
		Node: []*onnx.NodeProto{
			onnx.Node("ReduceMean", "mean", []string{"x"}, []string{"var"}),
			onnx.Node("Sqrt", "root", []string{"var"}, []string{"std"}),
			onnx.Node("Div", "div", []string{"x", "std"}, []string{"y"}),
		},
		Input:  []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 2, 4)},
		Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 2, 4)},
	}
	m := &onnx.ModelProto{Graph: g}
	out, err := AddEpsilon(m, map[string]float32{"var": 1e-12})
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Node) != 3 || g.Node[1].Input[0] != "var" || len(g.Initializer) != 0 {
		t.Fatalf("the input model changed: %v", g.Node)
	}
	var ops []string
	for _, n := range out.Graph.Node {
		ops = append(ops, n.OpType)
	}
	if strings.Join(ops, " ") != "ReduceMean Add Sqrt Div" {
		t.Fatalf("ops %v, want the Add before the Sqrt", ops)
	}
	add, root := out.Graph.Node[1], out.Graph.Node[2]
	if add.Input[0] != "var" || root.Input[0] != add.Output[0] {
		t.Fatalf("Add %v → Sqrt %v: the root does not read var + eps", add.Input, root.Input)
	}
	if len(out.Graph.Initializer) != 1 || out.Graph.Initializer[0].Name != add.Input[1] {
		t.Fatalf("initializers %v: want the epsilon", out.Graph.Initializer)
	}
	if _, err := AddEpsilon(m, map[string]float32{"x": 1e-12}); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Fatalf("a value no Sqrt reads: err %v", err)
	}
}
