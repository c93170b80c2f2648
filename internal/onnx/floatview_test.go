package onnx

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// bf16File writes vals as bfloat16 (truncated) into dir/w.data after pad
// bytes and returns the external BFLOAT16 tensor over them.
func bf16File(t *testing.T, dir string, pad int, vals []float32) *TensorProto {
	t.Helper()
	buf := make([]byte, pad+2*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint16(buf[pad+2*i:], uint16(math.Float32bits(v)>>16))
	}
	if err := os.WriteFile(filepath.Join(dir, "w.data"), buf, 0o644); err != nil {
		t.Fatal(err)
	}
	return &TensorProto{Name: "W", DataType: int32(TensorProto_BFLOAT16), Dims: []int64{2, int64(len(vals) / 2)}, DataLocation: TensorProto_EXTERNAL,
		ExternalData: []*StringStringEntryProto{{Key: "location", Value: "w.data"}, {Key: "offset", Value: "8"}, {Key: "length", Value: "8"}}}
}

// TestFloatView: the FLOAT view of a bf16 weight in an external file reads
// the same bytes (its range is the stored one), decodes to their float32
// values, passes the model's external-data check, leaves the tensor it
// was made from as it was, and is refused by the scan of a model's own
// tensors.
func TestFloatView(t *testing.T) {
	dir := t.TempDir()
	vals := []float32{1.5, -2, 65536, 0.25}
	w := bf16File(t, dir, 8, vals)
	v := FloatView(w)
	if v.GetDataType() != int32(TensorProto_FLOAT) || StoredAs(v) != int32(TensorProto_BFLOAT16) || StoredAs(w) != w.GetDataType() {
		t.Fatalf("view type %d stored as %d; the tensor's own %d", v.GetDataType(), StoredAs(v), StoredAs(w))
	}
	if len(w.ExternalData) != 3 {
		t.Errorf("the bf16 tensor was changed: %v", w.ExternalData)
	}
	if TensorBytes(v) != 16 {
		t.Errorf("TensorBytes of the view = %d, want its fp32 size 16", TensorBytes(v))
	}
	_, off, n, err := ExternalRange(v, dir)
	if err != nil || off != 8 || n != 8 {
		t.Fatalf("ExternalRange = %d, %d, %v; want the stored 8 bytes at 8", off, n, err)
	}
	d, err := DecodeTensor(v, dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	for i := range vals {
		if got[i] != vals[i] {
			t.Errorf("element %d = %g, want %g", i, got[i], vals[i])
		}
	}
	m := &ModelProto{Graph: &GraphProto{Initializer: []*TensorProto{v}}}
	if err := CheckExternalData(m, dir); err != nil {
		t.Errorf("CheckExternalData: %v", err)
	}
	if err := ScanExternal(v, dir, func([]byte) {}); err == nil || !strings.Contains(err.Error(), "view") {
		t.Errorf("ScanExternal of a view: %v, want a refusal", err)
	}
}
