package diagnose

import (
	"math"
	"slices"
	"sort"

	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
	"fp16audit/internal/tensor"
	"fp16audit/report"
)

// origin is where non-finite values start in one pass: a node one of whose
// outputs holds NaN/Inf while all of its inputs are finite, or a graph
// input (node -1) whose batch holds NaN/Inf.
type origin struct {
	node  int
	input string
	// affected are the nodes downstream of the origin whose outputs hold
	// NaN/Inf in the same pass, in topological order; outputs the graph
	// outputs among their values.
	affected []int
	outputs  []string
}

// findOrigins walks the graph in topological order and returns every origin
// of non-finite values: first the graph inputs in inputs that nonFinite
// says hold NaN/Inf, then the nodes. Values fp16audit did not observe
// (integer values, initializers) count as finite, and so do the values
// isConst marks (initializers, Constant outputs and what is computed from
// them alone): a constant that a precision cannot hold is the fault of the
// node that writes it into a value of that precision, so its readers, not
// its producers, are origins. Propagation is followed through consumers,
// so independent origins are all reported, each with what it reached. The
// values a selection ranks (ranked) count as graph outputs.
func findOrigins(g *onnx.GraphProto, ranked []string, order []int, inputs []string, nonFinite, isConst func(string) bool, consumers func(string) []int) []origin {
	isGraphOutput := map[string]bool{}
	for _, o := range g.Output {
		isGraphOutput[o.Name] = true
	}
	for _, v := range ranked {
		isGraphOutput[v] = true
	}
	pos := make(map[int]int, len(order))
	for p, ni := range order {
		pos[ni] = p
	}
	claimed := map[int]bool{}
	// spread follows the non-finite values of an origin's outputs through
	// their consumers.
	spread := func(o *origin, outs []string) {
		seen := map[int]bool{o.node: true}
		queue := append([]string(nil), outs...)
		for len(queue) > 0 {
			out := queue[0]
			queue = queue[1:]
			if !nonFinite(out) {
				continue
			}
			if isGraphOutput[out] {
				o.outputs = append(o.outputs, out)
			}
			for _, c := range consumers(out) {
				if seen[c] {
					continue
				}
				seen[c] = true
				bad := false
				for _, co := range g.Node[c].Output {
					if nonFinite(co) {
						bad = true
					}
				}
				if bad {
					claimed[c] = true
					o.affected = append(o.affected, c)
					queue = append(queue, g.Node[c].Output...)
				}
			}
		}
		sort.Slice(o.affected, func(a, b int) bool { return pos[o.affected[a]] < pos[o.affected[b]] })
	}
	var origins []origin
	for _, in := range inputs {
		if nonFinite(in) {
			o := origin{node: -1, input: in}
			spread(&o, []string{in})
			origins = append(origins, o)
		}
	}
	for _, ni := range order {
		n := g.Node[ni]
		if claimed[ni] {
			continue
		}
		bad, allConst := false, true
		for _, o := range n.Output {
			if o != "" && nonFinite(o) {
				bad = true
			}
			if o != "" && !isConst(o) {
				allConst = false
			}
		}
		if !bad || allConst {
			continue
		}
		clean := true
		for _, in := range n.Input {
			if in != "" && nonFinite(in) && !isConst(in) {
				clean = false
				break
			}
		}
		if !clean {
			continue
		}
		o := origin{node: ni}
		spread(&o, n.Output)
		origins = append(origins, o)
	}
	return origins
}

// constantValues returns the values of g fixed without running it: the
// initializers, Constant outputs and the outputs of nodes that read
// nothing else (the exporter's Identity of a shared weight, constant
// arithmetic it did not fold).
func constantValues(g *onnx.GraphProto, order []int) map[string]bool {
	c := map[string]bool{}
	for _, t := range g.Initializer {
		c[t.Name] = true
	}
	for _, ni := range order {
		n := g.Node[ni]
		all := len(n.Input) > 0 || (n.OpType == "Constant" && onnx.IsDefaultDomain(n.Domain))
		for _, in := range n.Input {
			if in != "" && !c[in] {
				all = false
			}
		}
		if all && !ops.Random(n.Domain, n.OpType) {
			for _, o := range n.Output {
				if o != "" {
					c[o] = true
				}
			}
		}
	}
	return c
}

