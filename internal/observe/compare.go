package observe

import "math"

// Diff compares one value of an emulated pass with the same value of the
// fp32 reference pass, element by element, aggregated over batches.
type Diff struct {
	// SumSqDiff and SumSqRef give the relative error ‖y − y32‖/‖y32‖ over
	// the elements finite in both passes.
	SumSqDiff, SumSqRef float64
	// NewNonFinite counts elements finite in fp32 and NaN/Inf here.
	NewNonFinite int64
	// NonzeroRef counts finite nonzero fp32 elements; Flushed those of them
	// that are exactly zero here.
	NonzeroRef, Flushed int64
	// BothFinite counts the elements finite in both passes: the ones the
	// sums cover.
	BothFinite int64
}

// Observe folds one batch: y is the emulated value, ref the fp32 one. The
// two have the same length; a mismatch (a shape that depends on values)
// compares the common prefix only.
//
// The loop is branch free: whether an element is finite, zero or nonzero
// comes from the sign bit of a wrapped uint32 subtraction (for an abs bit
// pattern a < 2^31 and T <= 2^31, uint32(a-T) has its top bit set exactly
// when a < T), and elements that are not finite in both passes enter the
// sums as zeros through a bit mask. Relu outputs, half zeros at random,
// would otherwise mispredict a branch on every other element. Four
// independent accumulators keep the float64 adds from waiting on each
// other.
func (d *Diff) Observe(y, ref []float32) {
	n := min(len(y), len(ref))
	y, ref = y[:n], ref[:n]
	var sd, sr [4]float64
	var newNF, nz, fl, bf uint64
	i := 0
	for ; i+4 <= n; i += 4 {
		for k := range 4 {
			e, r, nf, z, f, b := diffElem(y[i+k], ref[i+k])
			sd[k] += e * e
			sr[k] += r * r
			newNF += nf
			nz += z
			fl += f
			bf += b
		}
	}
	for ; i < n; i++ {
		e, r, nf, z, f, b := diffElem(y[i], ref[i])
		sd[0] += e * e
		sr[0] += r * r
		newNF += nf
		nz += z
		fl += f
		bf += b
	}
	d.SumSqDiff += (sd[0] + sd[1]) + (sd[2] + sd[3])
	d.SumSqRef += (sr[0] + sr[1]) + (sr[2] + sr[3])
	d.NewNonFinite += int64(newNF)
	d.NonzeroRef += int64(nz)
	d.Flushed += int64(fl)
	d.BothFinite += int64(bf)
}

// diffElem classifies one element pair: the difference and reference as
// float64 (both 0 unless finite in both passes), whether it became
// non-finite, whether the reference is a finite nonzero, whether that
// nonzero was flushed to zero, and whether both are finite.
func diffElem(v, r float32) (e, ref float64, newNF, nonzero, flushed, bothFinite uint64) {
	rb := math.Float32bits(r) & 0x7fffffff
	vb := math.Float32bits(v) & 0x7fffffff
	rFin := (rb - 0x7f800000) >> 31
	vFin := (vb - 0x7f800000) >> 31
	both := rFin & vFin
	rNZ := (-rb) >> 31
	vZero := 1 ^ ((-vb) >> 31)
	m := -both // all ones when both are finite
	rv := float64(math.Float32frombits(math.Float32bits(r) & m))
	vv := float64(math.Float32frombits(math.Float32bits(v) & m))
	return vv - rv, rv, uint64(rFin &^ vFin), uint64(both & rNZ), uint64(both & rNZ & vZero), uint64(both)
}

// Merge folds the differences of another part of the same value.
func (d *Diff) Merge(o Diff) {
	d.SumSqDiff += o.SumSqDiff
	d.SumSqRef += o.SumSqRef
	d.NewNonFinite += o.NewNonFinite
	d.NonzeroRef += o.NonzeroRef
	d.Flushed += o.Flushed
	d.BothFinite += o.BothFinite
}

// RelErr is ‖y − y32‖/‖y32‖ over elements finite in both passes; 0 when the
// reference is all zero and the values agree, NaN when no element is finite
// in both passes.
func (d Diff) RelErr() float64 {
	if d.BothFinite == 0 {
		return math.NaN()
	}
	if d.SumSqRef == 0 {
		if d.SumSqDiff == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return math.Sqrt(d.SumSqDiff / d.SumSqRef)
}

// FlushedFraction is the fraction of nonzero fp32 elements that became zero.
func (d Diff) FlushedFraction() float64 {
	if d.NonzeroRef == 0 {
		return 0
	}
	return float64(d.Flushed) / float64(d.NonzeroRef)
}
