package batch

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"fp16audit/internal/tensor"
)

func TestNPZRoundTrip(t *testing.T) {
	in := []*tensor.Tensor{
		tensor.FromFloat32s("pixel_values", []int64{1, 2}, []float32{1, -2}),
		{Name: "mask", DType: tensor.Int64, Shape: []int64{2}, Data: make([]byte, 16)},
		tensor.FromFloat32s("", []int64{}, []float32{9}),
	}
	for _, compress := range []bool{false, true} {
		b, err := EncodeNPZ(in, compress)
		if err != nil {
			t.Fatal(err)
		}
		zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		wantMethod := zip.Store
		if compress {
			wantMethod = zip.Deflate
		}
		if zr.File[0].Method != wantMethod {
			t.Errorf("compress=%v: method %d", compress, zr.File[0].Method)
		}
		out, err := DecodeNPZ(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, x := range out {
			names = append(names, x.Name)
		}
		if want := []string{"pixel_values", "mask", "arr_2"}; !slices.Equal(names, want) {
			t.Errorf("compress=%v: names %v, want %v (archive order)", compress, names, want)
		}
		for i, x := range out {
			if x.DType != in[i].DType || !slices.Equal(x.Shape, in[i].Shape) || !bytes.Equal(x.Data, in[i].Data) {
				t.Errorf("compress=%v: member %d differs", compress, i)
			}
		}
	}
	dup := []*tensor.Tensor{tensor.FromFloat32s("x", nil, []float32{1}), tensor.FromFloat32s("x", nil, []float32{2})}
	if _, err := EncodeNPZ(dup, false); err == nil {
		t.Error("duplicate names encoded without error")
	}
}

func TestNumpyNPZ(t *testing.T) {
	tests := []struct {
		file  string
		names []string
		want  [][]float32
	}{
		{"stored.npz", []string{"x", "mask"}, [][]float32{{0, 1, 2}, {1, 0, 1}}},
		{"deflated.npz", []string{"arr_0", "arr_1"}, [][]float32{{0, 1, 2, 3}, {1, 1, 1, 1}}},
	}
	for _, tc := range tests {
		ts, err := ReadNPZ(filepath.Join("testdata", "numpy", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		if len(ts) != len(tc.names) {
			t.Fatalf("%s: %d members", tc.file, len(ts))
		}
		for i, x := range ts {
			if x.Name != tc.names[i] || !slices.Equal(floats(t, x), tc.want[i]) {
				t.Errorf("%s: member %d = %s %v", tc.file, i, x.Name, floats(t, x))
			}
		}
	}
}

// rawZip builds a one-member archive whose header declares the given sizes,
// whatever the body really holds: the shape of a zip bomb or a corrupt file.
func rawZip(t *testing.T, name string, method uint16, body []byte, declared uint64, crc ...uint32) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var sum uint32 // zero: archive/zip skips the check
	if len(crc) > 0 {
		sum = crc[0]
	}
	w, err := zw.CreateRaw(&zip.FileHeader{
		Name: name, Method: method, CRC32: sum,
		CompressedSize64: uint64(len(body)), UncompressedSize64: declared,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(body); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func deflate(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	fw, _ := flate.NewWriter(&buf, flate.BestCompression)
	fw.Write(b)
	fw.Close()
	return buf.Bytes()
}

func TestDecodeNPZErrors(t *testing.T) {
	member, _ := EncodeNPY(tensor.FromFloat32s("", []int64{2}, []float32{1, 2}))
	// A header claiming a petabyte in a member that declares its real size.
	bomb := npyFile(1, hdr("<f4", "False", "(1048576, 1048576, 262144)"), nil)
	// Deflate of a megabyte of zeros is about a kilobyte; declaring a
	// terabyte for it is a lie no real deflate stream can back.
	zeros := deflate(t, make([]byte, 1<<20))
	var twoNames bytes.Buffer
	zw := zip.NewWriter(&twoNames)
	for range 2 {
		w, _ := zw.Create("x.npy")
		w.Write(member)
	}
	zw.Close()
	// A stored member whose CRC does not match its bytes.
	corrupt := rawZip(t, "x.npy", zip.Store, member, uint64(len(member)), 12345)

	tests := []struct {
		name string
		file []byte
		want string
	}{
		{"not a zip", []byte("hello"), "not an .npz archive"},
		{"non-npy member", rawZip(t, "notes.txt", zip.Store, []byte("hi"), 2), `npz member "notes.txt" is not a .npy array`},
		{"petabyte header", rawZip(t, "x.npy", zip.Store, bomb, uint64(len(bomb))), "truncated npy data"},
		{"declared beyond deflate ratio", rawZip(t, "x.npy", zip.Deflate, zeros, 1<<40), "more than"},
		{"stored size mismatch", rawZip(t, "x.npy", zip.Store, member, 1<<30), "stored member declares"},
		{"header beyond declared size", rawZip(t, "x.npy", zip.Deflate, deflate(t, member), uint64(len(member)-4)), "truncated npy data"},
		{"duplicate member", twoNames.Bytes(), "appears twice"},
		{"bad crc", corrupt, "checksum"},
		{"bzip2", rawZip(t, "x.npy", 12, member, uint64(len(member))), "compression method 12"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeNPZ(bytes.NewReader(tc.file), int64(len(tc.file)))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