// passOrigins finds the origins of non-finite values in one pass's results
// under assignment asg, classified: their cause, the fp32 magnitude of each
// origin's value, the out-of-range constant a constant origin writes, and
// the precision provenance of an emulated-pass origin. It also returns the
// values whose only non-finite elements are infinities the model writes on
// purpose (see deliberateValues), which are neither origins nor what an
// origin spreads to, and where the pass writes a mask constant beyond its
// format's range. It reads the facts and writes nothing.
func (f *Facts) passOrigins(pass string, res *observe.PassResult, asg *precision.Assignment) ([]report.Origin, map[string]bool, []fill) {
	g := f.graph()
	idx := f.Static.Model.Index
	deliberate, fills := f.deliberateValues(pass, res, asg)
	nonFinite := func(name string) bool {
		if in := f.input(name); in != nil {
			return in.Stats.NonFinite() > 0
		}
		s, ok := res.Stats[name]
		return ok && s.NonFinite() > 0 && !deliberate[name]
	}
	isConst := func(name string) bool { return f.consts[name] }
	var inputs []string
	for _, in := range f.Inputs {
		inputs = append(inputs, in.Spec.Name)
	}
	out := []report.Origin{}
	// starts holds, per origin, the values its NaN/Inf are in: where its
	// effect on the outputs starts.
	var starts [][]string
	castInputs := map[string]int{} // input origins of the policy's cast, by input
	for _, o := range findOrigins(g, f.Ranked, f.Static.Order, inputs, nonFinite, isConst, idx.Consumers) {
		start := o.values(g)
		var or report.Origin
		if o.node < 0 {
			in := f.input(o.input)
			or = report.Origin{Pass: pass, Cause: report.CauseInput, Index: -1, Input: o.input, Value: o.input,
				NonFinite: in.Stats.NonFinite(), Samples: in.Samples}
		} else if in := f.castInput(pass, o.node, asg); in != nil {
			// The policy holds a graph input in reduced precision (half:
			// x.half()), and that cast overflows: the input is the origin,
			// whichever nodes read it.
			if k, ok := castInputs[in.Spec.Name]; ok {
				merge(&out[k], o, f)
				starts[k] = append(starts[k], start...)
				continue
			}
			castInputs[in.Spec.Name] = len(out)
			or = report.Origin{Pass: pass, Cause: report.CauseOverflow, Index: -1, Input: in.Spec.Name, Value: in.Spec.Name,
				Precision: asg.Value[in.Spec.Name].String(), FP32MaxAbs: float64(in.Stats.MaxAbs), NonFinite: in.Stats.AboveFP16Max}
		} else {
			or = f.nodeOrigin(pass, o.node, res, asg)
		}
		or.Affected, or.AffectedOutputs = []string{}, []string{}
		merge(&or, o, f)
		out = append(out, or)
		starts = append(starts, start)
	}
	if pass != PassFP32 && res.Outputs != nil {
		out = f.attributeWrong(out, starts, res, asg)
	}
	return out, deliberate, fills
}

// values lists the values an origin's NaN/Inf are in: its input or its
// node's outputs, and the outputs of the nodes they reached.
func (o origin) values(g *onnx.GraphProto) []string {
	var vs []string
	if o.node < 0 {
		vs = append(vs, o.input)
	} else {
		vs = append(vs, g.Node[o.node].Output...)
	}
	for _, ni := range o.affected {
		vs = append(vs, g.Node[ni].Output...)
	}
	return vs
}

