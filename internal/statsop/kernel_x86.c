// AVX2 versions of the block loops. They compute what the portable loops
// compute, bit for bit: the class counts by vector compares, each fast
// 8-element block's float64 tree ((d0+d1)+(d2+d3))+((d4+d5)+(d6+d7)) with
// the same pairings, and the comparison's four float64 lanes as four
// vector lanes. Blocks that move an extremum or hold NaN/Inf take the same
// element-by-element path.
#include "kernel_impl.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

int fa_have_avx2(void) { return __builtin_cpu_supports("avx2"); }

#define AVX2 __attribute__((target("avx2")))

// lanes counts per 32-bit lane; a range call adds at most one per block to
// a lane, and callers keep ranges under 2^31 blocks.
typedef struct {
	__m256i c[4];
} lanes;

AVX2 static inline int64_t lane_sum(__m256i v) {
	uint32_t l[8];
	_mm256_storeu_si256((__m256i *)l, v);
	int64_t s = 0;
	for (int i = 0; i < 8; i++) {
		s += l[i];
	}
	return s;
}

// count8 counts eight abs patterns (all below 2^31, so signed compares
// order them as unsigned ones would); a true compare is -1, subtracted.
AVX2 static inline void count8(lanes *k, __m256i a) {
	k->c[0] = _mm256_sub_epi32(k->c[0], _mm256_cmpeq_epi32(a, _mm256_setzero_si256()));
	k->c[1] = _mm256_sub_epi32(k->c[1], _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(FP16_FLUSH + 1u)), a));
	k->c[2] = _mm256_sub_epi32(k->c[2], _mm256_cmpgt_epi32(_mm256_set1_epi32((int)FP16_MIN_NORM), a));
	k->c[3] = _mm256_sub_epi32(k->c[3], _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(FP16_MAX_BITS + 1u)), a));
}

// tree8 adds the block's float64 tree to the sums: hadd pairs (d0+d1),
// (d4+d5) | (d2+d3), (d6+d7); adding the halves pairs those; the last add
// joins the two quarters. Every add and product rounds as in Go.
AVX2 static inline void tree8(fa_state *s, __m256 f) {
	__m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(f));
	__m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
	__m256d h = _mm256_hadd_pd(lo, hi);
	__m128d q = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
	__m256d hs = _mm256_hadd_pd(_mm256_mul_pd(lo, lo), _mm256_mul_pd(hi, hi));
	__m128d qs = _mm_add_pd(_mm256_castpd256_pd128(hs), _mm256_extractf128_pd(hs, 1));
	s->sum += _mm_cvtsd_f64(q) + _mm_cvtsd_f64(_mm_unpackhi_pd(q, q));
	s->sumsq += _mm_cvtsd_f64(qs) + _mm_cvtsd_f64(_mm_unpackhi_pd(qs, qs));
}

// block tracks what decides the fast path: mx and mn+1 broadcast.
typedef struct {
	__m256i mx, mn1;
	lanes k;
} blockstate;

AVX2 static inline void bs_load(blockstate *b, const fa_state *s) {
	b->mx = _mm256_set1_epi32((int)s->mx);
	b->mn1 = _mm256_set1_epi32((int)(s->mn + 1u));
	for (int i = 0; i < 4; i++) {
		b->k.c[i] = _mm256_setzero_si256();
	}
}

AVX2 static inline void bs_store(const blockstate *b, fa_state *s) {
	for (int i = 0; i < 4; i++) {
		s->cnt[i] += lane_sum(b->k.c[i]);
	}
}

// stats8 handles x[i:i+8] given its abs patterns a: counted, then the
// tree of a block with every a <= mx and no a-1 below mn (a != 0 and
// a <= mn), or the elements one by one.
AVX2 static inline void stats8(fa_state *s, blockstate *b, const float *x, int64_t i, __m256 f, __m256i a) {
	count8(&b->k, a);
	__m256i up = _mm256_cmpgt_epi32(a, b->mx);
	__m256i down = _mm256_andnot_si256(_mm256_cmpeq_epi32(a, _mm256_setzero_si256()), _mm256_cmpgt_epi32(b->mn1, a));
	if (_mm256_movemask_epi8(_mm256_or_si256(up, down)) != 0) {
		for (int k = 0; k < 8; k++) {
			slow_step(s, x[i + k], i + k);
		}
		b->mx = _mm256_set1_epi32((int)s->mx);
		b->mn1 = _mm256_set1_epi32((int)(s->mn + 1u));
		return;
	}
	tree8(s, f);
}

