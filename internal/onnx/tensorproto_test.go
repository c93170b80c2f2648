package onnx

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"fp16audit/internal/tensor"
)

func le16(v ...uint16) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], x)
	}
	return b
}

func le32(v ...uint32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], x)
	}
	return b
}

func le64(v ...uint64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], x)
	}
	return b
}

func TestDecodeTensor(t *testing.T) {
	dt := func(d TensorProto_DataType) int32 { return int32(d) }
	tests := []struct {
		name  string
		in    *TensorProto
		dtype tensor.DType
		want  []byte
	}{
		{"float_data", &TensorProto{Dims: []int64{2}, DataType: dt(TensorProto_FLOAT), FloatData: []float32{1.5, -2}},
			tensor.Float32, le32(math.Float32bits(1.5), math.Float32bits(-2))},
		{"raw float", FloatTensor("w", []int64{1, 2}, []float32{3, 4}),
			tensor.Float32, le32(math.Float32bits(3), math.Float32bits(4))},
		{"double_data", &TensorProto{Dims: []int64{1}, DataType: dt(TensorProto_DOUBLE), DoubleData: []float64{0.25}},
			tensor.Float64, le64(math.Float64bits(0.25))},
		{"int64_data", &TensorProto{Dims: []int64{2}, DataType: dt(TensorProto_INT64), Int64Data: []int64{-1, 7}},
			tensor.Int64, le64(math.MaxUint64, 7)},
		{"int32_data int32", &TensorProto{Dims: []int64{2}, DataType: dt(TensorProto_INT32), Int32Data: []int32{-2, 5}},
			tensor.Int32, le32(0xfffffffe, 5)},
		{"int32_data int16", &TensorProto{Dims: []int64{2}, DataType: dt(TensorProto_INT16), Int32Data: []int32{-2, 300}},
			tensor.Int16, le16(0xfffe, 300)},
		{"int32_data uint16", &TensorProto{Dims: []int64{1}, DataType: dt(TensorProto_UINT16), Int32Data: []int32{65535}},
			tensor.Uint16, le16(65535)},
		{"int32_data int8", &TensorProto{Dims: []int64{2}, DataType: dt(TensorProto_INT8), Int32Data: []int32{-128, 127}},
			tensor.Int8, []byte{0x80, 0x7f}},
		{"int32_data uint8", &TensorProto{Dims: []int64{2}, DataType: dt(TensorProto_UINT8), Int32Data: []int32{0, 255}},
			tensor.Uint8, []byte{0, 255}},
		{"int32_data bool", &TensorProto{Dims: []int64{3}, DataType: dt(TensorProto_BOOL), Int32Data: []int32{0, 1, 1}},
			tensor.Bool, []byte{0, 1, 1}},
		{"int32_data float16 bits", &TensorProto{Dims: []int64{3}, DataType: dt(TensorProto_FLOAT16), Int32Data: []int32{0x3c00, 0x7bff, 0xfc00}},
			tensor.Float16, le16(0x3c00, 0x7bff, 0xfc00)},
		{"int32_data bfloat16 bits", &TensorProto{Dims: []int64{1}, DataType: dt(TensorProto_BFLOAT16), Int32Data: []int32{0x3f80}},
			tensor.BFloat16, le16(0x3f80)},
		{"uint64_data uint32", &TensorProto{Dims: []int64{1}, DataType: dt(TensorProto_UINT32), Uint64Data: []uint64{math.MaxUint32}},
			tensor.Uint32, le32(math.MaxUint32)},
		{"uint64_data uint64", &TensorProto{Dims: []int64{1}, DataType: dt(TensorProto_UINT64), Uint64Data: []uint64{math.MaxUint64}},
			tensor.Uint64, le64(math.MaxUint64)},
		{"raw float16", &TensorProto{Dims: []int64{2}, DataType: dt(TensorProto_FLOAT16), RawData: le16(0x7c00, 0x0001)},
			tensor.Float16, le16(0x7c00, 0x0001)},
		{"scalar", &TensorProto{DataType: dt(TensorProto_FLOAT), FloatData: []float32{2}},
			tensor.Float32, le32(math.Float32bits(2))},
		{"empty", &TensorProto{Dims: []int64{0, 3}, DataType: dt(TensorProto_FLOAT)},
			tensor.Float32, []byte{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeTensor(tc.in, "")
			if err != nil {
				t.Fatal(err)
			}
			if got.DType != tc.dtype || !bytes.Equal(got.Data, tc.want) || tensor.NumElements(got.Shape) != tensor.NumElements(tc.in.Dims) {
				t.Errorf("got %s %v % x, want %s %v % x", got.DType, got.Shape, got.Data, tc.dtype, tc.in.Dims, tc.want)
			}
		})
	}
}