// fill is where a pass writes a mask constant on purpose into a value
// whose format cannot hold it: ±float32's largest value (what an fp32
// export of torch.finfo(x.dtype).min looks like) held in fp16 or bf16,
// where it is ±Inf.
type fill struct {
	node     int
	constant string
	value    float64
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
func deliberateExtreme(v float64) bool { return math.IsInf(v, 0) || dtypeAwareLimit(v) }

// deliberateValues returns the values of one pass whose only non-finite
// elements are infinities the model writes on purpose: a mask constant of
// -inf or finfo(float32).min — ConstantOfShape of it, an initializer — and
// what mask-carrying ops make of it (Trilu, Expand, Where, scores + mask)
// while no NaN and no infinity of another sign appears and no other
// non-finite value flows in. Softmax of an all -inf row is NaN, so the
// Softmax is where that NaN starts. It also returns the fills: where such
// a constant, finite in fp32, is written into a value the pass holds in
// fp16 or bf16.
func (f *Facts) deliberateValues(pass string, res *observe.PassResult, asg *precision.Assignment) (map[string]bool, []fill) {
	g := f.graph()
	out := map[string]bool{}
	var fills []fill
	for _, ni := range f.Static.Order {
		n := g.Node[ni]
		if !carriesInf(n) {
			continue
		}
		var signs infSigns
		var wrote *fill
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
				if !math.IsInf(v, 0) && pass != PassFP32 && overflowAt(f.Static.HeldAtIn(asg, in, ni)) > 0 {
					wrote = &fill{node: ni, constant: in, value: v}
				}
			case out[in]:
				signs |= statSigns(res.Stats[in])
			default:
				if s, ok := res.Stats[in]; ok && s.NonFinite() > 0 {
					clean = false
				}
				if gi := f.input(in); gi != nil && gi.Stats.NonFinite() > 0 {
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
	g := f.graph()
	idx := f.Static.Model.Index
	ref := f.Passes[PassFP32]
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

// castInput returns the graph input that node ni reads in a precision
// whose range the input's values exceed because the policy holds the input
// itself there (not because ni casts it, as an autocast op does).
func (f *Facts) castInput(pass string, ni int, asg *precision.Assignment) *Input {
	if pass == PassFP32 {
		return nil
	}
	for _, name := range f.graph().Node[ni].Input {
		in := f.input(name)
		if in == nil || in.chans == nil {
			continue
		}
		if limit := overflowAt(asg.Value[name]); limit > 0 && float64(in.Stats.MaxAbs) >= limit {
			return in
		}
	}
	return nil
}

// overflowAt is where a float32 value starts rounding to Inf in precision
// p; 0 for the precisions without such a limit.
func overflowAt(p precision.Precision) float64 {
	switch p {
	case precision.FP16:
		return tensor.FP16Overflow
	case precision.BF16:
		return tensor.BF16Overflow
	}
	return 0
}

// merge adds what another reader of the same overflowing input reached.
func merge(or *report.Origin, o origin, f *Facts) {
	for _, ni := range o.affected {
		or.Affected = append(or.Affected, f.nodeName(ni))
	}
	for _, out := range o.outputs {
		if !slices.Contains(or.AffectedOutputs, out) {
			or.AffectedOutputs = append(or.AffectedOutputs, out)
		}
	}
}

// nodeOrigin describes an origin at node ni.
func (f *Facts) nodeOrigin(pass string, ni int, res *observe.PassResult, asg *precision.Assignment) report.Origin {
	g := f.graph()
	n := g.Node[ni]
	or := report.Origin{Pass: pass, Cause: report.CauseOverflow, Node: f.nodeName(ni), Index: ni, OpType: n.OpType,
		Module: onnx.ModulePath(n), Precision: asg.Node[ni].String()}
	if pass == PassFP32 {
		or.Cause, or.Precision = report.CauseFP32, precision.FP32.String()
	}
	for _, v := range n.Output {
		if s, ok := res.Stats[v]; ok && s.NonFinite() > 0 {
			or.Value, or.NonFinite = v, s.NonFinite()
			if ref, ok := f.Passes[PassFP32].Stats[v]; ok && ref.Finite > 0 {
				or.FP32MaxAbs = float64(ref.MaxAbs)
				if h := ref.HeadroomBits(); !isInfOrNaN(h) {
					or.HeadroomBits = &h
				}
			}
			if w := asg.Why[v]; w != 0 && pass != PassFP32 {
				or.Provenance = &report.Provenance{Reasons: w.Names()}
				for _, c := range asg.Casts[v] {
					or.Provenance.Casts = append(or.Provenance.Casts, f.nodeName(c))
				}
				or.ExplicitCast = asg.Explicit(v)
			}
			break
		}
	}
	if f.HalfCasts[ni] && pass != PassFP32 {
		// The model's own Cast to half overflows itself.
		or.ExplicitCast = true
		if or.Provenance == nil {
			or.Provenance = &report.Provenance{Reasons: precision.ReasonCast.Names()}
		}
		if len(or.Provenance.Casts) == 0 {
			or.Provenance.Casts = []string{f.nodeName(ni)}
		}
	}
	if c, v, ok := f.outOfRangeConstant(ni, asg, pass == PassFP32); ok {
		or.Cause, or.Constant, or.ConstantValue = report.CauseConstant, c, &v
		or.ExplicitCast = false
	}
	return or
}

// outOfRangeConstant returns a constant input of node ni that the node
// holds in a precision too narrow for it (the first such input, its most
// extreme value): a mask fill of -1e9 in fp16. In the fp32 pass nothing
// is out of range (an infinity written on purpose is a mask, see
// deliberateValues).
func (f *Facts) outOfRangeConstant(ni int, asg *precision.Assignment, fp32 bool) (string, float64, bool) {
	if fp32 {
		return "", 0, false
	}
	n := f.graph().Node[ni]
	for _, in := range n.Input {
		if in == "" || !f.consts[in] {
			continue
		}
		v, ok := f.constantExtreme(in)
		if !ok {
			continue
		}
		held := f.Static.HeldAtIn(asg, in, ni)
		if limit := overflowAt(held); limit > 0 && math.Abs(v) >= limit {
			return in, v, true
		}
	}
	return "", 0, false
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
		n := f.graph().Node[p]
		if len(n.Input) > 0 && passesThrough(n) {
			return f.constantExtreme(n.Input[0])
		}
	}
	if s, ok := f.Passes[PassFP32].Stats[name]; ok {
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
