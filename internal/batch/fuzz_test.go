package batch

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"fp16audit/internal/tensor"
)

func FuzzDecodeNPY(f *testing.F) {
	f.Add(npyFile(1, hdr("<f4", "True", "(2, 3)"), le32f(0, 1, 2, 3, 4, 5)))
	f.Add(npyFile(3, hdr(">f2", "False", "()"), []byte{0x3c, 0}))
	f.Add(npyFile(2, hdr("|b1", "False", "(0, 4)"), nil))
	if b, err := os.ReadFile(filepath.Join("testdata", "numpy", "i2_be_fortran.npy")); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		x, err := DecodeNPY(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return
		}
		if n := tensor.NumElements(x.Shape) * int64(x.DType.Size()); n != int64(len(x.Data)) {
			t.Fatalf("shape %v of %s with %d bytes", x.Shape, x.DType, len(x.Data))
		}
		// A decoded array survives a round trip through EncodeNPY.
		b, err := EncodeNPY(x)
		if err != nil {
			t.Fatal(err)
		}
		y, err := DecodeNPY(bytes.NewReader(b), int64(len(b)))
		if err != nil || !bytes.Equal(x.Data, y.Data) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

func FuzzReadNPZ(f *testing.F) {
	for _, name := range []string{"stored.npz", "deflated.npz"} {
		if b, err := os.ReadFile(filepath.Join("testdata", "numpy", name)); err == nil {
			f.Add(b)
		}
	}
	if b, err := EncodeNPZ([]*tensor.Tensor{tensor.FromFloat32s("x", []int64{2}, []float32{1, 2})}, true); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ts, err := DecodeNPZ(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return
		}
		for _, x := range ts {
			if n := tensor.NumElements(x.Shape) * int64(x.DType.Size()); n != int64(len(x.Data)) {
				t.Fatalf("%s: shape %v of %s with %d bytes", x.Name, x.Shape, x.DType, len(x.Data))
			}
		}
	})
}
