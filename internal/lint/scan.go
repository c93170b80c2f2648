package lint

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"

	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

// The limits the scan classifies by (package tensor has the facts).
var (
	fp16Overflow  = float64(tensor.FP16Overflow)
	fp16Flush     = float64(tensor.FP16Flush)
	fp16Subnormal = float64(tensor.FP16MinSubnormal)
	bf16Overflow  = float64(tensor.BF16Overflow)
	// flushFraction is the share of nonzero elements above which an
	// initializer "mostly" flushes to zero (FP4006).
	flushFraction = 0.5
)

// Stats summarizes the float elements of a constant.
type Stats struct {
	Elements int64
	NonZero  int64
	// Flush counts nonzero finite elements that become 0 in fp16.
	Flush int64
	// OverFP16 and OverBF16 count finite elements that become ±Inf in fp16
	// and in bf16.
	OverFP16, OverBF16  int64
	NaN, PosInf, NegInf int64
	// Extreme is the finite element of largest magnitude.
	Extreme float64
}

func (s *Stats) add(v float64) {
	s.Elements++
	a := math.Abs(v)
	if a > fp16Flush && a < fp16Overflow {
		s.NonZero++
		if a > math.Abs(s.Extreme) {
			s.Extreme = v
		}
		return
	}
	switch {
	case v != v:
		s.NaN++
		return
	case math.IsInf(v, 1):
		s.PosInf++
		return
	case math.IsInf(v, -1):
		s.NegInf++
		return
	case a == 0:
		return
	}
	s.NonZero++
	if a > math.Abs(s.Extreme) {
		s.Extreme = v
	}
	if a <= fp16Flush {
		s.Flush++
		return
	}
	s.OverFP16++
	if a >= bf16Overflow {
		s.OverBF16++
	}
}

// Constant is a float value whose contents the graph fixes: an
// initializer, the output of a Constant node, or the output of a
// ConstantOfShape node (every element is its fill value).
type Constant struct {
	// Name is the value's name in the graph.
	Name string
	// Node is the Constant or ConstantOfShape node that produces the
	// value, or -1 for an initializer.
	Node int
	// Fill is set for ConstantOfShape: Stats describe the fill value.
	Fill bool
	// DataType is the ONNX element type.
	DataType int32
	Stats    Stats
}

// Kind names the constant's origin for messages.
func (c *Constant) Kind() string {
	switch {
	case c.Node < 0:
		return "initializer"
	case c.Fill:
		return "ConstantOfShape fill value"
	}
	return "constant"
}

// Constants returns every float constant of the main graph with the
// statistics of its elements. Dense initializers are read where they lie
// in the decoded model, without a copy; only external data, sparse
// tensors and typed fields other than float_data are decoded.
func (f *Facts) Constants() ([]*Constant, error) {
	f.constOnce.Do(func() {
		f.consts, f.constErr = f.scanConstants()
		f.constByName = map[string]*Constant{}
		for _, c := range f.consts {
			f.constByName[c.Name] = c
		}
	})
	return f.consts, f.constErr
}

// Constant returns the float constant called name, or nil.
func (f *Facts) Constant(name string) *Constant {
	if _, err := f.Constants(); err != nil {
		return nil
	}
	return f.constByName[name]
}

