package evidence

// reductions are the ops whose output is a mean or sum over an axis: the
// variance or squared norm a normalization takes the square root of.
var reductions = map[string]bool{"ReduceMean": true, "ReduceSum": true, "ReduceSumSquare": true}

// RootWithoutEps is a division by the square root of a mean or sum with
// no epsilon: Node divides by Root's output; Radicand is what Root takes
// the square root of ("" for ReduceL2, which the fix cannot reach).
type RootWithoutEps struct {
	Node, Root int
	Radicand   string
}

// MissingEpsilon finds whether node ni divides by the square root of a
// mean or sum (a hand-written LayerNorm, RMSNorm or L2 normalization)
// with no epsilon added inside or outside the root, where a row whose
// values are all equal (a zero pad embedding) makes 0/0.
func (f *Facts) MissingEpsilon(ni int) (RootWithoutEps, bool) {
	g := f.Graph()
	ix := f.Static.Model.Index
	if ni < 0 || ni >= len(g.Node) {
		return RootWithoutEps{}, false
	}
	n := g.Node[ni]
	var den string
	switch {
	case n.OpType == "Div" && len(n.Input) == 2:
		den = n.Input[1]
	case n.OpType == "Reciprocal" && len(n.Input) == 1:
		den = n.Input[0]
	default:
		return RootWithoutEps{}, false
	}
	p := ix.Producer(den)
	if p < 0 {
		return RootWithoutEps{}, false
	}
	root := g.Node[p]
	switch {
	case root.OpType == "ReduceL2":
		return RootWithoutEps{Node: ni, Root: p}, true
	case root.OpType == "Sqrt" && len(root.Input) == 1:
		if q := ix.Producer(root.Input[0]); q >= 0 && reductions[g.Node[q].OpType] {
			return RootWithoutEps{Node: ni, Root: p, Radicand: root.Input[0]}, true
		}
	}
	return RootWithoutEps{}, false
}
