// The element steps shared by the portable kernels (kernel.c) and the
// AVX2 ones (kernel_x86.c), so that both sum in exactly the same order.
#ifndef FP16AUDIT_ORTSTATS_KERNEL_IMPL_H
#define FP16AUDIT_ORTSTATS_KERNEL_IMPL_H

#include <string.h>

#include "kernel.h"

// Sums must round after every operation, as Go's do on amd64: no fused
// multiply-add. GCC contracts nothing in ISO C mode (-std=c11, see ops.go)
// and the AVX2 code is compiled without the FMA extension; clang needs the
// pragma.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

// The binary32 bit patterns the classes are defined by; see audit/stats.go.
#define ABS_MASK 0x7fffffffu
#define INF_BITS 0x7f800000u
#define FP16_MAX_BITS 0x477fe000u
#define FP16_MIN_NORM 0x38800000u
#define FP16_FLUSH 0x33000000u
#define NO_MIN (INF_BITS - 1u)

static inline uint32_t bits_of(float f) {
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return u;
}

static inline float float_of(uint32_t u) {
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

// count1 counts one abs pattern into the four class counts.
static inline void count1(int64_t cnt[4], uint32_t a) {
	cnt[0] += a == 0;
	cnt[1] += a <= FP16_FLUSH;
	cnt[2] += a < FP16_MIN_NORM;
	cnt[3] += a <= FP16_MAX_BITS;
}

// slow_step is the element-by-element path of an 8-element block that may
// move an extremum or holds NaN/Inf; it does not count.
static inline void slow_step(fa_state *s, float f, int64_t index) {
	uint32_t a = bits_of(f) & ABS_MASK;
	if (a > INF_BITS) {
		s->nan++;
	} else if (a == INF_BITS) {
		if (f > 0) {
			s->pos_inf++;
		} else {
			s->neg_inf++;
		}
	} else {
		if (a > s->mx) {
			s->mx = a;
			s->arg = index;
		}
		uint32_t am1 = a - 1u;
		if (am1 < s->mn) {
			s->mn = am1;
		}
		double d = (double)f;
		s->sum += d;
		s->sumsq += d * d;
	}
}

// diff_step is audit's diffElem and the lane update of Diff.Observe:
// branch free, the pairs not finite in both masked out of the sums.
static inline void diff_step(fa_dstate *c, int lane, float v, float r) {
	uint32_t rb = bits_of(r) & ABS_MASK;
	uint32_t vb = bits_of(v) & ABS_MASK;
	uint32_t r_fin = (uint32_t)(rb - INF_BITS) >> 31;
	uint32_t v_fin = (uint32_t)(vb - INF_BITS) >> 31;
	uint32_t both = r_fin & v_fin;
	uint32_t r_nz = (uint32_t)(0u - rb) >> 31;
	uint32_t v_zero = 1u ^ ((uint32_t)(0u - vb) >> 31);
	uint32_t m = 0u - both;
	double rv = (double)float_of(bits_of(r) & m);
	double vv = (double)float_of(bits_of(v) & m);
	double e = vv - rv;
	c->newnf += r_fin & ~v_fin;
	c->nz += both & r_nz;
	c->fl += both & r_nz & v_zero;
	c->bf += both;
	c->sd[lane] += e * e;
	c->sr[lane] += rv * rv;
}

// The AVX2 block loops (kernel_x86.c); the portable ones dispatch to them
// when the CPU has AVX2.
int fa_have_avx2(void);
void fa_blocks_avx2(fa_state *s, const float *x, int64_t lo, int64_t hi);
void fa_blocks_diff_avx2(fa_state *s, fa_dstate *d, const float *y, const float *ref, int64_t lo, int64_t hi);

#endif
