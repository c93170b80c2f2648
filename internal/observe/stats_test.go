package observe

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
)

// naiveStats is the reference: one element at a time, classified with
// float64 comparisons rather than bit patterns, summed in order.
func naiveStats(x []float32, batch int) Stats {
	const (
		minNormal = 1.0 / (1 << 14) // 2^-14
		flush     = 1.0 / (1 << 25) // 2^-25
	)
	s := NewStats()
	for i, f := range x {
		s.Count++
		v := float64(f)
		switch {
		case math.IsNaN(v):
			s.NaN++
			continue
		case math.IsInf(v, 1):
			s.PosInf++
			continue
		case math.IsInf(v, -1):
			s.NegInf++
			continue
		}
		s.Finite++
		s.Sum += v
		s.SumSq += v * v
		a := math.Abs(v)
		if s.ArgMax < 0 || a > float64(s.MaxAbs) {
			s.MaxAbs, s.ArgMaxBatch, s.ArgMax = float32(a), batch, int64(i)
		}
		switch {
		case a == 0:
			s.Zeros++
		case a <= flush:
			s.FP16Flush++
		case a < minNormal:
			s.FP16Subnormal++
		case a > 65504:
			s.AboveFP16Max++
		}
		if a != 0 && (s.MinNonzero == 0 || a < float64(s.MinNonzero)) {
			s.MinNonzero = float32(a)
		}
	}
	return s
}

// sumAbs is the scale Sum and SumSq are compared at: summation order
// differs between kernel and reference, and Sum may cancel to near zero.
func sumAbs(x []float32) (sum, sumSq float64) {
	for _, f := range x {
		v := math.Abs(float64(f))
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			sum += v
			sumSq += v * v
		}
	}
	return sum, sumSq
}

// checkStats compares every field of got and want: exactly, except Sum and
// SumSq, which must agree to 1e-9 relative to the sum of |x| (of x²).
func checkStats(t *testing.T, got, want Stats, x []float32) {
	t.Helper()
	absSum, absSumSq := sumAbs(x)
	if math.Abs(got.Sum-want.Sum) > 1e-9*absSum {
		t.Errorf("Sum = %v, want %v", got.Sum, want.Sum)
	}
	if math.Abs(got.SumSq-want.SumSq) > 1e-9*absSumSq {
		t.Errorf("SumSq = %v, want %v", got.SumSq, want.SumSq)
	}
	got.Sum, got.SumSq, want.Sum, want.SumSq = 0, 0, 0, 0
	if math.Float32bits(got.MaxAbs) != math.Float32bits(want.MaxAbs) ||
		math.Float32bits(got.MinNonzero) != math.Float32bits(want.MinNonzero) || got != want {
		t.Errorf("stats differ:\n got %+v\nwant %+v", got, want)
	}
}

var (
	f32Inf  = float32(math.Inf(1))
	f32NaN  = float32(math.NaN())
	pow2m14 = float32(1.0 / (1 << 14))
	pow2m25 = float32(1.0 / (1 << 25))
	pow2m24 = float32(1.0 / (1 << 24))
)

// specialValues are the values on and next to every class boundary.
var specialValues = []float32{
	0, float32(math.Copysign(0, -1)),
	f32NaN, -f32NaN, math.Float32frombits(0x7f800001), math.Float32frombits(0xffc12345),
	f32Inf, -f32Inf, math.MaxFloat32, -math.MaxFloat32,
	65504, -65504, 65504.0001, math.Nextafter32(65504, 0), math.Nextafter32(65504, 1e9),
	65519.99, 65520, -65520, 65536, 1e9, -1e30,
	pow2m14, -pow2m14, math.Nextafter32(pow2m14, 0), math.Nextafter32(pow2m14, 1),
	pow2m25, -pow2m25, math.Nextafter32(pow2m25, 0), math.Nextafter32(pow2m25, 1),
	pow2m24, 3e-8, 1e-7, 1e-5, 5e-5,
	math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, // fp32 subnormals
	math.Float32frombits(0x007fffff), 1.1754944e-38, // largest fp32 subnormal, smallest normal
	1, -1, 0.5, 3.14159,
}

