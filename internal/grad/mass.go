package grad

import (
	"errors"
	"math"

	"fp16audit/internal/onnx"
)

// Format is a 16-bit floating-point format a gradient is held in: how
// rounding to it treats a value of a given size.
type Format struct {
	// Name is "fp16" or "bf16".
	Name string
	// Mant is the number of explicit mantissa bits; MinExp the exponent
	// of the smallest normal number.
	Mant, MinExp int
	// Max is the largest finite value and Overflow the smallest magnitude
	// that rounds to infinity.
	Max, Overflow float64
}

// The formats autocast holds gradients in.
var (
	FP16 = Format{Name: "fp16", Mant: 10, MinExp: -14, Max: 65504, Overflow: 65520}
	BF16 = Format{Name: "bf16", Mant: 7, MinExp: -126,
		Max: math.Ldexp(2-math.Ldexp(1, -7), 127), Overflow: math.Ldexp(2-math.Ldexp(1, -8), 127)}
)

// FormatOf returns the format of a 16-bit ONNX element type (FLOAT16 or
// BFLOAT16).
func FormatOf(elemType int32) Format {
	if elemType == int32(onnx.TensorProto_BFLOAT16) {
		return BF16
	}
	return FP16
}

// massBuckets is the number of float32 exponent fields a Mass counts by.
const massBuckets = 256

// Mass is where the L2 mass of one gradient lies, by binary exponent: what
// the Mass operator (internal/statsop) computes inside ONNX Runtime. Bucket
// e ≥ 1 holds the elements with |g| in [2^(e−127), 2^(e−126)), bucket 0
// zeros and float32 subnormals. From it follow, for every loss scale
// without another run, whether the gradient overflows a format and how
// much of its norm rounding to it loses.
type Mass struct {
	// Count and SumSq are the number of elements and the sum of their
	// squares per bucket.
	Count, SumSq [massBuckets]float64
	// Max is max |g| over the finite elements; NonFinite counts NaN and
	// Inf elements.
	Max, NonFinite float64
}

// MassFrom reads the numbers the Mass operator wrote (statsop.MassLen of
// them: counts, sums of squares, max, non-finite count).
func MassFrom(h []float64) (*Mass, error) {
	if len(h) != 2*massBuckets+2 {
		return nil, errors.New("mass: want 514 numbers")
	}
	m := &Mass{Max: h[2*massBuckets], NonFinite: h[2*massBuckets+1]}
	copy(m.Count[:], h[:massBuckets])
	copy(m.SumSq[:], h[massBuckets:2*massBuckets])
	return m, nil
}

// Add adds o's elements to m: the mass of the two gradients together.
func (m *Mass) Add(o *Mass) {
	for e := range m.Count {
		m.Count[e] += o.Count[e]
		m.SumSq[e] += o.SumSq[e]
	}
	m.Max = max(m.Max, o.Max)
	m.NonFinite += o.NonFinite
}

// Norm is the gradient's L2 norm over its finite elements.
func (m *Mass) Norm() float64 {
	var s float64
	for _, q := range m.SumSq {
		s += q
	}
	return math.Sqrt(s)
}

// Overflows reports whether the gradient × 2^exp holds an element that
// rounds to infinity in f (or already holds NaN/Inf).
func (m *Mass) Overflows(exp int, f Format) bool {
	return m.NonFinite > 0 || math.Ldexp(m.Max, exp) >= f.Overflow
}

// MaxCleanExp is the largest exponent at which the gradient does not
// overflow f: the first scale a GradScaler halving from above keeps.
func (m *Mass) MaxCleanExp(f Format) int {
	if m.Max == 0 {
		return math.MaxInt32
	}
	_, e := math.Frexp(f.Overflow / m.Max) // f.Overflow/m.Max in [2^(e−1), 2^e)
	k := e - 1
	for k > -2000 && m.Overflows(k, f) {
		k--
	}
	for !m.Overflows(k+1, f) {
		k++
	}
	return k
}