func (f *Facts) scanConstants() ([]*Constant, error) {
	g := f.Model.Proto.GetGraph()
	ix := f.Model.Index
	var out []*Constant
	// The initializers are scanned on every core (a 600 M model's 2.4 GB
	// took 2.5 s on one), their results kept in the graph's order.
	inits := g.GetInitializer()
	type scanned struct {
		st  Stats
		ok  bool
		err error
	}
	res := make([]scanned, len(inits))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), max(len(inits), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(inits); i = int(next.Add(1) - 1) {
				r := &res[i]
				r.st, r.ok, r.err = scanProto(inits[i], ix.BaseDir)
			}
		}()
	}
	wg.Wait()
	for i, t := range inits {
		if err := res[i].err; err != nil {
			return nil, fmt.Errorf("initializer %q: %w", t.GetName(), err)
		}
		if res[i].ok {
			out = append(out, &Constant{Name: t.GetName(), Node: -1, DataType: t.GetDataType(), Stats: res[i].st})
		}
	}
	for _, s := range g.GetSparseInitializer() {
		name := s.GetValues().GetName()
		c, err := f.decodedConstant(name, -1)
		if err != nil {
			return nil, err
		}
		if c != nil {
			out = append(out, c)
		}
	}
	for _, i := range f.Order {
		n := g.GetNode()[i]
		if !onnx.IsDefaultDomain(n.GetDomain()) || len(n.GetOutput()) == 0 {
			continue
		}
		switch n.GetOpType() {
		case "Constant":
			c, err := f.decodedConstant(n.GetOutput()[0], i)
			if err != nil {
				return nil, err
			}
			if c != nil {
				out = append(out, c)
			}
		case "ConstantOfShape":
			for _, a := range n.GetAttribute() {
				if a.GetName() != "value" || a.GetT() == nil {
					continue
				}
				st, ok, err := scanProto(a.GetT(), ix.BaseDir)
				if err != nil {
					return nil, fmt.Errorf("node %s value: %w", ix.NodeLabel(i), err)
				}
				if ok {
					out = append(out, &Constant{Name: n.GetOutput()[0], Node: i, Fill: true, DataType: a.GetT().GetDataType(), Stats: st})
				}
			}
		}
	}
	return out, nil
}

// decodedConstant scans a constant through Index.ConstantValue; nil when
// it is not a float.
func (f *Facts) decodedConstant(name string, node int) (*Constant, error) {
	t, err := f.Model.Index.ConstantValue(name)
	if err != nil {
		return nil, fmt.Errorf("constant %q: %w", name, err)
	}
	if !t.DType.IsFloat() {
		return nil, nil
	}
	return &Constant{Name: name, Node: node, DataType: int32(t.DType), Stats: scanBytes(t.DType, t.Data)}, nil
}

// scanProto returns the statistics of a float tensor, reading raw_data
// and float_data in place; ok is false for non-float tensors.
func scanProto(t *onnx.TensorProto, baseDir string) (Stats, bool, error) {
	var dt tensor.DType
	switch onnx.TensorProto_DataType(t.GetDataType()) {
	case onnx.TensorProto_FLOAT:
		dt = tensor.Float32
	case onnx.TensorProto_DOUBLE:
		dt = tensor.Float64
	case onnx.TensorProto_FLOAT16:
		dt = tensor.Float16
	case onnx.TensorProto_BFLOAT16:
		dt = tensor.BFloat16
	default:
		return Stats{}, false, nil
	}
	if t.GetDataLocation() != onnx.TensorProto_EXTERNAL {
		if raw := t.GetRawData(); len(raw) > 0 && len(raw)%dt.Size() == 0 {
			return scanBytes(dt, raw), true, nil
		}
		if fd := t.GetFloatData(); dt == tensor.Float32 && len(fd) > 0 {
			var s Stats
			for _, v := range fd {
				s.add(float64(v))
			}
			return s, true, nil
		}
	}
	if t.GetDataLocation() == onnx.TensorProto_EXTERNAL {
		// A model's weights: read in pieces, never held.
		var s Stats
		err := onnx.ScanExternal(t, baseDir, func(b []byte) { scanInto(&s, dt, b) })
		return s, err == nil, err
	}
	d, err := onnx.DecodeTensor(t, baseDir)
	if err != nil {
		return Stats{}, false, err
	}
	return scanBytes(d.DType, d.Data), true, nil
}

// scanBytes returns the statistics of little-endian elements of a float
// type.
func scanBytes(dt tensor.DType, data []byte) Stats {
	var s Stats
	scanInto(&s, dt, data)
	return s
}