// genData returns n seeded values of the named kind.
func genData(kind string, n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, uint64(n)))
	x := make([]float32, n)
	for i := range x {
		switch kind {
		case "mixed": // every class, boundaries included
			switch r.IntN(6) {
			case 0:
				x[i] = specialValues[r.IntN(len(specialValues))]
			case 1: // any bit pattern: all exponents, NaN payloads
				x[i] = math.Float32frombits(r.Uint32())
			case 2: // fp16 subnormal and flush range
				x[i] = float32(r.NormFloat64() * 1e-6)
			case 3: // around the fp16 maximum
				x[i] = float32(r.NormFloat64() * 6e4)
			default:
				x[i] = float32(r.NormFloat64())
			}
		case "normal":
			x[i] = float32(r.NormFloat64() * 10)
		case "relu":
			if v := r.NormFloat64(); v > 0 {
				x[i] = float32(v)
			}
		case "zeros":
			if r.IntN(2) == 0 {
				x[i] = float32(math.Copysign(0, -1))
			}
		case "nonfinite":
			x[i] = []float32{f32NaN, f32Inf, -f32Inf}[r.IntN(3)]
		case "zeros+nan": // finite values exist but are all zero
			x[i] = []float32{0, f32NaN, -f32Inf}[r.IntN(3)]
		case "rare-nonfinite": // mostly finite blocks, some with NaN/Inf
			x[i] = float32(r.NormFloat64() * 100)
			if r.IntN(50) == 0 {
				x[i] = []float32{f32NaN, f32Inf, -f32Inf, 1e6}[r.IntN(4)]
			}
		case "ties": // the maximum repeated, with both signs
			x[i] = []float32{0, 1, -7, 7, 3, f32NaN}[r.IntN(6)]
		case "ascending": // a new maximum at every element
			x[i] = float32(i) * 0.5
		case "descending":
			x[i] = float32(n - i)
		default:
			panic(kind)
		}
	}
	return x
}

var (
	testKinds   = []string{"mixed", "normal", "relu", "zeros", "nonfinite", "zeros+nan", "rare-nonfinite", "ties", "ascending", "descending"}
	testLengths = []int{0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 1000, 100003}
)

func TestObserveMatchesReference(t *testing.T) {
	for _, kind := range testKinds {
		for _, n := range testLengths {
			for seed := range uint64(3) {
				x := genData(kind, n, seed)
				t.Run(fmt.Sprintf("%s/n=%d/seed=%d", kind, n, seed), func(t *testing.T) {
					s := NewStats()
					s.Observe(x, 4)
					checkStats(t, s, naiveStats(x, 4), x)
				})
			}
		}
	}
}

// TestObserveEveryPosition puts each special value at every position of a
// block of finite values, so that each unrolled lane and the tail meet it.
func TestObserveEveryPosition(t *testing.T) {
	for _, n := range []int{8, 16, 19} {
		for _, v := range specialValues {
			for pos := range n {
				x := make([]float32, n)
				for i := range x {
					x[i] = float32(i%5) + 0.25
				}
				x[pos] = v
				s := NewStats()
				s.Observe(x, 0)
				want := naiveStats(x, 0)
				s.Sum, s.SumSq, want.Sum, want.SumSq = 0, 0, 0, 0
				if s != want {
					t.Fatalf("n=%d value %g (%#08x) at %d:\n got %+v\nwant %+v",
						n, v, math.Float32bits(v), pos, s, want)
				}
			}
		}
	}
}

// TestClassBoundaries states the class of each boundary value outright,
// independently of the reference implementation.
func TestClassBoundaries(t *testing.T) {
	const (
		zero = iota
		flush
		sub
		normal
		above
		nan
		posInf
		negInf
	)
	cases := []struct {
		x     float32
		class int
	}{
		{0, zero},
		{float32(math.Copysign(0, -1)), zero},
		{math.SmallestNonzeroFloat32, flush},
		{-math.SmallestNonzeroFloat32, flush},
		{1e-30, flush},
		{math.Nextafter32(pow2m25, 0), flush},
		{pow2m25, flush}, // ties to even: rounds to 0
		{-pow2m25, flush},
		{math.Nextafter32(pow2m25, 1), sub}, // rounds to 2^-24
		{pow2m24, sub},
		{1e-5, sub},
		{math.Nextafter32(pow2m14, 0), sub},
		{-math.Nextafter32(pow2m14, 0), sub},
		{pow2m14, normal},
		{math.Nextafter32(pow2m14, 1), normal},
		{1, normal},
		{-3.5, normal},
		{65504, normal},
		{-65504, normal},
		{math.Nextafter32(65504, 0), normal},
		{65504.0001, normal}, // float32(65504.0001) == 65504: float32 spacing there is 2^-8
		{65504.004, above},   // 65504.00390625, the next float32
		{math.Nextafter32(65504, 1e9), above},
		{65519.99, above},
		{65520, above},
		{-65520, above},
		{1e38, above},
		{math.MaxFloat32, above},
		{-math.MaxFloat32, above},
		{f32NaN, nan},
		{-f32NaN, nan},
		{math.Float32frombits(0x7f800001), nan},
		{math.Float32frombits(0xffffffff), nan},
		{f32Inf, posInf},
		{-f32Inf, negInf},
	}
	for _, c := range cases {
		for _, n := range []int{1, 8, 9} { // tail, unrolled block, both
			x := make([]float32, n)
			for i := range x {
				x[i] = 1
			}
			x[n-1] = c.x
			s := NewStats()
			s.Observe(x, 0)
			got := [...]int64{s.Zeros, s.FP16Flush, s.FP16Subnormal, s.Finite - s.Zeros - s.FP16Flush - s.FP16Subnormal - s.AboveFP16Max,
				s.AboveFP16Max, s.NaN, s.PosInf, s.NegInf}
			var want [8]int64
			want[normal] = int64(n - 1)
			want[c.class]++
			if got != want {
				t.Errorf("%g (%#08x) n=%d: classes [zero flush sub normal above nan +inf -inf] = %v, want %v",
					c.x, math.Float32bits(c.x), n, got, want)
			}
		}
	}
}

