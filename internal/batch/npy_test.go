package batch

import (
	"bytes"
	"encoding/binary"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"fp16audit/internal/tensor"
)

// npyFile builds a .npy file by hand: magic, version, header length (u16 for
// 1.0, u32 otherwise), the header text verbatim, then data.
func npyFile(major byte, header string, data []byte) []byte {
	b := []byte("\x93NUMPY")
	b = append(b, major, 0)
	if major == 1 {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(header)))
	} else {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(header)))
	}
	b = append(b, header...)
	return append(b, data...)
}

func hdr(descr, fortran, shape string) string {
	return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }\n"
}

func le32f(vs ...float32) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

func be32f(vs ...float32) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.BigEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

func floats(t *testing.T, x *tensor.Tensor) []float32 {
	t.Helper()
	v, err := x.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestDecodeNPY(t *testing.T) {
	be16 := func(vs ...int16) []byte {
		var b []byte
		for _, v := range vs {
			b = binary.BigEndian.AppendUint16(b, uint16(v))
		}
		return b
	}
	le64 := func(vs ...int64) []byte {
		var b []byte
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint64(b, uint64(v))
		}
		return b
	}
	f8 := func(vs ...float64) []byte {
		var b []byte
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
		}
		return b
	}
	tests := []struct {
		name  string
		file  []byte
		dtype tensor.DType
		shape []int64
		want  []float32
	}{
		{"v1 f4 C", npyFile(1, hdr("<f4", "False", "(2, 3)"), le32f(0, 1, 2, 3, 4, 5)),
			tensor.Float32, []int64{2, 3}, []float32{0, 1, 2, 3, 4, 5}},
		{"v2 f4", npyFile(2, hdr("<f4", "False", "(2,)"), le32f(1.5, -2)),
			tensor.Float32, []int64{2}, []float32{1.5, -2}},
		{"v3 f4", npyFile(3, hdr("<f4", "False", "(1,)"), le32f(7)),
			tensor.Float32, []int64{1}, []float32{7}},
		{"big-endian f4", npyFile(1, hdr(">f4", "False", "(3,)"), be32f(1, -0.5, 65504)),
			tensor.Float32, []int64{3}, []float32{1, -0.5, 65504}},
		{"native = f4", npyFile(1, hdr("=f4", "False", "(1,)"), le32f(3)),
			tensor.Float32, []int64{1}, []float32{3}},
		{"no byte order f4", npyFile(1, hdr("f4", "False", "(1,)"), le32f(3)),
			tensor.Float32, []int64{1}, []float32{3}},
		// Fortran [[0,1,2],[3,4,5]] is stored column by column: 0 3 1 4 2 5.
		{"fortran 2x3", npyFile(1, hdr("<f4", "True", "(2, 3)"), le32f(0, 3, 1, 4, 2, 5)),
			tensor.Float32, []int64{2, 3}, []float32{0, 1, 2, 3, 4, 5}},
		// x[i,j,k] = 100i+10j+k for shape (2,2,3), stored with i fastest.
		{"fortran 2x2x3", npyFile(1, hdr("<f4", "True", "(2, 2, 3)"),
			le32f(0, 100, 10, 110, 1, 101, 11, 111, 2, 102, 12, 112)),
			tensor.Float32, []int64{2, 2, 3}, []float32{0, 1, 2, 10, 11, 12, 100, 101, 102, 110, 111, 112}},
		{"fortran 1-d", npyFile(1, hdr("<f4", "True", "(3,)"), le32f(1, 2, 3)),
			tensor.Float32, []int64{3}, []float32{1, 2, 3}},
		{"big-endian fortran i2", npyFile(1, hdr(">i2", "True", "(2, 2)"), be16(1, -3, 2, 4)),
			tensor.Int16, []int64{2, 2}, []float32{1, 2, -3, 4}},
		{"f2", npyFile(1, hdr("<f2", "False", "(2,)"), []byte{0x00, 0x3c, 0xff, 0x7b}),
			tensor.Float16, []int64{2}, []float32{1, 65504}},
		{"big-endian f2", npyFile(1, hdr(">f2", "False", "(1,)"), []byte{0xc0, 0x00}),
			tensor.Float16, []int64{1}, []float32{-2}},
		{"f8", npyFile(1, hdr("<f8", "False", "(2,)"), f8(0.25, -1e10)),
			tensor.Float64, []int64{2}, []float32{0.25, -1e10}},
		{"i1", npyFile(1, hdr("|i1", "False", "(2,)"), []byte{0xff, 5}),
			tensor.Int8, []int64{2}, []float32{-1, 5}},
		{"i4", npyFile(1, hdr("<i4", "False", "(1,)"), []byte{0xfe, 0xff, 0xff, 0xff}),
			tensor.Int32, []int64{1}, []float32{-2}},
		{"i8", npyFile(1, hdr("<i8", "False", "(2,)"), le64(-7, 1<<40)),
			tensor.Int64, []int64{2}, []float32{-7, 1 << 40}},
		{"u1", npyFile(1, hdr("|u1", "False", "(2,)"), []byte{0, 255}),
			tensor.Uint8, []int64{2}, []float32{0, 255}},
		{"u1 without order", npyFile(1, hdr("u1", "False", "(1,)"), []byte{9}),
			tensor.Uint8, []int64{1}, []float32{9}},
		{"u2 big-endian", npyFile(1, hdr(">u2", "False", "(1,)"), []byte{0x01, 0x02}),
			tensor.Uint16, []int64{1}, []float32{258}},
		{"u4", npyFile(1, hdr("<u4", "False", "(1,)"), []byte{0xff, 0xff, 0xff, 0xff}),
			tensor.Uint32, []int64{1}, []float32{4294967295}},
		{"u8", npyFile(1, hdr("<u8", "False", "(1,)"), le64(3)),
			tensor.Uint64, []int64{1}, []float32{3}},
		{"b1", npyFile(1, hdr("|b1", "False", "(3,)"), []byte{1, 0, 1}),
			tensor.Bool, []int64{3}, []float32{1, 0, 1}},
		{"bool ?", npyFile(1, hdr("?", "False", "(1,)"), []byte{1}),
			tensor.Bool, []int64{1}, []float32{1}},
		{"scalar", npyFile(1, hdr("<f4", "False", "()"), le32f(42)),
			tensor.Float32, []int64{}, []float32{42}},
		{"zero-size", npyFile(1, hdr("<f4", "False", "(0, 3)"), nil),
			tensor.Float32, []int64{0, 3}, []float32{}},
		{"zero-size huge other dim", npyFile(1, hdr("<f8", "False", "(0, 9223372036854775807)"), nil),
			tensor.Float64, []int64{0, math.MaxInt64}, []float32{}},
		{"fortran zero-size", npyFile(1, hdr("<f4", "True", "(2, 0)"), nil),
			tensor.Float32, []int64{2, 0}, []float32{}},
		{"python2 longs", npyFile(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1L, 2L), }", le32f(1, 2)),
			tensor.Float32, []int64{1, 2}, []float32{1, 2}},
		{"spacing and order", npyFile(1, "  {\"shape\":(2,),'fortran_order':False,\n\t'descr':'<f4'}   \n", le32f(1, 2)),
			tensor.Float32, []int64{2}, []float32{1, 2}},
		{"no trailing comma", npyFile(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1)}", le32f(5)),
			tensor.Float32, []int64{1, 1}, []float32{5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x, err := DecodeNPY(bytes.NewReader(tc.file), int64(len(tc.file)))
			if err != nil {
				t.Fatal(err)
			}
			if x.DType != tc.dtype || !slices.Equal(x.Shape, tc.shape) {
				t.Fatalf("got %s %v, want %s %v", x.DType, x.Shape, tc.dtype, tc.shape)
			}
			if got := floats(t, x); !slices.Equal(got, tc.want) {
				t.Errorf("values %v, want %v", got, tc.want)
			}
			// The same bytes through a reader of unknown size.
			y, err := DecodeNPY(bytes.NewReader(tc.file), -1)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(x.Data, y.Data) {
				t.Errorf("unknown-size decode differs")
			}
		})
	}
}