func TestDecodeFloat16Values(t *testing.T) {
	in := &TensorProto{Name: "h", Dims: []int64{4}, DataType: int32(TensorProto_FLOAT16), Int32Data: []int32{0x3c00, 0x7bff, 0x0001, 0xc000}}
	got, err := DecodeTensor(in, "")
	if err != nil {
		t.Fatal(err)
	}
	f, err := got.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	want := []float32{1, 65504, 5.9604645e-8, -2}
	for i := range want {
		if f[i] != want[i] {
			t.Errorf("element %d = %g, want %g", i, f[i], want[i])
		}
	}
}

func TestDecodeTensorErrors(t *testing.T) {
	dt := func(d TensorProto_DataType) int32 { return int32(d) }
	tests := []struct {
		name string
		in   *TensorProto
		want string
	}{
		{"string", &TensorProto{Name: "s", Dims: []int64{1}, DataType: dt(TensorProto_STRING), StringData: [][]byte{[]byte("a")}},
			`tensor "s": element type STRING is not supported`},
		{"complex", &TensorProto{Name: "c", Dims: []int64{1}, DataType: dt(TensorProto_COMPLEX64), FloatData: []float32{1, 2}},
			"element type COMPLEX64 is not supported"},
		{"float8", &TensorProto{Name: "f8", Dims: []int64{1}, DataType: dt(TensorProto_FLOAT8E4M3FN), RawData: []byte{1}},
			"element type FLOAT8E4M3FN is not supported"},
		{"int4", &TensorProto{Name: "i4", Dims: []int64{2}, DataType: dt(TensorProto_INT4), RawData: []byte{1}},
			"element type INT4 is not supported"},
		{"undefined", &TensorProto{Name: "u", DataType: 0}, "element type UNDEFINED is not supported"},
		{"raw too short", &TensorProto{Name: "w", Dims: []int64{2, 2}, DataType: dt(TensorProto_FLOAT), RawData: make([]byte, 12)},
			`tensor "w": raw_data holds 12 bytes, want 16 (4 elements of FLOAT, shape [2 2])`},
		{"typed count", &TensorProto{Name: "w", Dims: []int64{3}, DataType: dt(TensorProto_FLOAT), FloatData: []float32{1, 2}},
			`tensor "w": float_data holds 2 values, want 3`},
		{"wrong field", &TensorProto{Name: "w", Dims: []int64{1}, DataType: dt(TensorProto_FLOAT), Int64Data: []int64{1}},
			"stored in the wrong field; want raw_data or float_data"},
		{"int8 range", &TensorProto{Name: "q", Dims: []int64{1}, DataType: dt(TensorProto_INT8), Int32Data: []int32{200}},
			"int32_data[0] = 200 is outside the INT8 range [-128, 127]"},
		{"negative dim", &TensorProto{Name: "w", Dims: []int64{-1}, DataType: dt(TensorProto_FLOAT)},
			"dim 0 is -1"},
		{"overflow", &TensorProto{Name: "w", Dims: []int64{1 << 40, 1 << 40}, DataType: dt(TensorProto_FLOAT)},
			"more elements than fit in int64"},
		{"segment", &TensorProto{Name: "w", Dims: []int64{1}, DataType: dt(TensorProto_FLOAT), Segment: &TensorProto_Segment{End: 1}},
			"segmented tensors are not supported"},
		{"unnamed", &TensorProto{Dims: []int64{1}, DataType: dt(TensorProto_FLOAT)},
			"tensor (unnamed): float_data holds 0 values, want 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeTensor(tc.in, "")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestDecodeExternal(t *testing.T) {
	dir := t.TempDir()
	payload := append([]byte("junkjunk"), le32(math.Float32bits(1), math.Float32bits(2))...)
	if err := os.WriteFile(filepath.Join(dir, "w.bin"), payload, 0o644); err != nil {
		t.Fatal(err)
	}
	in := ExternalTensor("w", TensorProto_FLOAT, []int64{2}, "w.bin", 8, 8)
	got, err := DecodeTensor(in, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Data, payload[8:]) {
		t.Errorf("data % x, want % x", got.Data, payload[8:])
	}
	in = ExternalTensor("w", TensorProto_FLOAT, []int64{2}, "w.bin", 12, -1)
	if _, err := DecodeTensor(in, dir); err == nil || !strings.Contains(err.Error(), "lies beyond the end") {
		t.Errorf("error = %v, want a range error", err)
	}
}

func TestEncodeTensor(t *testing.T) {
	src := &tensor.Tensor{Name: "x", DType: tensor.Float16, Shape: []int64{2}, Data: le16(0x3c00, 0x4000)}
	p := EncodeTensor(src)
	if p.GetDataType() != int32(TensorProto_FLOAT16) || p.GetName() != "x" {
		t.Fatalf("encoded %v", p)
	}
	back, err := DecodeTensor(p, "")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.Data, src.Data) || back.DType != src.DType || len(back.Shape) != 1 || back.Shape[0] != 2 {
		t.Errorf("round trip gave %+v, want %+v", back, src)
	}
}