func TestObserveExtrema(t *testing.T) {
	tests := []struct {
		name         string
		x            []float32
		maxAbs       float32
		arg          int64
		argBatch     int
		minNonzero   float32
		finite, zero int64
	}{
		{"empty", nil, 0, -1, -1, 0, 0, 0},
		{"nan only", []float32{f32NaN, f32Inf, -f32Inf}, 0, -1, -1, 0, 0, 0},
		{"zeros only", []float32{f32NaN, float32(math.Copysign(0, -1)), 0}, 0, 1, 3, 0, 2, 2},
		{"inf is not the max", []float32{1, f32Inf, -2, f32NaN}, 2, 2, 3, 1, 2, 0},
		{"negative wins", []float32{1, -5, 4, 0}, 5, 1, 3, 1, 4, 1},
		{"tie keeps first", []float32{3, -7, 7, -7, 2, 7, 7, 7, 7, 7, -7}, 7, 1, 3, 2, 11, 0},
		{"tie in later block", []float32{1, 1, 1, 1, 1, 1, 1, 1, 9, 2, -9}, 9, 8, 3, 1, 11, 0},
		{"max in tail", []float32{1, 2, 3, 4, 5, 6, 7, 8, 1e30, 0.5}, 1e30, 8, 3, 0.5, 10, 0},
		{"max above fp16", []float32{0, 0, 0, 0, 0, 0, 0, 0, 0, 7e4}, 7e4, 9, 3, 7e4, 10, 9},
		{"fp32 subnormal min", []float32{math.SmallestNonzeroFloat32, -1, 0, 0, 0, 0, 0, 0}, 1, 1, 3, math.SmallestNonzeroFloat32, 8, 6},
		{"max float", []float32{-math.MaxFloat32, math.MaxFloat32}, math.MaxFloat32, 0, 3, math.MaxFloat32, 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewStats()
			s.Observe(tt.x, 3)
			if s.MaxAbs != tt.maxAbs || s.ArgMax != tt.arg || s.ArgMaxBatch != tt.argBatch ||
				s.MinNonzero != tt.minNonzero || s.Finite != tt.finite || s.Zeros != tt.zero {
				t.Errorf("got MaxAbs %g at (%d, %d), MinNonzero %g, Finite %d, Zeros %d; want %g at (%d, %d), %g, %d, %d",
					s.MaxAbs, s.ArgMaxBatch, s.ArgMax, s.MinNonzero, s.Finite, s.Zeros,
					tt.maxAbs, tt.argBatch, tt.arg, tt.minNonzero, tt.finite, tt.zero)
			}
			checkStats(t, s, naiveStats(tt.x, 3), tt.x)
		})
	}
}

