package ortcapi

import (
	"fmt"
	"unsafe"
)

// NewTensorOf wraps a Go slice as a tensor of shape without copying.
func NewTensorOf[T float32 | float64 | int64 | int32 | uint8 | uint16](rt *Runtime, shape []int64, data []T) (*Value, error) {
	var zero T
	var t ElemType
	switch any(zero).(type) {
	case float32:
		t = Float32
	case float64:
		t = Float64
	case int64:
		t = Int64
	case int32:
		t = Int32
	case uint8:
		t = Uint8
	case uint16:
		t = Uint16
	}
	return rt.NewTensor(t, shape, unsafe.Pointer(unsafe.SliceData(data)), len(data)*int(unsafe.Sizeof(zero)))
}

// Elements returns the tensor's elements as a []T over its memory, after
// checking the element type; it is valid while v is.
func Elements[T float32 | float64 | int64](v *Value) ([]T, error) {
	t, shape, err := v.Info()
	if err != nil {
		return nil, err
	}
	var zero T
	var want ElemType
	switch any(zero).(type) {
	case float32:
		want = Float32
	case float64:
		want = Float64
	case int64:
		want = Int64
	}
	if t != want {
		return nil, fmt.Errorf("tensor of element type %d, want %d", t, want)
	}
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	if n == 0 {
		return []T{}, nil
	}
	p, err := v.Data()
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*T)(p), n), nil
}
