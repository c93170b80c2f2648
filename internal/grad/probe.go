package grad

import (
	"fmt"

	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/tensor"
)

// Facts are what Build needs to know about one batch that the model file
// does not say: the shape of every value, and the contents of the small
// values that shape arithmetic computes (the starts and ends of a Slice
// after torch.chunk, a Pad's pads, a Dropout's training flag).
type Facts struct {
	// Shapes maps every value to its shape.
	Shapes map[string][]int64
	// Values maps the non-constant inputs that rules read as parameters
	// to their contents.
	Values map[string]*tensor.Tensor
}

// paramInputs lists, per op, the input slots a rule reads as fixed
// parameters rather than as data.
var paramInputs = map[string][]int{
	"Slice":      {1, 2, 3, 4},
	"Pad":        {1, 3},
	"Tile":       {1},
	"ReduceSum":  {1},
	"ReduceMean": {1}, "ReduceMax": {1}, "ReduceMin": {1}, "ReduceSumSquare": {1}, "ReduceL2": {1},
	"Dropout": {1, 2},
}

// Probe runs the forward model once on inputs (in the order of the graph
// inputs that need feeding) and returns the Facts of that batch: it adds a
// Shape node per value and the parameter inputs of the rules as outputs,
// so nothing but shapes and a few integers leaves ONNX Runtime. opt
// configures the session; the caller has initialized ONNX Runtime.
func Probe(m *onnx.ModelProto, inputs []*tensor.Tensor, opt onnxrt.SessionOptions) (*Facts, error) {
	ix, err := onnx.NewIndex(m.Graph)
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	feeds := ix.GraphInputs()
	if len(inputs) != len(feeds) {
		return nil, fmt.Errorf("probe: the model takes %d inputs, got %d", len(feeds), len(inputs))
	}
	f := &Facts{Shapes: map[string][]int64{}, Values: map[string]*tensor.Tensor{}}
	var inNames []string
	for k, vi := range feeds {
		inNames = append(inNames, vi.Name)
		f.Shapes[vi.Name] = inputs[k].Shape
	}
	for _, t := range m.Graph.Initializer {
		f.Shapes[t.Name] = append([]int64{}, t.Dims...)
	}

	// The graph's own outputs stay declared (a value requested below may
	// be one of them); only the added outputs are fetched.
	g := &onnx.GraphProto{
		Node: append([]*onnx.NodeProto(nil), m.Graph.Node...), Name: m.Graph.Name,
		Initializer: m.Graph.Initializer, SparseInitializer: m.Graph.SparseInitializer,
		Input: m.Graph.Input, ValueInfo: m.Graph.ValueInfo,
		Output: append([]*onnx.ValueInfoProto(nil), m.Graph.Output...),
	}
	declared := map[string]bool{}
	for _, vi := range m.Graph.Output {
		declared[vi.Name] = true
	}
	var outNames []string
	var shapeOf []string // value each output's shape belongs to ("" for value outputs)
	seen := map[string]bool{}
	for _, n := range m.Graph.Node {
		for _, o := range n.Output {
			if o == "" || seen[o] {
				continue
			}
			seen[o] = true
			s := o + "::shape" + internal
			g.Node = append(g.Node, onnx.Node("Shape", s, []string{o}, []string{s}))
			g.Output = append(g.Output, onnx.TensorValueInfo(s, onnx.TensorProto_INT64, -1))
			outNames = append(outNames, s)
			shapeOf = append(shapeOf, o)
		}
	}
	for _, n := range m.Graph.Node {
		for _, k := range paramInputs[n.OpType] {
			if k >= len(n.Input) || n.Input[k] == "" {
				continue
			}
			v := n.Input[k]
			if _, err := ix.ConstantValue(v); err == nil || ix.Producer(v) < 0 || seen[v+"::value"] {
				continue
			}
			et := ix.ElemType(v)
			if et == 0 {
				continue
			}
			seen[v+"::value"] = true
			if !declared[v] {
				g.Output = append(g.Output, &onnx.ValueInfoProto{Name: v, Type: &onnx.TypeProto{Value: &onnx.TypeProto_TensorType{
					TensorType: &onnx.TypeProto_Tensor{ElemType: et}}}})
			}
			outNames = append(outNames, v)
			shapeOf = append(shapeOf, "")
		}
	}
	if len(outNames) == 0 {
		return f, nil
	}
	pm := &onnx.ModelProto{IrVersion: m.IrVersion, OpsetImport: m.OpsetImport, Graph: g, Functions: m.Functions}
	data, err := onnx.Marshal(pm)
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	s, err := onnxrt.NewSession(data, inNames, outNames, opt)
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	defer s.Close()
	outs, err := s.Run(inputs)
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	for k, t := range outs {
		if v := shapeOf[k]; v != "" {
			dims, err := int64s(t)
			if err != nil {
				return nil, fmt.Errorf("probe: shape of %q: %w", v, err)
			}
			f.Shapes[v] = dims
			continue
		}
		f.Values[outNames[k]] = t
	}
	return f, nil
}
