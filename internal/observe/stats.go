// Package observe summarises the values a pass produces: the per-tensor
// statistics kernel (one read of the float32 elements of a value records its
// range, moments and how the values would fare stored as IEEE binary16) and
// the element-wise comparison of an emulated pass with the fp32 reference.
// Everything the diagnosis knows about a value comes from here.
package observe

import (
	"fp16audit/internal/tensor"
	"math"
	"unsafe"
)

// IEEE binary32 bit patterns of the absolute values the kernel classifies by.
// For a float32 x with abs bits a = bits(x) & 0x7fffffff, unsigned comparison
// of a is monotonic in |x|: 0 is zero, a < 0x00800000 is an fp32 subnormal,
// a == 0x7f800000 is Inf and a > 0x7f800000 is NaN.
const (
	absMask     = 0x7fffffff
	signMask    = 0x80000000
	infBits     = 0x7f800000 // +Inf
	fp16MaxBits = 0x477fe000 // 65504, the largest finite fp16
	fp16MinNorm = 0x38800000 // 2^-14, the smallest normal fp16
	fp16Flush   = 0x33000000 // 2^-25: |x| <= 2^-25 rounds to 0 in fp16 (ties to even)

	// noMin is minNonzero-1 when no nonzero finite value was seen: the
	// kernel tracks a-1 (so that 0 wraps to 0xffffffff and never wins) and
	// every non-finite a-1 is >= noMin.
	noMin = infBits - 1
)

// Stats summarises the float32 values of one tensor, aggregated over batches.
//
// The fp16 classes follow round-to-nearest-even conversion of binary32 to
// binary16: AboveFP16Max counts finite |x| > 65504, every one of which no
// longer keeps its value in fp16 (65504 < |x| < 65520 rounds down to 65504,
// |x| >= 65520 becomes Inf); FP16Subnormal counts 2^-25 < |x| < 2^-14, stored
// as fp16 subnormals with fewer significant bits; FP16Flush counts
// 0 < |x| <= 2^-25, which become (signed) zero. The three classes and Zeros
// are disjoint subsets of the finite values.
type Stats struct {
	Count         int64   // elements seen
	MaxAbs        float32 // largest finite |x| (0 when none)
	ArgMaxBatch   int     // batch index of MaxAbs (-1 when no finite value)
	ArgMax        int64   // flat index of MaxAbs within that batch's tensor (-1 when none)
	MinNonzero    float32 // smallest nonzero finite |x| (0 when none)
	Sum, SumSq    float64 // over finite values, for Mean and RMS
	Finite        int64   // finite values, zeros included
	NaN           int64
	PosInf        int64
	NegInf        int64
	Zeros         int64 // +0 and -0
	AboveFP16Max  int64 // finite |x| > 65504
	FP16Subnormal int64 // 2^-25 < |x| < 2^-14
	FP16Flush     int64 // 0 < |x| <= 2^-25
}

// NewStats returns empty statistics: no elements, no maximum location.
func NewStats() Stats {
	return Stats{ArgMaxBatch: -1, ArgMax: -1}
}

// Observe adds the elements of x, the flat (row-major) values of one tensor
// of batch number batch, to s in a single pass.
func (s *Stats) Observe(x []float32, batch int) {
	s.Merge(Of(x, batch))
}

// Merge adds the statistics o to s. The larger MaxAbs wins together with its
// location; on equal MaxAbs the earlier location (lower batch, then lower
// index) wins, so merging is order independent for everything but the
// floating-point rounding of Sum and SumSq.
func (s *Stats) Merge(o Stats) {
	if o.Finite > 0 {
		if s.Finite == 0 || o.MaxAbs > s.MaxAbs ||
			(o.MaxAbs == s.MaxAbs && (o.ArgMaxBatch < s.ArgMaxBatch ||
				(o.ArgMaxBatch == s.ArgMaxBatch && o.ArgMax < s.ArgMax))) {
			s.MaxAbs, s.ArgMaxBatch, s.ArgMax = o.MaxAbs, o.ArgMaxBatch, o.ArgMax
		}
	} else if s.Finite == 0 {
		s.MaxAbs, s.ArgMaxBatch, s.ArgMax = 0, -1, -1
	}
	if o.MinNonzero != 0 && (s.MinNonzero == 0 || o.MinNonzero < s.MinNonzero) {
		s.MinNonzero = o.MinNonzero
	}
	s.Count += o.Count
	s.Sum += o.Sum
	s.SumSq += o.SumSq
	s.Finite += o.Finite
	s.NaN += o.NaN
	s.PosInf += o.PosInf
	s.NegInf += o.NegInf
	s.Zeros += o.Zeros
	s.AboveFP16Max += o.AboveFP16Max
	s.FP16Subnormal += o.FP16Subnormal
	s.FP16Flush += o.FP16Flush
}

// Mean returns the mean of the finite values, 0 when there are none.
func (s Stats) Mean() float64 {
	if s.Finite == 0 {
		return 0
	}
	return s.Sum / float64(s.Finite)
}

