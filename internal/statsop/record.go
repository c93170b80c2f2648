package statsop

import (
	"math"

	"fp16audit/internal/observe"
)

// Stats and Diff are the statistics and comparison package observe
// defines; the operator computes them bit for bit as observe's kernels do.
type (
	Stats = observe.Stats
	Diff  = observe.Diff
)

// Record is what a statistics op writes for one value of one batch:
// RecordLen int64 slots (see ops.h for the layout).
type Record []int64

// Stats returns the statistics in r, with the maximum located in batch
// number batch.
func (r Record) Stats(batch int) Stats {
	s := Stats{
		Count:         r[slotCount],
		MaxAbs:        math.Float32frombits(uint32(r[slotMaxabs])),
		ArgMaxBatch:   -1,
		ArgMax:        r[slotArgmax],
		MinNonzero:    math.Float32frombits(uint32(r[slotMinnz])),
		Sum:           math.Float64frombits(uint64(r[slotSum])),
		SumSq:         math.Float64frombits(uint64(r[slotSumsq])),
		Finite:        r[slotFinite],
		NaN:           r[slotNan],
		PosInf:        r[slotPosinf],
		NegInf:        r[slotNeginf],
		Zeros:         r[slotZeros],
		AboveFP16Max:  r[slotAbove],
		FP16Subnormal: r[slotSubnormal],
		FP16Flush:     r[slotFlush],
	}
	if s.ArgMax >= 0 {
		s.ArgMaxBatch = batch
	}
	return s
}

// Diff returns the comparison in r; ok is false for a record of the Stats
// op, which compares nothing.
func (r Record) Diff() (d Diff, ok bool) {
	if r[slotHasdiff] == 0 {
		return Diff{}, false
	}
	return Diff{
		SumSqDiff:    math.Float64frombits(uint64(r[slotSumsqdiff])),
		SumSqRef:     math.Float64frombits(uint64(r[slotSumsqref])),
		NewNonFinite: r[slotNewnf],
		NonzeroRef:   r[slotNzref],
		Flushed:      r[slotFlushed],
		BothFinite:   r[slotBothfin],
	}, true
}

// Seq returns the record's place among the process's op calls.
func (r Record) Seq() int64 { return r[slotSeq] }

// Shape returns the value's shape; ok is false when its rank exceeds what
// a record holds (then the caller knows it from shape inference).
func (r Record) Shape() (shape []int64, ok bool) {
	rank := int(r[slotRank])
	if rank > slotMaxdims {
		return nil, false
	}
	return append([]int64{}, r[slotDims:slotDims+rank]...), true
}
