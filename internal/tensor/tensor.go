// Package tensor holds the dense tensors that flow between batch files, ONNX
// Runtime and the statistics: an element type, a shape and the elements as
// little-endian bytes in row-major (C) order. Every batch format (package
// batch) and every ONNX tensor (package onnx) arrives in this one layout.
package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
)

// DType is an element type, numbered as ONNX's TensorProto.DataType.
type DType int32

// Element types fp16audit reads and passes to ONNX Runtime.
const (
	Undefined DType = 0
	Float32   DType = 1
	Uint8     DType = 2
	Int8      DType = 3
	Uint16    DType = 4
	Int16     DType = 5
	Int32     DType = 6
	Int64     DType = 7
	String    DType = 8
	Bool      DType = 9
	Float16   DType = 10
	Float64   DType = 11
	Uint32    DType = 12
	Uint64    DType = 13
	BFloat16  DType = 16
)

var dtypeNames = map[DType]string{
	Float32: "float32", Uint8: "uint8", Int8: "int8", Uint16: "uint16",
	Int16: "int16", Int32: "int32", Int64: "int64", String: "string",
	Bool: "bool", Float16: "float16", Float64: "float64", Uint32: "uint32",
	Uint64: "uint64", BFloat16: "bfloat16",
}

// String returns the numpy-style name of d, such as "float32".
func (d DType) String() string {
	if s, ok := dtypeNames[d]; ok {
		return s
	}
	return fmt.Sprintf("dtype(%d)", int32(d))
}

// Size returns the number of bytes of one element, or 0 for types without a
// fixed size (string) and types fp16audit does not handle.
func (d DType) Size() int {
	switch d {
	case Uint8, Int8, Bool:
		return 1
	case Uint16, Int16, Float16, BFloat16:
		return 2
	case Float32, Int32, Uint32:
		return 4
	case Float64, Int64, Uint64:
		return 8
	}
	return 0
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool {
	return d == Float32 || d == Float16 || d == Float64 || d == BFloat16
}

// Tensor is a dense tensor. Data holds Elements()*DType.Size() bytes,
// little-endian, row-major.
type Tensor struct {
	Name  string
	DType DType
	Shape []int64
	Data  []byte
}

// Elements returns the product of the shape (1 for a scalar).
func (t *Tensor) Elements() int64 { return NumElements(t.Shape) }

// NumElements returns the product of shape, 1 for an empty shape.
func NumElements(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// ShapeString formats a shape as [2,3,4].
func ShapeString(shape []int64) string {
	parts := make([]string, len(shape))
	for i, d := range shape {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// Float32s returns the elements converted to float32. Float32 data is
// reinterpreted without conversion cost beyond one copy; other numeric types
// are converted element by element.
func (t *Tensor) Float32s() ([]float32, error) {
	n := int(t.Elements())
	if t.DType.Size() == 0 {
		return nil, fmt.Errorf("tensor %q: cannot convert %s to float32", t.Name, t.DType)
	}
	if len(t.Data) != n*t.DType.Size() {
		return nil, fmt.Errorf("tensor %q: %d bytes for %d elements of %s", t.Name, len(t.Data), n, t.DType)
	}
	out := make([]float32, n)
	d := t.Data
	le := binary.LittleEndian
	for i := range out {
		switch t.DType {
		case Float32:
			out[i] = math.Float32frombits(le.Uint32(d[4*i:]))
		case Float64:
			out[i] = float32(math.Float64frombits(le.Uint64(d[8*i:])))
		case Float16:
			out[i] = HalfToFloat32(le.Uint16(d[2*i:]))
		case BFloat16:
			out[i] = math.Float32frombits(uint32(le.Uint16(d[2*i:])) << 16)
		case Uint8, Bool:
			out[i] = float32(d[i])
		case Int8:
			out[i] = float32(int8(d[i]))
		case Uint16:
			out[i] = float32(le.Uint16(d[2*i:]))
		case Int16:
			out[i] = float32(int16(le.Uint16(d[2*i:])))
		case Int32:
			out[i] = float32(int32(le.Uint32(d[4*i:])))
		case Uint32:
			out[i] = float32(le.Uint32(d[4*i:]))
		case Int64:
			out[i] = float32(int64(le.Uint64(d[8*i:])))
		case Uint64:
			out[i] = float32(le.Uint64(d[8*i:]))
		}
	}
	return out, nil
}

// Int64s returns the elements of an int64 tensor.
func (t *Tensor) Int64s() ([]int64, error) {
	if t.DType != Int64 || len(t.Data)%8 != 0 {
		return nil, fmt.Errorf("tensor %q: want int64 data, got %s (%d bytes)", t.Name, t.DType, len(t.Data))
	}
	out := make([]int64, len(t.Data)/8)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(t.Data[8*i:]))
	}
	return out, nil
}

// FromInt64s builds an int64 tensor from values.
func FromInt64s(name string, shape []int64, values []int64) *Tensor {
	data := make([]byte, 8*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint64(data[8*i:], uint64(v))
	}
	return &Tensor{Name: name, DType: Int64, Shape: shape, Data: data}
}

// FromFloat32s builds a float32 tensor from values.
func FromFloat32s(name string, shape []int64, values []float32) *Tensor {
	data := make([]byte, 4*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	return &Tensor{Name: name, DType: Float32, Shape: append([]int64(nil), shape...), Data: data}
}

// HalfToFloat32 converts IEEE 754 binary16 bits to float32.
func HalfToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		// Subnormal half: value = mant * 2^-24.
		f := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}
