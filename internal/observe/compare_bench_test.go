package observe

import (
	"math"
	"testing"
)

// BenchmarkDiff measures the comparison kernel on a Relu-like value (half
// zeros) against a copy with fp16's 10 mantissa bits.
func BenchmarkDiff(b *testing.B) {
	const n = 1 << 22
	y, ref := make([]float32, n), make([]float32, n)
	x := uint32(1)
	for i := range ref {
		x = x*1664525 + 1013904223
		v := float32(int32(x)) / (1 << 31)
		if v < 0 {
			v = 0
		}
		ref[i] = v
		y[i] = math.Float32frombits(math.Float32bits(v) &^ 0x1fff)
	}
	b.SetBytes(8 * n)
	b.ResetTimer()
	for range b.N {
		var d Diff
		d.Observe(y, ref)
	}
}