// scanInto adds little-endian elements of a float type to s.
func scanInto(s *Stats, dt tensor.DType, data []byte) {
	le := binary.LittleEndian
	switch dt {
	case tensor.Float32:
		scanFloat32(s, data)
	case tensor.Float64:
		for i := 0; i+8 <= len(data); i += 8 {
			s.add(math.Float64frombits(le.Uint64(data[i:])))
		}
	case tensor.Float16:
		for i := 0; i+2 <= len(data); i += 2 {
			s.add(float64(tensor.HalfToFloat32(le.Uint16(data[i:]))))
		}
	case tensor.BFloat16:
		for i := 0; i+2 <= len(data); i += 2 {
			s.add(float64(math.Float32frombits(uint32(le.Uint16(data[i:])) << 16)))
		}
	}
}

// The float32 bit patterns of the magnitudes add tells apart: a value
// whose magnitude lies strictly between them is an ordinary one (NaN's
// patterns lie above overflow's).
var (
	flushBits32    = math.Float32bits(float32(fp16Flush))
	overflowBits32 = math.Float32bits(float32(fp16Overflow))
)

// scanFloat32 is scanInto for float32 data: the ordinary values (nonzero,
// finite, within fp16's range: nearly all of a model's weights) are
// counted on their bit patterns, eight at a time, and only the others go
// through add; the result is add's for every element.
func scanFloat32(s *Stats, data []byte) {
	le := binary.LittleEndian
	var nonZero int64
	var maxBits uint32
	maxAt := -1
	n := len(data) / 4
	i := 0
	for ; i+8 <= n; i += 8 {
		b := data[4*i : 4*i+32]
		all := true
		for k := 0; k < 8; k++ {
			a := le.Uint32(b[4*k:]) & 0x7fffffff
			all = all && a > flushBits32 && a < overflowBits32
		}
		if !all {
			for k := 0; k < 8; k++ {
				scanOne(s, le.Uint32(b[4*k:]), &nonZero, &maxBits, &maxAt, i+k)
			}
			continue
		}
		nonZero += 8
		for k := 0; k < 8; k++ {
			if a := le.Uint32(b[4*k:]) & 0x7fffffff; a > maxBits {
				maxBits, maxAt = a, i+k
			}
		}
	}
	for ; i < n; i++ {
		scanOne(s, le.Uint32(data[4*i:]), &nonZero, &maxBits, &maxAt, i)
	}
	s.Elements += nonZero
	s.NonZero += nonZero
	if maxAt >= 0 {
		if v := float64(math.Float32frombits(le.Uint32(data[4*maxAt:]))); math.Abs(v) > math.Abs(s.Extreme) {
			s.Extreme = v
		}
	}
}

// scanOne counts one float32 element of scanFloat32: an ordinary one in
// the running count and maximum, any other through add.
func scanOne(s *Stats, u uint32, nonZero *int64, maxBits *uint32, maxAt *int, i int) {
	if a := u & 0x7fffffff; a > flushBits32 && a < overflowBits32 {
		*nonZero++
		if a > *maxBits {
			*maxBits, *maxAt = a, i
		}
		return
	}
	s.add(float64(math.Float32frombits(u)))
}

// scalarValue returns the value of a constant with exactly one element,
// decoding only small constants; ok is false for anything else.
func (f *Facts) scalarValue(name string) (float64, bool) {
	ix := f.Model.Index
	if !ix.IsInitializer(name) && ix.Producer(name) < 0 {
		return 0, false
	}
	if s, ok := ix.Shape(name); !ok || tensor.NumElements(s.Dims) != 1 {
		return 0, false
	}
	t, err := ix.ConstantValue(name)
	if err != nil || !t.DType.IsFloat() || t.Elements() != 1 {
		return 0, false
	}
	vs, err := t.Float32s()
	if err != nil {
		return 0, false
	}
	return float64(vs[0]), true
}
