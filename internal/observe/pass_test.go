package observe

import (
	"math"
	"testing"
)

// TestContain: a container gets the statistics of the tensors it holds,
// merged, and their differences; NaN/Inf in one of them is in it; one
// whose tensors the pass did not observe gets nothing.
func TestContain(t *testing.T) {
	inf := float32(math.Inf(1))
	r := NewPassResult("fp16", []string{"a", "b"}, true)
	r.Stats["a"].Observe([]float32{1, -3}, 0)
	r.Stats["b"].Observe([]float32{2, inf}, 0)
	r.Diffs["a"].Observe([]float32{1, -3}, []float32{1, -3})
	r.Diffs["b"].Observe([]float32{2, inf}, []float32{2, 70000})
	r.Contain(map[string][]string{"seq": {"a", "b"}, "empty": {"c"}})
	s, ok := r.Stats["seq"]
	if !ok {
		t.Fatal("no statistics for the sequence")
	}
	if s.Count != 4 || s.MaxAbs != 3 || s.PosInf != 1 || s.NonFinite() != 1 {
		t.Errorf("sequence stats %+v: want 4 elements, max |x| 3, one +Inf", *s)
	}
	if d := r.Diffs["seq"]; d == nil || d.NewNonFinite != 1 || d.BothFinite != 3 {
		t.Errorf("sequence diff %+v: want one new non-finite, three finite in both", d)
	}
	if _, ok := r.Stats["empty"]; ok {
		t.Error("a container of unobserved tensors got statistics")
	}
}
