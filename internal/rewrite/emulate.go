package rewrite

import (
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
)

// Emulate rewrites the upcast graph up so that ONNX Runtime's fp32 kernels
// see exactly the values autocast would hold in half precision: every value
// the assignment a holds in fp16 (bf16) passes through Cast(to=FLOAT16
// (BFLOAT16)) → Cast(to=FLOAT) right after it is produced, and every input
// an op casts to its lower precision passes through the same pair before
// that op. Arithmetic inside each op stays fp32, as on a GPU's fp16 kernels
// with fp32 accumulation; range and rounding are those of the 16-bit type.
//
// orig is the model's own graph (up has the same nodes at the same indices,
// with half casts promoted); a was computed on it, so explicit half casts
// of the model are restored here. Rounding a value keeps its name for the
// rounded result, so consumers, graph outputs and the statistics all see
// what the next op would see; the op's unrounded result gets an internal
// name.
func Emulate(up *onnx.ModelProto, orig *onnx.GraphProto, a *precision.Assignment) *onnx.ModelProto {
	out := onnx.ShallowCopy(up)
	g := out.Graph
	var extra []*onnx.NodeProto

	round := func(src, dst string, p precision.Precision) {
		mid := onnx.InternalName(dst, p.String())
		extra = append(extra,
			onnx.Node("Cast", mid, []string{src}, []string{mid}, onnx.AttrInt("to", int64(p.ElemType()))),
			onnx.Node("Cast", onnx.InternalName(dst, "back"), []string{mid}, []string{dst}, onnx.AttrInt("to", int64(elemFloat))))
	}
	isHalfPrec := func(p precision.Precision) bool { return p == precision.FP16 || p == precision.BF16 }
	// Autocast leaves float64 tensors alone (only float32 is eligible for
	// its casts), and rounding one through a Cast back to FLOAT would change
	// its type; so values the graph holds in DOUBLE are never rounded.
	isDouble := func(string) bool { return false }
	if ix, err := onnx.NewIndex(up.Graph); err == nil {
		isDouble = func(name string) bool { return ix.ElemType(name) == elemDouble }
	}

	// Sources held in half precision (graph inputs and parameters under
	// half, half initializers of the model) are rounded once; every use
	// reads the rounded copy.
	sourceCopy := map[string]string{}
	for _, vi := range orig.Input {
		if p := a.Value[vi.Name]; isHalfPrec(p) && !isDouble(vi.Name) {
			sourceCopy[vi.Name] = ""
		}
	}
	for _, t := range orig.Initializer {
		if p := a.Value[t.Name]; isHalfPrec(p) && !isDouble(t.Name) {
			sourceCopy[t.Name] = ""
		}
	}
	for name := range sourceCopy {
		r := onnx.InternalName(name, "src")
		sourceCopy[name] = r
		round(name, r, a.Value[name])
	}

	// Inputs cast to an op's lower precision: one rounded copy per value and
	// precision, shared by all ops that cast it.
	castCopy := map[string]string{}
	castOf := func(name string, p precision.Precision) string {
		key := name + "|" + p.String()
		if r, ok := castCopy[key]; ok {
			return r
		}
		r := onnx.InternalName(name, "to-"+p.String())
		castCopy[key] = r
		round(name, r, p)
		return r
	}

	for i, on := range orig.Node {
		n := g.Node[i]
		np := a.Node[i]
		var changed *onnx.NodeProto
		edit := func() *onnx.NodeProto {
			if changed == nil {
				changed = onnx.CloneNode(n)
			}
			return changed
		}
		for j, in := range on.Input {
			if in == "" {
				continue
			}
			cur := n.Input[j]
			if r, ok := sourceCopy[in]; ok {
				cur = r
				edit().Input[j] = r
			}
			if i < len(a.CastInputs) && j < len(a.CastInputs[i]) && a.CastInputs[i][j] &&
				isHalfPrec(np) && a.Value[in] != np && !isDouble(in) {
				edit().Input[j] = castOf(cur, np)
			}
		}
		for k, o := range on.Output {
			if o == "" || !isHalfPrec(a.Value[o]) || isDouble(o) {
				continue
			}
			raw := onnx.InternalName(o, "raw")
			edit().Output[k] = raw
			round(raw, o, a.Value[o])
		}
		if changed != nil {
			g.Node[i] = changed
		}
	}
	g.Node = append(g.Node, extra...)
	return out
}