// RMS returns the root mean square of the finite values, 0 when there are
// none.
func (s Stats) RMS() float64 {
	if s.Finite == 0 {
		return 0
	}
	return math.Sqrt(s.SumSq / float64(s.Finite))
}

// HeadroomBits returns log2(65504/MaxAbs): how many doublings the largest
// finite magnitude can take before it leaves the fp16 range. It is negative
// when MaxAbs > 65504 and +Inf when MaxAbs == 0.
func (s Stats) HeadroomBits() float64 {
	if s.MaxAbs == 0 {
		return math.Inf(1)
	}
	return math.Log2(tensor.FP16Max / float64(s.MaxAbs))
}

// NonFinite returns the number of NaN and infinite values.
func (s Stats) NonFinite() int64 {
	return s.NaN + s.PosInf + s.NegInf
}

// segmentLen bounds the elements one kernel call sees, so that the count
// recovered from its uint64 sums (see kernel) cannot wrap: n < 2^32 suffices.
const segmentLen = 1 << 30

// Of returns the statistics of x alone, the flat values of one tensor of
// batch number batch.
func Of(x []float32, batch int) Stats {
	return observeSegments(x, batch, segmentLen)
}

// observeSegments runs the kernel over segments of at most seg elements.
func observeSegments(x []float32, batch, seg int) Stats {
	if len(x) <= seg {
		return kernel(x, batch)
	}
	st := NewStats()
	for lo := 0; lo < len(x); lo += seg {
		p := kernel(x[lo:min(lo+seg, len(x))], batch)
		if p.ArgMax >= 0 {
			p.ArgMax += int64(lo)
		}
		st.Merge(p)
	}
	return st
}

