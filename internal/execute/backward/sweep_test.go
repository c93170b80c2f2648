package backward

import (
	"slices"
	"sort"
	"testing"

	"fp16audit/internal/grad"
)

// TestSweepFindsEveryChange: three keys change their flags at exponents
// 5, 6 and 19 (and one never); the sweep must scan both sides of each
// change and skip the stretches where nothing changes.
func TestSweepFindsEveryChange(t *testing.T) {
	changeAt := map[string]int{"a": 5, "b": 6, "c": 19, "d": 99}
	var calls []int
	scan := func(e int) (*grad.Scan, error) {
		calls = append(calls, e)
		return &grad.Scan{Exp: e}, nil
	}
	status := func(s *grad.Scan) map[string]uint8 {
		out := map[string]uint8{}
		for k, at := range changeAt {
			if s.Exp >= at {
				out[k] = 1
			}
		}
		return out
	}
	scans, err := Sweep(scan, 0, 24, []int{16}, status)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for e := range scans {
		got = append(got, e)
	}
	sort.Ints(got)
	for _, e := range []int{0, 4, 5, 6, 16, 18, 19, 24} {
		if !slices.Contains(got, e) {
			t.Errorf("exponent %d not scanned (scanned %v): a change next to it would be missed", e, got)
		}
	}
	if len(got) > 14 {
		t.Errorf("%d scans %v for three change points: the sweep should skip agreeing intervals", len(got), got)
	}
	seen := map[int]bool{}
	for _, e := range calls {
		if seen[e] {
			t.Errorf("exponent %d scanned twice", e)
		}
		seen[e] = true
	}
}