// concatRef is the reference for several batches: counts and sums of the
// concatenation, the maximum location per the tie rule (earliest batch,
// then earliest index, among equal maxima).
func concatRef(batches [][]float32, ids []int) Stats {
	want := NewStats()
	var all []float32
	for _, b := range batches {
		all = append(all, b...)
	}
	ref := naiveStats(all, 0)
	want = ref
	want.MaxAbs, want.ArgMaxBatch, want.ArgMax = 0, -1, -1
	for k, b := range batches {
		r := naiveStats(b, ids[k])
		if r.ArgMax < 0 {
			continue
		}
		if want.ArgMax < 0 || r.MaxAbs > want.MaxAbs ||
			(r.MaxAbs == want.MaxAbs && (ids[k] < want.ArgMaxBatch || ids[k] == want.ArgMaxBatch && r.ArgMax < want.ArgMax)) {
			want.MaxAbs, want.ArgMaxBatch, want.ArgMax = r.MaxAbs, ids[k], r.ArgMax
		}
	}
	return want
}

func TestMerge(t *testing.T) {
	tests := []struct {
		name    string
		batches [][]float32
		ids     []int // batch index of each
	}{
		{"random", [][]float32{genData("mixed", 1000, 1), genData("mixed", 17, 2), genData("mixed", 333, 3)}, []int{0, 1, 2}},
		{"with empty", [][]float32{nil, genData("normal", 9, 1), nil, genData("relu", 100, 2)}, []int{0, 1, 2, 3}},
		{"nonfinite first", [][]float32{genData("nonfinite", 50, 1), genData("zeros", 50, 1), genData("normal", 50, 1)}, []int{0, 1, 2}},
		{"zeros then values", [][]float32{genData("zeros", 20, 1), genData("zeros+nan", 30, 1)}, []int{0, 1}},
		{"tie earlier batch observed later", [][]float32{{1, 5, 2}, {5, 1}, {-5}}, []int{7, 2, 2}},
		{"tie same batch lower index later", [][]float32{{0, 0, 5}, {5, 0}}, []int{4, 4}},
		{"ties", [][]float32{genData("ties", 64, 1), genData("ties", 64, 2), genData("ties", 64, 3)}, []int{2, 1, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := concatRef(tt.batches, tt.ids)
			var all []float32
			for _, b := range tt.batches {
				all = append(all, b...)
			}

			// Observe batch after batch into one Stats.
			seq := NewStats()
			for k, b := range tt.batches {
				seq.Observe(b, tt.ids[k])
			}
			checkStats(t, seq, want, all)

			// Merge separately observed Stats, forwards and backwards,
			// and into the zero Stats as well as into NewStats.
			parts := make([]Stats, len(tt.batches))
			for k, b := range tt.batches {
				parts[k] = NewStats()
				parts[k].Observe(b, tt.ids[k])
			}
			fwd, bwd, zero := NewStats(), NewStats(), Stats{}
			for k := range parts {
				fwd.Merge(parts[k])
				bwd.Merge(parts[len(parts)-1-k])
				zero.Merge(parts[k])
			}
			checkStats(t, fwd, want, all)
			checkStats(t, bwd, want, all)
			checkStats(t, zero, want, all)

			// Merging empty statistics changes nothing.
			e := fwd
			e.Merge(NewStats())
			e.Merge(Stats{})
			if e != fwd {
				t.Errorf("merging empty stats changed %+v to %+v", fwd, e)
			}
		})
	}
}

func TestObserveParallel(t *testing.T) {
	for _, kind := range []string{"mixed", "ties", "zeros+nan", "nonfinite", "ascending", "descending", "rare-nonfinite"} {
		for _, n := range []int{0, 1, 7, 63, 64, 65, 200, 1000, 4099} {
			x := genData(kind, n, 9)
			want := NewStats()
			want.Observe(x, 5)
			for _, workers := range []int{0, 1, 2, 3, 7, 64, 100} {
				t.Run(fmt.Sprintf("%s/n=%d/w=%d", kind, n, workers), func(t *testing.T) {
					checkStats(t, observeParallel(x, 5, workers, 1), want, x)
				})
			}
		}
	}
	// The exported entry point, above its split threshold.
	for _, kind := range []string{"mixed", "ties"} {
		x := genData(kind, parallelMin*3+17, 1)
		want := NewStats()
		want.Observe(x, 2)
		for _, workers := range []int{0, 2, 5} {
			checkStats(t, observeParallel(x, 2, workers, parallelMin), want, x)
		}
		checkStats(t, observeParallel(x, 2, 3, parallelMin), naiveStats(x, 2), x)
	}
	// A tie across chunk boundaries goes to the first chunk.
	x := make([]float32, 1000)
	x[10], x[500], x[999] = -8, 8, 8
	if s := observeParallel(x, 1, 4, 1); s.ArgMax != 10 || s.MaxAbs != 8 || s.ArgMaxBatch != 1 {
		t.Errorf("tie across chunks: MaxAbs %g at (%d, %d), want 8 at (1, 10)", s.MaxAbs, s.ArgMaxBatch, s.ArgMax)
	}
}