// kernel computes the statistics of up to segmentLen elements in one pass.
//
// The class counts are branch free. For an abs bit pattern a < 2^31 and a
// threshold T < 2^31, the uint32 a-T wraps (adds 2^32) exactly when a < T, so
// over n elements
//
//	Σ uint32(a-T) = Σ a - n·T + 2^32·#{a < T}
//
// and #{a < T} = (Σ uint32(a-T) + n·T - Σ a) >> 32 in uint64 arithmetic: two
// instructions per element and threshold, no compare, no branch. The
// thresholds are 1 (zeros), 2^-25 (flush), 2^-14 (fp16 normal) and 65504.
//
// Blocks of 8 elements take a fast path when no element raises the maximum
// or lowers the nonzero minimum and none is NaN or Inf, which a handful of
// branch-free instructions per element decide; in typical tensors the other
// blocks are few (the running extrema settle quickly) and are redone element
// by element. Sums run in float64, each fast block summed as a tree.
func kernel(x []float32, batch int) Stats {
	var (
		sumA, sumB, sum25, sum14, sumMax uint64 // Σ a, Σ uint32(a-T) for the thresholds
		nan, posInf, negInf              int64
		mx                               uint32 // largest finite nonzero a (valid when arg >= 0)
		arg                              = -1   // its index
		mn                               = uint32(noMin)
		sum, sumSq                       float64
	)
	n := len(x)
	// The bit patterns of x, read straight into integer registers.
	bits := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(x))), n)
	i := 0
	for ; i <= n-8; i += 8 {
		u := bits[i : i+8 : i+8]
		// out gets its top bit set by an element that raises the
		// maximum (a > mx; NaN and Inf are above every finite mx) or
		// lowers the minimum (a-1 < mn; a-1 wraps 0 to 0xffffffff).
		mx64, mn64 := uint64(mx), uint64(mn)
		var out uint64
		a0 := u[0] & absMask
		sumA += uint64(a0)
		sumB += uint64(a0 - 1)
		sum25 += uint64(a0 - (fp16Flush + 1))
		sum14 += uint64(a0 - fp16MinNorm)
		sumMax += uint64(a0 - (fp16MaxBits + 1))
		out |= (mx64 - uint64(a0)) | (uint64(a0-1) - mn64)
		a1 := u[1] & absMask
		sumA += uint64(a1)
		sumB += uint64(a1 - 1)
		sum25 += uint64(a1 - (fp16Flush + 1))
		sum14 += uint64(a1 - fp16MinNorm)
		sumMax += uint64(a1 - (fp16MaxBits + 1))
		out |= (mx64 - uint64(a1)) | (uint64(a1-1) - mn64)
		a2 := u[2] & absMask
		sumA += uint64(a2)
		sumB += uint64(a2 - 1)
		sum25 += uint64(a2 - (fp16Flush + 1))
		sum14 += uint64(a2 - fp16MinNorm)
		sumMax += uint64(a2 - (fp16MaxBits + 1))
		out |= (mx64 - uint64(a2)) | (uint64(a2-1) - mn64)
		a3 := u[3] & absMask
		sumA += uint64(a3)
		sumB += uint64(a3 - 1)
		sum25 += uint64(a3 - (fp16Flush + 1))
		sum14 += uint64(a3 - fp16MinNorm)
		sumMax += uint64(a3 - (fp16MaxBits + 1))
		out |= (mx64 - uint64(a3)) | (uint64(a3-1) - mn64)
		a4 := u[4] & absMask
		sumA += uint64(a4)
		sumB += uint64(a4 - 1)
		sum25 += uint64(a4 - (fp16Flush + 1))
		sum14 += uint64(a4 - fp16MinNorm)
		sumMax += uint64(a4 - (fp16MaxBits + 1))
		out |= (mx64 - uint64(a4)) | (uint64(a4-1) - mn64)
		a5 := u[5] & absMask
		sumA += uint64(a5)
		sumB += uint64(a5 - 1)
		sum25 += uint64(a5 - (fp16Flush + 1))
		sum14 += uint64(a5 - fp16MinNorm)
		sumMax += uint64(a5 - (fp16MaxBits + 1))
		out |= (mx64 - uint64(a5)) | (uint64(a5-1) - mn64)
		a6 := u[6] & absMask
		sumA += uint64(a6)
		sumB += uint64(a6 - 1)
		sum25 += uint64(a6 - (fp16Flush + 1))
		sum14 += uint64(a6 - fp16MinNorm)
		sumMax += uint64(a6 - (fp16MaxBits + 1))
		out |= (mx64 - uint64(a6)) | (uint64(a6-1) - mn64)
		a7 := u[7] & absMask
		sumA += uint64(a7)
		sumB += uint64(a7 - 1)
		sum25 += uint64(a7 - (fp16Flush + 1))
		sum14 += uint64(a7 - fp16MinNorm)
		sumMax += uint64(a7 - (fp16MaxBits + 1))
		out |= (mx64 - uint64(a7)) | (uint64(a7-1) - mn64)

		// Such a block is rare: it is redone element by element.
		v := x[i : i+8 : i+8]
		if out>>63 != 0 {
			for j, f := range v {
				a := math.Float32bits(f) & absMask
				switch {
				case a > infBits:
					nan++
				case a == infBits:
					if f > 0 {
						posInf++
					} else {
						negInf++
					}
				default:
					if a > mx {
						mx, arg = a, i+j
					}
					mn = min(mn, a-1)
					d := float64(f)
					sum += d
					sumSq += d * d
				}
			}
			continue
		}
		d0, d1, d2, d3 := float64(v[0]), float64(v[1]), float64(v[2]), float64(v[3])
		d4, d5, d6, d7 := float64(v[4]), float64(v[5]), float64(v[6]), float64(v[7])
		sum += ((d0 + d1) + (d2 + d3)) + ((d4 + d5) + (d6 + d7))
		sumSq += ((d0*d0 + d1*d1) + (d2*d2 + d3*d3)) + ((d4*d4 + d5*d5) + (d6*d6 + d7*d7))
	}
	for ; i < n; i++ {
		f := x[i]
		a := math.Float32bits(f) & absMask
		sumA += uint64(a)
		sumB += uint64(a - 1)
		sum25 += uint64(a - (fp16Flush + 1))
		sum14 += uint64(a - fp16MinNorm)
		sumMax += uint64(a - (fp16MaxBits + 1))
		mn = min(mn, a-1)
		switch {
		case a > infBits:
			nan++
		case a == infBits:
			if f > 0 {
				posInf++
			} else {
				negInf++
			}
		default:
			if a > mx {
				mx, arg = a, i
			}
			d := float64(f)
			sum += d
			sumSq += d * d
		}
	}

	// #{a < T}; see above.
	below := func(sumT uint64, T uint64) int64 {
		return int64((sumT + uint64(n)*T - sumA) >> 32)
	}
	zeros := below(sumB, 1)
	le25 := below(sum25, fp16Flush+1)
	lt14 := below(sum14, fp16MinNorm)
	leMax := below(sumMax, fp16MaxBits+1)
	finite := int64(n) - nan - posInf - negInf
	st := Stats{
		Count:         int64(n),
		ArgMaxBatch:   -1,
		ArgMax:        -1,
		Sum:           sum,
		SumSq:         sumSq,
		Finite:        finite,
		NaN:           nan,
		PosInf:        posInf,
		NegInf:        negInf,
		Zeros:         zeros,
		AboveFP16Max:  finite - leMax,
		FP16Subnormal: lt14 - le25,
		FP16Flush:     le25 - zeros,
	}
	if arg < 0 && finite > 0 {
		// Every finite value is zero: the maximum is the first of them.
		for j, f := range x {
			if math.Float32bits(f)&absMask < infBits {
				arg = j
				break
			}
		}
	}
	if arg >= 0 {
		st.MaxAbs = math.Float32frombits(mx)
		st.ArgMaxBatch, st.ArgMax = batch, int64(arg)
	}
	if mn < noMin {
		st.MinNonzero = math.Float32frombits(mn + 1)
	}
	return st
}
