package evidence

import (
	"math"

	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
	"fp16audit/report"
)

// Fill is where a pass writes a mask constant on purpose into a value
// whose format cannot hold it: ±float32's largest value (what an fp32
// export of torch.finfo(x.dtype).min looks like) held in fp16 or bf16,
// where it is ±Inf: node Node writes Constant, whose value is Value.
type Fill struct {
	Node     int
	Constant string
	Value    float64
}

// carriesInf reports whether a default-domain op hands a mask's
// infinities on without making new ones (ops.CarriesInf: it moves,
// selects, broadcasts or adds values). An op without the role that reads
// such infinities (Softmax, Exp, MatMul) is where a NaN they cause starts.
func carriesInf(n *onnx.NodeProto) bool {
	return onnx.IsDefaultDomain(n.Domain) && ops.Lookup(ops.Default, n.OpType).Is(ops.CarriesInf)
}

// infSigns is a set of signs of infinity: 1 for +Inf, 2 for -Inf.
type infSigns uint8

func signOf(v float64) infSigns {
	if v < 0 {
		return 2
	}
	return 1
}

func statSigns(s *observe.Stats) infSigns {
	var out infSigns
	if s.PosInf > 0 {
		out |= 1
	}
	if s.NegInf > 0 {
		out |= 2
	}
	return out
}

// deliberateExtreme reports whether v is a value a model writes on purpose
// as "minus infinity": an infinity, or float32's extreme
// (torch.finfo(torch.float32).min, or finfo(x.dtype).min traced in fp32).
func deliberateExtreme(v float64) bool { return math.IsInf(v, 0) || DtypeAwareLimit(v) }

// deliberateValues returns the values of one pass whose only non-finite
// elements are infinities the model writes on purpose: a mask constant of
// -inf or finfo(float32).min — ConstantOfShape of it, an initializer — and
// what mask-carrying ops make of it (Trilu, Expand, Where, scores + mask)
// while no NaN and no infinity of another sign appears and no other
// non-finite value flows in. Softmax of an all -inf row is NaN, so the
// Softmax is where that NaN starts. It also returns the fills: where such
// a constant, finite in fp32, is written into a value the pass holds in
// fp16 or bf16.
func (f *Facts) deliberateValues(pass string, res *observe.PassResult, asg *precision.Assignment) (map[string]bool, []Fill) {
	g := f.Graph()
	out := map[string]bool{}
	var fills []Fill
	for _, ni := range f.Static.Order {
		n := g.Node[ni]
		if !carriesInf(n) {
			continue
		}
		var signs infSigns
		var wrote *Fill
		if n.OpType == "ConstantOfShape" {
			if v, ok := f.fillValue(n); ok && deliberateExtreme(v) {
				signs |= signOf(v)
			}
		}
		clean := true
		for _, in := range n.Input {
			switch {
			case in == "":
			case f.consts[in]:
				v, ok := f.constantExtreme(in)
				if !ok || !deliberateExtreme(v) {
					continue
				}
				signs |= signOf(v)
				if !math.IsInf(v, 0) && pass != report.PassFP32 && overflowAt(f.Static.HeldAtIn(asg, in, ni)) > 0 {
					wrote = &Fill{Node: ni, Constant: in, Value: v}
				}
			case out[in]:
				signs |= statSigns(res.Stats[in])
			default:
				if s, ok := res.Stats[in]; ok && s.NonFinite() > 0 {
					clean = false
				}
				if gi := f.Input(in); gi != nil && gi.Stats.NonFinite() > 0 {
					clean = false
				}
			}
		}
		if !clean || signs == 0 {
			continue
		}
		carried := false
		for _, v := range n.Output {
			s, ok := res.Stats[v]
			if v == "" || !ok || s.NonFinite() == 0 || s.NaN > 0 || statSigns(s)&^signs != 0 {
				continue
			}
			out[v], carried = true, true
		}
		if carried && wrote != nil {
			fills = append(fills, *wrote)
		}
	}
	return out, fills
}