// The block loops work on a local copy of the state, so that the compiler
// keeps the running sums in registers instead of storing and reloading
// them through s on every block (the order of the additions is the same).
AVX2 void fa_blocks_avx2(fa_state *out, const float *x, int64_t lo, int64_t hi) {
	fa_state st = *out, *s = &st;
	blockstate b;
	bs_load(&b, s);
	const __m256i abs_mask = _mm256_set1_epi32((int)ABS_MASK);
	for (int64_t i = lo; i < hi; i += 8) {
		__m256 f = _mm256_loadu_ps(x + i);
		stats8(s, &b, x, i, f, _mm256_and_si256(_mm256_castps_si256(f), abs_mask));
	}
	bs_store(&b, s);
	*out = st;
}

// dvec is the comparison in vector lanes: the float64 lanes of fa_dstate
// and its counts per 32-bit lane.
typedef struct {
	__m256d sd, sr;
	__m256i newnf, nz, fl, bf;
} dvec;

// sq_add adds the squared differences and references of four elements to
// the lanes; masked-out elements are +0 on both sides.
AVX2 static inline void sq_add(dvec *d, __m128 v, __m128 r) {
	__m256d rv = _mm256_cvtps_pd(r), vv = _mm256_cvtps_pd(v);
	__m256d e = _mm256_sub_pd(vv, rv);
	d->sd = _mm256_add_pd(d->sd, _mm256_mul_pd(e, e));
	d->sr = _mm256_add_pd(d->sr, _mm256_mul_pd(rv, rv));
}

// diff8 is diff_step on eight elements, the first four then the last four
// into lanes 0-3: finite is a < Inf, nonzero is a != 0, and the pairs not
// finite in both enter the sums as zeros.
AVX2 static inline void diff8(dvec *d, __m256 v, __m256 r, __m256i vb) {
	const __m256i inf = _mm256_set1_epi32((int)INF_BITS), zero = _mm256_setzero_si256();
	__m256i ri = _mm256_castps_si256(r);
	__m256i rb = _mm256_and_si256(ri, _mm256_set1_epi32((int)ABS_MASK));
	__m256i r_fin = _mm256_cmpgt_epi32(inf, rb), v_fin = _mm256_cmpgt_epi32(inf, vb);
	__m256i both = _mm256_and_si256(r_fin, v_fin);
	__m256i nz = _mm256_andnot_si256(_mm256_cmpeq_epi32(rb, zero), both);
	d->newnf = _mm256_sub_epi32(d->newnf, _mm256_andnot_si256(v_fin, r_fin));
	d->nz = _mm256_sub_epi32(d->nz, nz);
	d->bf = _mm256_sub_epi32(d->bf, both);
	d->fl = _mm256_sub_epi32(d->fl, _mm256_and_si256(nz, _mm256_cmpeq_epi32(vb, zero)));
	__m256 rm = _mm256_castsi256_ps(_mm256_and_si256(ri, both));
	__m256 vm = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(v), both));
	sq_add(d, _mm256_castps256_ps128(vm), _mm256_castps256_ps128(rm));
	sq_add(d, _mm256_extractf128_ps(vm, 1), _mm256_extractf128_ps(rm, 1));
}

AVX2 void fa_blocks_diff_avx2(fa_state *out, fa_dstate *d, const float *y, const float *ref, int64_t lo, int64_t hi) {
	fa_state st = *out, *s = &st;
	blockstate b;
	bs_load(&b, s);
	dvec dv = {_mm256_loadu_pd(d->sd), _mm256_loadu_pd(d->sr), _mm256_setzero_si256(), _mm256_setzero_si256(),
		_mm256_setzero_si256(), _mm256_setzero_si256()};
	const __m256i abs_mask = _mm256_set1_epi32((int)ABS_MASK);
	for (int64_t i = lo; i < hi; i += 8) {
		__m256 f = _mm256_loadu_ps(y + i);
		__m256i a = _mm256_and_si256(_mm256_castps_si256(f), abs_mask);
		diff8(&dv, f, _mm256_loadu_ps(ref + i), a);
		stats8(s, &b, y, i, f, a);
	}
	bs_store(&b, s);
	*out = st;
	_mm256_storeu_pd(d->sd, dv.sd);
	_mm256_storeu_pd(d->sr, dv.sr);
	d->newnf += lane_sum(dv.newnf);
	d->nz += lane_sum(dv.nz);
	d->fl += lane_sum(dv.fl);
	d->bf += lane_sum(dv.bf);
}

#else

int fa_have_avx2(void) { return 0; }

void fa_blocks_avx2(fa_state *s, const float *x, int64_t lo, int64_t hi) {
	(void)s;
	(void)x;
	(void)lo;
	(void)hi;
}

void fa_blocks_diff_avx2(fa_state *s, fa_dstate *d, const float *y, const float *ref, int64_t lo, int64_t hi) {
	(void)s;
	(void)d;
	(void)y;
	(void)ref;
	(void)lo;
	(void)hi;
}

#endif
