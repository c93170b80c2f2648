package tensor

import (
	"encoding/binary"
	"math"
	"testing"
)

func TestHalfToFloat32(t *testing.T) {
	cases := []struct {
		bits uint16
		want float32
	}{
		{0x0000, 0}, {0x3c00, 1}, {0xc000, -2}, {0x7bff, 65504}, {0x0400, 1.0 / 16384},
		{0x0001, 1.0 / (1 << 24)}, {0x03ff, 1023.0 / (1 << 24)}, {0x7c00, float32(math.Inf(1))},
		{0xfc00, float32(math.Inf(-1))}, {0x3555, 0.333251953125},
	}
	for _, c := range cases {
		if got := HalfToFloat32(c.bits); got != c.want {
			t.Errorf("HalfToFloat32(%#04x) = %g, want %g", c.bits, got, c.want)
		}
	}
	if got := HalfToFloat32(0x7e00); !math.IsNaN(float64(got)) {
		t.Errorf("HalfToFloat32(0x7e00) = %g, want NaN", got)
	}
	if got := HalfToFloat32(0x8000); got != 0 || !math.Signbit(float64(got)) {
		t.Errorf("HalfToFloat32(0x8000) = %g, want -0", got)
	}
}

func TestFloat32s(t *testing.T) {
	le := binary.LittleEndian
	u16 := func(vs ...uint16) []byte {
		b := make([]byte, 2*len(vs))
		for i, v := range vs {
			le.PutUint16(b[2*i:], v)
		}
		return b
	}
	i64 := make([]byte, 16)
	le.PutUint64(i64, uint64(0xFFFFFFFFFFFFFFFD)) // -3
	le.PutUint64(i64[8:], 1<<40)
	f64 := make([]byte, 16)
	le.PutUint64(f64, math.Float64bits(1e300))
	le.PutUint64(f64[8:], math.Float64bits(-0.5))
	cases := []struct {
		dtype DType
		data  []byte
		want  []float32
	}{
		{Uint8, []byte{0, 255}, []float32{0, 255}},
		{Int8, []byte{0x80, 7}, []float32{-128, 7}},
		{Bool, []byte{1, 0}, []float32{1, 0}},
		{Float16, u16(0x3c00, 0xfbff), []float32{1, -65504}},
		{BFloat16, u16(0x3f80, 0xc2c8), []float32{1, -100}},
		{Int16, u16(0xffff, 300), []float32{-1, 300}},
		{Int64, i64, []float32{-3, 1 << 40}},
		{Float64, f64, []float32{float32(math.Inf(1)), -0.5}},
	}
	for _, c := range cases {
		tt := &Tensor{Name: "x", DType: c.dtype, Shape: []int64{2}, Data: c.data}
		got, err := tt.Float32s()
		if err != nil {
			t.Fatalf("%s: %v", c.dtype, err)
		}
		for i := range c.want {
			if got[i] != c.want[i] {
				t.Errorf("%s[%d] = %g, want %g", c.dtype, i, got[i], c.want[i])
			}
		}
	}
	bad := &Tensor{Name: "x", DType: Float32, Shape: []int64{3}, Data: make([]byte, 8)}
	if _, err := bad.Float32s(); err == nil {
		t.Error("3 float32 elements in 8 bytes: no error")
	}
	if _, err := (&Tensor{Name: "s", DType: String, Shape: []int64{1}}).Float32s(); err == nil {
		t.Error("string tensor converted without error")
	}
}
