package batch

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"

	"fp16audit/internal/tensor"
)

// maxSyntheticBytes bounds one synthetic tensor, so that a mistyped --shape
// fails instead of exhausting memory.
const maxSyntheticBytes = 1 << 30

// Synthesize makes opt.SyntheticBatches (default 1) batches for specs from
// opt.Seed; the same seed and specs always give the same batches.
//
// Shapes: fixed dims as declared; a symbolic dim takes its --shape pin, else
// the value another pinned input gives the same dim_param, else 1 when it is
// batch-like (the first dim, or a dim whose name contains "batch"); any
// other symbolic dim is an error asking for --shape.
//
// Values: float inputs are drawn from the standard normal N(0,1), the
// distribution of normalized data, so the audit sees well-scaled
// activations; integer inputs are uniform in [0, 10), valid token ids and
// indices for any vocabulary or axis of at least 10; bool inputs are fair
// coin flips. The notes say synthetic data was used and with which shapes.
func Synthesize(specs []InputSpec, opt Options) ([]Batch, []Note, error) {
	n := opt.SyntheticBatches
	if n <= 0 {
		n = 1
	}
	shapes, err := syntheticShapes(specs, opt.Shapes)
	if err != nil {
		return nil, nil, err
	}
	notes := []Note{{Text: fmt.Sprintf("no -i given: using %d synthetic batch(es) from seed %d; real batches give a truer audit", n, opt.Seed)}}
	for i, s := range specs {
		dist := "N(0,1)"
		switch {
		case s.DType == tensor.Bool:
			dist = "random true/false"
		case !s.DType.IsFloat():
			dist = "uniform integers in [0,10)"
		}
		notes = append(notes, Note{Input: s.Name, Text: fmt.Sprintf("synthetic %s %s, %s", s.DType, tensor.ShapeString(shapes[i]), dist)})
	}
	rng := rand.New(rand.NewPCG(uint64(opt.Seed), 0x6670313661756469))
	batches := make([]Batch, n)
	for k := range batches {
		inputs := make([]*tensor.Tensor, len(specs))
		saved := make([]tensor.DType, len(specs))
		for i, s := range specs {
			inputs[i], saved[i] = synthTensor(rng, s.Name, s.DType, shapes[i]), s.DType
		}
		batches[k] = Batch{Source: fmt.Sprintf("synthetic batch %d (seed %d)", k, opt.Seed), Inputs: inputs, Saved: saved}
	}
	return batches, notes, nil
}

func syntheticShapes(specs []InputSpec, pins map[string][]int64) ([][]int64, error) {
	named := map[string]int64{}
	for _, s := range specs {
		pin := pins[s.Name]
		for k, d := range s.Dims {
			name := dimName(s, k)
			if d >= 0 || pin == nil || name == "" {
				continue
			}
			if v, ok := named[name]; ok && v != pin[k] {
				return nil, fmt.Errorf("--shape pins dim %q to both %d and %d; inputs sharing a dim name must agree", name, v, pin[k])
			}
			named[name] = pin[k]
		}
	}
	shapes := make([][]int64, len(specs))
	for i, s := range specs {
		if s.DType.Size() == 0 {
			return nil, fmt.Errorf("input %q: cannot make synthetic %s data; pass a batch with -i %s=path", s.Name, s.DType, s.Name)
		}
		if pin := pins[s.Name]; pin != nil {
			shapes[i] = append([]int64(nil), pin...)
		} else if s.Dims == nil {
			return nil, fmt.Errorf("input %q has no shape in the model; give one with --shape %s=DIMS or pass a batch with -i", s.Name, s.Name)
		} else {
			shape := make([]int64, len(s.Dims))
			var unknown []int
			for k, d := range s.Dims {
				name := dimName(s, k)
				v, ok := named[name]
				switch {
				case d >= 0:
					shape[k] = d
				case name != "" && ok:
					shape[k] = v
				case k == 0 || strings.Contains(strings.ToLower(name), "batch"):
					shape[k] = 1
				default:
					unknown = append(unknown, k)
				}
			}
			if len(unknown) > 0 {
				return nil, unknownDimError(s, shape, unknown)
			}
			shapes[i] = shape
		}
		n, err := elementCount(shapes[i])
		if err != nil || n > maxSyntheticBytes/int64(s.DType.Size()) {
			return nil, fmt.Errorf("input %q: synthetic shape %s is too large (over %d bytes)", s.Name, tensor.ShapeString(shapes[i]), maxSyntheticBytes)
		}
	}
	return shapes, nil
}

