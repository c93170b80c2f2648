package rewrite

import "fp16audit/internal/onnx"

// Observed is a value a pass reads back from ONNX Runtime: Name is the
// model's value, Output the graph output that carries it as FLOAT.
type Observed struct {
	Name   string
	Output string
}

// Instrument marks every float value in names as a graph output, after the
// model's own outputs, so that one run returns all of them. FLOAT values are
// marked directly (elem_type is all ONNX Runtime needs); DOUBLE and half
// values get a Cast to FLOAT first, since fp16audit reads everything as
// float32. elemType gives each value's element type (0 when unknown: such
// values are marked FLOAT, which holds for every graph fp16audit rewrites).
func Instrument(m *onnx.ModelProto, names []string, elemType func(string) int32) (*onnx.ModelProto, []Observed) {
	out := onnx.ShallowCopy(m)
	g := out.Graph
	isOutput := map[string]bool{}
	for _, o := range g.Output {
		isOutput[o.Name] = true
	}
	obs := make([]Observed, 0, len(names))
	for _, name := range names {
		t := elemType(name)
		switch {
		case t == elemFloat || t == 0:
			if !isOutput[name] {
				g.Output = append(g.Output, onnx.TypedValue(name, elemFloat))
				isOutput[name] = true
			}
			obs = append(obs, Observed{Name: name, Output: name})
		case t == elemDouble || onnx.IsHalfType(t):
			f := onnx.InternalName(name, "f32")
			g.Node = append(g.Node, onnx.Node("Cast", f, []string{name}, []string{f}, onnx.AttrInt("to", int64(elemFloat))))
			g.Output = append(g.Output, onnx.TypedValue(f, elemFloat))
			obs = append(obs, Observed{Name: name, Output: f})
		}
	}
	return out, obs
}
