package onnxrt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

func marshal(t *testing.T, g *onnx.GraphProto) []byte {
	t.Helper()
	b, err := proto.Marshal(onnx.NewModel(g, 17))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newSession(t *testing.T, model []byte, in, out []string, opt SessionOptions) *Session {
	t.Helper()
	requireORT(t)
	s, err := NewSession(model, in, out, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func f32(name string, shape []int64, v ...float32) *tensor.Tensor {
	return tensor.FromFloat32s(name, shape, v)
}

func wantFloats(t *testing.T, got *tensor.Tensor, shape []int64, want ...float32) {
	t.Helper()
	if got.DType != tensor.Float32 {
		t.Fatalf("%s: dtype %s, want float32", got.Name, got.DType)
	}
	if tensor.ShapeString(got.Shape) != tensor.ShapeString(shape) {
		t.Errorf("%s: shape %s, want %s", got.Name, tensor.ShapeString(got.Shape), tensor.ShapeString(shape))
	}
	if !bytes.Equal(got.Data, f32("", shape, want...).Data) {
		t.Errorf("%s: got %v, want %v", got.Name, Float32View(got), want)
	}
}

// addReluMatMul computes relu(x + y) @ w with w = [[1, 2], [3, 4], [5, 6]].
func addReluMatMul(t *testing.T) []byte {
	return marshal(t, &onnx.GraphProto{
		Name: "add_relu_matmul",
		Node: []*onnx.NodeProto{
			onnx.Node("Add", "add", []string{"x", "y"}, []string{"s"}),
			onnx.Node("Relu", "relu", []string{"s"}, []string{"r"}),
			onnx.Node("MatMul", "mm", []string{"r", "w"}, []string{"z"}),
		},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("w", []int64{3, 2}, []float32{1, 2, 3, 4, 5, 6})},
		Input: []*onnx.ValueInfoProto{
			onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, "batch", 3),
			onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, "batch", 3),
		},
		Output: []*onnx.ValueInfoProto{
			onnx.TensorValueInfo("z", onnx.TensorProto_FLOAT, "batch", 2),
			onnx.TensorValueInfo("r", onnx.TensorProto_FLOAT, "batch", 3),
		},
	})
}

func TestRunAddReluMatMul(t *testing.T) {
	s := newSession(t, addReluMatMul(t), []string{"x", "y"}, []string{"z", "r"}, SessionOptions{Threads: 1})
	out, err := s.Run([]*tensor.Tensor{
		f32("x", []int64{2, 3}, 1, -2, 3, 0.5, 0.25, -8),
		f32("y", []int64{2, 3}, 1, 1, 1, 0.5, 0.25, 1),
	})
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Name != "z" || out[1].Name != "r" {
		t.Errorf("outputs named %q, %q; want z, r", out[0].Name, out[1].Name)
	}
	// r = [[2, 0, 4], [1, 0.5, 0]]; every product and sum is exact in float32.
	wantFloats(t, out[1], []int64{2, 3}, 2, 0, 4, 1, 0.5, 0)
	wantFloats(t, out[0], []int64{2, 2}, 22, 28, 2.5, 4)
}

// elements encodes values as little-endian elements of d.
func elements(d tensor.DType, values []float64) []byte {
	b := make([]byte, len(values)*d.Size())
	le := binary.LittleEndian
	for i, v := range values {
		switch d {
		case tensor.Float32:
			le.PutUint32(b[4*i:], math.Float32bits(float32(v)))
		case tensor.Float64:
			le.PutUint64(b[8*i:], math.Float64bits(v))
		case tensor.Int64, tensor.Uint64:
			le.PutUint64(b[8*i:], uint64(int64(v)))
		case tensor.Int32, tensor.Uint32:
			le.PutUint32(b[4*i:], uint32(int32(v)))
		case tensor.Int16, tensor.Uint16:
			le.PutUint16(b[2*i:], uint16(int16(v)))
		case tensor.Int8, tensor.Uint8, tensor.Bool:
			b[i] = byte(int8(v))
		case tensor.Float16, tensor.BFloat16:
			le.PutUint16(b[2*i:], uint16(v)) // values are the bits
		}
	}
	return b
}

