package statsop

import (
	"errors"
	"unsafe"

	"fp16audit/internal/onnx"
	"fp16audit/internal/ortcapi"
)

// SetSIMD exposes setSIMD to the external tests.
var SetSIMD = setSIMD

// The record slots the tests fill by hand.
const (
	SlotRank = slotRank
	SlotDims = slotDims
)

// mustRecords is observeRecords for the tests, which have the memory.
func mustRecords(chunk int, xs ...[]float32) []Record {
	recs, err := observeRecords(chunk, xs...)
	if err != nil {
		panic(err)
	}
	return recs
}

// ObserveRecord is the record Observe makes of x.
func ObserveRecord(x []float32) Record { return mustRecords(0, x)[0] }

// Observe computes the statistics of y (the flat values of one tensor of
// batch number batch) exactly as the Observe operator does with chunks of
// chunk elements (0: DefaultChunk).
func Observe(y []float32, batch, chunk int) Stats {
	return mustRecords(chunk, y)[0].Stats(batch)
}

// ObserveDiff computes the statistics of y and its comparison with ref
// exactly as the Observe operator does for an emulated value y and its
// reference ref.
func ObserveDiff(y, ref []float32, batch, chunk int) (Stats, Diff) {
	recs := mustRecords(chunk, ref, y)
	d, _ := recs[1].Diff()
	return recs[1].Stats(batch), d
}

// Round rounds src to the element type to (FLOAT16 or BFLOAT16) and back
// into dst exactly as the Round operator does.
func Round(dst, src []float32, to int32) {
	if len(dst) != len(src) {
		panic("statsop.Round: dst and src differ in length")
	}
	round(dst, src, to)
}

// SetRoundSIMD exposes setRoundSIMD to the external tests.
var SetRoundSIMD = setRoundSIMD

// FailAllocs makes the n-th allocation of the operators' C code from now
// fail (0: none).
var FailAllocs = failAllocs

// ObserveRecords is observeRecords, with its error.
var ObserveRecords = observeRecords

// FailRegisterOnce makes the next Register fail as creating the domain
// would, forgetting the domain registered so far; the call after it
// registers again (handing back the domain the process already had, so
// that ONNX Runtime sees one domain of the name). It returns the error
// the failing call must return.
func FailRegisterOnce() error {
	registered.mu.Lock()
	had := registered.d
	registered.d = nil
	registered.mu.Unlock()
	real := newDomain
	failure := errors.New("creating the domain failed")
	newDomain = func(rt *ortcapi.Runtime, name string, ops ...unsafe.Pointer) (*ortcapi.CustomOpDomain, error) {
		newDomain = func(rt *ortcapi.Runtime, name string, ops ...unsafe.Pointer) (*ortcapi.CustomOpDomain, error) {
			newDomain = real
			if had != nil {
				return had, nil
			}
			return real(rt, name, ops...)
		}
		return nil, failure
	}
	return failure
}

// Mass is what the Mass operator returns for x, computed on the calling
// goroutine.
var Mass = mass

// WeightValue exposes (*Weights).value to the external tests.
func WeightValue(w *Weights, t *onnx.TensorProto) (*ortcapi.Value, error) { return w.value(t) }
