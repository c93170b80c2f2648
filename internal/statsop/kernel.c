#include "kernel.h"

#include "kernel_impl.h"

void fa_stats_init(fa_stats *st) {
	memset(st, 0, sizeof *st);
	st->argmax = -1;
}

void fa_state_init(fa_state *s) {
	memset(s, 0, sizeof *s);
	s->arg = -1;
	s->mn = NO_MIN;
}

void fa_dstate_init(fa_dstate *d) { memset(d, 0, sizeof *d); }

// fa_simd is whether the AVX2 loops run: decided on first use (an
// unsynchronised first use at worst decides twice, the same way).
static int fa_simd = -1;

int fa_set_simd(int on) {
	int old = fa_simd < 0 ? fa_have_avx2() : fa_simd;
	fa_simd = on && fa_have_avx2();
	return old;
}

static inline int use_simd(void) {
	if (fa_simd < 0) {
		fa_simd = fa_have_avx2();
	}
	return fa_simd;
}

// block8 processes x[i:i+8] as the Go kernel's unrolled loop does: every
// element counted, then either the float64 tree of a block that moves no
// extremum and holds no NaN/Inf, or the elements one by one. The test for
// such a block is the Go kernel's: a > mx (NaN and Inf are above every
// finite mx) or uint32(a-1) < mn, from the top bits of wrapped uint64
// subtractions.
static inline void block8(fa_state *s, const float *x, int64_t i) {
	uint64_t mx64 = s->mx, mn64 = s->mn, out = 0;
	for (int k = 0; k < 8; k++) {
		uint32_t a = bits_of(x[i + k]) & ABS_MASK;
		count1(s->cnt, a);
		out |= (mx64 - (uint64_t)a) | ((uint64_t)(uint32_t)(a - 1u) - mn64);
	}
	if (out >> 63) {
		for (int k = 0; k < 8; k++) {
			slow_step(s, x[i + k], i + k);
		}
		return;
	}
	double d0 = x[i], d1 = x[i + 1], d2 = x[i + 2], d3 = x[i + 3];
	double d4 = x[i + 4], d5 = x[i + 5], d6 = x[i + 6], d7 = x[i + 7];
	s->sum += ((d0 + d1) + (d2 + d3)) + ((d4 + d5) + (d6 + d7));
	s->sumsq += ((d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3)) + ((d4 * d4 + d5 * d5) + (d6 * d6 + d7 * d7));
}

void fa_blocks(fa_state *s, const float *x, int64_t lo, int64_t hi) {
	if (use_simd()) {
		fa_blocks_avx2(s, x, lo, hi);
		return;
	}
	for (int64_t i = lo; i < hi; i += 8) {
		block8(s, x, i);
	}
}

void fa_blocks_diff(fa_state *s, fa_dstate *d, const float *y, const float *ref, int64_t lo, int64_t hi) {
	if (use_simd()) {
		fa_blocks_diff_avx2(s, d, y, ref, lo, hi);
		return;
	}
	for (int64_t i = lo; i < hi; i += 8) {
		block8(s, y, i);
		// Lane k takes elements k, k+4, k+8, ... in order.
		for (int k = 0; k < 8; k++) {
			diff_step(d, k & 3, y[i + k], ref[i + k]);
		}
	}
}

