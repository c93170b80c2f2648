package observe

import "math"

// OutputDiff compares one graph output of an emulated pass with the same
// output of the fp32 pass, over every batch: what a user's loss or
// prediction sees. Per-value Diffs say where values drift; this says
// whether the outputs are still right. Sums are float64 and errors are
// measured over the elements finite in both passes.
type OutputDiff struct {
	// Name is the graph output.
	Name string
	// Count is the number of elements compared; NonFinite counts those
	// NaN/Inf in this pass, RefNonFinite those NaN/Inf in fp32, and
	// BothFinite those finite in both, which the errors cover.
	Count, NonFinite, RefNonFinite, BothFinite int64
	// MaxAbsErr is the largest |y − y32|; RefMaxAbs the largest |y32|.
	MaxAbsErr, RefMaxAbs float64
	// SumSqDiff and SumSqRef give the relative L2 error ‖y − y32‖/‖y32‖.
	SumSqDiff, SumSqRef float64
	// Samples counts the samples compared (slices along the first axis;
	// an output of rank 0 is one sample per batch); Worst is the one with
	// the largest relative L2 error, which is what a tolerance judges: a
	// batch average hides one corrupted sample among healthy ones.
	Samples int64
	Worst   SampleErr
	// Rows counts the rows of class scores (every index of the axes before
	// the last) of an output of rank >= 2 with more than one class on its
	// last axis; Top1 counts the rows whose largest score is at the same
	// class as in fp32.
	Rows, Top1 int64
}

// SampleErr is the relative L2 error of one sample: its batch (in the
// order the batches ran), its index along the first axis, and the error
// (−1 before any sample was compared).
type SampleErr struct {
	Batch  int
	Index  int64
	RelErr float64
}

// NewOutputDiff returns an empty comparison of output name.
func NewOutputDiff(name string) *OutputDiff {
	return &OutputDiff{Name: name, Worst: SampleErr{RelErr: -1}}
}

// Observe folds one batch, or one part of a batch: y is the emulated
// output, ref the fp32 one, shape y's shape, batch the batch's number and
// first the index of the part's first sample within the batch. A length
// mismatch (a shape that depends on values) compares the common prefix.
func (d *OutputDiff) Observe(batch int, first int64, shape []int64, y, ref []float32) {
	n := min(len(y), len(ref))
	y, ref = y[:n], ref[:n]
	samples, per := int64(1), int64(n)
	if len(shape) > 0 && shape[0] > 0 {
		samples, per = shape[0], int64(n)/shape[0]
	}
	if per == 0 {
		return
	}
	for s := range samples {
		lo, hi := s*per, (s+1)*per
		if hi > int64(n) {
			break
		}
		e := d.sample(y[lo:hi], ref[lo:hi])
		d.Samples++
		if !math.IsNaN(e) && e > d.Worst.RelErr {
			d.Worst = SampleErr{Batch: batch, Index: first + s, RelErr: e}
		}
	}
	if classes := classAxis(shape); classes > 1 {
		for lo := 0; lo+classes <= n; lo += classes {
			d.Rows++
			if argmax(y[lo:lo+classes]) == argmax(ref[lo:lo+classes]) {
				d.Top1++
			}
		}
	}
}

// sample folds the elements of one sample and returns its relative L2
// error: NaN when no element is finite in both passes, +Inf when fp32's
// are all zero and this pass's are not.
func (d *OutputDiff) sample(y, ref []float32) float64 {
	var sd, sr float64
	both := 0
	for i, v := range y {
		r := ref[i]
		d.Count++
		vf, rf := finite32(v), finite32(r)
		if !vf {
			d.NonFinite++
		}
		if !rf {
			d.RefNonFinite++
		}
		if !vf || !rf {
			continue
		}
		both++
		e := float64(v) - float64(r)
		sd += e * e
		sr += float64(r) * float64(r)
		d.MaxAbsErr = max(d.MaxAbsErr, math.Abs(e))
		d.RefMaxAbs = max(d.RefMaxAbs, math.Abs(float64(r)))
	}
	d.SumSqDiff += sd
	d.SumSqRef += sr
	d.BothFinite += int64(both)
	return relL2(sd, sr, both > 0)
}

func finite32(x float32) bool { return math.Float32bits(x)&0x7f800000 != 0x7f800000 }

// relL2 is sqrt(sd/sr) with the conventions of Diff.RelErr.
func relL2(sd, sr float64, some bool) float64 {
	switch {
	case !some:
		return math.NaN()
	case sr == 0 && sd == 0:
		return 0
	case sr == 0:
		return math.Inf(1)
	}
	return math.Sqrt(sd / sr)
}

// classAxis is the length of the class axis of an output of this shape
// (its last axis, for rank >= 2), 0 when it has none.
func classAxis(shape []int64) int {
	if len(shape) < 2 {
		return 0
	}
	return int(shape[len(shape)-1])
}

// argmax is the index of the largest element, the first of equal ones;
// NaN never wins, so a row of NaN has argmax 0.
func argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] || (math.IsNaN(float64(x[best])) && !math.IsNaN(float64(v))) {
			best = i
		}
	}
	return best
}

// RelErr is ‖y − y32‖/‖y32‖ over every sample's elements finite in both
// passes; NaN when there are none.
func (d *OutputDiff) RelErr() float64 {
	return relL2(d.SumSqDiff, d.SumSqRef, d.BothFinite > 0)
}

// MaxRelErr is the largest absolute error relative to the output's
// largest fp32 magnitude, max|y − y32| / max|y32|: an element-wise ratio
// would be dominated by elements near zero. +Inf when fp32's output is all
// zero and this pass's is not.
func (d *OutputDiff) MaxRelErr() float64 {
	switch {
	case d.RefMaxAbs == 0 && d.MaxAbsErr == 0:
		return 0
	case d.RefMaxAbs == 0:
		return math.Inf(1)
	}
	return d.MaxAbsErr / d.RefMaxAbs
}

// Top1Agreement is the fraction of class-score rows whose top class agrees
// with fp32's; ok is false for an output that has no class axis.
func (d *OutputDiff) Top1Agreement() (frac float64, ok bool) {
	if d.Rows == 0 {
		return 0, false
	}
	return float64(d.Top1) / float64(d.Rows), true
}
