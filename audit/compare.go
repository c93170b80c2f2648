package audit

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
}

// Observe folds one batch: y is the emulated value, ref the fp32 one. The
// two have the same length; a mismatch (a shape that depends on values)
// compares the common prefix only.
func (d *Diff) Observe(y, ref []float32) {
	n := len(y)
	if len(ref) < n {
		n = len(ref)
	}
	y, ref = y[:n], ref[:n]
	var sd, sr float64
	var newNF, nz, fl int64
	for i, r := range ref {
		v := y[i]
		rb := math.Float32bits(r) & 0x7fffffff
		if rb >= 0x7f800000 {
			continue // not finite in fp32
		}
		vb := math.Float32bits(v) & 0x7fffffff
		if vb >= 0x7f800000 {
			newNF++
			continue
		}
		if rb != 0 {
			nz++
			if vb == 0 {
				fl++
			}
		}
		e := float64(v) - float64(r)
		sd += e * e
		sr += float64(r) * float64(r)
	}
	d.SumSqDiff += sd
	d.SumSqRef += sr
	d.NewNonFinite += newNF
	d.NonzeroRef += nz
	d.Flushed += fl
}

// RelErr is ‖y − y32‖/‖y32‖ over elements finite in both passes; 0 when the
// reference is all zero and the values agree.
func (d Diff) RelErr() float64 {
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
