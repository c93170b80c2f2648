package statsop

import "fmt"

// Splitting a batch. When one run of a batch needs more memory than the
// budget allows, the batch can run as sub-batches, consecutive samples
// along its batch axis, through the same session, and the records of the
// sub-batches merge into the batch's. Counts, maxima (with their location)
// and minima merge exactly: the result equals the unsplit batch's. The
// float64 sums (Sum, SumSq and the differences' sums) are added per
// sub-batch, which rounds otherwise than one pass over the whole value.
// Splitting is valid only for a model whose samples do not interact (no
// op reduces or normalises across the batch axis); the caller checks that
// before splitting.

// Located is a value's statistics in one batch, merged from its
// sub-batches.
type Located struct {
	Stats Stats
	Diff  *Diff
	// Shape is the value's shape for the whole batch.
	Shape []int64
	// Part is -1 when Stats.ArgMax is a flat index into the whole batch's
	// value, as the unsplit batch's records give it. Otherwise the maximum
	// lies in sub-batch Part (samples from PartStart on) at flat index
	// Stats.ArgMax of that sub-batch's value: the value's shape does not
	// tell where a sub-batch's elements lie in the whole batch's (a
	// PyTorch attention reshapes [B, L, E] to [L*B, E], samples inner),
	// and on equal maxima the earliest sub-batch wins.
	Part      int
	PartStart int64
}

// RecordSource is what Merger reads records from: a Session after a run.
type RecordSource interface {
	Record(i, row int) Record
}

// Merger folds the records of a batch's sub-batches. A value whose batch
// axis has one element per sample (a sub-batch occupies a known range of
// it) gets its maximum located in the whole batch; values whose shape does
// not depend on the batch are taken from the first sub-batch only.
type Merger struct {
	plan  *Plan
	batch int
	full  map[string][]int64
	total int64 // samples in the whole batch
	acc   [][]*Located
	parts int   // sub-batches merged so far
	seen  int64 // samples merged so far
}

// NewMerger starts merging batch number batch of total samples; full gives
// each observed value's shape for the whole batch (from shape inference).
func NewMerger(plan *Plan, batch int, total int64, full map[string][]int64) *Merger {
	m := &Merger{plan: plan, batch: batch, full: full, total: total, acc: make([][]*Located, len(plan.Outputs))}
	for i, o := range plan.Outputs {
		m.acc[i] = make([]*Located, len(o.Passes))
	}
	return m
}

// Add folds the records of a sub-batch of n samples that follows the ones
// added before.
func (m *Merger) Add(src RecordSource, n int64) error {
	if n <= 0 || m.seen+n > m.total {
		return fmt.Errorf("a sub-batch of %d samples after %d of %d", n, m.seen, m.total)
	}
	for i, o := range m.plan.Outputs {
		full, ok := m.full[o.Value]
		if !ok {
			return fmt.Errorf("value %q: no shape for the whole batch", o.Value)
		}
		for row := range o.Passes {
			r := src.Record(i, row)
			sub, ok := r.Shape()
			if !ok {
				return fmt.Errorf("value %q: rank above %d", o.Value, slotMaxdims)
			}
			axis, perSample, err := batchAxis(sub, full, n, m.total)
			if err != nil {
				return fmt.Errorf("value %q: %w", o.Value, err)
			}
			if axis < 0 && m.seen > 0 {
				continue // the same in every sub-batch
			}
			st := r.Stats(m.batch)
			part := m.parts
			if axis < 0 || n == m.total {
				part = -1
			} else if perSample == 1 && st.ArgMax >= 0 {
				st.ArgMax = relocate(st.ArgMax, sub, full, axis, m.seen)
				part = -1
			}
			d, hasDiff := r.Diff()
			acc := m.acc[i][row]
			if acc == nil {
				acc = &Located{Stats: Stats{ArgMaxBatch: -1, ArgMax: -1}, Shape: full, Part: -1}
				if hasDiff {
					acc.Diff = &Diff{}
				}
				m.acc[i][row] = acc
			}
			acc.merge(st, part, m.seen)
			if hasDiff {
				acc.Diff.Merge(d)
			}
		}
	}
	m.parts++
	m.seen += n
	return nil
}

// Result returns the merged statistics of output i, record row, once every
// sample has been added.
func (m *Merger) Result(i, row int) (*Located, error) {
	if m.seen != m.total {
		return nil, fmt.Errorf("merged %d of %d samples", m.seen, m.total)
	}
	return m.acc[i][row], nil
}

// merge is Stats.Merge with the maximum's sub-batch: a located maximum
// (part -1) and one in a sub-batch compare by value, then by sub-batch
// (located ones are in the whole batch, that is before any).
func (l *Located) merge(o Stats, part int, start int64) {
	take := o.Finite > 0 && (l.Stats.Finite == 0 || o.MaxAbs > l.Stats.MaxAbs ||
		o.MaxAbs == l.Stats.MaxAbs && part == l.Part && o.ArgMax < l.Stats.ArgMax)
	mx, argBatch, arg := l.Stats.MaxAbs, l.Stats.ArgMaxBatch, l.Stats.ArgMax
	l.Stats.Merge(o)
	if !take {
		// Stats.Merge compares indices, which here may lie in
		// different sub-batches.
		l.Stats.MaxAbs, l.Stats.ArgMaxBatch, l.Stats.ArgMax = mx, argBatch, arg
		return
	}
	l.Stats.MaxAbs, l.Stats.ArgMaxBatch, l.Stats.ArgMax = o.MaxAbs, o.ArgMaxBatch, o.ArgMax
	l.Part, l.PartStart = part, start
	if part < 0 {
		l.PartStart = 0
	}
}

// batchAxis finds the axis of a value along which a sub-batch of n of
// total samples spans sub[axis] = full[axis]*n/total elements, every
// other axis equal, and the elements per sample along it; axis -1 when the
// value does not depend on the batch.
func batchAxis(sub, full []int64, n, total int64) (axis int, perSample int64, err error) {
	if len(sub) != len(full) {
		return 0, 0, fmt.Errorf("rank %d in the sub-batch, %d for the whole batch", len(sub), len(full))
	}
	axis = -1
	for a := range sub {
		if sub[a] == full[a] {
			continue
		}
		if axis >= 0 || full[a]%total != 0 || sub[a] != full[a]/total*n {
			return 0, 0, fmt.Errorf("shape %v in a sub-batch of %d is not a slice of %v along one axis", sub, n, full)
		}
		axis, perSample = a, full[a]/total
	}
	// Equal shapes in a sub-batch smaller than the batch: a value whose
	// shape does not depend on the batch (a value that depended on it
	// would have an axis in proportion). Its contents must not either,
	// which the caller's check that samples do not interact covers.
	if axis < 0 && n == total {
		for a := range full {
			if full[a] == total {
				return a, 1, nil
			}
		}
	}
	return axis, perSample, nil
}

// relocate maps a flat index in a sub-batch's value of shape sub to the
// flat index in the whole batch's value of shape full, the sub-batch
// starting at offset along axis.
func relocate(flat int64, sub, full []int64, axis int, offset int64) int64 {
	idx := make([]int64, len(sub))
	for a := len(sub) - 1; a >= 0; a-- {
		idx[a] = flat % sub[a]
		flat /= sub[a]
	}
	idx[axis] += offset
	var out int64
	for a := range full {
		out = out*full[a] + idx[a]
	}
	return out
}
