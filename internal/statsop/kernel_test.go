package statsop_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"fp16audit/internal/observe"
	"fp16audit/internal/statsop"
)

// chunkLen is the chunk length audit's passRun.observe cuts values into;
// shortChunk is the shorter one this package proposes (see Combine).
const (
	chunkLen   = 1 << 20
	shortChunk = 1 << 16
)

// goReference computes what audit's passes compute for one value of one
// batch with the exported Go kernels: the value cut into k = ceil(n/chunk)
// chunks [c*n/k, (c+1)*n/k), each observed alone (its maximum located
// relative to the value) and merged in index order; each chunk compared
// with the reference's common prefix, the chunk differences added in index
// order into the batch's Diff.
func goReference(y, ref []float32, batch, chunk int) (observe.Stats, observe.Diff) {
	n := len(y)
	k := max(1, (n+chunk-1)/chunk)
	st := observe.NewStats()
	var d observe.Diff
	for c := range k {
		lo, hi := c*n/k, (c+1)*n/k
		p := observe.NewStats()
		p.Observe(y[lo:hi], batch)
		if p.ArgMax >= 0 {
			p.ArgMax += int64(lo)
		}
		st.Merge(p)
		if ref != nil {
			var pd observe.Diff
			l, h := min(lo, len(ref)), min(hi, len(ref))
			pd.Observe(y[l:h], ref[l:h])
			d.SumSqDiff += pd.SumSqDiff
			d.SumSqRef += pd.SumSqRef
			d.NewNonFinite += pd.NewNonFinite
			d.NonzeroRef += pd.NonzeroRef
			d.Flushed += pd.Flushed
			d.BothFinite += pd.BothFinite
		}
	}
	return st, d
}

// identical compares statistics bit for bit (NaN-free fields, but -0 and
// +0 differ).
func identical(a, b observe.Stats) bool {
	return a.Count == b.Count && math.Float32bits(a.MaxAbs) == math.Float32bits(b.MaxAbs) &&
		a.ArgMaxBatch == b.ArgMaxBatch && a.ArgMax == b.ArgMax &&
		math.Float32bits(a.MinNonzero) == math.Float32bits(b.MinNonzero) &&
		math.Float64bits(a.Sum) == math.Float64bits(b.Sum) && math.Float64bits(a.SumSq) == math.Float64bits(b.SumSq) &&
		a.Finite == b.Finite && a.NaN == b.NaN && a.PosInf == b.PosInf && a.NegInf == b.NegInf && a.Zeros == b.Zeros &&
		a.AboveFP16Max == b.AboveFP16Max && a.FP16Subnormal == b.FP16Subnormal && a.FP16Flush == b.FP16Flush
}

func identicalDiff(a, b observe.Diff) bool {
	return math.Float64bits(a.SumSqDiff) == math.Float64bits(b.SumSqDiff) &&
		math.Float64bits(a.SumSqRef) == math.Float64bits(b.SumSqRef) &&
		a.NewNonFinite == b.NewNonFinite && a.NonzeroRef == b.NonzeroRef && a.Flushed == b.Flushed &&
		a.BothFinite == b.BothFinite
}

// special are the values the statistics classify by, and their
// neighbours: zeros, fp32 subnormals, the fp16 flush, subnormal, normal and
// overflow thresholds, the largest float32, infinities and NaNs with
// several payloads and signs.
var special = func() []float32 {
	bits := []uint32{
		0, 1, 2, 0x007fffff, 0x00800000, // zero, fp32 subnormals, smallest normal
		0x32ffffff, 0x33000000, 0x33000001, // around 2^-25 (flush)
		0x337fffff, 0x33800000, // 2^-24, smallest fp16 subnormal
		0x387fffff, 0x38800000, 0x38800001, // around 2^-14 (fp16 normal)
		0x3f800000, 0x477fdfff, 0x477fe000, 0x477fe001, 0x477ff000, // 1, around 65504, 65520
		0x7f7fffff,             // largest float32
		0x7f800000,             // Inf
		0x7f800001, 0x7fc00000, // NaNs
		0x7fffffff,
	}
	var out []float32
	for _, b := range bits {
		out = append(out, math.Float32frombits(b), math.Float32frombits(b|0x80000000))
	}
	return out
}()

