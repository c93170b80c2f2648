package observe

// PassResult is what one pass learned: statistics per observed value,
// aggregated over every batch, the shape each value had in the first batch,
// and, for passes compared with a reference, the per-value differences
// and the comparison of the graph outputs.
type PassResult struct {
	// Name is the pass's name ("fp32", "fp16", "fp16+standardized"...).
	Name   string
	Stats  map[string]*Stats
	Shapes map[string][]int64
	// Diffs is nil for a pass not compared with a reference.
	Diffs map[string]*Diff
	// Outputs compares the pass's float graph outputs with the fp32
	// pass's, in the graph's order; nil for a pass not compared.
	Outputs []*OutputDiff
}

// NewPassResult returns empty results for the named values; compared says
// whether the pass is compared with a reference (Diffs is made).
func NewPassResult(name string, values []string, compared bool) *PassResult {
	res := &PassResult{Name: name, Stats: make(map[string]*Stats, len(values)), Shapes: make(map[string][]int64, len(values))}
	for _, v := range values {
		s := NewStats()
		res.Stats[v] = &s
	}
	if compared {
		res.Diffs = make(map[string]*Diff, len(values))
		for _, v := range values {
			res.Diffs[v] = &Diff{}
		}
	}
	return res
}

// NonFinite counts the non-finite elements of the named values (those the
// pass did not observe count as finite).
func (r *PassResult) NonFinite(values []string) int64 {
	var t int64
	for _, v := range values {
		if s, ok := r.Stats[v]; ok {
			t += s.NonFinite()
		}
	}
	return t
}

// Contain gives each container value (an ONNX sequence or optional,
// which no statistics node can read) the statistics of the tensors it
// holds, merged in the order contents lists them, and their differences
// with the reference where the pass is compared: a sequence that
// SplitToSequence made from a tensor holds exactly that tensor's
// elements, so it holds NaN/Inf exactly where that tensor does, and the
// analyses that follow a value from its producer to its readers cross it.
// A container none of whose tensors the pass observed gets nothing.
func (r *PassResult) Contain(contents map[string][]string) {
	for c, held := range contents {
		s, d, seen := NewStats(), Diff{}, false
		for _, v := range held {
			vs, ok := r.Stats[v]
			if !ok {
				continue
			}
			seen = true
			s.Merge(*vs)
			if vd, ok := r.Diffs[v]; ok {
				d.Merge(*vd)
			}
		}
		if !seen {
			continue
		}
		r.Stats[c] = &s
		if r.Diffs != nil {
			r.Diffs[c] = &d
		}
	}
}