func unknownDimError(s InputSpec, shape []int64, unknown []int) error {
	parts := make([]string, len(shape))
	for k, d := range shape {
		parts[k] = strconv.FormatInt(d, 10)
	}
	var what []string
	for _, k := range unknown {
		name := dimName(s, k)
		if name == "" {
			name = "dim" + strconv.Itoa(k)
		}
		parts[k] = "<" + name + ">"
		what = append(what, fmt.Sprintf("%d (%q)", k, name))
	}
	return fmt.Errorf("input %q: cannot make a synthetic batch: dim %s of %s has no fixed size; pass it with --shape %s=%s, or pass real batches with -i",
		s.Name, strings.Join(what, ", "), wantString(s, nil), s.Name, strings.Join(parts, "x"))
}

func synthTensor(rng *rand.Rand, name string, dt tensor.DType, shape []int64) *tensor.Tensor {
	n := int(tensor.NumElements(shape))
	size := dt.Size()
	data := make([]byte, n*size)
	le := binary.LittleEndian
	for i := range n {
		b := data[i*size : (i+1)*size]
		switch dt {
		case tensor.Float32:
			le.PutUint32(b, math.Float32bits(float32(rng.NormFloat64())))
		case tensor.Float64:
			le.PutUint64(b, math.Float64bits(rng.NormFloat64()))
		case tensor.Float16:
			le.PutUint16(b, float32ToHalf(float32(rng.NormFloat64())))
		case tensor.BFloat16:
			le.PutUint16(b, float32ToBFloat16(float32(rng.NormFloat64())))
		case tensor.Bool:
			b[0] = byte(rng.IntN(2))
		default:
			// Integer types: little-endian bytes of a value in [0,10) are the
			// value in the low byte and zeros above, for every width.
			b[0] = byte(rng.IntN(10))
		}
	}
	return &tensor.Tensor{Name: name, DType: dt, Shape: shape, Data: data}
}

// float32ToHalf rounds f to the nearest IEEE 754 binary16, ties to even.
func float32ToHalf(f float32) uint16 {
	bits := math.Float32bits(f)
	sign := uint16(bits>>16) & 0x8000
	exp := int32(bits>>23) & 0xff
	mant := bits & 0x7fffff
	switch {
	case exp == 0xff:
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp-127 > 15:
		return sign | 0x7c00
	case exp-127 >= -14:
		// Normal half: keep 10 mantissa bits, round the 13 dropped ones.
		h := uint32(exp-127+15)<<10 | mant>>13
		rest := mant & 0x1fff
		if rest > 0x1000 || (rest == 0x1000 && h&1 == 1) {
			h++ // may carry into the exponent, up to Inf: correct
		}
		return sign | uint16(h)
	case exp-127 >= -25:
		// Subnormal half: value = m * 2^-24 with the implicit bit restored.
		m := mant | 0x800000
		shift := uint32(-14 - (exp - 127) + 13)
		h := m >> shift
		rest := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rest > half || (rest == half && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	return sign
}

// float32ToBFloat16 rounds f to bfloat16, ties to even.
func float32ToBFloat16(f float32) uint16 {
	bits := math.Float32bits(f)
	if bits&0x7fffffff > 0x7f800000 {
		return uint16(bits>>16) | 0x40
	}
	bits += 0x7fff + (bits>>16)&1
	return uint16(bits >> 16)
}
