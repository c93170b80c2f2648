// Rounding to fp16 or bf16 and back to float32 in one step (round.c), the
// kernel of the Round operator (ops.c).
#ifndef FP16AUDIT_ORTSTATS_ROUND_H
#define FP16AUDIT_ORTSTATS_ROUND_H

#include <stdint.h>

// The formats, by their ONNX element types.
enum { FA_ROUND_FP16 = 10, FA_ROUND_BF16 = 16 };

// fa_round writes src[0:n] rounded to format to (FA_ROUND_FP16 or
// FA_ROUND_BF16) into dst[0:n], as float32: bit for bit what ONNX
// Runtime's Cast to that type and back to FLOAT returns.
void fa_round(float *dst, const float *src, int64_t n, int to);

// fa_round_simd turns the vector loops on (where the CPU has AVX2 and
// F16C) or off and returns whether they were on.
int fa_round_simd(int on);

#endif