// TestRunEveryDType feeds each element type through Identity (output in the
// same type, bits unchanged) and Cast to float (output float32).
func TestRunEveryDType(t *testing.T) {
	half := func(bits ...uint16) ([]float64, []float32) {
		var v []float64
		var f []float32
		for _, b := range bits {
			v = append(v, float64(b))
			f = append(f, tensor.HalfToFloat32(b))
		}
		return v, f
	}
	bhalf := func(bits ...uint16) ([]float64, []float32) {
		var v []float64
		var f []float32
		for _, b := range bits {
			v = append(v, float64(b))
			f = append(f, math.Float32frombits(uint32(b)<<16))
		}
		return v, f
	}
	same := func(v ...float64) ([]float64, []float32) {
		f := make([]float32, len(v))
		for i, x := range v {
			f[i] = float32(x)
		}
		return v, f
	}
	// float16 bits: 1.5, -2, 65504 (max), 2^-14 (smallest normal), 2^-24
	// (smallest subnormal), +Inf.
	h16, h16f := half(0x3e00, 0xc000, 0x7bff, 0x0400, 0x0001, 0x7c00)
	// bfloat16 bits: 1.5, -2, 3.39e38 (max), 1e-38-ish, 65536, -Inf.
	b16, b16f := bhalf(0x3fc0, 0xc000, 0x7f7f, 0x0080, 0x4780, 0xff80)
	tests := []struct {
		dtype  tensor.DType
		onnx   onnx.TensorProto_DataType
		values []float64
		floats []float32
		// identity is the Identity output's dtype: float64 comes back as
		// float32.
		identity tensor.DType
	}{
		{dtype: tensor.Float32, onnx: onnx.TensorProto_FLOAT, identity: tensor.Float32},
		{dtype: tensor.Float64, onnx: onnx.TensorProto_DOUBLE, identity: tensor.Float32},
		{dtype: tensor.Int64, onnx: onnx.TensorProto_INT64, identity: tensor.Int64},
		{dtype: tensor.Int32, onnx: onnx.TensorProto_INT32, identity: tensor.Int32},
		{dtype: tensor.Int16, onnx: onnx.TensorProto_INT16, identity: tensor.Int16},
		{dtype: tensor.Int8, onnx: onnx.TensorProto_INT8, identity: tensor.Int8},
		{dtype: tensor.Uint8, onnx: onnx.TensorProto_UINT8, identity: tensor.Uint8},
		{dtype: tensor.Bool, onnx: onnx.TensorProto_BOOL, identity: tensor.Bool},
		{dtype: tensor.Float16, onnx: onnx.TensorProto_FLOAT16, identity: tensor.Float16},
		{dtype: tensor.BFloat16, onnx: onnx.TensorProto_BFLOAT16, identity: tensor.BFloat16},
	}
	for _, tt := range tests {
		switch tt.dtype {
		case tensor.Float16:
			tt.values, tt.floats = h16, h16f
		case tensor.BFloat16:
			tt.values, tt.floats = b16, b16f
		case tensor.Float32, tensor.Float64:
			tt.values, tt.floats = same(1.5, -2, 0.1, 1e30, -0, 3)
		case tensor.Uint8:
			tt.values, tt.floats = same(0, 1, 2, 127, 200-256, 255-256)
			tt.floats = []float32{0, 1, 2, 127, 200, 255}
		case tensor.Bool:
			tt.values, tt.floats = same(0, 1, 1, 0, 1, 0)
		default:
			tt.values, tt.floats = same(0, 1, -2, 127, -128, 100)
		}
		t.Run(tt.dtype.String(), func(t *testing.T) {
			model := marshal(t, &onnx.GraphProto{
				Name: "identity_cast",
				Node: []*onnx.NodeProto{
					onnx.Node("Identity", "id", []string{"x"}, []string{"same"}),
					onnx.Node("Cast", "cast", []string{"x"}, []string{"float"}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT))),
				},
				Input: []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", tt.onnx, "n", 3)},
				Output: []*onnx.ValueInfoProto{
					onnx.TensorValueInfo("same", tt.onnx, "n", 3),
					onnx.TensorValueInfo("float", onnx.TensorProto_FLOAT, "n", 3),
				},
			})
			s := newSession(t, model, []string{"x"}, []string{"same", "float"}, SessionOptions{})
			in := &tensor.Tensor{Name: "x", DType: tt.dtype, Shape: []int64{2, 3}, Data: elements(tt.dtype, tt.values)}
			out, err := s.Run([]*tensor.Tensor{in})
			if err != nil {
				t.Fatal(err)
			}
			id := out[0]
			want := in.Data
			if tt.dtype == tensor.Float64 {
				want = f32("", nil, tt.floats...).Data
			}
			if id.DType != tt.identity || !bytes.Equal(id.Data, want) || tensor.ShapeString(id.Shape) != "[2,3]" {
				t.Errorf("Identity: got %s %s % x, want %s [2,3] % x", id.DType, tensor.ShapeString(id.Shape), id.Data, tt.identity, want)
			}
			wantFloats(t, out[1], []int64{2, 3}, tt.floats...)
		})
	}
}

