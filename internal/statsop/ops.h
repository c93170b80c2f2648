// The custom operator of package statsop: ONNX Runtime calls it on every
// observed value while the session runs, and it writes one record of
// FA_REC_LEN int64 slots per input that the Go side decodes (record.go).
#ifndef FP16AUDIT_ORTSTATS_OPS_H
#define FP16AUDIT_ORTSTATS_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "../ortcapi/abi.h"
#include "kernel.h"

// FA_OP_OBSERVE is the operator's name in the domain statsop registers.
// Observe(token, x0, x1, ..., xm) -> token writes m+1 records into the
// record sink its attribute "sink" names, from record "slot" on: record 0
// holds the statistics of x0, record i those of xi and its comparison with
// x0 (the same value in the reference pass). The inputs are read in tiles,
// one after the other, so x0 is read from memory once for all of them. The
// token (a float tensor whose contents do not matter) chains the Observe
// nodes of a graph one after the other: ONNX Runtime then runs them in
// that order, computing each value just before it is summarised, and the
// graph has one output instead of one per value (ONNX Runtime's session
// creation grows with the square of a graph's leaves). The int attribute
// "chunk" (default fa_chunk_len) sets the chunk length.
#define FA_OP_OBSERVE "Observe"
#define FA_ATTR_CHUNK "chunk"
#define FA_ATTR_SINK "sink"
#define FA_ATTR_SLOT "slot"

// Record slots. Floating-point slots hold the bits of a float64 (sums) or
// of a float32 (MAXABS, MINNZ); HASDIFF is 1 when the diff slots are set;
// SEQ numbers the op calls of the process in the order they started.
enum {
	FA_REC_COUNT,
	FA_REC_MAXABS,
	FA_REC_ARGMAX,
	FA_REC_MINNZ,
	FA_REC_SUM,
	FA_REC_SUMSQ,
	FA_REC_FINITE,
	FA_REC_NAN,
	FA_REC_POSINF,
	FA_REC_NEGINF,
	FA_REC_ZEROS,
	FA_REC_ABOVE,
	FA_REC_SUBNORMAL,
	FA_REC_FLUSH,
	FA_REC_HASDIFF,
	FA_REC_SUMSQDIFF,
	FA_REC_SUMSQREF,
	FA_REC_NEWNF,
	FA_REC_NZREF,
	FA_REC_FLUSHED,
	FA_REC_BOTHFIN,
	FA_REC_SEQ,
	FA_REC_RANK,
	FA_REC_DIMS,
	FA_REC_LEN = 32,
	FA_REC_MAXDIMS = FA_REC_LEN - FA_REC_DIMS,
};

// fa_sink_new registers rec, a buffer of nrec records, as a record sink and
// returns its id (>= 1), or 0 when every sink is taken; fa_sink_free
// forgets it. A graph's Observe nodes write into the sink their "sink"
// attribute names while a session runs; the caller keeps rec alive until
// it frees the sink.
int64_t fa_sink_new(int64_t *rec, int64_t nrec);
void fa_sink_free(int64_t id);

// FA_OP_ROUND is Round(x [, on]) -> y: the float tensor x rounded to the
// format its int attribute "to" names (FLOAT16 = 10 or BFLOAT16 = 16) and
// back to float32, bit for bit what Cast(to) followed by Cast(to=FLOAT)
// returns (see round.h), in one pass over the data. Combine puts it in
// place of the emulated passes' Cast pairs. With the optional float input
// on, a run whose on holds 0 copies x unrounded: one backward graph then
// serves both the fp32 run and the emulated ones; a run whose on holds 2
// rounds to the format of the optional attribute "alt" (0: unrounded).
#define FA_OP_ROUND "Round"
#define FA_ATTR_TO "to"
// FA_ATTR_ALT is Round's optional int attribute: the format (FLOAT16,
// BFLOAT16, or 0 for none) used when the input "on" is 2, so that one
// session runs a second policy's rounding of the same points.
#define FA_ATTR_ALT "alt"

// FA_OP_MASS is Mass(x) -> h: where the mass of the float tensor x lies,
// by binary exponent, as FA_MASS_LEN doubles: h[e] counts the elements
// whose float32 exponent field is e (0: zeros and float32 subnormals,
// 1..254: |x| in [2^(e-127), 2^(e-126))), h[FA_MASS_SUMSQ + e] sums their
// squares, h[FA_MASS_MAX] is max |x| over the finite elements and
// h[FA_MASS_NONFINITE] counts the NaN and Inf elements (exponent field
// 255, in neither table). From it the share of x's L2 norm that rounding
// to a narrower format loses at any scale follows without another read
// (internal/grad's Mass). An optional second input "on" (a float scalar)
// of 0 switches it off: h is all zeros and x is not read.
#define FA_OP_MASS "Mass"
enum {
	FA_MASS_BUCKETS = 256,
	FA_MASS_SUMSQ = FA_MASS_BUCKETS,
	FA_MASS_MAX = 2 * FA_MASS_BUCKETS,
	FA_MASS_NONFINITE,
	FA_MASS_LEN,
};

// fa_mass writes the FA_MASS_LEN numbers of Mass(x[0:n]) into h, on the
// calling thread, chunked as the operator chunks them (so the sums agree
// bit for bit).
void fa_mass(const float *x, int64_t n, double *h);

// fa_ops_init stores the function table the kernels call and writes the
// three operators, Observe, Round and Mass, as OrtCustomOp pointers into
// ops[0:3].
void fa_ops_init(const void *api, const void **ops);

// fa_fail_allocs makes the n-th allocation of the operators from now fail
// (returning NULL), for the tests of the out-of-memory paths; 0 makes none
// fail. fa_calloc is calloc with those failures, for the Go side's record
// buffers.
void fa_fail_allocs(int n);
void *fa_calloc(size_t n, size_t size);

// fa_observe writes the records of the m values x[i][0:n[i]] (x[0] the
// reference) on the calling thread, chunked (chunk elements; see
// fa_chunk_len) and tiled exactly as the operator does; it returns -1 when
// out of memory.
int fa_observe(int m, const float *const *x, const int64_t *n, int64_t chunk, int64_t *rec);

#endif
