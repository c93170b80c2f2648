package onnx

import (
	"slices"
	"testing"
)

func TestFXRecord(t *testing.T) {
	n := &NodeProto{MetadataProps: []*StringStringEntryProto{{Key: "pkg.torch.onnx.fx_node",
		Value: "%mean_1 : [num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_1, [-1, 2], True), kwargs = {})"}}}
	fx, ok := FXRecord(n)
	if !ok || fx.Name != "mean_1" || fx.Target != "torch.ops.aten.mean.dim" || !slices.Equal(fx.Args, []string{"%pow_1", "[-1, 2]", "True"}) {
		t.Errorf("FXRecord: %+v %v", fx, ok)
	}
	if _, ok := FXRecord(&NodeProto{Name: "/ln/Sqrt"}); ok {
		t.Error("a node without the record has one")
	}
}

// fxNode is a node with the FX record of name = target(args).
func fxNode(op, in, out, name, target, args string) *NodeProto {
	n := Node(op, "node_"+name, []string{in}, []string{out})
	n.MetadataProps = []*StringStringEntryProto{{Key: "pkg.torch.onnx.fx_node",
		Value: "%" + name + " : [num_users=1] = call_function[target=torch.ops.aten." + target + "](args = (" + args + ",), kwargs = {})"}}
	return n
}

// TestDroppedAdds: a Sqrt whose FX node read an add no node computes has
// lost its sum; one that reads an Add (merged with an equal one), one
// whose FX argument is not an add, and one without a record have not.
func TestDroppedAdds(t *testing.T) {
	mean := fxNode("ReduceMean", "x", "m", "mean_1", "mean.dim", "%x")
	for _, c := range []struct {
		name  string
		nodes []*NodeProto
		want  bool
	}{
		{"folded", []*NodeProto{mean, fxNode("Sqrt", "m", "s", "sqrt", "sqrt.default", "%add_24")}, true},
		{"rsqrt folded", []*NodeProto{mean, fxNode("Sqrt", "m", "s", "rsqrt", "rsqrt.default", "%add")}, true},
		{"the sum merged with an equal one", []*NodeProto{mean, fxNode("Add", "m", "a", "add_23", "add.Tensor", "%mean_1, 1e-12"),
			fxNode("Sqrt", "a", "s", "sqrt", "sqrt.default", "%add_24")}, false},
		{"not an add", []*NodeProto{mean, fxNode("Sqrt", "m", "s", "sqrt", "sqrt.default", "%mean_2")}, false},
		{"an addmm is not an add", []*NodeProto{mean, fxNode("Sqrt", "m", "s", "sqrt", "sqrt.default", "%addmm_2")}, false},
		{"no record", []*NodeProto{mean, Node("Sqrt", "sq", []string{"m"}, []string{"s"})}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := &GraphProto{Node: c.nodes, Input: []*ValueInfoProto{TensorValueInfo("x", TensorProto_FLOAT, 2, 4)}}
			ix, err := NewIndex(g)
			if err != nil {
				t.Fatal(err)
			}
			d := DroppedAdds(g, ix)
			if got := len(d) == 1; got != c.want {
				t.Fatalf("dropped %+v, want %v", d, c.want)
			}
			if c.want && (d[0].Radicand != "m" || d[0].Name != c.nodes[len(c.nodes)-1].Name) {
				t.Errorf("dropped %+v: want the Sqrt reading m", d[0])
			}
		})
	}
}
