package evidence

import (
	"math"
	"slices"
	"sort"

	"fp16audit/internal/diagnose/inputs"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/precision"
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

// PassOrigins finds the origins of non-finite values in one pass's results
// under assignment asg, classified: their cause, the fp32 magnitude of each
// origin's value, the out-of-range constant a constant origin writes, and
// the precision provenance of an emulated-pass origin. It also returns the
// values whose only non-finite elements are infinities the model writes on
// purpose (see deliberateValues), which are neither origins nor what an
// origin spreads to, and where the pass writes a mask constant beyond its
// format's range. It reads the facts and writes nothing.
func (f *Facts) PassOrigins(pass string, res *observe.PassResult, asg *precision.Assignment) ([]report.Origin, map[string]bool, []Fill) {
	g := f.Graph()
	idx := f.Static.Model.Index
	deliberate, fills := f.deliberateValues(pass, res, asg)
	nonFinite := func(name string) bool {
		if in := f.Input(name); in != nil {
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
			in := f.Input(o.input)
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
	if pass != report.PassFP32 && res.Outputs != nil {
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

// castInput returns the graph input that node ni reads in a precision
// whose range the input's values exceed because the policy holds the input
// itself there (not because ni casts it, as an autocast op does).
func (f *Facts) castInput(pass string, ni int, asg *precision.Assignment) *inputs.Input {
	if pass == report.PassFP32 {
		return nil
	}
	for _, name := range f.Graph().Node[ni].Input {
		in := f.Input(name)
		if in == nil || !in.Float() {
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
		or.Affected = append(or.Affected, f.NodeName(ni))
	}
	for _, out := range o.outputs {
		if !slices.Contains(or.AffectedOutputs, out) {
			or.AffectedOutputs = append(or.AffectedOutputs, out)
		}
	}
}

// nodeOrigin describes an origin at node ni.
func (f *Facts) nodeOrigin(pass string, ni int, res *observe.PassResult, asg *precision.Assignment) report.Origin {
	g := f.Graph()
	n := g.Node[ni]
	or := report.Origin{Pass: pass, Cause: report.CauseOverflow, Node: f.NodeName(ni), Index: ni, OpType: n.OpType,
		Module: onnx.ModulePath(n), Precision: asg.Node[ni].String()}
	if pass == report.PassFP32 {
		or.Cause, or.Precision = report.CauseFP32, precision.FP32.String()
	}
	for _, v := range n.Output {
		if s, ok := res.Stats[v]; ok && s.NonFinite() > 0 {
			or.Value, or.NonFinite = v, s.NonFinite()
			if ref, ok := f.Passes[report.PassFP32].Stats[v]; ok && ref.Finite > 0 {
				or.FP32MaxAbs = float64(ref.MaxAbs)
				if h := ref.HeadroomBits(); !isInfOrNaN(h) {
					or.HeadroomBits = &h
				}
			}
			if w := asg.Why[v]; w != 0 && pass != report.PassFP32 {
				or.Provenance = &report.Provenance{Reasons: w.Names()}
				for _, c := range asg.Casts[v] {
					or.Provenance.Casts = append(or.Provenance.Casts, f.NodeName(c))
				}
				or.ExplicitCast = asg.Explicit(v)
			}
			break
		}
	}
	if f.HalfCasts[ni] && pass != report.PassFP32 {
		// The model's own Cast to half overflows itself.
		or.ExplicitCast = true
		if or.Provenance == nil {
			or.Provenance = &report.Provenance{Reasons: precision.ReasonCast.Names()}
		}
		if len(or.Provenance.Casts) == 0 {
			or.Provenance.Casts = []string{f.NodeName(ni)}
		}
	}
	if c, v, ok := f.outOfRangeConstant(ni, asg, pass == report.PassFP32); ok {
		or.Cause, or.Constant, or.ConstantValue = report.CauseConstant, c, &v
		or.ExplicitCast = false
		or.Weight, _ = f.WeightConstant(or)
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
	n := f.Graph().Node[ni]
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
