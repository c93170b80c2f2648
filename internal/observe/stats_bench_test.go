package observe

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
)

// benchLen is the benchmark tensor size: 16M float32 values, 64 MiB, well
// beyond the caches, like a large activation.
const benchLen = 16 << 20

// benchData returns the benchmark inputs, built once per process:
//
//	normal: N(0, 3) activations, all in the fp16 normal range but a few;
//	relu:   half exact zeros, the rest |N(0, 3)| (post-ReLU activations);
//	mixed:  normal with 1% NaN, ±Inf, fp16 subnormals and flushes, and
//	        values above 65504, scattered at random;
//	nan:    all NaN (downstream of an overflow), the kernel's slow path;
//	ramp:   ascending, a new maximum in every block, the other slow path.
var benchData = sync.OnceValue(func() map[string][]float32 {
	r := rand.New(rand.NewPCG(1, 2))
	normal := make([]float32, benchLen)
	relu := make([]float32, benchLen)
	mixed := make([]float32, benchLen)
	nan := make([]float32, benchLen)
	ramp := make([]float32, benchLen)
	specials := []float32{
		float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)),
		1e-6, -3e-5, 1e-9, 7e4, -1e5,
	}
	for i := range normal {
		v := float32(r.NormFloat64() * 3)
		normal[i] = v
		if r.IntN(2) == 0 {
			relu[i] = float32(math.Abs(float64(v)))
		}
		mixed[i] = v
		nan[i] = float32(math.NaN())
		ramp[i] = float32(i)
		if r.IntN(100) == 0 {
			mixed[i] = specials[r.IntN(len(specials))]
		}
	}
	return map[string][]float32{"normal": normal, "relu": relu, "mixed": mixed, "nan": nan, "ramp": ramp}
})

func reportGBs(b *testing.B, n int) {
	b.SetBytes(int64(4 * n))
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(4*n)*float64(b.N)/s/1e9, "GB/s")
	}
}

// BenchmarkStatsObserve measures the single-goroutine kernel.
func BenchmarkStatsObserve(b *testing.B) {
	for _, name := range []string{"normal", "relu", "mixed", "nan", "ramp"} {
		b.Run(name, func(b *testing.B) {
			x := benchData()[name]
			b.ResetTimer()
			for b.Loop() {
				s := NewStats()
				s.Observe(x, 0)
			}
			reportGBs(b, len(x))
		})
	}
}