// gen fills n values of one of several kinds: mostly normal numbers with a
// sprinkling of special ones, Relu-like halves of zeros, all zeros, all
// non-finite, repeated maxima (ties) of both signs, and wide magnitudes.
func gen(r *rand.Rand, kind string, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch kind {
		case "normal":
			x[i] = float32(r.NormFloat64())
			if r.IntN(50) == 0 {
				x[i] = special[r.IntN(len(special))]
			}
		case "relu":
			if v := float32(r.NormFloat64()); v > 0 {
				x[i] = v
			}
		case "zeros":
			if r.IntN(3) == 0 {
				x[i] = float32(math.Copysign(0, -1))
			}
		case "nonfinite":
			x[i] = special[len(special)-8+r.IntN(8)]
		case "ties":
			x[i] = float32(r.IntN(5) - 2) // |x| = 2 repeats everywhere
		case "wide":
			x[i] = float32(math.Ldexp(r.Float64()-0.5, r.IntN(280)-150))
		case "special":
			x[i] = special[r.IntN(len(special))]
		}
	}
	return x
}

// perturb returns y as an emulated pass would see it: rounded to fewer
// mantissa bits, some elements flushed, some turned non-finite.
func perturb(r *rand.Rand, y []float32) []float32 {
	out := make([]float32, len(y))
	for i, v := range y {
		out[i] = math.Float32frombits(math.Float32bits(v) &^ 0x1fff)
		switch r.IntN(40) {
		case 0:
			out[i] = 0
		case 1:
			out[i] = float32(math.Inf(1 - 2*r.IntN(2)))
		case 2:
			out[i] = float32(math.NaN())
		}
	}
	return out
}

var kinds = []string{"normal", "relu", "zeros", "nonfinite", "ties", "wide", "special"}

// sizes cover every tail length of the 8- and 4-element blocks, and values
// of one, two and three chunks whose chunks are not multiples of 8.
var sizes = []int{0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 31, 100, 1003,
	chunkLen - 1, chunkLen, chunkLen + 1, 2*chunkLen + 13, 3*chunkLen - 5}

// TestKernelEqualsGo: the C kernels, chunked as the ops chunk, against the
// Go kernels chunked as audit's passes chunk, bit for bit, with and without
// the comparison, fused and not.
func TestKernelEqualsGo(t *testing.T) {
	for _, simd := range []bool{true, false} {
		for _, chunk := range []int{chunkLen, shortChunk} {
			t.Run(fmt.Sprintf("simd=%v/chunk=%d", simd, chunk), func(t *testing.T) {
				defer statsop.SetSIMD(statsop.SetSIMD(simd))
				kernelEqualsGo(t, chunk)
			})
		}
	}
}

func kernelEqualsGo(t *testing.T, chunk int) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, kind := range kinds {
		for _, n := range sizes {
			if n > 4*chunkLen && testing.Short() {
				continue
			}
			y := gen(r, kind, n)
			ref := perturb(r, y)
			name := fmt.Sprintf("%s/%d", kind, n)
			batch := r.IntN(4)

			want, _ := goReference(y, nil, batch, chunk)
			if got := observe.Stats(statsop.Observe(y, batch, chunk)); !identical(got, want) {
				t.Errorf("%s: Observe\n got %+v\nwant %+v", name, got, want)
			}
			// y is the emulated value and ref the fp32 one here, as in a
			// pass; also the reverse, so both sides see non-finite values;
			// and y against an unrelated value of wide range, whose
			// differences need all 53 bits (their squares round).
			other := gen(r, "normal", n)
			for _, pair := range [][2][]float32{{ref, y}, {y, ref}, {y, other}} {
				want, wantD := goReference(pair[0], pair[1], batch, chunk)
				got, gotD := statsop.ObserveDiff(pair[0], pair[1], batch, chunk)
				if !identical(observe.Stats(got), want) {
					t.Errorf("%s: ObserveDiff stats\n got %+v\nwant %+v", name, got, want)
				}
				if !identicalDiff(observe.Diff(gotD), wantD) {
					t.Errorf("%s: ObserveDiff diff\n got %+v\nwant %+v", name, gotD, wantD)
				}
			}
		}
	}
}

