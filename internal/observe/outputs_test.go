package observe

import (
	"math"
	"testing"
)

// TestOutputDiffPerSample: the worst sample is found across parts and
// batches with its batch and absolute index, the overall error pools every
// sample, and one corrupted sample stands out where the pooled error would
// hide it.
func TestOutputDiffPerSample(t *testing.T) {
	d := NewOutputDiff("logits")
	// batch 0: two samples of [2,3], the second 1% off.
	ref := []float32{1, 2, 3, 4, 5, 6}
	y := []float32{1, 2, 3, 4.04, 5.05, 6.06}
	d.Observe(0, 0, []int64{2, 3}, []int64{2, 3}, y, ref)
	// batch 1 in two parts of one sample; the part at index 1 is
	// corrupted (every element 0: relative error 1).
	d.Observe(1, 0, []int64{1, 3}, []int64{1, 3}, []float32{1, 2, 3}, []float32{1, 2, 3})
	d.Observe(1, 1, []int64{1, 3}, []int64{1, 3}, []float32{0, 0, 0}, []float32{7, 8, 9})
	if d.Samples != 4 || d.Count != 12 || d.BothFinite != 12 {
		t.Fatalf("samples %d count %d both finite %d, want 4, 12, 12", d.Samples, d.Count, d.BothFinite)
	}
	if d.Worst.Batch != 1 || d.Worst.Index != 1 || d.Worst.RelErr != 1 {
		t.Errorf("worst %+v, want batch 1 sample 1 error 1", d.Worst)
	}
	var sd, sr float64
	for i := range ref {
		e := float64(y[i]) - float64(ref[i])
		sd += e * e
		sr += float64(ref[i]) * float64(ref[i])
	}
	sr += 1 + 4 + 9 + 49 + 64 + 81
	sd += 49 + 64 + 81
	if got, want := d.RelErr(), math.Sqrt(sd/sr); math.Abs(got-want) > 1e-12 {
		t.Errorf("overall relative error %g, want %g", got, want)
	}
	if got := d.MaxRelErr(); got != 1 {
		t.Errorf("max relative error %g, want 9/9 = 1", got)
	}
	if d.Rows != 4 || d.Top1 != 3 {
		t.Errorf("top-1 %d of %d rows, want 3 of 4 (the zeroed row's argmax moves to class 0)", d.Top1, d.Rows)
	}
}

// TestOutputDiffNonFinite: NaN/Inf are counted apart and never enter the
// errors; a sample with nothing finite in both passes is not a worst one.
func TestOutputDiffNonFinite(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	d := NewOutputDiff("y")
	d.Observe(0, 0, []int64{2, 2}, []int64{2, 2}, []float32{nan, inf, 1, 2}, []float32{1, 2, 1, 2.5})
	if d.NonFinite != 2 || d.RefNonFinite != 0 || d.BothFinite != 2 {
		t.Fatalf("non-finite %d/%d, both finite %d; want 2/0, 2", d.NonFinite, d.RefNonFinite, d.BothFinite)
	}
	if d.Worst.Index != 1 || math.Abs(d.Worst.RelErr-0.5/math.Sqrt(1+6.25)) > 1e-12 {
		t.Errorf("worst %+v, want sample 1", d.Worst)
	}
	if d.MaxAbsErr != 0.5 || d.RefMaxAbs != 2.5 {
		t.Errorf("max abs error %g of %g, want 0.5 of 2.5", d.MaxAbsErr, d.RefMaxAbs)
	}
	if d.Top1 != 2 {
		t.Errorf("top-1 %d, want 2: NaN never wins and +Inf does, so row 0's argmax is class 1 as in fp32; row 1 agrees", d.Top1)
	}
}

// TestOutputDiffShapes: a vector output has no class axis, a scalar is one
// sample per batch, and an all-zero fp32 output is an infinite relative
// error only when the pass differs.
func TestOutputDiffShapes(t *testing.T) {
	d := NewOutputDiff("v")
	d.Observe(0, 0, []int64{3}, []int64{3}, []float32{1, 2, 3}, []float32{1, 2, 3})
	if _, ok := d.Top1Agreement(); ok || d.Samples != 3 || d.RelErr() != 0 {
		t.Errorf("vector: top-1 present %v, samples %d, error %g", ok, d.Samples, d.RelErr())
	}
	s := NewOutputDiff("loss")
	s.Observe(0, 0, nil, nil, []float32{0}, []float32{0})
	s.Observe(1, 0, nil, nil, []float32{1e-3}, []float32{0})
	if s.Samples != 2 || !math.IsInf(s.Worst.RelErr, 1) || s.Worst.Batch != 1 || !math.IsInf(s.MaxRelErr(), 1) {
		t.Errorf("scalar: samples %d, worst %+v, max relative %g", s.Samples, s.Worst, s.MaxRelErr())
	}
	e := NewOutputDiff("none")
	if !math.IsNaN(e.RelErr()) || e.Worst.RelErr != -1 {
		t.Errorf("empty: error %g, worst %+v", e.RelErr(), e.Worst)
	}
}

