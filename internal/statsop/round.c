// The rounding of the emulated passes: a value rounded to fp16 or bf16 and
// read back as float32, what the pair Cast(to=FLOAT16 or BFLOAT16) →
// Cast(to=FLOAT) computes in ONNX Runtime, in one read and one write.
#include "round.h"

#include "kernel_impl.h"

// round_fp16 is IEEE binary16 rounding, to nearest with ties to even,
// computed on the binary32 bit pattern: above the largest value that
// rounds to 65504 is infinity, binary16's subnormals are multiples of
// 2^-24, and a NaN stays a NaN, quieted, with the top ten bits of its
// payload (as the x86 conversion instruction keeps them).
static inline uint32_t round_fp16(uint32_t u) {
	uint32_t sign = u & 0x80000000u, a = u & 0x7fffffffu;
	if (a > 0x7f800000u) {
		return sign | 0x7fc00000u | (a & 0x007fe000u);
	}
	if (a >= 0x477ff000u) { // 65520: the tie above 65504 rounds to even, up
		return sign | 0x7f800000u;
	}
	if (a >= 0x38800000u) { // 2^-14, binary16's smallest normal
		return sign | ((a + 0x0fffu + ((a >> 13) & 1u)) & ~0x1fffu);
	}
	if (a <= 0x33000000u) { // 2^-25: the tie with zero rounds to zero
		return sign;
	}
	// A binary16 subnormal: m * 2^(e-150) in units of 2^-24.
	uint32_t e = a >> 23, m = (a & 0x007fffffu) | 0x00800000u;
	uint32_t shift = 126u - e; // 14..24
	uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
	if (rem > half || (rem == half && (q & 1u))) {
		q++;
	}
	return sign | bits_of((float)q * 0x1p-24f);
}

// round_bf16 is bfloat16 rounding, to nearest with ties to even (the carry
// out of the mantissa reaches infinity at the top); a NaN becomes the quiet
// NaN 0x7fc1 ONNX Runtime makes.
static inline uint32_t round_bf16(uint32_t u) {
	if ((u & 0x7fffffffu) > 0x7f800000u) {
		return 0x7fc10000u;
	}
	return (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
}

static void round_portable(float *dst, const float *src, int64_t n, int to) {
	if (to == FA_ROUND_FP16) {
		for (int64_t i = 0; i < n; i++) {
			dst[i] = float_of(round_fp16(bits_of(src[i])));
		}
		return;
	}
	for (int64_t i = 0; i < n; i++) {
		dst[i] = float_of(round_bf16(bits_of(src[i])));
	}
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

static int have_f16c(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"); }

// The vector loops: F16C's conversions with the rounding given in the
// instruction (to nearest even, not MXCSR's), and bf16 in integer lanes.
__attribute__((target("avx2,f16c"))) static int64_t round_fp16_f16c(float *dst, const float *src, int64_t n) {
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
		_mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
	}
	return i;
}

__attribute__((target("avx2"))) static int64_t round_bf16_avx2(float *dst, const float *src, int64_t n) {
	const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
	const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
	const __m256i keep = _mm256_set1_epi32((int)0xffff0000u), qnan = _mm256_set1_epi32(0x7fc10000);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256i u = _mm256_loadu_si256((const __m256i *)(src + i));
		__m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
		__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
		__m256i r = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(bias, lsb)), keep);
		_mm256_storeu_si256((__m256i *)(dst + i), _mm256_blendv_epi8(r, qnan, nan));
	}
	return i;
}

static int simd = -1;

void fa_round(float *dst, const float *src, int64_t n, int to) {
	if (simd < 0) {
		simd = have_f16c();
	}
	int64_t i = 0;
	if (simd) {
		i = to == FA_ROUND_FP16 ? round_fp16_f16c(dst, src, n) : round_bf16_avx2(dst, src, n);
	}
	round_portable(dst + i, src + i, n - i, to);
}

int fa_round_simd(int on) {
	int old = simd < 0 ? have_f16c() : simd;
	simd = on && have_f16c();
	return old;
}

#else

void fa_round(float *dst, const float *src, int64_t n, int to) { round_portable(dst, src, n, to); }

int fa_round_simd(int on) {
	(void)on;
	return 0;
}

#endif
