package lint

import (
	"encoding/binary"
	"math"
	"math/rand"
	"testing"
)

// TestScanFloat32MatchesAdd: the bit-pattern fast path counts every
// element as add does, for ordinary values and each kind of special one
// (zeros, flushed, subnormal in fp16, beyond fp16 and bf16, ±Inf, NaN), at
// every position relative to the eight-element groups, and across pieces.
func TestScanFloat32MatchesAdd(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	specials := []float32{0, float32(math.Copysign(0, -1)), 1e-8, -3e-8, 2e-7, 6e-5, -65504, 65519, 65520, -7e4, 3.3e38,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 0x1p-25, -0x1p-25, 3}
	for trial := 0; trial < 200; trial++ {
		n := rng.Intn(70)
		vals := make([]float32, n)
		for i := range vals {
			switch r := rng.Intn(4); {
			case r == 0 && len(specials) > 0:
				vals[i] = specials[rng.Intn(len(specials))]
			default:
				vals[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.Intn(9)-4)))
			}
		}
		data := make([]byte, 4*n)
		for i, v := range vals {
			binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
		}
		var want Stats
		for _, v := range vals {
			want.add(float64(v))
		}
		var got Stats
		cut := 4 * rng.Intn(n+1)
		scanFloat32(&got, data[:cut])
		scanFloat32(&got, data[cut:])
		if got != want && !(math.IsNaN(got.Extreme) && math.IsNaN(want.Extreme)) {
			t.Fatalf("trial %d (%v): got %+v, want %+v", trial, vals, got, want)
		}
	}
}
