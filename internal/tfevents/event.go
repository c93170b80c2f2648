package tfevents

import (
	"encoding/binary"
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers from TensorBoard's .proto files (tensorboard/compat/proto).
const (
	// Event (event.proto).
	fEventWallTime    = 1 // double
	fEventStep        = 2 // int64
	fEventFileVersion = 3 // string, oneof what
	fEventSummary     = 5 // Summary, oneof what

	// Summary (summary.proto).
	fSummaryValue = 1 // repeated Value

	// Summary.Value.
	fValueTag         = 1 // string
	fValueSimpleValue = 2 // float, oneof value
	fValueImage       = 4 // Image, oneof value
	fValueHisto       = 5 // HistogramProto, oneof value
	fValueAudio       = 6 // Audio, oneof value
	fValueTensor      = 8 // TensorProto, oneof value
	fValueMetadata    = 9 // SummaryMetadata

	// SummaryMetadata.
	fMetaPluginData = 1 // PluginData
	fMetaDataClass  = 4 // DataClass enum
	// SummaryMetadata.PluginData.
	fPluginName = 1 // string

	// TensorProto (tensor.proto).
	fTensorDType   = 1  // DataType enum
	fTensorShape   = 2  // TensorShapeProto
	fTensorContent = 4  // bytes
	fTensorFloat   = 5  // repeated float, packed
	fTensorDouble  = 6  // repeated double, packed
	fTensorHalf    = 13 // repeated int32, packed: fp16/bf16 bits

	// TensorShapeProto (tensor_shape.proto).
	fShapeDim         = 2 // repeated Dim
	fShapeUnknownRank = 3 // bool
	// TensorShapeProto.Dim.
	fDimSize = 1 // int64
)

// DataType is TensorFlow's DataType enum (types.proto); only the values a
// scalar summary can hold are named.
type DataType int32

// The DataType values scalars come in.
const (
	DTFloat    DataType = 1
	DTDouble   DataType = 2
	DTBFloat16 DataType = 14
	DTHalf     DataType = 19
)

// DataClassScalar is SummaryMetadata.data_class DATA_CLASS_SCALAR.
const DataClassScalar = 1

// FileVersion is the file_version of the first event TensorBoard writers
// put in every event file.
const FileVersion = "brain.Event:2"

// Event is the part of a tensorboard Event this package reads and writes.
type Event struct {
	WallTime    float64
	Step        int64
	FileVersion string
	// Values holds the summary's values; nil when the event has no
	// summary (a file_version, graph or session-log event).
	Values []Value
}

// Value is one Summary.Value. Exactly one of HasSimple, Tensor and Other
// describes its payload.
type Value struct {
	Tag string
	// Plugin is metadata.plugin_data.plugin_name, "" without metadata.
	// TensorBoard writers attach metadata to the first value of a tag only.
	Plugin    string
	DataClass int32
	HasSimple bool
	Simple    float32
	Tensor    *Tensor
	// Other is set for payloads this package does not decode (image,
	// histogram, audio).
	Other bool
}

// Tensor is the part of a TensorProto a scalar can be stored in.
type Tensor struct {
	DType DataType
	// Shape holds the dimensions; empty for rank 0 (or no shape at all).
	Shape       []int64
	UnknownRank bool
	Content     []byte // tensor_content: little-endian raw values
	FloatVal    []float32
	DoubleVal   []float64
	HalfVal     []int32 // fp16 or bf16 bit patterns in the low 16 bits
}

// Scalar returns the value's number when it holds exactly one float: a
// simple_value, or a one-element DT_FLOAT, DT_DOUBLE, DT_HALF or DT_BFLOAT16
// tensor in any of its encodings.
func (v Value) Scalar() (float64, bool) {
	if v.HasSimple {
		return float64(v.Simple), true
	}
	if v.Tensor == nil {
		return 0, false
	}
	return v.Tensor.scalar()
}

func (t *Tensor) scalar() (float64, bool) {
	if t.UnknownRank {
		return 0, false
	}
	for _, d := range t.Shape {
		if d != 1 {
			return 0, false
		}
	}
	switch t.DType {
	case DTFloat:
		if len(t.FloatVal) == 1 && t.Content == nil {
			return float64(t.FloatVal[0]), true
		}
		if len(t.Content) == 4 && t.FloatVal == nil {
			return float64(math.Float32frombits(binary.LittleEndian.Uint32(t.Content))), true
		}
	case DTDouble:
		if len(t.DoubleVal) == 1 && t.Content == nil {
			return t.DoubleVal[0], true
		}
		if len(t.Content) == 8 && t.DoubleVal == nil {
			return math.Float64frombits(binary.LittleEndian.Uint64(t.Content)), true
		}
	case DTHalf, DTBFloat16:
		var bits uint16
		switch {
		case len(t.HalfVal) == 1 && t.Content == nil:
			bits = uint16(t.HalfVal[0])
		case len(t.Content) == 2 && t.HalfVal == nil:
			bits = binary.LittleEndian.Uint16(t.Content)
		default:
			return 0, false
		}
		if t.DType == DTBFloat16 {
			return float64(math.Float32frombits(uint32(bits) << 16)), true
		}
		return halfToFloat64(bits), true
	}
	return 0, false
}

// halfToFloat64 converts IEEE 754 binary16 bits.
func halfToFloat64(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	frac := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * math.Ldexp(frac, -24)
	case 0x1f:
		if frac != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * math.Ldexp(1024+frac, exp-25)
}

// decoder walks one message; it records the first error and turns every
// later call into a no-op, so field loops stay short.
type decoder struct {
	b   []byte
	msg string // message name for errors
	err error
}

func (d *decoder) next() (protowire.Number, protowire.Type, bool) {
	if d.err != nil || len(d.b) == 0 {
		return 0, 0, false
	}
	num, typ, n := protowire.ConsumeTag(d.b)
	if n < 0 {
		d.err = fmt.Errorf("%s: bad field tag: %v", d.msg, protowire.ParseError(n))
		return 0, 0, false
	}
	d.b = d.b[n:]
	return num, typ, true
}

func (d *decoder) want(num protowire.Number, typ, want protowire.Type) bool {
	if typ != want {
		d.err = fmt.Errorf("%s: field %d has wire type %d, want %d", d.msg, num, typ, want)
		return false
	}
	return true
}

func (d *decoder) consumed(num protowire.Number, n int) bool {
	if n < 0 {
		d.err = fmt.Errorf("%s: field %d: %v", d.msg, num, protowire.ParseError(n))
		return false
	}
	d.b = d.b[n:]
	return true
}

func (d *decoder) skip(num protowire.Number, typ protowire.Type) {
	d.consumed(num, protowire.ConsumeFieldValue(num, typ, d.b))
}

func (d *decoder) bytes(num protowire.Number, typ protowire.Type) []byte {
	if !d.want(num, typ, protowire.BytesType) {
		return nil
	}
	v, n := protowire.ConsumeBytes(d.b)
	if !d.consumed(num, n) {
		return nil
	}
	return v
}

func (d *decoder) varint(num protowire.Number, typ protowire.Type) uint64 {
	if !d.want(num, typ, protowire.VarintType) {
		return 0
	}
	v, n := protowire.ConsumeVarint(d.b)
	d.consumed(num, n)
	return v
}

func (d *decoder) fixed64(num protowire.Number, typ protowire.Type) uint64 {
	if !d.want(num, typ, protowire.Fixed64Type) {
		return 0
	}
	v, n := protowire.ConsumeFixed64(d.b)
	d.consumed(num, n)
	return v
}

func (d *decoder) fixed32(num protowire.Number, typ protowire.Type) uint32 {
	if !d.want(num, typ, protowire.Fixed32Type) {
		return 0
	}
	v, n := protowire.ConsumeFixed32(d.b)
	d.consumed(num, n)
	return v
}

// repeated reads one occurrence of a repeated scalar field, packed (one
// length-delimited run) or not (one element), calling elem per element.
func (d *decoder) repeated(num protowire.Number, typ, elemType protowire.Type, elem func([]byte) int) {
	if typ != protowire.BytesType {
		if d.want(num, typ, elemType) {
			d.consumed(num, elem(d.b))
		}
		return
	}
	run := d.bytes(num, typ)
	for len(run) > 0 && d.err == nil {
		n := elem(run)
		if n < 0 {
			d.err = fmt.Errorf("%s: packed field %d: %v", d.msg, num, protowire.ParseError(n))
			return
		}
		run = run[n:]
	}
}

// DecodeEvent parses a serialized Event. Fields it does not know are
// skipped; a known field with the wrong wire type is an error.
func DecodeEvent(b []byte) (Event, error) {
	var e Event
	d := decoder{b: b, msg: "event"}
	for num, typ, ok := d.next(); ok; num, typ, ok = d.next() {
		switch num {
		case fEventWallTime:
			e.WallTime = math.Float64frombits(d.fixed64(num, typ))
		case fEventStep:
			e.Step = int64(d.varint(num, typ))
		case fEventFileVersion:
			e.FileVersion = string(d.bytes(num, typ))
		case fEventSummary:
			sub := d.bytes(num, typ)
			if d.err == nil {
				vals, err := decodeSummary(sub)
				if err != nil {
					return Event{}, err
				}
				// Non-nil even when empty: the event had a summary.
				if e.Values == nil {
					e.Values = []Value{}
				}
				e.Values = append(e.Values, vals...)
			}
		default:
			d.skip(num, typ)
		}
	}
	return e, d.err
}

func decodeSummary(b []byte) ([]Value, error) {
	var vals []Value
	d := decoder{b: b, msg: "summary"}
	for num, typ, ok := d.next(); ok; num, typ, ok = d.next() {
		if num != fSummaryValue {
			d.skip(num, typ)
			continue
		}
		sub := d.bytes(num, typ)
		if d.err != nil {
			break
		}
		v, err := decodeValue(sub)
		if err != nil {
			return nil, err
		}
		vals = append(vals, v)
	}
	return vals, d.err
}

func decodeValue(b []byte) (Value, error) {
	var v Value
	d := decoder{b: b, msg: "summary value"}
	for num, typ, ok := d.next(); ok; num, typ, ok = d.next() {
		switch num {
		case fValueTag:
			v.Tag = string(d.bytes(num, typ))
		case fValueSimpleValue:
			v.Simple = math.Float32frombits(d.fixed32(num, typ))
			v.HasSimple, v.Tensor, v.Other = true, nil, false
		case fValueTensor:
			sub := d.bytes(num, typ)
			if d.err == nil {
				t, err := decodeTensor(sub)
				if err != nil {
					return Value{}, fmt.Errorf("tag %q: %w", v.Tag, err)
				}
				v.Tensor, v.HasSimple, v.Other = t, false, false
			}
		case fValueImage, fValueHisto, fValueAudio:
			d.skip(num, typ)
			v.Other, v.HasSimple, v.Tensor = true, false, nil
		case fValueMetadata:
			sub := d.bytes(num, typ)
			if d.err == nil {
				if err := decodeMetadata(sub, &v); err != nil {
					return Value{}, err
				}
			}
		default:
			d.skip(num, typ)
		}
	}
	return v, d.err
}

func decodeMetadata(b []byte, v *Value) error {
	d := decoder{b: b, msg: "summary metadata"}
	for num, typ, ok := d.next(); ok; num, typ, ok = d.next() {
		switch num {
		case fMetaPluginData:
			sub := d.bytes(num, typ)
			pd := decoder{b: sub, msg: "plugin data"}
			for pnum, ptyp, pok := pd.next(); pok; pnum, ptyp, pok = pd.next() {
				if pnum == fPluginName {
					v.Plugin = string(pd.bytes(pnum, ptyp))
				} else {
					pd.skip(pnum, ptyp)
				}
			}
			if pd.err != nil {
				return pd.err
			}
		case fMetaDataClass:
			v.DataClass = int32(d.varint(num, typ))
		default:
			d.skip(num, typ)
		}
	}
	return d.err
}

func decodeTensor(b []byte) (*Tensor, error) {
	t := &Tensor{}
	d := decoder{b: b, msg: "tensor"}
	for num, typ, ok := d.next(); ok; num, typ, ok = d.next() {
		switch num {
		case fTensorDType:
			t.DType = DataType(d.varint(num, typ))
		case fTensorShape:
			sub := d.bytes(num, typ)
			if d.err == nil {
				if err := decodeShape(sub, t); err != nil {
					return nil, err
				}
			}
		case fTensorContent:
			c := d.bytes(num, typ)
			t.Content = append([]byte{}, c...)
		case fTensorFloat:
			d.repeated(num, typ, protowire.Fixed32Type, func(b []byte) int {
				v, n := protowire.ConsumeFixed32(b)
				if n >= 0 {
					t.FloatVal = append(t.FloatVal, math.Float32frombits(v))
				}
				return n
			})
		case fTensorDouble:
			d.repeated(num, typ, protowire.Fixed64Type, func(b []byte) int {
				v, n := protowire.ConsumeFixed64(b)
				if n >= 0 {
					t.DoubleVal = append(t.DoubleVal, math.Float64frombits(v))
				}
				return n
			})
		case fTensorHalf:
			d.repeated(num, typ, protowire.VarintType, func(b []byte) int {
				v, n := protowire.ConsumeVarint(b)
				if n >= 0 {
					t.HalfVal = append(t.HalfVal, int32(v))
				}
				return n
			})
		default:
			d.skip(num, typ)
		}
	}
	return t, d.err
}

func decodeShape(b []byte, t *Tensor) error {
	d := decoder{b: b, msg: "tensor shape"}
	for num, typ, ok := d.next(); ok; num, typ, ok = d.next() {
		switch num {
		case fShapeDim:
			sub := d.bytes(num, typ)
			var size int64
			dd := decoder{b: sub, msg: "tensor shape dim"}
			for dnum, dtyp, dok := dd.next(); dok; dnum, dtyp, dok = dd.next() {
				if dnum == fDimSize {
					size = int64(dd.varint(dnum, dtyp))
				} else {
					dd.skip(dnum, dtyp)
				}
			}
			if dd.err != nil {
				return dd.err
			}
			t.Shape = append(t.Shape, size)
		case fShapeUnknownRank:
			t.UnknownRank = d.varint(num, typ) != 0
		default:
			d.skip(num, typ)
		}
	}
	return d.err
}
