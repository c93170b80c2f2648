package audit

import (
	"fmt"

	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

// Graph rewrites shared by every pass. None of them mutates the loaded
// model: a rewritten graph gets new node and value slices, and only the nodes
// and tensors it changes are copied; initializers it leaves alone are shared.

const (
	elemFloat    = int32(onnx.TensorProto_FLOAT)
	elemFloat16  = int32(onnx.TensorProto_FLOAT16)
	elemBFloat16 = int32(onnx.TensorProto_BFLOAT16)
	elemDouble   = int32(onnx.TensorProto_DOUBLE)
)

// internalSuffix marks every value name fp16audit invents, so it can never
// collide with a name of the model.
const internalSuffix = "::fp16audit"

func isHalf(t int32) bool  { return t == elemFloat16 || t == elemBFloat16 }
func isFloat(t int32) bool { return t == elemFloat || t == elemDouble || isHalf(t) }

// shallowModel copies the model and graph structs and their node and value
// lists, sharing everything else.
func shallowModel(m *onnx.ModelProto) *onnx.ModelProto {
	g := m.Graph
	ng := &onnx.GraphProto{
		Node:                   append([]*onnx.NodeProto(nil), g.Node...),
		Name:                   g.Name,
		Initializer:            append([]*onnx.TensorProto(nil), g.Initializer...),
		SparseInitializer:      g.SparseInitializer,
		DocString:              g.DocString,
		Input:                  append([]*onnx.ValueInfoProto(nil), g.Input...),
		Output:                 append([]*onnx.ValueInfoProto(nil), g.Output...),
		ValueInfo:              append([]*onnx.ValueInfoProto(nil), g.ValueInfo...),
		QuantizationAnnotation: g.QuantizationAnnotation,
		MetadataProps:          g.MetadataProps,
	}
	return &onnx.ModelProto{
		IrVersion:       m.IrVersion,
		OpsetImport:     m.OpsetImport,
		ProducerName:    m.ProducerName,
		ProducerVersion: m.ProducerVersion,
		Domain:          m.Domain,
		ModelVersion:    m.ModelVersion,
		DocString:       m.DocString,
		Graph:           ng,
		MetadataProps:   m.MetadataProps,
		Functions:       m.Functions,
	}
}

func cloneNode(n *onnx.NodeProto) *onnx.NodeProto {
	return &onnx.NodeProto{
		Input:         append([]string(nil), n.Input...),
		Output:        append([]string(nil), n.Output...),
		Name:          n.Name,
		OpType:        n.OpType,
		Domain:        n.Domain,
		Overload:      n.Overload,
		Attribute:     append([]*onnx.AttributeProto(nil), n.Attribute...),
		DocString:     n.DocString,
		MetadataProps: n.MetadataProps,
	}
}

func withElemType(vi *onnx.ValueInfoProto, elem int32) *onnx.ValueInfoProto {
	tt := vi.GetType().GetTensorType()
	if tt == nil {
		return vi
	}
	return &onnx.ValueInfoProto{Name: vi.Name, DocString: vi.DocString, MetadataProps: vi.MetadataProps,
		Type: &onnx.TypeProto{Denotation: vi.Type.Denotation, Value: &onnx.TypeProto_TensorType{
			TensorType: &onnx.TypeProto_Tensor{ElemType: elem, Shape: tt.Shape}}}}
}

// upcastTensor converts a FLOAT16 or BFLOAT16 tensor to FLOAT.
func upcastTensor(t *onnx.TensorProto, dir string) (*onnx.TensorProto, error) {
	dense, err := onnx.DecodeTensor(t, dir)
	if err != nil {
		return nil, err
	}
	vals, err := dense.Float32s()
	if err != nil {
		return nil, err
	}
	out := onnx.EncodeTensor(tensor.FromFloat32s(t.Name, dense.Shape, vals))
	out.DocString = t.DocString
	return out, nil
}

// Upcast returns a model that computes in fp32 wherever the model itself asks
// for half precision: Cast to FLOAT16/BFLOAT16 becomes Cast to FLOAT, half
// initializers, constants and value types become FLOAT, and half graph inputs
// keep their declared type with a Cast to FLOAT behind them. It also reports
// the explicit half casts it found (node indices), which the emulated passes
// restore. dir is the model's folder, for external data. The main graph is
// rewritten; subgraphs of control-flow nodes are left as they are.
func Upcast(m *onnx.ModelProto, dir string) (*onnx.ModelProto, []int, error) {
	out := shallowModel(m)
	g := out.Graph
	var halfCasts []int
	for i, n := range g.Node {
		if n.Domain != "" && n.Domain != "ai.onnx" {
			continue
		}
		var changed *onnx.NodeProto
		for ai, a := range n.Attribute {
			var na *onnx.AttributeProto
			switch {
			case n.OpType == "Cast" && a.Name == "to" && isHalf(int32(a.I)):
				halfCasts = append(halfCasts, i)
				na = onnx.AttrInt("to", int64(elemFloat))
			case a.Name == "dtype" && isHalf(int32(a.I)):
				na = onnx.AttrInt("dtype", int64(elemFloat))
			case a.Type == onnx.AttributeProto_TENSOR && a.T != nil && isHalf(a.T.DataType):
				t, err := upcastTensor(a.T, dir)
				if err != nil {
					return nil, nil, fmt.Errorf("node %q attribute %s: %w", n.Name, a.Name, err)
				}
				na = onnx.AttrTensor(a.Name, t)
			}
			if na != nil {
				if changed == nil {
					changed = cloneNode(n)
				}
				changed.Attribute[ai] = na
			}
		}
		if changed != nil {
			g.Node[i] = changed
		}
	}
	for i, t := range g.Initializer {
		if isHalf(t.DataType) {
			nt, err := upcastTensor(t, dir)
			if err != nil {
				return nil, nil, fmt.Errorf("initializer %q: %w", t.Name, err)
			}
			g.Initializer[i] = nt
		}
	}
	for i, vi := range g.ValueInfo {
		if isHalf(vi.GetType().GetTensorType().GetElemType()) {
			g.ValueInfo[i] = withElemType(vi, elemFloat)
		}
	}
	for i, vi := range g.Output {
		if isHalf(vi.GetType().GetTensorType().GetElemType()) {
			g.Output[i] = withElemType(vi, elemFloat)
		}
	}
	// Half graph inputs: the caller feeds half data; everything behind the
	// boundary Cast sees FLOAT.
	rename := map[string]string{}
	var boundary []*onnx.NodeProto
	for _, vi := range g.Input {
		if isHalf(vi.GetType().GetTensorType().GetElemType()) && !isInitializerName(g, vi.Name) {
			up := vi.Name + "::up" + internalSuffix
			rename[vi.Name] = up
			boundary = append(boundary, onnx.Node("Cast", up, []string{vi.Name}, []string{up}, onnx.AttrInt("to", int64(elemFloat))))
		}
	}
	if len(rename) > 0 {
		for i, n := range g.Node {
			var changed *onnx.NodeProto
			for j, in := range n.Input {
				if r, ok := rename[in]; ok {
					if changed == nil {
						changed = cloneNode(n)
					}
					changed.Input[j] = r
				}
			}
			if changed != nil {
				g.Node[i] = changed
			}
		}
		// Boundary casts go last so node indices stay those of the model;
		// the topological order puts them first.
		g.Node = append(g.Node, boundary...)
	}
	return out, halfCasts, nil
}

func isInitializerName(g *onnx.GraphProto, name string) bool {
	for _, t := range g.Initializer {
		if t.Name == name {
			return true
		}
	}
	return false
}

// observed is a value a pass reads back from ONNX Runtime: Name is the
// model's value, Output the graph output that carries it as FLOAT.
type observed struct {
	Name   string
	Output string
}

// Instrument marks every float value in names as a graph output, after the
// model's own outputs, so that one run returns all of them. FLOAT values are
// marked directly (elem_type is all ONNX Runtime needs); DOUBLE and half
// values get a Cast to FLOAT first, since fp16audit reads everything as
// float32. elemType gives each value's element type (0 when unknown: such
// values are marked FLOAT, which holds for every graph fp16audit rewrites).
func Instrument(m *onnx.ModelProto, names []string, elemType func(string) int32) (*onnx.ModelProto, []observed) {
	out := shallowModel(m)
	g := out.Graph
	isOutput := map[string]bool{}
	for _, o := range g.Output {
		isOutput[o.Name] = true
	}
	obs := make([]observed, 0, len(names))
	for _, name := range names {
		t := elemType(name)
		switch {
		case t == elemFloat || t == 0:
			if !isOutput[name] {
				g.Output = append(g.Output, floatOutput(name))
				isOutput[name] = true
			}
			obs = append(obs, observed{Name: name, Output: name})
		case t == elemDouble || isHalf(t):
			f := name + "::f32" + internalSuffix
			g.Node = append(g.Node, onnx.Node("Cast", f, []string{name}, []string{f}, onnx.AttrInt("to", int64(elemFloat))))
			g.Output = append(g.Output, floatOutput(f))
			obs = append(obs, observed{Name: name, Output: f})
		}
	}
	return out, obs
}

// floatOutput declares a FLOAT graph output without a shape: a declared
// empty shape would mean rank 0 and contradict the value's real shape.
func floatOutput(name string) *onnx.ValueInfoProto {
	return &onnx.ValueInfoProto{Name: name, Type: &onnx.TypeProto{Value: &onnx.TypeProto_TensorType{
		TensorType: &onnx.TypeProto_Tensor{ElemType: elemFloat}}}}
}
