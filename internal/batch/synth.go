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
// Values follow what each input holds (InputSpec.Meaning): what a
// tokenizer gives a language model — token ids uniform over the rows of
// the embedding table that reads them, attention masks of ones (the last
// of several samples padded over its final quarter), token type ids of
// zeros, position ids 0..S−1 — and otherwise floats from the standard
// normal N(0,1), the distribution of normalized data, integers uniform in
// [0, 10) (or below the rows of a smaller table they index) and bools as
// fair coin flips. The notes say synthetic data was used, with which
// shapes and values.
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
		notes = append(notes, Note{Input: s.Name, Text: fmt.Sprintf("synthetic %s %s, %s", s.DType, tensor.ShapeString(shapes[i]), synthDescription(s, shapes[i]))})
	}
	rng := rand.New(rand.NewPCG(uint64(opt.Seed), 0x6670313661756469))
	batches := make([]Batch, n)
	for k := range batches {
		inputs := make([]*tensor.Tensor, len(specs))
		saved := make([]tensor.DType, len(specs))
		for i, s := range specs {
			inputs[i], saved[i] = synthTensor(rng, s, shapes[i]), s.DType
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

func synthTensor(rng *rand.Rand, s InputSpec, shape []int64) *tensor.Tensor {
	dt := s.DType
	n := int(tensor.NumElements(shape))
	size := dt.Size()
	data := make([]byte, n*size)
	last := int64(1) // the length of the last axis: positions, padding
	if len(shape) > 0 {
		last = max(shape[len(shape)-1], 1)
	}
	// With several samples (along the first axis of a rank ≥ 2 mask) the
	// last one ends in padding over the final quarter of its positions, as
	// in a batch of sequences of different lengths.
	lastSample := int64(n)
	if len(shape) >= 2 && shape[0] > 1 {
		lastSample = int64(n) - int64(n)/shape[0]
	}
	for i := range n {
		b := data[i*size : (i+1)*size]
		padded := int64(i) >= lastSample && int64(i)%last >= last-last/4
		var v float64 // the value of an input that holds numbers by meaning
		switch s.Meaning {
		case MeaningTokens:
			v = float64(rng.Int64N(s.Rows))
		case MeaningAttentionMask:
			v = 1
			if padded {
				v = 0
			}
		case MeaningPaddingMask:
			if padded {
				v = 1
			}
		case MeaningTokenTypes:
		case MeaningPositions:
			v = float64(int64(i) % last)
		default:
			putRandom(rng, b, s)
			continue
		}
		putNumber(b, dt, v)
	}
	return &tensor.Tensor{Name: s.Name, DType: dt, Shape: shape, Data: data}
}

// putRandom writes one random element of an input without a particular
// meaning: N(0,1) floats, integers in [0, 10) or below the rows of the
// table they index, fair bools.
func putRandom(rng *rand.Rand, b []byte, s InputSpec) {
	switch s.DType {
	case tensor.Float32, tensor.Float64, tensor.Float16, tensor.BFloat16:
		putNumber(b, s.DType, rng.NormFloat64())
	case tensor.Bool:
		b[0] = byte(rng.IntN(2))
	default:
		bound := int64(10)
		if s.Rows > 0 {
			bound = min(bound, s.Rows)
		}
		putNumber(b, s.DType, float64(rng.Int64N(bound)))
	}
}

// putNumber writes v as one element of type dt, little-endian; integers
// are truncated to the type's width, bools are v != 0.
func putNumber(b []byte, dt tensor.DType, v float64) {
	le := binary.LittleEndian
	switch dt {
	case tensor.Float32:
		le.PutUint32(b, math.Float32bits(float32(v)))
	case tensor.Float64:
		le.PutUint64(b, math.Float64bits(v))
	case tensor.Float16:
		le.PutUint16(b, float32ToHalf(float32(v)))
	case tensor.BFloat16:
		le.PutUint16(b, float32ToBFloat16(float32(v)))
	case tensor.Bool:
		if v != 0 {
			b[0] = 1
		}
	default:
		x := uint64(int64(v))
		for k := range b {
			b[k] = byte(x >> (8 * k))
		}
	}
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
