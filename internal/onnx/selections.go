package onnx

import (
	"slices"

	"fp16audit/internal/onnx/ops"
)

// Selections are the values of a graph that a data-dependent choice made:
// which boxes NonMaxSuppression keeps, which entries TopK, ArgMax or a sort
// picks, where NonZero finds its condition true, and everything computed
// from such a choice (the scores and boxes gathered at the kept indices).
// A 0.01 % change in a ranked score picks another candidate, so such a
// value is no longer comparable element by element with fp32's; what a
// precision changes shows in the values the choice was made from (Ranked).
type Selections struct {
	// Chosen holds every value computed from a choice.
	Chosen map[string]bool
	// Ranked lists, in topological order of their consumers, the float
	// values a choice reads that are not chosen themselves: what is
	// ranked (TopK's and ArgMax's input, NonMaxSuppression's boxes and
	// scores, the floats a NonZero condition compares) and what is
	// gathered at chosen indices. Weights are left out: they are the same
	// in every pass.
	Ranked []string
}

// The ops that choose, the slots whose values they rank, and the ops that
// read their data at indices are facts of their entries in
// internal/onnx/ops (Op.Chooses, Op.GathersAt).

// chooser returns the entry of a default-domain op that chooses, nil for
// the others.
func chooser(opType string) *ops.Op {
	if o := ops.Lookup(ops.Default, opType); o != nil && o.Chooses != nil {
		return o
	}
	return nil
}

// gathersAt returns the index slot of a default-domain op that reads its
// data (input 0) at indices, 0 for the others.
func gathersAt(n *NodeProto) int {
	if !IsDefaultDomain(n.Domain) {
		return 0
	}
	if o := ops.Lookup(ops.Default, n.OpType); o != nil {
		return o.GathersAt
	}
	return 0
}

// conditionOp reports whether an op is one a NonZero or Compress
// condition is built from: a comparison or logic on its results (a bool
// output), or a Cast of one. The floats such ops compare are what the
// condition ranks.
func conditionOp(opType string) bool {
	o := ops.Lookup(ops.Default, opType)
	return o != nil && o.Type == ops.TypeBool || opType == "Cast"
}

// FindSelections walks the graph in topological order and returns the
// values made by choices (nil Chosen when nothing chooses). A Loop or Scan
// whose body holds a choosing op is a choice as a whole (a beam search, a
// per-class NMS loop); its float inputs are not ranked, since what the
// body ranks is inside it.
func FindSelections(ix *Index) *Selections {
	g := ix.Graph()
	s := &Selections{Chosen: map[string]bool{}}
	ranked := map[string]bool{}
	rank := func(v string) {
		if v == "" || s.Chosen[v] || ranked[v] || ix.IsInitializer(v) || !IsFloatType(ix.ElemType(v)) {
			return
		}
		if isConstant(ix, v) {
			return
		}
		ranked[v] = true
		s.Ranked = append(s.Ranked, v)
	}
	for _, i := range ix.Order() {
		n := g.Node[i]
		chosen := false
		if c := chooser(n.OpType); c != nil && IsDefaultDomain(n.Domain) {
			chosen = true
			for _, k := range c.Chooses {
				if k < len(n.Input) {
					s.rankCondition(ix, n.Input[k], rank, 0)
				}
			}
		}
		if (n.OpType == "Loop" || n.OpType == "Scan") && bodyChooses(n) {
			chosen = true
		}
		if k := gathersAt(n); k > 0 && slices.ContainsFunc(n.Input[min(k, len(n.Input)):], func(v string) bool { return s.Chosen[v] }) {
			chosen = true
			rank(n.Input[0])
		}
		if !chosen {
			chosen = slices.ContainsFunc(n.Input, func(v string) bool { return s.Chosen[v] }) ||
				slices.ContainsFunc(ix.ImplicitInputs(i), func(v string) bool { return s.Chosen[v] })
		}
		if chosen {
			for _, o := range n.Output {
				if o != "" {
					s.Chosen[o] = true
				}
			}
		}
	}
	// A value ranked before a later choice consumed it may itself have
	// become chosen (a choice of a choice): only the unchosen stay.
	s.Ranked = slices.DeleteFunc(s.Ranked, func(v string) bool { return s.Chosen[v] })
	if len(s.Chosen) == 0 {
		return &Selections{}
	}
	return s
}

// rankCondition ranks v, or, for a boolean condition, the floats the
// comparisons it is built from read.
func (s *Selections) rankCondition(ix *Index, v string, rank func(string), depth int) {
	if IsFloatType(ix.ElemType(v)) || depth > 16 {
		rank(v)
		return
	}
	p := ix.Producer(v)
	if p < 0 {
		return
	}
	n := ix.Graph().Node[p]
	if !conditionOp(n.OpType) {
		return
	}
	for _, in := range n.Input {
		if in != "" {
			s.rankCondition(ix, in, rank, depth+1)
		}
	}
}

// bodyChooses reports whether a subgraph of n (at any depth) holds a
// choosing op.
func bodyChooses(n *NodeProto) bool {
	for _, a := range n.Attribute {
		for _, sg := range append([]*GraphProto{a.G}, a.Graphs...) {
			if sg == nil {
				continue
			}
			for _, b := range sg.Node {
				if chooser(b.OpType) != nil || bodyChooses(b) {
					return true
				}
			}
		}
	}
	return false
}

// ClassScores reports whether the last axis of value v holds class scores
// by the model's meaning: v (through activations, softmax and shape ops
// that keep the last axis: ops.KeepsScores, and biases and scales:
// ops.Affine) comes from a Gemm or MatMul, whose last axis is its output
// features, or from a Softmax or LogSoftmax (ops.Scores). Values a Concat
// assembles (box coordinates, anchors) and chosen values are not.
func ClassScores(ix *Index, sel *Selections, v string) bool {
	g := ix.Graph()
	for range 32 {
		if sel != nil && sel.Chosen[v] {
			return false
		}
		p := ix.Producer(v)
		if p < 0 {
			return false
		}
		n := g.Node[p]
		o := ops.Lookup(ops.Default, n.OpType)
		switch {
		case o.Is(ops.Scores):
			return true
		case o.Is(ops.KeepsScores):
			v = n.Input[0]
		case o.Is(ops.Affine):
			// A bias or a scale: follow the operand that is computed.
			if len(n.Input) < 2 || ix.IsInitializer(n.Input[0]) || isConstant(ix, n.Input[0]) {
				v = n.Input[len(n.Input)-1]
			} else {
				v = n.Input[0]
			}
		default:
			return false
		}
	}
	return false
}

// isConstant reports whether v is a Constant node's output.
func isConstant(ix *Index, v string) bool {
	p := ix.Producer(v)
	return p >= 0 && ix.Graph().Node[p].OpType == "Constant"
}
