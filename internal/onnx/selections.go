package onnx

import "slices"

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

// choosers maps an op that chooses to the input slots whose values it
// ranks; every output of such an op is chosen.
var choosers = map[string][]int{
	"NonMaxSuppression": {0, 1},
	"TopK":              {0},
	"ArgMax":            {0},
	"ArgMin":            {0},
	"Unique":            {0},
	"NonZero":           {0},
	"Compress":          {0, 1},
}

// gathers maps an op that reads its data at indices to its index slot:
// with chosen indices, its data slot 0 is ranked and its outputs chosen.
var gathers = map[string]int{
	"Gather": 1, "GatherND": 1, "GatherElements": 1, "Slice": 1,
}

// conditionOps are the comparisons (and logic on them) a NonZero or
// Compress condition is built from: the floats they compare are what the
// condition ranks.
var conditionOps = map[string]bool{
	"Greater": true, "GreaterOrEqual": true, "Less": true, "LessOrEqual": true, "Equal": true,
	"Not": true, "And": true, "Or": true, "Xor": true, "Cast": true, "IsNaN": true, "IsInf": true,
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
		if slots, ok := choosers[n.OpType]; ok && IsDefaultDomain(n.Domain) {
			chosen = true
			for _, k := range slots {
				if k < len(n.Input) {
					s.rankCondition(ix, n.Input[k], rank, 0)
				}
			}
		}
		if (n.OpType == "Loop" || n.OpType == "Scan") && bodyChooses(n) {
			chosen = true
		}
		if k, ok := gathers[n.OpType]; ok && IsDefaultDomain(n.Domain) && slices.ContainsFunc(n.Input[min(k, len(n.Input)):], func(v string) bool { return s.Chosen[v] }) {
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
	if !conditionOps[n.OpType] {
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
				if _, ok := choosers[b.OpType]; ok || bodyChooses(b) {
					return true
				}
			}
		}
	}
	return false
}

// ClassScores reports whether the last axis of value v holds class scores
// by the model's meaning: v (through activations, softmax and shape ops
// that keep the last axis) comes from a Gemm or MatMul, whose last axis is
// its output features, or from a Softmax or LogSoftmax. Values a Concat
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
		switch n.OpType {
		case "Gemm", "MatMul", "Softmax", "LogSoftmax":
			return true
		case "Identity", "Cast", "Relu", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "Gelu", "Neg",
			"Flatten", "Squeeze", "Unsqueeze", "Dropout":
			v = n.Input[0]
		case "Add", "Sub", "Mul", "Div":
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