// TestKernelShorterReference: a reference shorter than the value (a shape
// that depends on values) is compared over the common prefix only.
func TestKernelShorterReference(t *testing.T) {
	for _, simd := range []bool{true, false} {
		t.Run(fmt.Sprintf("simd=%v", simd), func(t *testing.T) {
			defer statsop.SetSIMD(statsop.SetSIMD(simd))
			shorterReference(t)
		})
	}
}

func shorterReference(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{10, 1000, chunkLen + 100} {
		y := gen(r, "normal", n)
		for _, m := range []int{0, 3, n / 2, n - 1} {
			ref := perturb(r, y[:m])
			want, wantD := goReference(y, ref, 0, chunkLen)
			got, gotD := statsop.ObserveDiff(y, ref, 0, 0)
			if !identical(observe.Stats(got), want) || !identicalDiff(observe.Diff(gotD), wantD) {
				t.Errorf("n=%d ref=%d:\n got %+v %+v\nwant %+v %+v", n, m, got, gotD, want, wantD)
			}
		}
	}
}

// FuzzKernel compares the kernels on arbitrary bit patterns, in chunks
// of 8 so that short inputs have several.
func FuzzKernel(f *testing.F) {
	f.Add([]byte{0, 0, 0x80, 0x7f, 1, 0, 0, 0}, uint8(3))
	f.Add([]byte{0xff, 0xdf, 0x7f, 0x47, 0, 0xe0, 0x7f, 0x47, 0, 0xe0, 0x7f, 0xc7}, uint8(0))
	f.Fuzz(func(t *testing.T, raw []byte, shift uint8) {
		y := make([]float32, len(raw)/4)
		for i := range y {
			y[i] = math.Float32frombits(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		}
		ref := make([]float32, len(y))
		for i := range y {
			ref[(i+int(shift))%len(y)] = y[i]
		}
		want, wantD := goReference(y, ref, 1, 8)
		got, gotD := statsop.ObserveDiff(y, ref, 1, 8)
		if !identical(observe.Stats(got), want) || !identicalDiff(observe.Diff(gotD), wantD) {
			t.Fatalf("got %+v %+v\nwant %+v %+v", got, gotD, want, wantD)
		}
	})
}

// BenchmarkKernel measures, in GB/s of one value's elements, the
// statistics of one value (stats) and the work a value does in an audit
// with one emulated pass (pair: the statistics of the fp32 value and of the
// emulated one, and their comparison), Go against C (portable and AVX2): a
// 1 MiB value (in the core's L2) and a 256 MiB one (from memory).
func BenchmarkKernel(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{1 << 18, 1 << 26} {
		// A healthy pair: the emulated value is the fp32 one with fp16's
		// 10 mantissa bits.
		ref := gen(r, "relu", n)
		emu := make([]float32, n)
		for i, v := range ref {
			emu[i] = math.Float32frombits(math.Float32bits(v) &^ 0x1fff)
		}
		for _, impl := range []string{"go", "c", "simd"} {
			b.Run(fmt.Sprintf("%dMiB/%s/stats", 4*n>>20, impl), func(b *testing.B) {
				defer statsop.SetSIMD(statsop.SetSIMD(impl == "simd"))
				b.SetBytes(int64(4 * n))
				for range b.N {
					if impl == "go" {
						goReference(ref, nil, 0, chunkLen)
					} else {
						statsop.Observe(ref, 0, 0)
					}
				}
			})
			b.Run(fmt.Sprintf("%dMiB/%s/pair", 4*n>>20, impl), func(b *testing.B) {
				defer statsop.SetSIMD(statsop.SetSIMD(impl == "simd"))
				b.SetBytes(int64(4 * n))
				for range b.N {
					if impl == "go" {
						goReference(ref, nil, 0, chunkLen)
						goReference(emu, ref, 0, chunkLen)
					} else {
						statsop.ObserveDiff(emu, ref, 0, 0)
					}
				}
			})
		}
	}
}
