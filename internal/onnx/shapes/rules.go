package shapes

import (
	"maps"
	"slices"

	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

// rule returns the shapes of node n's outputs (nil entries where
// unknown); x is the shape of its first input, nil when unknown.
type rule func(si *shapeInference, n *onnx.NodeProto, x []int64) [][]int64

// rules are the shape rules, by the name an op's entry in
// internal/onnx/ops gives (Op.Shape): the generic ones many ops share
// (unary, broadcast, reduce) and those of one op or a few.
var rules = map[string]rule{
	"unary": func(_ *shapeInference, _ *onnx.NodeProto, x []int64) [][]int64 {
		if x == nil {
			return nil
		}
		return [][]int64{x}
	},
	"broadcast": broadcastRule,
	"reduce":    (*shapeInference).reduce,
	"constant":  constantRule,
	"dropout":   dropoutRule,
	"batchNorm": batchNormRule,
	"matmul": func(si *shapeInference, n *onnx.NodeProto, x []int64) [][]int64 {
		return [][]int64{matmulShape(x, si.in(n, 1))}
	},
	"gemm":            gemmRule,
	"window":          (*shapeInference).window,
	"convTranspose":   (*shapeInference).convTranspose,
	"globalPool":      globalPoolRule,
	"flatten":         flattenRule,
	"transpose":       transposeRule,
	"reshape":         reshapeRule,
	"expand":          expandRule,
	"unsqueeze":       unsqueezeRule,
	"squeeze":         squeezeRule,
	"concat":          concatRule,
	"gather":          gatherRule,
	"slice":           sliceRule,
	"split":           (*shapeInference).split,
	"constantOfShape": constantOfShapeRule,
	"range":           rangeRule,
	"shape":           shapeRule,
	"sequenceAt":      sequenceAtRule,
}

// Rules returns the names of the shape rules, sorted: every one an entry
// of internal/onnx/ops may name.
func Rules() []string { return slices.Sorted(maps.Keys(rules)) }

func broadcastRule(si *shapeInference, n *onnx.NodeProto, _ []int64) [][]int64 {
	out := []int64{}
	for k := range n.GetInput() {
		s := si.in(n, k)
		if s == nil {
			return nil
		}
		var ok bool
		if out, ok = broadcast(out, s); !ok {
			return nil
		}
	}
	return [][]int64{out}
}

func constantRule(si *shapeInference, n *onnx.NodeProto, _ []int64) [][]int64 {
	t, err := si.idx.ConstantValue(n.GetOutput()[0])
	if err != nil {
		return nil
	}
	if t.DType == tensor.Int64 && len(t.Data) <= 8*maxInts {
		si.ints[n.GetOutput()[0]], _ = t.Int64s()
	}
	return [][]int64{nonNilDims(t.Shape)}
}

func dropoutRule(_ *shapeInference, _ *onnx.NodeProto, x []int64) [][]int64 {
	if x == nil {
		return nil
	}
	return [][]int64{x, x} // the mask has the input's shape
}

func batchNormRule(si *shapeInference, n *onnx.NodeProto, x []int64) [][]int64 {
	if x == nil {
		return nil
	}
	// In training mode the running mean and variance come out beside y,
	// shaped as the ones read in.
	return [][]int64{x, si.in(n, 3), si.in(n, 4)}
}

func gemmRule(si *shapeInference, n *onnx.NodeProto, x []int64) [][]int64 {
	b := si.in(n, 1)
	if len(x) != 2 || len(b) != 2 {
		return nil
	}
	m, nn := x[0], b[1]
	if onnx.IntAttr(n, "transA", 0) != 0 {
		m = x[1]
	}
	if onnx.IntAttr(n, "transB", 0) != 0 {
		nn = b[0]
	}
	return [][]int64{{m, nn}}
}

func globalPoolRule(_ *shapeInference, _ *onnx.NodeProto, x []int64) [][]int64 {
	if len(x) < 2 {
		return nil
	}
	out := slices.Clone(x)
	for i := 2; i < len(out); i++ {
		out[i] = 1
	}
	return [][]int64{out}
}

func flattenRule(_ *shapeInference, n *onnx.NodeProto, x []int64) [][]int64 {
	if x == nil {
		return nil
	}
	a := axis(onnx.IntAttr(n, "axis", 1), len(x))
	if a < 0 || a > len(x) {
		return nil
	}
	return [][]int64{{tensor.NumElements(x[:a]), tensor.NumElements(x[a:])}}
}

func transposeRule(_ *shapeInference, n *onnx.NodeProto, x []int64) [][]int64 {
	if x == nil {
		return nil
	}
	perm, ok := onnx.IntsAttr(n, "perm")
	if !ok {
		for i := len(x) - 1; i >= 0; i-- {
			perm = append(perm, int64(i))
		}
	}
	if len(perm) != len(x) {
		return nil
	}
	out := make([]int64, len(x))
	for i, p := range perm {
		if p < 0 || int(p) >= len(x) {
			return nil
		}
		out[i] = x[p]
	}
	return [][]int64{out}
}

func reshapeRule(si *shapeInference, n *onnx.NodeProto, x []int64) [][]int64 {
	shape, ok := si.constInts(n, 1)
	if x == nil || !ok {
		return nil
	}
	return [][]int64{reshape(x, shape, onnx.IntAttr(n, "allowzero", 0) != 0)}
}

func expandRule(si *shapeInference, n *onnx.NodeProto, x []int64) [][]int64 {
	shape, ok := si.constInts(n, 1)
	if x == nil || !ok {
		return nil
	}
	out, ok := broadcast(x, shape)
	if !ok {
		return nil
	}
	return [][]int64{out}
}

// axesOf returns the axes of an Unsqueeze or Squeeze: the attribute
// (before opset 13) or input 1.
func (si *shapeInference) axesOf(n *onnx.NodeProto) ([]int64, bool) {
	axes, ok := onnx.IntsAttr(n, "axes")
	if !ok {
		axes, ok = si.constInts(n, 1)
	}
	return axes, ok
}

func unsqueezeRule(si *shapeInference, n *onnx.NodeProto, x []int64) [][]int64 {
	axes, ok := si.axesOf(n)
	if x == nil || !ok {
		return nil
	}
	return [][]int64{unsqueeze(x, axes)}
}

func squeezeRule(si *shapeInference, n *onnx.NodeProto, x []int64) [][]int64 {
	if x == nil {
		return nil
	}
	axes, _ := si.axesOf(n)
	return [][]int64{squeeze(x, axes)}
}

func concatRule(si *shapeInference, n *onnx.NodeProto, _ []int64) [][]int64 {
	var out []int64
	var vals []int64
	intsKnown := true
	for k := range n.GetInput() {
		s := si.in(n, k)
		if s == nil {
			return nil
		}
		if v, ok := si.constInts(n, k); ok && intsKnown {
			vals = append(vals, v...)
		} else {
			intsKnown = false
		}
		if out == nil {
			out = slices.Clone(s)
			continue
		}
		a := axis(onnx.IntAttr(n, "axis", 0), len(s))
		if len(s) != len(out) || a < 0 || a >= len(s) {
			return nil
		}
		out[a] += s[a]
	}
	if intsKnown && len(out) == 1 {
		si.ints[n.GetOutput()[0]] = vals
	}
	return [][]int64{out}
}

func gatherRule(si *shapeInference, n *onnx.NodeProto, x []int64) [][]int64 {
	idx := si.in(n, 1)
	if x == nil || idx == nil {
		return nil
	}
	a := axis(onnx.IntAttr(n, "axis", 0), len(x))
	if a < 0 || a >= len(x) {
		return nil
	}
	out := append(append(slices.Clone(x[:a]), idx...), x[a+1:]...)
	if v, ok := si.ints[n.GetInput()[0]]; ok && len(x) == 1 {
		if iv, ok := si.constInts(n, 1); ok {
			var g []int64
			for _, i := range iv {
				if i < 0 {
					i += int64(len(v))
				}
				if i < 0 || i >= int64(len(v)) {
					return [][]int64{out}
				}
				g = append(g, v[i])
			}
			si.ints[n.GetOutput()[0]] = g
		}
	}
	return [][]int64{out}
}

func sliceRule(si *shapeInference, n *onnx.NodeProto, x []int64) [][]int64 {
	if x == nil || len(n.GetInput()) < 3 {
		return nil
	}
	starts, ok1 := si.constInts(n, 1)
	ends, ok2 := si.constInts(n, 2)
	if !ok1 || !ok2 || len(starts) != len(ends) {
		return nil
	}
	axes := make([]int64, len(starts))
	for i := range axes {
		axes[i] = int64(i)
	}
	steps := make([]int64, len(starts))
	for i := range steps {
		steps[i] = 1
	}
	if len(n.GetInput()) > 3 && n.GetInput()[3] != "" {
		v, ok := si.constInts(n, 3)
		if !ok || len(v) != len(starts) {
			return nil
		}
		axes = v
	}
	if len(n.GetInput()) > 4 && n.GetInput()[4] != "" {
		v, ok := si.constInts(n, 4)
		if !ok || len(v) != len(starts) {
			return nil
		}
		steps = v
	}
	out := slices.Clone(x)
	for i := range starts {
		a := axis(axes[i], len(x))
		if a < 0 || a >= len(x) || steps[i] == 0 {
			return nil
		}
		out[a] = sliceLen(x[a], starts[i], ends[i], steps[i])
	}
	return [][]int64{out}
}

func constantOfShapeRule(si *shapeInference, n *onnx.NodeProto, _ []int64) [][]int64 {
	if shape, ok := si.constInts(n, 0); ok {
		return [][]int64{shape}
	}
	return nil
}

func rangeRule(si *shapeInference, n *onnx.NodeProto, _ []int64) [][]int64 {
	start, ok1 := si.constInts(n, 0)
	limit, ok2 := si.constInts(n, 1)
	delta, ok3 := si.constInts(n, 2)
	if !ok1 || !ok2 || !ok3 || len(start) != 1 || len(limit) != 1 || len(delta) != 1 || delta[0] == 0 {
		return nil
	}
	return [][]int64{{rangeLen(start[0], limit[0], delta[0])}}
}

func shapeRule(si *shapeInference, n *onnx.NodeProto, x []int64) [][]int64 {
	if x == nil {
		return nil
	}
	r := int64(len(x))
	start, end := onnx.IntAttr(n, "start", 0), onnx.IntAttr(n, "end", r)
	if start < 0 {
		start += r
	}
	if end < 0 {
		end += r
	}
	start, end = max(0, min(start, r)), max(0, min(end, r))
	if end < start {
		end = start
	}
	si.ints[n.GetOutput()[0]] = slices.Clone(x[start:end])
	return [][]int64{{end - start}}
}

// sequenceAtRule is the shape of the tensor SequenceAt takes out of a
// sequence SplitToSequence made: the piece at its position (a sequence
// is no tensor and has no shape of its own; one made otherwise is not
// followed).
func sequenceAtRule(si *shapeInference, n *onnx.NodeProto, _ []int64) [][]int64 {
	pi := si.idx.Producer(n.GetInput()[0])
	if pi < 0 || len(n.GetInput()) < 2 {
		return nil
	}
	sp := si.idx.Graph().GetNode()[pi]
	if sp.GetOpType() != "SplitToSequence" || !onnx.IsDefaultDomain(sp.GetDomain()) {
		return nil
	}
	x := si.in(sp, 0)
	pos, ok := si.constInts(n, 1)
	if x == nil || !ok || len(pos) != 1 {
		return nil
	}
	var split []int64
	has, scalar := len(sp.GetInput()) > 1 && sp.GetInput()[1] != "", false
	if has {
		if split, ok = si.constInts(sp, 1); !ok {
			return nil
		}
		s, known := si.shapes[sp.GetInput()[1]]
		if !known {
			return nil
		}
		scalar = len(s) == 0
	}
	p, ok := onnx.SplitPieces(sp, x, split, has, scalar)
	if !ok {
		return nil
	}
	k, ok := p.Index(pos[0])
	if !ok {
		return nil
	}
	return [][]int64{p.PieceShape(x, k)}
}
