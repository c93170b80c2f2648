package rewrite

import (
	"fmt"

	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

// elem* are the ONNX element types the rewrites turn values into.
const (
	elemFloat  = int32(onnx.TensorProto_FLOAT)
	elemDouble = int32(onnx.TensorProto_DOUBLE)
)

// Graph rewrites shared by every pass. None of them mutates the loaded
// model: a rewritten graph gets new node and value slices, and only the nodes
// and tensors it changes are copied; initializers it leaves alone are shared.

// upcastTensor converts a FLOAT16 or BFLOAT16 tensor to FLOAT. One in an
// external data file becomes a FLOAT view of its bytes (onnx.FloatView),
// converted only where it is read: a model stored in 16 bits (a checkpoint
// loaded with from_pretrained(dtype=torch.bfloat16), 16 GB for 8 B
// parameters) is not held in fp32 by the upcast.
func upcastTensor(t *onnx.TensorProto, dir string) (*onnx.TensorProto, error) {
	if t.GetDataLocation() == onnx.TensorProto_EXTERNAL {
		return onnx.FloatView(t), nil
	}
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
// for half precision (a clamp the model runs only on float16 values,
// HalfGuards, becomes an Identity): Cast to FLOAT16/BFLOAT16 becomes Cast to FLOAT, half
// initializers, constants and value types become FLOAT, and half graph inputs
// keep their declared type with a Cast to FLOAT behind them. It also reports
// the explicit half casts it found (node indices), which the emulated passes
// restore. dir is the model's folder, for external data. The main graph is
// rewritten; subgraphs of control-flow nodes are left as they are.
func Upcast(m *onnx.ModelProto, dir string) (*onnx.ModelProto, []int, error) {
	out := onnx.ShallowCopy(m)
	g := out.Graph
	var halfCasts []int
	// The model's float16-only clamps (HalfGuards) do not run in float32:
	// an Identity in their place keeps the node indices.
	for i := range HalfGuards(g) {
		n := g.Node[i]
		g.Node[i] = onnx.Node("Identity", n.Name, []string{n.Input[0]}, []string{n.Output[0]})
	}
	for i, n := range g.Node {
		if n.Domain != "" && n.Domain != "ai.onnx" {
			continue
		}
		var changed *onnx.NodeProto
		for ai, a := range n.Attribute {
			var na *onnx.AttributeProto
			switch {
			case n.OpType == "Cast" && a.Name == "to" && onnx.IsHalfType(int32(a.I)):
				halfCasts = append(halfCasts, i)
				na = onnx.AttrInt("to", int64(elemFloat))
			case a.Name == "dtype" && onnx.IsHalfType(int32(a.I)):
				na = onnx.AttrInt("dtype", int64(elemFloat))
			case a.Type == onnx.AttributeProto_TENSOR && a.T != nil && onnx.IsHalfType(a.T.DataType):
				t, err := upcastTensor(a.T, dir)
				if err != nil {
					return nil, nil, fmt.Errorf("node %q attribute %s: %w", n.Name, a.Name, err)
				}
				na = onnx.AttrTensor(a.Name, t)
			}
			if na != nil {
				if changed == nil {
					changed = onnx.CloneNode(n)
				}
				changed.Attribute[ai] = na
			}
		}
		if changed != nil {
			g.Node[i] = changed
		}
	}
	for i, t := range g.Initializer {
		if onnx.IsHalfType(t.DataType) {
			nt, err := upcastTensor(t, dir)
			if err != nil {
				return nil, nil, fmt.Errorf("initializer %q: %w", t.Name, err)
			}
			g.Initializer[i] = nt
		}
	}
	for i, vi := range g.ValueInfo {
		switch {
		case onnx.IsHalfType(vi.GetType().GetTensorType().GetElemType()):
			g.ValueInfo[i] = onnx.WithElemType(vi, elemFloat)
		case onnx.HalfContainer(vi):
			// a sequence of half tensors holds them upcast too
			g.ValueInfo[i] = onnx.WithContainedElemType(vi, elemFloat)
		}
	}
	for i, vi := range g.Output {
		switch {
		case onnx.IsHalfType(vi.GetType().GetTensorType().GetElemType()):
			g.Output[i] = onnx.WithElemType(vi, elemFloat)
		case onnx.HalfContainer(vi):
			g.Output[i] = onnx.WithContainedElemType(vi, elemFloat)
		}
	}
	// Half graph inputs: the caller feeds half data; everything behind the
	// boundary Cast sees FLOAT.
	rename := map[string]string{}
	var boundary []*onnx.NodeProto
	for _, vi := range g.Input {
		if onnx.IsHalfType(vi.GetType().GetTensorType().GetElemType()) && !isInitializerName(g, vi.Name) {
			up := onnx.InternalName(vi.Name, "up")
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
						changed = onnx.CloneNode(n)
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