// TestChosenItems: an output a selection chose counts fp32's items and
// those this pass kept too (boxes by IoU, other rows within 5 %, each
// matched once), whatever order or number the pass kept them in, and
// gets no relative error.
func TestChosenItems(t *testing.T) {
	d := NewOutputDiff("boxes")
	d.Role = RoleChosen
	ref := []float32{0, 0, 10, 10, 20, 20, 30, 30, 50, 50, 60, 60}
	// The same first two boxes in the other order (one shifted by a pixel),
	// the third lost, another one kept instead.
	y := []float32{20, 20, 30, 30, 1, 0, 11, 10, 80, 80, 90, 90, 0, 0, 10, 10}
	d.Observe(0, 0, []int64{4, 4}, []int64{3, 4}, y, ref)
	if d.Kept != 3 || d.Common != 2 {
		t.Errorf("kept %d, common %d; want 3, 2", d.Kept, d.Common)
	}
	if frac, ok := d.CommonItems(); !ok || frac != 2.0/3 {
		t.Errorf("common items %v %v", frac, ok)
	}
	if d.Worst.RelErr != -1 || d.SumSqRef != 0 || d.Rows != 0 {
		t.Errorf("a chosen output got errors: worst %v, sums %v, rows %d", d.Worst.RelErr, d.SumSqRef, d.Rows)
	}
	s := NewOutputDiff("scores")
	s.Role = RoleChosen
	s.Observe(0, 0, []int64{3}, []int64{2}, []float32{0.5, 0.91, 0.2}, []float32{0.9, 0.5})
	if s.Kept != 2 || s.Common != 2 {
		t.Errorf("scores: kept %d, common %d; want 2, 2", s.Kept, s.Common)
	}
}

// TestRankedWhole: a value a selection ranks is one sample per batch (its
// first axis counts candidates), and top-1 is counted only where the last
// axis holds classes.
func TestRankedWhole(t *testing.T) {
	d := NewOutputDiff("scores")
	d.Role, d.Classes = RoleRanked, false
	d.Observe(0, 0, []int64{3, 2}, []int64{3, 2}, []float32{1, 2, 3, 4, 5, 0}, []float32{1, 2, 3, 4, 5, 6})
	if d.Samples != 1 || d.Rows != 0 {
		t.Errorf("samples %d, rows %d; want one sample and no class rows", d.Samples, d.Rows)
	}
}

// TestChosenItemsBatched: a batched chosen output of rank 3 (a top-k's
// vectors) matches its picks sample by sample, along its second axis; of
// rank 2 (the argmax class's vector) it is one row per sample.
func TestChosenItemsBatched(t *testing.T) {
	d := NewOutputDiff("top_scores")
	d.Role, d.Batched = RoleChosen, true
	// two samples, three picks of one value each; sample 1's last pick
	// differs, sample 0's come in another order
	ref := []float32{0.9, 0.5, 0.1, 0.8, 0.7, 0.6}
	y := []float32{0.5, 0.9, 0.1, 0.8, 0.7, 0.2}
	d.Observe(0, 0, []int64{2, 3, 1}, []int64{2, 3, 1}, y, ref)
	if d.Kept != 6 || d.Common != 5 || d.Samples != 2 {
		t.Errorf("kept %d, common %d, samples %d; want 6, 5, 2", d.Kept, d.Common, d.Samples)
	}
	// of rank 2, one row per sample: sample 0's row is the same, sample
	// 1's is not
	r := NewOutputDiff("prototype")
	r.Role, r.Batched = RoleChosen, true
	r.Observe(0, 0, []int64{2, 3}, []int64{2, 3}, []float32{1, 2, 3, 4, 5, 6}, []float32{1, 2, 3, 4, 5, 9})
	if r.Kept != 2 || r.Common != 1 {
		t.Errorf("rank 2: kept %d, common %d; want 2, 1 (a row per sample)", r.Kept, r.Common)
	}
}