void fa_finish(fa_state *s, const float *x, int64_t i, int64_t n, fa_stats *st) {
	// The Go kernel's tail loop lowers the minimum before classifying;
	// NaN/Inf patterns minus one never go below it.
	for (; i < n; i++) {
		float f = x[i];
		uint32_t a = bits_of(f) & ABS_MASK;
		count1(s->cnt, a);
		if (a != 0 && a - 1u < s->mn) {
			s->mn = a - 1u;
		}
		if (a >= INF_BITS) {
			slow_step(s, f, i);
		} else {
			if (a > s->mx) {
				s->mx = a;
				s->arg = i;
			}
			double d = (double)f;
			s->sum += d;
			s->sumsq += d * d;
		}
	}
	int64_t finite = n - s->nan - s->pos_inf - s->neg_inf;
	fa_stats_init(st);
	st->count = n;
	st->sum = s->sum;
	st->sumsq = s->sumsq;
	st->finite = finite;
	st->nan = s->nan;
	st->posinf = s->pos_inf;
	st->neginf = s->neg_inf;
	st->zeros = s->cnt[0];
	st->above = finite - s->cnt[3];
	st->subnormal = s->cnt[2] - s->cnt[1];
	st->flush = s->cnt[1] - s->cnt[0];
	int64_t arg = s->arg;
	if (arg < 0 && finite > 0) {
		// Every finite value is zero: the maximum is the first of them.
		for (int64_t j = 0; j < n; j++) {
			if ((bits_of(x[j]) & ABS_MASK) < INF_BITS) {
				arg = j;
				break;
			}
		}
	}
	if (arg >= 0) {
		st->maxabs = s->mx;
		st->argmax = arg;
	}
	if (s->mn < NO_MIN) {
		st->minnz = s->mn + 1u;
	}
}

void fa_diff_finish(fa_dstate *d, const float *y, const float *ref, int64_t i, int64_t n, fa_diff *out) {
	if (i + 4 <= n) {
		for (int k = 0; k < 4; k++) {
			diff_step(d, k, y[i + k], ref[i + k]);
		}
		i += 4;
	}
	for (; i < n; i++) {
		diff_step(d, 0, y[i], ref[i]);
	}
	memset(out, 0, sizeof *out);
	out->sumsqdiff += (d->sd[0] + d->sd[1]) + (d->sd[2] + d->sd[3]);
	out->sumsqref += (d->sr[0] + d->sr[1]) + (d->sr[2] + d->sr[3]);
	out->newnf = d->newnf;
	out->nzref = d->nz;
	out->flushed = d->fl;
	out->bothfin = d->bf;
}

void fa_kernel(const float *x, int64_t n, fa_stats *st) {
	fa_state s;
	fa_state_init(&s);
	int64_t n8 = n - n % 8;
	fa_blocks(&s, x, 0, n8);
	fa_finish(&s, x, n8, n, st);
}

void fa_diff_observe(const float *y, const float *ref, int64_t n, fa_diff *d) {
	fa_dstate c;
	fa_dstate_init(&c);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		for (int k = 0; k < 8; k++) {
			diff_step(&c, k & 3, y[i + k], ref[i + k]);
		}
	}
	fa_diff_finish(&c, y, ref, i, n, d);
}

void fa_stats_merge(fa_stats *st, const fa_stats *o) {
	if (o->finite > 0) {
		// One batch: on equal maxima the lower index wins. Maxima are
		// finite and non-negative, so their bit patterns order as the
		// values do.
		if (st->finite == 0 || o->maxabs > st->maxabs || (o->maxabs == st->maxabs && o->argmax < st->argmax)) {
			st->maxabs = o->maxabs;
			st->argmax = o->argmax;
		}
	} else if (st->finite == 0) {
		st->maxabs = 0;
		st->argmax = -1;
	}
	if (o->minnz != 0 && (st->minnz == 0 || o->minnz < st->minnz)) {
		st->minnz = o->minnz;
	}
	st->count += o->count;
	st->sum += o->sum;
	st->sumsq += o->sumsq;
	st->finite += o->finite;
	st->nan += o->nan;
	st->posinf += o->posinf;
	st->neginf += o->neginf;
	st->zeros += o->zeros;
	st->above += o->above;
	st->subnormal += o->subnormal;
	st->flush += o->flush;
}

void fa_diff_add(fa_diff *d, const fa_diff *o) {
	d->sumsqdiff += o->sumsqdiff;
	d->sumsqref += o->sumsqref;
	d->newnf += o->newnf;
	d->nzref += o->nzref;
	d->flushed += o->flushed;
	d->bothfin += o->bothfin;
}