// Lost is the share of the gradient's L2 norm that holding g × 2^exp in f
// loses, ‖f(g·2^exp)/2^exp − g‖ / ‖g‖, estimated from the buckets:
// elements below half f's smallest subnormal flush to zero and lose their
// whole square (exact from the sums), those in the next bucket round to
// the smallest subnormal or to zero, and the others lose their rounding
// error, taken as uniform within one unit in the last place (ulp²/12 per
// element; the normal range's is at most 2^−22 of the square). It ignores
// overflow (see Overflows) and what rounding elsewhere in the backward did
// to g: an emulated run measures that.
func (m *Mass) Lost(exp int, f Format) float64 {
	var total, lost float64
	for e := range m.Count {
		n, q := m.Count[e], m.SumSq[e]
		total += q
		if n == 0 || q == 0 {
			continue
		}
		k := e - 127 + exp // the bucket's lower edge, scaled
		if e == 0 {
			k = -127 + exp // float32 subnormals: below 2^−126
		}
		sub := f.MinExp - f.Mant // exponent of the smallest subnormal
		switch {
		case k >= f.MinExp:
			u := math.Ldexp(1, k-f.Mant-exp)
			lost += n * u * u / 12
		case k >= sub:
			u := math.Ldexp(1, sub-exp)
			lost += n * u * u / 12
		case k == sub-1:
			// [half the smallest subnormal, the smallest): rounds up to it
			// (or, at exactly half, to zero); the error is below the value.
			h := math.Ldexp(1, sub-1-exp)
			lost += min(n*h*h/3, q)
		default:
			lost += q
		}
	}
	if total == 0 {
		return 0
	}
	return math.Min(1, math.Sqrt(lost/total))
}

// Range returns log2 of the smallest nonzero |g| (the lower edge of its
// bucket) and of the largest; ok is false for a gradient without a
// nonzero finite element.
func (m *Mass) Range() (lo, hi float64, ok bool) {
	if m.Max == 0 {
		return 0, 0, false
	}
	lo = -127
	if m.SumSq[0] == 0 {
		for e := 1; e < massBuckets; e++ {
			if m.Count[e] > 0 {
				lo = float64(e - 127)
				break
			}
		}
	}
	return lo, math.Log2(m.Max), true
}

// Run is what one run of a backward graph returned at loss scale 2^Exp,
// with the gradients held in 16 bits rounded (Rounded) or left in fp32.
type Run struct {
	Exp     int
	Rounded bool
	// Loss is the unscaled loss.
	Loss float64
	// Grads maps Grad.Value, and Sites maps Site.Rounded, to the Mass of
	// the gradient (× 2^Exp) before it is rounded.
	Grads map[string]*Mass
	Sites map[string]*Mass
	// Params maps the Grad.Value of every parameter (Result.Params) to
	// its gradient × 2^Exp, as the optimizer would read it before
	// unscaling.
	Params map[string][]float32
}

// LostMass compares a parameter gradient g (× 2^exp) of an emulated run
// with the fp32 one, ref (at scale 1): ‖g/2^exp − ref‖ / ‖ref‖, the share
// of the gradient's L2 norm the reduced precision lost, rounding
// compounded through the backward included. finite is false when g holds
// NaN or Inf (GradScaler skips the step); lost is 0 for a zero ref.
func LostMass(g, ref []float32, exp int) (lost float64, finite bool) {
	inv := math.Ldexp(1, -exp)
	var d, r float64
	for i, x := range g {
		v := float64(x)
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return math.Inf(1), false
		}
		y := float64(ref[i])
		d += (v*inv - y) * (v*inv - y)
		r += y * y
	}
	if r == 0 {
		return 0, true
	}
	return math.Sqrt(d / r), true
}

// Params returns the gradients of the model's parameters, in the order
// of Grads: those of float initializers, and those of Identity nodes
// that read one (the exporter's deduplicated copies of equal parameters,
// each a parameter of its own in PyTorch).
func (r *Result) Params() []Grad {
	var out []Grad
	g := r.Model.GetGraph()
	init := map[string]bool{}
	for _, t := range g.GetInitializer() {
		init[t.Name] = true
	}
	for _, gr := range r.Grads {
		switch {
		case gr.Kind == Parameter:
		case gr.Kind == Activation && gr.Node >= 0 && gr.Node < len(g.Node) &&
			g.Node[gr.Node].OpType == "Identity" && len(g.Node[gr.Node].Input) == 1 && init[g.Node[gr.Node].Input[0]]:
		default:
			continue
		}
		out = append(out, gr)
	}
	return out
}
