package backward_test

import (
	"reflect"
	"testing"

	"fp16audit/internal/execute/backward"
	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

// TestKnown: the recorded shapes become the Facts (a Constant's and a
// Dropout mask's shapes, which the passes do not record, derived), and
// anything the record cannot stand for leaves the graph to the probe.
func TestKnown(t *testing.T) {
	x := tensor.FromFloat32s("x", []int64{2, 3}, make([]float32, 6))
	model := func(last *onnx.NodeProto) *onnx.ModelProto {
		c := onnx.Node("Constant", "c", nil, []string{"c"})
		c.Attribute = append(c.Attribute, &onnx.AttributeProto{Name: "value", Type: onnx.AttributeProto_TENSOR,
			T: &onnx.TensorProto{Dims: []int64{3}, DataType: int32(onnx.TensorProto_FLOAT), FloatData: []float32{1, 2, 3}}})
		nodes := []*onnx.NodeProto{c, onnx.Node("Add", "add", []string{"x", "c"}, []string{"y"}),
			onnx.Node("Dropout", "drop", []string{"y"}, []string{"z", "mask"})}
		if last != nil {
			nodes = append(nodes, last)
		}
		return &onnx.ModelProto{IrVersion: 8, OpsetImport: []*onnx.OperatorSetIdProto{{Version: 17}},
			Graph: &onnx.GraphProto{Name: "g", Node: nodes, Input: []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 2, 3)},
				Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("z", onnx.TensorProto_FLOAT)}}}
	}
	recorded := map[string][]int64{"y": {2, 3}, "z": {2, 3}, "w": {6}}
	f := backward.Known(model(nil), []*tensor.Tensor{x}, recorded)
	if f == nil {
		t.Fatal("no facts from a complete record")
	}
	want := map[string][]int64{"x": {2, 3}, "c": {3}, "y": {2, 3}, "z": {2, 3}, "mask": {2, 3}}
	if !reflect.DeepEqual(f.Shapes, want) {
		t.Errorf("shapes %v, want %v", f.Shapes, want)
	}
	for _, c := range []struct {
		name     string
		last     *onnx.NodeProto
		recorded map[string][]int64
	}{
		{"a value not recorded", nil, map[string][]int64{"y": {2, 3}}},
		{"a shape that depends on data", onnx.Node("NonZero", "nz", []string{"z"}, []string{"w"}), recorded},
		{"a parameter computed at run time", onnx.Node("ReduceSum", "sum", []string{"z", "y"}, []string{"w"}), recorded},
	} {
		if f := backward.Known(model(c.last), []*tensor.Tensor{x}, c.recorded); f != nil {
			t.Errorf("%s: facts %v, want none (the probe)", c.name, f.Shapes)
		}
	}
	if f := backward.Known(model(nil), nil, recorded); f != nil {
		t.Error("facts without the batch's input")
	}
}
