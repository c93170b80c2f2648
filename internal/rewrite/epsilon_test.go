package rewrite

import (
	"strings"
	"testing"

	"fp16audit/internal/onnx"
)

// TestAddEpsilon: the Sqrt of the named value reads value + eps through an
// Add of a Constant placed before it, both in the root's module, the model
// handed in is unchanged, and a value no Sqrt reads is refused by name.
func TestAddEpsilon(t *testing.T) {
	g := &onnx.GraphProto{
		Node: []*onnx.NodeProto{
			onnx.Node("ReduceMean", "mean", []string{"x"}, []string{"var"}),
			{OpType: "Sqrt", Name: "root", Input: []string{"var"}, Output: []string{"std"},
				MetadataProps: []*onnx.StringStringEntryProto{{Key: "pkg.torch.onnx.name_scopes", Value: "['', 'ln', 'sqrt']"}}},
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
	if strings.Join(ops, " ") != "ReduceMean Constant Add Sqrt Div" {
		t.Fatalf("ops %v, want a Constant and the Add before the Sqrt", ops)
	}
	k, add, root := out.Graph.Node[1], out.Graph.Node[2], out.Graph.Node[3]
	if add.Input[0] != "var" || add.Input[1] != k.Output[0] || root.Input[0] != add.Output[0] {
		t.Fatalf("Constant %v, Add %v → Sqrt %v: the root does not read var + eps", k.Output, add.Input, root.Input)
	}
	v, err := onnx.DecodeTensor(onnx.FindAttr(k, "value").GetT(), "")
	if err != nil {
		t.Fatal(err)
	}
	if f, err := v.Float32s(); err != nil || len(f) != 1 || f[0] != 1e-12 || len(v.Shape) != 0 {
		t.Fatalf("the epsilon constant %v %v: want the scalar 1e-12", f, v.Shape)
	}
	if onnx.ModulePath(k) != "ln" || onnx.ModulePath(add) != "ln" {
		t.Errorf("modules %q %q, want the root's, ln", onnx.ModulePath(k), onnx.ModulePath(add))
	}
	if _, err := AddEpsilon(m, map[string]float32{"x": 1e-12}); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Fatalf("a value no Sqrt reads: err %v", err)
	}
}
