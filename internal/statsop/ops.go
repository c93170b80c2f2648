// Package statsop computes fp16audit's per-value statistics inside ONNX
// Runtime, where the values are produced: a custom operator (Observe),
// registered through ONNX Runtime's C API, summarises every observed value
// while the session runs, and only a record of 32 numbers per value and
// pass leaves the session. The fp32 reference and the emulated passes run
// side by side in one graph that shares the weights (Combine), so that one
// Observe node reads a value of every pass together and compares the
// emulated ones with fp32 in the same read. A second operator, Round,
// takes the place of the emulation's rounding Cast pairs in the combined
// graph: the same values, bit for bit, in one read and one write.
//
// The statistics are bit-identical to fp16audit's Go kernels (audit.Stats,
// audit.Diff) chunked as audit's passes chunk a value (see kernel.h), with
// one difference in how a value's chunks enter audit.Diff: audit adds each
// chunk's difference to the running total over batches, the records hold
// each batch's chunks added from zero. Values of up to 2^20 elements have
// one chunk and agree either way; for larger ones audit should fold a
// batch's chunks first, as it already does for Stats.
package statsop

// #cgo CFLAGS: -O2 -std=c11 -Wall
// #include <stdlib.h>
// #include "ops.h"
// #include "round.h"
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"fp16audit/internal/ortcapi"
)

// Domain is the operator domain of Observe; a model that uses it imports
// the domain at version 1.
const Domain = "ai.fp16audit.stats"

// OpObserve is the operator's name in Domain: Observe(token, x0, ..., xm)
// writes m+1 records into the record sink its attribute AttrSink names,
// from record AttrSlot on — record 0 the statistics of x0, record i those
// of xi and its comparison with x0 — and returns the next token (see
// ops.h). Its int attribute AttrChunk sets the chunk length (default
// DefaultChunk).
const (
	OpObserve = C.FA_OP_OBSERVE
	AttrChunk = C.FA_ATTR_CHUNK
	AttrSink  = C.FA_ATTR_SINK
	AttrSlot  = C.FA_ATTR_SLOT
)

// OpRound is Round(x) -> y in Domain: the float tensor x rounded to the
// format of its int attribute AttrTo (FLOAT16 or BFLOAT16) and back to
// float32 in one pass, bit for bit what Cast(to=AttrTo) → Cast(to=FLOAT)
// returns in ONNX Runtime. Combine replaces the emulated passes' Cast
// pairs with it.
//
// Round(x, on) with on a float scalar reads it per run: 0 copies x
// unrounded, 2 rounds to the format of the optional int attribute AttrAlt
// (FLOAT16, BFLOAT16, or 0 for unrounded; AttrTo's when absent), anything
// else to AttrTo's.
const (
	OpRound = C.FA_OP_ROUND
	AttrTo  = C.FA_ATTR_TO
	AttrAlt = C.FA_ATTR_ALT
)

// OpMass is Mass(x) -> h in Domain: where the mass of the float tensor x
// lies by binary exponent, as MassLen float64s (see ops.h): element counts
// by float32 exponent field in h[0:256], their sums of squares from
// MassSumSq, max |x| over the finite elements at MassMax and the count of
// NaN and Inf at MassNonFinite. The backward audit reads one per gradient
// held in 16 bits (internal/grad's Mass interprets it). Mass(x, on) with
// on a float scalar 0 computes nothing and returns zeros (a run whose
// histograms nobody reads).
const (
	OpMass        = C.FA_OP_MASS
	MassLen       = C.FA_MASS_LEN
	MassSumSq     = C.FA_MASS_SUMSQ
	MassMax       = C.FA_MASS_MAX
	MassNonFinite = C.FA_MASS_NONFINITE
)

// mass computes, on the calling goroutine, what the Mass operator returns
// for x: the same numbers, bit for bit (the tests check the operator and
// the kernel through it).
func mass(x []float32) []float64 {
	h := make([]float64, MassLen)
	var p *C.float
	if len(x) > 0 {
		p = (*C.float)(unsafe.Pointer(&x[0]))
	}
	C.fa_mass(p, C.int64_t(len(x)), (*C.double)(unsafe.Pointer(&h[0])))
	return h
}

// RecordLen is the number of int64 slots of one record.
const RecordLen = C.FA_REC_LEN

