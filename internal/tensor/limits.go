package tensor

// Limits of the 16-bit float formats under IEEE round to nearest even, the
// conversion PyTorch and ONNX Runtime use. The mixed-precision checks all
// measure values against these.
const (
	// FP16Max is the largest finite IEEE binary16 value.
	FP16Max = 65504
	// FP16Overflow is where a float32 value starts rounding to ±Inf in
	// fp16: halfway between 65504 and the next power of two.
	FP16Overflow = 65520
	// FP16MinNormal is the smallest normal fp16 value, 2^-14.
	FP16MinNormal = 0x1p-14
	// FP16MinSubnormal is the smallest positive fp16 value, 2^-24.
	FP16MinSubnormal = 0x1p-24
	// FP16Flush is the largest magnitude that rounds to zero in fp16,
	// 2^-25 (halfway to the smallest subnormal, ties to even).
	FP16Flush = 0x1p-25
	// BF16Max is the largest finite bfloat16 value, about 3.39e38.
	BF16Max = 0x1.FEp127
	// BF16Overflow is where a float32 value starts rounding to ±Inf in
	// bf16, just below float32's own maximum: torch.finfo(torch.float32).min
	// is -Inf in bf16 too.
	BF16Overflow = 0x1.FFp127
)