func TestDecodeNPYErrors(t *testing.T) {
	good := hdr("<f4", "False", "(2,)")
	tests := []struct {
		name string
		file []byte
		want string
	}{
		{"empty", nil, "not a .npy file"},
		{"bad magic", []byte("\x93NUMPZ\x01\x00\x00\x00"), "missing the \\x93NUMPY magic"},
		{"version 4", npyFile(4, good, le32f(1, 2)), "version 4.0 is not supported"},
		{"header longer than file", npyFile(1, good, nil)[:20], "npy header: claims"},
		{"truncated data", npyFile(1, good, le32f(1)), "truncated npy data: shape [2] of <f4 needs 8 bytes, the file holds 4"},
		{"trailing data", npyFile(1, good, le32f(1, 2, 3)), "4 unexpected bytes after"},
		{"complex", npyFile(1, hdr("<c8", "False", "(1,)"), make([]byte, 8)), "dtype '<c8' (complex64) is not supported; convert to float32"},
		{"complex128", npyFile(1, hdr("<c16", "False", "(1,)"), make([]byte, 16)), "(complex128)"},
		{"float128", npyFile(1, hdr("<f16", "False", "(1,)"), make([]byte, 16)), "dtype '<f16' (float128) is not supported"},
		{"object", npyFile(1, hdr("|O", "False", "(1,)"), make([]byte, 8)), "dtype '|O' (object; object arrays need pickle"},
		{"unicode", npyFile(1, hdr("<U5", "False", "(1,)"), make([]byte, 20)), "dtype '<U5' (unicode string"},
		{"datetime", npyFile(1, hdr("<M8[ns]", "False", "(1,)"), make([]byte, 8)), "dtype '<M8[ns]' (datetime64; convert to a number) is not supported"},
		{"bad dtype", npyFile(1, hdr("<q4", "False", "(1,)"), make([]byte, 4)), "dtype '<q4' is not supported (want f2, f4, f8"},
		{"empty dtype", npyFile(1, hdr("<", "False", "(1,)"), make([]byte, 4)), "dtype \"<\" is not a numpy dtype"},
		{"structured", npyFile(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", le32f(1)), "structured (record) dtypes are not supported"},
		{"missing shape", npyFile(1, "{'descr': '<f4', 'fortran_order': False}", nil), "missing key 'shape'"},
		{"missing descr", npyFile(1, "{'fortran_order': False, 'shape': ()}", nil), "missing key 'descr'"},
		{"extra key", npyFile(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}", le32f(1)), "unexpected key \"x\""},
		{"duplicate key", npyFile(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}", le32f(1)), "duplicate key"},
		{"shape list", npyFile(1, hdr("<f4", "False", "[2]"), le32f(1, 2)), "'shape' is a list, want a tuple of ints"},
		{"shape parenthesized int", npyFile(1, hdr("<f4", "False", "(2)"), le32f(1, 2)), "'shape' is an int"},
		{"negative dim", npyFile(1, hdr("<f4", "False", "(-1,)"), nil), "negative dimension"},
		{"float dim", npyFile(1, hdr("<f4", "False", "(2.0,)"), nil), "is not an int"},
		{"fortran not bool", npyFile(1, hdr("<f4", "0", "(2,)"), le32f(1, 2)), "'fortran_order' is an int"},
		{"not a dict", npyFile(1, "('<f4', False, (2,))", le32f(1, 2)), "header is not a dict"},
		{"unterminated", npyFile(1, "{'descr': '<f4", nil), "unterminated string"},
		{"garbage after dict", npyFile(1, hdr("<f4", "False", "(2,)")+"x", le32f(1, 2)), "after the header dict"},
		{"call", npyFile(1, "{'descr': dtype('f4'), 'fortran_order': False, 'shape': ()}", nil), "unexpected name \"dtype\""},
		{"dim overflow", npyFile(1, hdr("<f4", "False", "(99999999999999999999,)"), nil), "not a 64-bit int"},
		{"product overflow", npyFile(1, hdr("<f4", "False", "(4294967296, 4294967296)"), nil), "more elements than fit in 64 bits"},
		{"bytes overflow", npyFile(1, hdr("<f8", "False", "(4611686018427387904,)"), nil), "too large"},
		{"v3 invalid utf-8", npyFile(3, "{'descr': '<f4\xff', 'fortran_order': False, 'shape': ()}", nil), "not valid UTF-8"},
		{"deep nesting", npyFile(1, strings.Repeat("(", 100), nil), "nested too deeply"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeNPY(bytes.NewReader(tc.file), int64(len(tc.file)))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestDecodeNPYHugeHeaderRefused checks that a header claiming a petabyte is
// refused from the header alone: quickly and without allocating the data.
func TestDecodeNPYHugeHeaderRefused(t *testing.T) {
	file := npyFile(1, hdr("<f4", "False", "(1048576, 1048576, 262144)"), le32f(1, 2, 3))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	_, err := DecodeNPY(bytes.NewReader(file), int64(len(file)))
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "truncated npy data") {
		t.Fatalf("error %v, want truncated npy data", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Errorf("allocated %d bytes refusing a petabyte header", alloc)
	}
	if elapsed > time.Second {
		t.Errorf("took %v", elapsed)
	}
}

// TestDecodeNPYUnknownSizeLies checks that with no size to check against, a
// lying header costs at most one read chunk before the short data is found.
func TestDecodeNPYUnknownSizeLies(t *testing.T) {
	file := npyFile(1, hdr("<f4", "False", "(1048576, 1048576, 262144)"), le32f(1, 2, 3))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := DecodeNPY(bytes.NewReader(file), -1)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "truncated npy data") {
		t.Fatalf("error %v, want truncated npy data", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 2*readChunk {
		t.Errorf("allocated %d bytes", alloc)
	}
}

func TestEncodeNPYRoundTrip(t *testing.T) {
	tests := []*tensor.Tensor{
		tensor.FromFloat32s("a", []int64{2, 3}, []float32{1, 2, 3, 4, 5, -6}),
		tensor.FromFloat32s("s", []int64{}, []float32{3.5}),
		tensor.FromFloat32s("e", []int64{0, 4}, nil),
		{Name: "h", DType: tensor.Float16, Shape: []int64{2}, Data: []byte{0, 0x3c, 0xff, 0x7b}},
		{Name: "b", DType: tensor.Bool, Shape: []int64{2}, Data: []byte{1, 0}},
		{Name: "i", DType: tensor.Int64, Shape: []int64{1, 1}, Data: []byte{9, 0, 0, 0, 0, 0, 0, 0x80}},
		{Name: "u", DType: tensor.Uint8, Shape: []int64{3}, Data: []byte{0, 128, 255}},
		{Name: "d", DType: tensor.Float64, Shape: []int64{1}, Data: []byte{0, 0, 0, 0, 0, 0, 0xf0, 0x3f}},
	}
	for _, x := range tests {
		t.Run(x.Name, func(t *testing.T) {
			b, err := EncodeNPY(x)
			if err != nil {
				t.Fatal(err)
			}
			hlen := int(binary.LittleEndian.Uint16(b[8:10]))
			if b[6] != 1 || b[7] != 0 || (10+hlen)%64 != 0 || b[10+hlen-1] != '\n' {
				t.Errorf("header not v1.0 padded to 64 bytes with a newline: %q", b[:10+hlen])
			}
			y, err := DecodeNPY(bytes.NewReader(b), int64(len(b)))
			if err != nil {
				t.Fatal(err)
			}
			if y.DType != x.DType || !slices.Equal(y.Shape, x.Shape) || !bytes.Equal(y.Data, x.Data) {
				t.Errorf("round trip gave %s %v %v, want %s %v %v", y.DType, y.Shape, y.Data, x.DType, x.Shape, x.Data)
			}
		})
	}
	if _, err := EncodeNPY(&tensor.Tensor{Name: "bf", DType: tensor.BFloat16, Shape: []int64{1}, Data: []byte{0, 0}}); err == nil {
		t.Error("bfloat16 encoded without error")
	}
	if _, err := EncodeNPY(&tensor.Tensor{Name: "short", DType: tensor.Float32, Shape: []int64{2}, Data: []byte{0}}); err == nil {
		t.Error("short data encoded without error")
	}
}

// TestNumpyFixtures reads files written by numpy itself (testdata/numpy/gen.py).
func TestNumpyFixtures(t *testing.T) {
	fortran := make([]float32, 24)
	for i := range fortran {
		fortran[i] = float32(i - 5)
	}
	tests := []struct {
		file  string
		dtype tensor.DType
		shape []int64
		want  []float32
	}{
		{"f4_c.npy", tensor.Float32, []int64{2, 3}, []float32{0, 0.25, 0.5, 0.75, 1, 1.25}},
		{"i2_be_fortran.npy", tensor.Int16, []int64{2, 3, 4}, fortran},
		{"f8_v2.npy", tensor.Float64, []int64{5}, []float32{0, 1.5, 3, 4.5, 6}},
		{"u1_v3.npy", tensor.Uint8, []int64{2, 2}, []float32{0, 1, 2, 3}},
		{"b1.npy", tensor.Bool, []int64{3}, []float32{1, 0, 1}},
		{"f2_scalar.npy", tensor.Float16, []int64{}, []float32{2.5}},
		{"f4_empty.npy", tensor.Float32, []int64{0, 3}, []float32{}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			x, err := ReadNPY(filepath.Join("testdata", "numpy", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if x.Name != strings.TrimSuffix(tc.file, ".npy") {
				t.Errorf("name %q", x.Name)
			}
			if x.DType != tc.dtype || !slices.Equal(x.Shape, tc.shape) {
				t.Fatalf("got %s %v, want %s %v", x.DType, x.Shape, tc.dtype, tc.shape)
			}
			if got := floats(t, x); !slices.Equal(got, tc.want) {
				t.Errorf("values %v, want %v", got, tc.want)
			}
		})
	}
	path := filepath.Join("testdata", "numpy", "c8.npy")
	_, err := ReadNPY(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+": ") || !strings.Contains(err.Error(), "dtype '<c8' (complex64) is not supported; convert to float32") {
		t.Errorf("complex64 file: error %v", err)
	}
	_, err = ReadNPY("testdata/missing.npy")
	if err == nil || !strings.HasPrefix(err.Error(), "testdata/missing.npy: ") {
		t.Errorf("missing file: error %v", err)
	}
}

func TestFloat32ToHalf(t *testing.T) {
	// Every finite half converts to float32 and back exactly.
	for h := range 1 << 16 {
		f := tensor.HalfToFloat32(uint16(h))
		if f != f {
			continue
		}
		if got := float32ToHalf(f); got != uint16(h) {
			t.Fatalf("half %#04x -> %v -> %#04x", h, f, got)
		}
	}
	tests := []struct {
		f    float32
		want uint16
	}{
		{65519, 0x7bff},                    // rounds down to max
		{65520, 0x7c00},                    // rounds to Inf
		{1 + 1.0/2048, 0x3c00},             // tie to even (down)
		{1 + 3.0/2048, 0x3c02},             // tie to even (up)
		{float32(math.Ldexp(1, -25)), 0},   // tie to even: zero
		{float32(math.Ldexp(1.5, -25)), 1}, // above the tie: smallest subnormal
		{float32(math.Inf(-1)), 0xfc00},
	}
	for _, tc := range tests {
		if got := float32ToHalf(tc.f); got != tc.want {
			t.Errorf("float32ToHalf(%v) = %#04x, want %#04x", tc.f, got, tc.want)
		}
	}
}
