// The statistics kernels of package statsop, in C so that ONNX Runtime can
// run them inside a session (see ops.c). They reproduce fp16audit's Go
// kernels (audit/stats.go kernel, audit/compare.go Diff.Observe) bit for
// bit: the same 8-element blocks, the same order of every floating-point
// addition, no fused multiply-adds.
//
// A kernel runs incrementally over one chunk (see fa_chunk_len): blocks in
// ranges (fa_blocks, fa_blocks_diff), then the last n%8 elements and the
// result (fa_finish, fa_diff_finish). Running the ranges of several values
// in turn, tile by tile, reads a reference value once while the passes
// compared with it are summarised.
#ifndef FP16AUDIT_ORTSTATS_KERNEL_H
#define FP16AUDIT_ORTSTATS_KERNEL_H

#include <stdint.h>

// fa_stats mirrors audit.Stats for one tensor of one batch. maxabs and
// minnz hold float32 bit patterns; argmax is -1 when no value is finite.
typedef struct {
	int64_t count;
	uint32_t maxabs;
	int64_t argmax;
	uint32_t minnz;
	double sum, sumsq;
	int64_t finite, nan, posinf, neginf, zeros, above, subnormal, flush;
} fa_stats;

// fa_diff mirrors audit.Diff.
typedef struct {
	double sumsqdiff, sumsqref;
	int64_t newnf, nzref, flushed, bothfin;
} fa_diff;

// fa_state is a statistics kernel in progress: the largest finite abs bit
// pattern mx and its index arg (-1 before any), the smallest nonzero one
// minus one mn, the non-finite counts, the float64 sums and the counts of
// abs patterns == 0, <= 2^-25, < 2^-14 and <= 65504 (cnt).
typedef struct {
	uint32_t mx, mn;
	int64_t arg;
	int64_t nan, pos_inf, neg_inf;
	double sum, sumsq;
	int64_t cnt[4];
} fa_state;

// fa_dstate is a comparison in progress: Diff.Observe's four float64 lanes
// of squared differences and references, and its counts.
typedef struct {
	double sd[4], sr[4];
	int64_t newnf, nz, fl, bf;
} fa_dstate;

void fa_state_init(fa_state *s);
void fa_dstate_init(fa_dstate *d);

// fa_blocks runs the 8-element blocks of x[lo:hi] (hi-lo a multiple of 8;
// x is the start of the chunk, so indices are relative to it).
void fa_blocks(fa_state *s, const float *x, int64_t lo, int64_t hi);

// fa_blocks_diff is fa_blocks on y and the comparison of y with ref over
// the same blocks, in one read of y.
void fa_blocks_diff(fa_state *s, fa_dstate *d, const float *y, const float *ref, int64_t lo, int64_t hi);

// fa_finish runs the elements x[i:n] left after the last block (as the Go
// kernel's tail loop) and writes the statistics of x[0:n].
void fa_finish(fa_state *s, const float *x, int64_t i, int64_t n, fa_stats *st);

// fa_diff_finish runs what Diff.Observe does after the blocks end at i:
// one more 4-element step if 4 elements remain, then single elements into
// lane 0; it writes the difference of y[0:n] and ref[0:n].
void fa_diff_finish(fa_dstate *d, const float *y, const float *ref, int64_t i, int64_t n, fa_diff *out);

// fa_kernel is audit's kernel: the statistics of x[0:n] alone.
void fa_kernel(const float *x, int64_t n, fa_stats *st);

// fa_diff_observe is Diff.Observe(y[0:n], ref[0:n]) on a zero Diff.
void fa_diff_observe(const float *y, const float *ref, int64_t n, fa_diff *d);

// fa_stats_init sets st to audit.NewStats(); fa_stats_merge is
// Stats.Merge for two parts of the same batch; fa_diff_add is Diff.add.
void fa_stats_init(fa_stats *st);
void fa_stats_merge(fa_stats *st, const fa_stats *o);
void fa_diff_add(fa_diff *d, const fa_diff *o);

// fa_set_simd turns the AVX2 kernels on (where the CPU has them) or off
// and returns whether they were on; they are on by default.
int fa_set_simd(int on);

// fa_chunk_len is the chunk length of audit's passRun.observe: a value of
// n elements is cut into k = max(1, ceil(n/len)) chunks [c*n/k, (c+1)*n/k),
// observed independently and merged in index order. The operator takes
// another length as its "chunk" attribute.
enum { fa_chunk_len = 1 << 20 };

#endif