// TestFloat16Output measures the float16 rounding ONNX Runtime's Cast does
// at the edge of the range, through a preallocated float16 output whose
// symbolic batch size comes from the input.
func TestFloat16Output(t *testing.T) {
	model := marshal(t, &onnx.GraphProto{
		Name: "to_half",
		Node: []*onnx.NodeProto{
			onnx.Node("Cast", "h", []string{"x"}, []string{"h"}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT16))),
			onnx.Node("Cast", "b", []string{"x"}, []string{"b"}, onnx.AttrInt("to", int64(onnx.TensorProto_BFLOAT16))),
		},
		Input: []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, "batch", 4)},
		Output: []*onnx.ValueInfoProto{
			onnx.TensorValueInfo("h", onnx.TensorProto_FLOAT16, "batch", 4),
			onnx.TensorValueInfo("b", onnx.TensorProto_BFLOAT16, "batch", 4),
		},
	})
	s := newSession(t, model, []string{"x"}, []string{"h", "b"}, SessionOptions{})
	out, err := s.Run([]*tensor.Tensor{f32("x", []int64{2, 4}, 65504, 65519, 65520, 70000, -1e9, 1, 6e-8, 2e-8)})
	if err != nil {
		t.Fatal(err)
	}
	h := out[0]
	if h.DType != tensor.Float16 || tensor.ShapeString(h.Shape) != "[2,4]" {
		t.Fatalf("h: %s %s, want float16 [2,4]", h.DType, tensor.ShapeString(h.Shape))
	}
	// 65519 rounds down to max, 65520 and up overflow, -1e9 is -Inf, 6e-8
	// is the smallest subnormal, 2e-8 flushes to 0.
	wantH := []uint16{0x7bff, 0x7bff, 0x7c00, 0x7c00, 0xfc00, 0x3c00, 0x0001, 0x0000}
	for i, w := range wantH {
		if g := binary.LittleEndian.Uint16(h.Data[2*i:]); g != w {
			t.Errorf("h[%d] = %#04x, want %#04x", i, g, w)
		}
	}
	b := out[1]
	if b.DType != tensor.BFloat16 || len(b.Data) != 16 {
		t.Fatalf("b: %s with %d bytes, want bfloat16 with 16", b.DType, len(b.Data))
	}
	// bfloat16 keeps the range: 70000 stays finite (rounded to 70144).
	if g := math.Float32frombits(uint32(binary.LittleEndian.Uint16(b.Data[6:])) << 16); g != 70144 {
		t.Errorf("bfloat16(70000) = %v, want 70144", g)
	}
}

func TestFloat16OutputOfUnknownShape(t *testing.T) {
	model := marshal(t, &onnx.GraphProto{
		Name:  "to_half",
		Node:  []*onnx.NodeProto{onnx.Node("Cast", "h", []string{"x"}, []string{"h"}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT16)))},
		Input: []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, "batch", 4)},
		// An intermediate marked as output carries its element type only.
		Output: []*onnx.ValueInfoProto{{Name: "h", Type: &onnx.TypeProto{Value: &onnx.TypeProto_TensorType{
			TensorType: &onnx.TypeProto_Tensor{ElemType: int32(onnx.TensorProto_FLOAT16)}}}}},
	})
	s := newSession(t, model, []string{"x"}, []string{"h"}, SessionOptions{})
	_, err := s.Run([]*tensor.Tensor{f32("x", []int64{1, 4}, 1, 2, 3, 4)})
	if err == nil || !strings.Contains(err.Error(), "cast it to float in the graph") || !strings.Contains(err.Error(), `"h"`) {
		t.Errorf("want an error naming output h and the fix, got %v", err)
	}
}

func TestScalars(t *testing.T) {
	model := marshal(t, &onnx.GraphProto{
		Name: "scalars",
		Node: []*onnx.NodeProto{
			onnx.Node("Add", "add", []string{"x", "bias"}, []string{"y"}),
			onnx.Node("ReduceSum", "sum", []string{"y"}, []string{"total"}, onnx.AttrInt("keepdims", 0)),
		},
		Input: []*onnx.ValueInfoProto{
			onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 3),
			onnx.TensorValueInfo("bias", onnx.TensorProto_FLOAT),
		},
		Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("total", onnx.TensorProto_FLOAT)},
	})
	s := newSession(t, model, []string{"x", "bias"}, []string{"total"}, SessionOptions{})
	out, err := s.Run([]*tensor.Tensor{f32("x", []int64{3}, 1, 2, 3), f32("bias", []int64{}, 0.5)})
	if err != nil {
		t.Fatal(err)
	}
	wantFloats(t, out[0], []int64{}, 7.5)
}

