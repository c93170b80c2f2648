package observe

import (
	"math"
	"testing"
)

// refDiff is Diff.Observe written plainly, one branch per case.
func refDiff(y, ref []float32) Diff {
	var d Diff
	for i, r := range ref[:min(len(y), len(ref))] {
		v := y[i]
		if math.IsNaN(float64(r)) || math.IsInf(float64(r), 0) {
			continue
		}
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			d.NewNonFinite++
			continue
		}
		if r != 0 {
			d.NonzeroRef++
			if v == 0 {
				d.Flushed++
			}
		}
		e := float64(v) - float64(r)
		d.SumSqDiff += e * e
		d.SumSqRef += float64(r) * float64(r)
	}
	return d
}

// TestDiffMatchesReference checks the branch-free kernel on every class of
// element pair (finite, zero, signed zero, subnormal, NaN, ±Inf in either
// pass) and on lengths around its unrolling.
func TestDiffMatchesReference(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	vals := []float32{0, float32(math.Copysign(0, -1)), 1, -2.5, 1e-40, -1e-45, 65504, 7e4, -3e38, inf, -inf, nan}
	var y, ref []float32
	for _, a := range vals {
		for _, b := range vals {
			y, ref = append(y, a), append(ref, b)
		}
	}
	for n := range len(y) + 1 {
		got := Diff{}
		got.Observe(y[:n], ref[:n])
		want := refDiff(y[:n], ref[:n])
		if got.NewNonFinite != want.NewNonFinite || got.NonzeroRef != want.NonzeroRef || got.Flushed != want.Flushed ||
			math.Abs(got.SumSqDiff-want.SumSqDiff) > 1e-12*want.SumSqDiff || math.Abs(got.SumSqRef-want.SumSqRef) > 1e-12*want.SumSqRef {
			t.Fatalf("n=%d: got %+v, want %+v", n, got, want)
		}
	}
	// A shorter reference compares the common prefix.
	var d Diff
	d.Observe([]float32{1, 2, 3}, []float32{1, 0})
	if d.NonzeroRef != 1 || d.SumSqDiff != 4 {
		t.Errorf("prefix: %+v", d)
	}
}