// TestObserveSegments checks the split of huge tensors (over segmentLen
// elements) on small segments.
func TestObserveSegments(t *testing.T) {
	for _, kind := range []string{"mixed", "ties", "zeros+nan", "ascending"} {
		x := genData(kind, 1001, 3)
		for _, seg := range []int{1, 7, 8, 64, 1000, 1001} {
			checkStats(t, observeSegments(x, 6, seg), naiveStats(x, 6), x)
		}
	}
}

func TestDerived(t *testing.T) {
	tests := []struct {
		name              string
		x                 []float32
		mean, rms, head   float64
		nonFinite         int64
		headroomIsPosInf  bool
		meanRMSIgnoreNaNs bool
	}{
		{"empty", nil, 0, 0, 0, 0, true, false},
		{"nonfinite only", []float32{f32NaN, f32Inf, -f32Inf, f32NaN}, 0, 0, 0, 4, true, false},
		{"zeros", []float32{0, 0}, 0, 0, 0, 0, true, false},
		{"fp16 max", []float32{65504, -65504, f32NaN}, 0, 65504, 0, 1, false, false},
		{"half of max", []float32{32752, 0, 0, 32752, f32Inf}, 16376, math.Sqrt(2 * 32752 * 32752 / 4.0), 1, 1, false, false},
		{"double max", []float32{-131008}, -131008, 131008, -1, 0, false, false},
		{"mean rms", []float32{1, 2, 3, 4, -f32Inf}, 2.5, math.Sqrt(7.5), math.Log2(65504.0 / 4), 1, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewStats()
			s.Observe(tt.x, 0)
			near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-12*math.Max(1, math.Abs(b)) }
			if !near(s.Mean(), tt.mean) || !near(s.RMS(), tt.rms) {
				t.Errorf("Mean, RMS = %v, %v; want %v, %v", s.Mean(), s.RMS(), tt.mean, tt.rms)
			}
			h := s.HeadroomBits()
			if tt.headroomIsPosInf && !math.IsInf(h, 1) || !tt.headroomIsPosInf && !near(h, tt.head) {
				t.Errorf("HeadroomBits = %v, want %v (+Inf: %v)", h, tt.head, tt.headroomIsPosInf)
			}
			if s.NonFinite() != tt.nonFinite {
				t.Errorf("NonFinite = %d, want %d", s.NonFinite(), tt.nonFinite)
			}
		})
	}
}

// FuzzStatsObserve checks the kernel against the reference on arbitrary
// bit patterns (go test -fuzz FuzzStatsObserve ./audit/).
func FuzzStatsObserve(f *testing.F) {
	f.Add([]byte{})
	f.Add(binary.LittleEndian.AppendUint32(nil, 0x7f800000))
	f.Add([]byte("0123456789abcdef0123456789abcdef0123456789"))
	f.Fuzz(func(t *testing.T, data []byte) {
		x := make([]float32, len(data)/4)
		for i := range x {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		s := NewStats()
		s.Observe(x, 1)
		checkStats(t, s, naiveStats(x, 1), x)
		checkStats(t, observeParallel(x, 1, 3, 1), s, x)
	})
}

// parallelMin is the smallest tensor observeParallel splits over goroutines.
// observeParallel splits x over goroutines and merges the parts in index
// order, as the execution stage does with large values: the tests check that
// the merged statistics equal the whole.
const parallelMin = 1 << 20

func observeParallel(x []float32, batch, workers, minLen int) Stats {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	if workers == 1 || len(x) < minLen {
		return Of(x, batch)
	}
	if workers > len(x) {
		workers = len(x)
	}
	// Chunk boundaries on multiples of 64 elements (256 bytes) so that no
	// two goroutines share a cache line; the last chunk is the shortest.
	chunk := max((len(x)/workers+63)&^63, 64)
	parts := make([]Stats, (len(x)+chunk-1)/chunk)
	var wg sync.WaitGroup
	for i := range parts {
		lo := i * chunk
		hi := min(lo+chunk, len(x))
		wg.Go(func() {
			p := Of(x[lo:hi], batch)
			if p.ArgMax >= 0 {
				p.ArgMax += int64(lo)
			}
			parts[i] = p
		})
	}
	wg.Wait()
	st := NewStats()
	for _, p := range parts {
		st.Merge(p)
	}
	return st
}
