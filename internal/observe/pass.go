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