func TestConcurrentRuns(t *testing.T) {
	s := newSession(t, addReluMatMul(t), []string{"x", "y"}, []string{"z", "r"}, SessionOptions{Threads: 2})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				a := float32(g*100 + i)
				out, err := s.Run([]*tensor.Tensor{f32("x", []int64{1, 3}, a, 1, -a-5), f32("y", []int64{1, 3}, 1, 1, 1)})
				if err != nil {
					errs <- err
					return
				}
				// r = [a+1, 2, 0], so z = [a+7, 2(a+1)+8].
				want := f32("", []int64{1, 2}, a+7, 2*(a+1)+8).Data
				if !bytes.Equal(out[0].Data, want) {
					errs <- fmt.Errorf("goroutine %d run %d: got %v, want %v", g, i, Float32View(out[0]), []float32{a + 7, 2*(a+1) + 8})
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// rss returns the resident set size of the process in bytes.
func rss(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return pages * int64(os.Getpagesize())
}

func TestRunDoesNotLeak(t *testing.T) {
	s := newSession(t, addReluMatMul(t), []string{"x", "y"}, []string{"z", "r"}, SessionOptions{Threads: 1})
	const rows = 16384 // 192 KiB per input, 192 + 128 KiB of outputs per run
	x := f32("x", []int64{rows, 3}, make([]float32, 3*rows)...)
	half := &tensor.Tensor{DType: tensor.Float16, Shape: []int64{rows, 3}, Data: make([]byte, 6*rows)}
	hs := newSession(t, marshal(t, &onnx.GraphProto{
		Name:   "half",
		Node:   []*onnx.NodeProto{onnx.Node("Identity", "id", []string{"x"}, []string{"y"})},
		Input:  []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT16, "n", 3)},
		Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT16, "n", 3)},
	}), []string{"x"}, []string{"y"}, SessionOptions{Threads: 1})
	run := func(n int) {
		for range n {
			if _, err := s.Run([]*tensor.Tensor{x, x}); err != nil {
				t.Fatal(err)
			}
			if _, err := hs.Run([]*tensor.Tensor{half}); err != nil {
				t.Fatal(err)
			}
		}
		goruntime.GC()
	}
	run(100)
	before := rss(t)
	run(1000)
	grown := rss(t) - before
	t.Logf("RSS grew %d KiB over 1000 runs", grown>>10)
	// A leaked output would be 320 MiB.
	if grown > 48<<20 {
		t.Errorf("RSS grew %d MiB over 1000 runs", grown>>20)
	}
}

func TestExternalData(t *testing.T) {
	dir := t.TempDir()
	w := f32("", nil, 10, 20, 30)
	if err := os.WriteFile(filepath.Join(dir, "weights.bin"), w.Data, 0o644); err != nil {
		t.Fatal(err)
	}
	model := marshal(t, &onnx.GraphProto{
		Name: "external",
		Node: []*onnx.NodeProto{onnx.Node("Add", "add", []string{"x", "w"}, []string{"y"})},
		Initializer: []*onnx.TensorProto{{
			Name: "w", Dims: []int64{3}, DataType: int32(onnx.TensorProto_FLOAT),
			DataLocation: onnx.TensorProto_EXTERNAL,
			ExternalData: []*onnx.StringStringEntryProto{{Key: "location", Value: "weights.bin"}, {Key: "length", Value: "12"}},
		}},
		Input:  []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 3)},
		Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 3)},
	})
	requireORT(t)
	// Without the folder ONNX Runtime cannot find the file.
	t.Chdir(t.TempDir())
	if s, err := NewSession(model, []string{"x"}, []string{"y"}, SessionOptions{}); err == nil {
		s.Close()
		t.Error("a model with external data loaded without its folder")
	}
	s := newSession(t, model, []string{"x"}, []string{"y"}, SessionOptions{ExternalDataDir: dir})
	out, err := s.Run([]*tensor.Tensor{f32("x", []int64{3}, 1, 2, 3)})
	if err != nil {
		t.Fatal(err)
	}
	wantFloats(t, out[0], []int64{3}, 11, 22, 33)
}

func TestCUDAOnCPUBuild(t *testing.T) {
	requireORT(t)
	if _, err := os.Stat(filepath.Join(filepath.Dir(libPath), "libonnxruntime_providers_cuda.so")); err == nil {
		t.Skip("this library has the CUDA provider beside it")
	}
	_, err := NewSession(addReluMatMul(t), []string{"x", "y"}, []string{"z"}, SessionOptions{Device: "cuda"})
	var re *RuntimeError
	if !errors.As(err, &re) || re.Stage != StageProvider {
		t.Fatalf("want a *RuntimeError at stage %q, got %T: %v", StageProvider, err, err)
	}
	for _, want := range []string{"libonnxruntime_providers_shared.so", "libonnxruntime_providers_cuda.so", filepath.Dir(libPath), "CPU only"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message lacks %q:\n%v", want, err)
		}
	}
	t.Logf("cuda: %v", err)
}

