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
	// last axis, when Classes says its last axis holds classes; Top1
	// counts the rows whose largest score is at the same class as in fp32.
	Rows, Top1 int64
	// Role says how the comparison is judged: a graph output, a value a
	// selection ranks (judged like an output), or a graph output a
	// selection chose (information only).
	Role Role
	// Classes says that the last axis holds class scores (top-1 counted).
	Classes bool
	// Batched says that the first axis is the batch's: a chosen output of
	// rank 3 or more then has its items along its second axis, sample by
	// sample (the k picked vectors of a batched top-k), else along its
	// first.
	Batched bool
	// Kept counts, for a chosen output, the items (slices along its first
	// axis per batch, or along its second per sample when it is batched)
	// fp32 kept, and Common those of them this pass kept too: the same box
	// (IoU >= 0.5, for boxes [K,4]), or the same row within 5 % (relative
	// L2).
	Kept, Common int64
}

// Role is how an output comparison is judged.
type Role uint8

const (
	// RoleOutput is a graph output: judged against the tolerance.
	RoleOutput Role = iota
	// RoleRanked is a value a data-dependent selection ranks or gathers
	// from (NonMaxSuppression's scores, TopK's input), compared as if it
	// were an output: judged.
	RoleRanked
	// RoleChosen is a graph output a selection chose (the boxes NMS
	// kept): a tiny change of a ranked score picks another candidate, so
	// element-wise errors mean nothing; only the items in common are
	// counted.
	RoleChosen
)

// String names the role as the report writes it.
func (r Role) String() string {
	switch r {
	case RoleRanked:
		return "ranked"
	case RoleChosen:
		return "chosen"
	}
	return "output"
}

// SampleErr is the relative L2 error of one sample: its batch (in the
// order the batches ran), its index along the first axis, and the error
// (−1 before any sample was compared).
type SampleErr struct {
	Batch  int
	Index  int64
	RelErr float64
}

// NewOutputDiff returns an empty comparison of graph output name, whose
// last axis counts as classes until the caller knows better.
func NewOutputDiff(name string) *OutputDiff {
	return &OutputDiff{Name: name, Worst: SampleErr{RelErr: -1}, Classes: true}
}

// Observe folds one batch, or one part of a batch: y is the emulated
// output, ref the fp32 one, shape and refShape their shapes, batch the
// batch's number and first the index of the part's first sample within
// the batch. A length mismatch (a shape that depends on values) compares
// the common prefix; a chosen output counts its items in common instead.
func (d *OutputDiff) Observe(batch int, first int64, shape, refShape []int64, y, ref []float32) {
	if d.Role == RoleChosen {
		d.observeChosen(shape, refShape, y, ref)
		return
	}
	n := min(len(y), len(ref))
	y, ref = y[:n], ref[:n]
	samples, per := int64(1), int64(n)
	// A ranked value's first axis counts candidates (anchors, items), not
	// samples: it is judged whole, batch by batch.
	if len(shape) > 0 && shape[0] > 0 && d.Role != RoleRanked {
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
	if classes := classAxis(shape); classes > 1 && d.Classes {
		for lo := 0; lo+classes <= n; lo += classes {
			d.Rows++
			if argmax(y[lo:lo+classes]) == argmax(ref[lo:lo+classes]) {
				d.Top1++
			}
		}
	}
}

// maxItems bounds the items of a chosen output that are matched (the
// matching is quadratic); more are counted as kept but not matched.
const maxItems = 4096

// observeChosen counts a chosen output's items: those fp32 kept, and
// those of them this pass kept too, each matched at most once; sample by
// sample when the output is batched.
func (d *OutputDiff) observeChosen(shape, refShape []int64, y, ref []float32) {
	for _, v := range y {
		d.Count++
		if !finite32(v) {
			d.NonFinite++
		}
	}
	for _, v := range ref {
		if !finite32(v) {
			d.RefNonFinite++
		}
	}
	// A batched output of rank 3 or more holds several picks per sample
	// (top-k's vectors); of rank 2, one row per sample (the argmax class's
	// vector, or the k scores as one row).
	if d.Batched && len(shape) >= 3 && len(refShape) >= 3 && shape[0] == refShape[0] && shape[0] > 0 {
		n := int(shape[0])
		py, pr := len(y)/n, len(ref)/n
		for s := range n {
			d.Samples++
			d.matchItems(shape[1:], refShape[1:], y[s*py:(s+1)*py], ref[s*pr:(s+1)*pr])
		}
		return
	}
	d.Samples++
	d.matchItems(shape, refShape, y, ref)
}

// matchItems matches the items (slices along the first axis of shape and
// refShape) of one sample or one batch.
func (d *OutputDiff) matchItems(shape, refShape []int64, y, ref []float32) {
	rows := func(sh []int64, x []float32) (int, int) {
		if len(sh) == 0 || sh[0] <= 0 {
			return len(x), 1
		}
		return int(sh[0]), len(x) / int(sh[0])
	}
	nr, per := rows(refShape, ref)
	ny, perY := rows(shape, y)
	d.Kept += int64(nr)
	if per == 0 || per != perY || nr > maxItems || ny > maxItems {
		return
	}
	boxes := len(refShape) == 2 && per == 4
	used := make([]bool, ny)
	for i := range nr {
		r := ref[i*per : (i+1)*per]
		for j := range ny {
			if used[j] {
				continue
			}
			c := y[j*per : (j+1)*per]
			if (boxes && iou(r, c) >= 0.5) || (!boxes && relL2Of(c, r) <= 0.05) {
				used[j] = true
				d.Common++
				break
			}
		}
	}
}

// iou is the intersection over union of two boxes (x1, y1, x2, y2).
func iou(a, b []float32) float64 {
	w := min(a[2], b[2]) - max(a[0], b[0])
	h := min(a[3], b[3]) - max(a[1], b[1])
	if w <= 0 || h <= 0 {
		return 0
	}
	inter := float64(w) * float64(h)
	area := func(x []float32) float64 { return float64(x[2]-x[0]) * float64(x[3]-x[1]) }
	return inter / (area(a) + area(b) - inter)
}

// relL2Of is ‖y − r‖/‖r‖ of one item (0 when both are zero).
func relL2Of(y, r []float32) float64 {
	var sd, sr float64
	for i, v := range y {
		e := float64(v) - float64(r[i])
		sd += e * e
		sr += float64(r[i]) * float64(r[i])
	}
	e := relL2(sd, sr, true)
	if math.IsNaN(e) {
		return math.Inf(1)
	}
	return e
}

// CommonItems is the fraction of the items fp32 kept that this pass kept
// too; ok is false for an output that is not chosen or kept nothing.
func (d *OutputDiff) CommonItems() (frac float64, ok bool) {
	if d.Role != RoleChosen || d.Kept == 0 {
		return 0, false
	}
	return float64(d.Common) / float64(d.Kept), true
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