// The record slots, named after ops.h.
const (
	slotCount     = C.FA_REC_COUNT
	slotMaxabs    = C.FA_REC_MAXABS
	slotArgmax    = C.FA_REC_ARGMAX
	slotMinnz     = C.FA_REC_MINNZ
	slotSum       = C.FA_REC_SUM
	slotSumsq     = C.FA_REC_SUMSQ
	slotFinite    = C.FA_REC_FINITE
	slotNan       = C.FA_REC_NAN
	slotPosinf    = C.FA_REC_POSINF
	slotNeginf    = C.FA_REC_NEGINF
	slotZeros     = C.FA_REC_ZEROS
	slotAbove     = C.FA_REC_ABOVE
	slotSubnormal = C.FA_REC_SUBNORMAL
	slotFlush     = C.FA_REC_FLUSH
	slotHasdiff   = C.FA_REC_HASDIFF
	slotSumsqdiff = C.FA_REC_SUMSQDIFF
	slotSumsqref  = C.FA_REC_SUMSQREF
	slotNewnf     = C.FA_REC_NEWNF
	slotNzref     = C.FA_REC_NZREF
	slotFlushed   = C.FA_REC_FLUSHED
	slotBothfin   = C.FA_REC_BOTHFIN
	slotSeq       = C.FA_REC_SEQ
	slotRank      = C.FA_REC_RANK
	slotDims      = C.FA_REC_DIMS
	slotMaxdims   = C.FA_REC_MAXDIMS
)

var registered struct {
	mu sync.Mutex
	d  *ortcapi.CustomOpDomain
}

// newDomain creates the domain; the tests replace it to make it fail.
var newDomain = (*ortcapi.Runtime).NewCustomOpDomain

// Register creates the custom operator domain of Observe, Round and Mass,
// once per process; pass it in ortcapi.Options.Domains of every session whose
// model uses it. A failure is not kept: the next call tries again.
func Register(rt *ortcapi.Runtime) (*ortcapi.CustomOpDomain, error) {
	registered.mu.Lock()
	defer registered.mu.Unlock()
	if registered.d != nil {
		return registered.d, nil
	}
	var ops [3]unsafe.Pointer
	C.fa_ops_init(rt.API(), (*unsafe.Pointer)(unsafe.Pointer(&ops[0])))
	d, err := newDomain(rt, Domain, ops[:]...)
	if err != nil {
		return nil, err
	}
	registered.d = d
	return d, nil
}

// DefaultChunk is the chunk length audit's passes cut values into today
// (passRun.observe); see Options.Chunk.
const DefaultChunk = C.fa_chunk_len

// observeRecords computes, on the calling goroutine, the records the
// Observe operator makes of the values xs (xs[0] the reference) with chunks
// of chunk elements (0: DefaultChunk): the tests compare the operator's
// kernels with package observe's through it.
func observeRecords(chunk int, xs ...[]float32) ([]Record, error) {
	if chunk <= 0 {
		chunk = DefaultChunk
	}
	m := len(xs)
	if m == 0 {
		return nil, nil
	}
	// The array of data pointers is Go memory handed to C: every pointer
	// in it must be pinned for the call.
	var pin runtime.Pinner
	defer pin.Unpin()
	var empty [1]float32
	ptrs := make([]*C.float, m)
	n := make([]C.int64_t, m)
	for i, x := range xs {
		p := &empty[0]
		if len(x) > 0 {
			p = &x[0]
		}
		pin.Pin(p)
		ptrs[i] = (*C.float)(unsafe.Pointer(p))
		n[i] = C.int64_t(len(x))
	}
	rec := make([]int64, m*RecordLen)
	if C.fa_observe(C.int(m), &ptrs[0], &n[0], C.int64_t(chunk), (*C.int64_t)(unsafe.Pointer(&rec[0]))) != 0 {
		return nil, fmt.Errorf("statistics of %d values: out of memory", m)
	}
	out := make([]Record, m)
	for i := range out {
		out[i] = Record(rec[i*RecordLen : (i+1)*RecordLen])
	}
	return out, nil
}

// failAllocs makes the n-th allocation of the operators' C code from now
// fail (0: none), so that the tests reach the out-of-memory paths.
func failAllocs(n int) { C.fa_fail_allocs(C.int(n)) }

// setSIMD turns the AVX2 kernels on or off (tests compare both with Go)
// and returns whether they were on.
func setSIMD(on bool) bool {
	v := C.int(0)
	if on {
		v = 1
	}
	return C.fa_set_simd(v) != 0
}

// round rounds src to the element type to (FLOAT16 or BFLOAT16) and back
// into dst, on the calling goroutine, exactly as the Round operator does:
// the tests compare the operator's loops with ONNX Runtime's casts through
// it. It rounds as many elements as the shorter slice holds.
func round(dst, src []float32, to int32) {
	n := min(len(dst), len(src))
	if n == 0 {
		return
	}
	C.fa_round((*C.float)(unsafe.Pointer(&dst[0])), (*C.float)(unsafe.Pointer(&src[0])), C.int64_t(n), C.int(to))
}

// setRoundSIMD turns the vector rounding loops on or off and returns
// whether they were on.
func setRoundSIMD(on bool) bool {
	v := C.int(0)
	if on {
		v = 1
	}
	return C.fa_round_simd(v) != 0
}