func TestSessionErrors(t *testing.T) {
	requireORT(t)
	unknownOp := marshal(t, &onnx.GraphProto{
		Name:   "bad",
		Node:   []*onnx.NodeProto{onnx.Node("NoSuchOp", "n", []string{"x"}, []string{"y"})},
		Input:  []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 3)},
		Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 3)},
	})
	for name, model := range map[string][]byte{"garbage": []byte("this is not an ONNX model"), "unknown op": unknownOp} {
		_, err := NewSession(model, []string{"x"}, []string{"y"}, SessionOptions{})
		var re *RuntimeError
		if !errors.As(err, &re) || re.Stage != StageCreate || re.Err.Error() == "" {
			t.Errorf("%s: want a *RuntimeError at stage %q, got %T: %v", name, StageCreate, err, err)
		}
		t.Logf("%s: %v", name, err)
	}
	if _, err := NewSession(addReluMatMul(t), []string{"x", "y"}, []string{"z"}, SessionOptions{Device: "tpu"}); err == nil || !strings.Contains(err.Error(), `"tpu"`) {
		t.Errorf("unknown device: got %v", err)
	}

	s := newSession(t, addReluMatMul(t), []string{"x", "y"}, []string{"z"}, SessionOptions{})
	x := f32("x", []int64{1, 3}, 1, 2, 3)
	runErrs := []struct {
		name   string
		inputs []*tensor.Tensor
		want   string
	}{
		{"input count", []*tensor.Tensor{x}, "want 2 inputs"},
		{"short data", []*tensor.Tensor{x, {DType: tensor.Float32, Shape: []int64{1, 3}, Data: make([]byte, 8)}}, "needs 12 bytes, got 8"},
		{"string", []*tensor.Tensor{x, {DType: tensor.String, Shape: []int64{1}}}, "string is not supported"},
		{"wrong type", []*tensor.Tensor{x, {DType: tensor.Int64, Shape: []int64{1, 3}, Data: make([]byte, 24)}}, "run: "},
		{"wrong shape", []*tensor.Tensor{x, f32("y", []int64{1, 4}, 1, 2, 3, 4)}, "run: "},
	}
	for _, tt := range runErrs {
		_, err := s.Run(tt.inputs)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: want an error containing %q, got %v", tt.name, tt.want, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Run([]*tensor.Tensor{x, x}); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("run after Close: got %v", err)
	}
}

func TestFloat32View(t *testing.T) {
	x := f32("x", []int64{3}, 1, -2, 3.5)
	v := Float32View(x)
	if len(v) != 3 || v[1] != -2 {
		t.Fatalf("view = %v", v)
	}
	v[0] = 9
	if !bytes.Equal(x.Data[:4], f32("", nil, 9).Data) {
		t.Error("the view does not share Data")
	}
	odd := &tensor.Tensor{DType: tensor.Float32, Shape: []int64{3}, Data: append([]byte{0}, x.Data...)[1:]}
	if got := Float32View(odd); len(got) != 3 || got[2] != 3.5 {
		t.Errorf("misaligned view = %v", got)
	}
	if Float32View(&tensor.Tensor{DType: tensor.Int32, Shape: []int64{1}, Data: make([]byte, 4)}) != nil {
		t.Error("an int32 tensor has a float32 view")
	}
}

// An output the model declares without a type is left to ONNX Runtime to
// allocate, which onnxruntime_go cannot read back for float16.
func TestUntypedFloat16Output(t *testing.T) {
	model := marshal(t, &onnx.GraphProto{
		Name:   "to_half",
		Node:   []*onnx.NodeProto{onnx.Node("Cast", "h", []string{"x"}, []string{"h"}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT16)))},
		Input:  []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 7)},
		Output: []*onnx.ValueInfoProto{{Name: "h"}},
	})
	s := newSession(t, model, []string{"x"}, []string{"h"}, SessionOptions{})
	_, err := s.Run([]*tensor.Tensor{f32("x", []int64{7}, 1, 2, 3, 4, 5, 6, 7)})
	var re *RuntimeError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "cast it to float in the graph") {
		t.Fatalf("want a *RuntimeError with the fix, got %v", err)
	}
	t.Log(err)
}