// finfoCarriers returns the nodes whose values hold a number
// torch.finfo(dtype) wrote, read in fp16 or bf16 as that format's limit
// (fills, rewrite.FinfoFills): the readers, and the mask-carrying ops after
// them while the fp32 reference of what they make still lies beyond the
// format's range (the exported ±3.4e38 the limit stands for) — a mask
// added to the scores, expanded, cast for softmax. Their values differ
// from fp32's on purpose.
func (f *Facts) finfoCarriers(fills []rewrite.FinfoFill) map[int]bool {
	g := f.Graph()
	idx := f.Static.Model.Index
	ref := f.Passes[report.PassFP32]
	out := map[int]bool{}
	type reach struct {
		node  int
		limit float64
	}
	var queue []reach
	for _, w := range fills {
		if w.Reduced() && !out[w.Node] {
			out[w.Node] = true
			queue = append(queue, reach{w.Node, math.Abs(w.Limit())})
		}
	}
	if ref == nil {
		return out
	}
	beyond := func(ni int, limit float64) bool {
		for _, v := range g.Node[ni].Output {
			if s, ok := ref.Stats[v]; ok && (float64(s.MaxAbs) > limit || s.PosInf+s.NegInf > 0) {
				return true
			}
		}
		return false
	}
	for len(queue) > 0 {
		r := queue[0]
		queue = queue[1:]
		for _, v := range g.Node[r.node].Output {
			for _, c := range idx.Consumers(v) {
				n := g.Node[c]
				if out[c] || !carriesInf(n) || !beyond(c, r.limit) {
					continue
				}
				out[c] = true
				queue = append(queue, reach{c, r.limit})
			}
		}
	}
	return out
}

// fillValue returns the value a ConstantOfShape node writes (0 without a
// value attribute).
func (f *Facts) fillValue(n *onnx.NodeProto) (float64, bool) {
	a := onnx.FindAttr(n, "value")
	if a == nil || a.GetT() == nil {
		return 0, true
	}
	t, err := onnx.DecodeTensor(a.GetT(), f.Static.Model.Index.BaseDir)
	if err != nil || !t.DType.IsFloat() {
		return 0, false
	}
	xs, err := t.Float32s()
	if err != nil || len(xs) == 0 {
		return 0, false
	}
	return float64(xs[0]), true
}

// constantExtreme returns the element of largest magnitude of a constant
// value (±Inf included): from the constant scan for initializers and
// Constant outputs, from the fp32 pass for values computed from them.
func (f *Facts) constantExtreme(name string) (float64, bool) {
	if c := f.Static.Constant(name); c != nil {
		st := c.Stats
		switch {
		case st.NegInf > 0:
			return math.Inf(-1), true
		case st.PosInf > 0:
			return math.Inf(1), true
		}
		return st.Extreme, st.NonZero > 0
	}
	// A value computed from constants: follow single-input pass-throughs
	// (Identity, Cast, Reshape...) to the constant for its sign.
	if p := f.Static.Model.Index.Producer(name); p >= 0 {
		n := f.Graph().Node[p]
		if len(n.Input) > 0 && passesThrough(n) {
			return f.constantExtreme(n.Input[0])
		}
	}
	if s, ok := f.Passes[report.PassFP32].Stats[name]; ok {
		switch {
		case s.NegInf > 0:
			return math.Inf(-1), true
		case s.PosInf > 0:
			return math.Inf(1), true
		case s.Finite > 0:
			return float64(s.MaxAbs), true
		}
	}
	return 0, false
}

// passesThrough reports whether n hands its first input's values on
// unchanged (ops.PassThrough: Identity, Cast, the reshapes).
func passesThrough(n *onnx.NodeProto) bool {
	return ops.Lookup(ops.Default, n.OpType).Is(ops.PassThrough)
}
