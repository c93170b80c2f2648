package grad_test

import (
	"fmt"
	"math"
	"os"
	"testing"

	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/tensor"
)

var initErr error

// ortLib is the ONNX Runtime library the tests run on.
var ortLib string

func TestMain(m *testing.M) {
	lib, err := onnxrt.FindLibrary("")
	if err == nil {
		err = onnxrt.Init(lib)
	}
	initErr, ortLib = err, lib
	os.Exit(m.Run())
}

// requireORT fails the test when ONNX Runtime could not be loaded (`make
// ort` installs it).
func requireORT(t testing.TB) {
	t.Helper()
	if initErr != nil {
		t.Fatalf("ONNX Runtime is required: %v", initErr)
	}
}

// sessionOptions runs on one thread without spinning: the tests share the
// machine with other work.
var sessionOptions = onnxrt.SessionOptions{Threads: 1, NoSpinning: true}

func floats(t testing.TB, x *tensor.Tensor) []float32 {
	t.Helper()
	v, err := x.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// relErr returns max|got-want| / max(max|want|, floor): the error relative
// to the tensor's scale, so that elements near zero in a large tensor are
// judged against the tensor and not against themselves.
func relErr(got, want []float32, floor float64) (float64, int) {
	scale := floor
	for _, w := range want {
		scale = math.Max(scale, math.Abs(float64(w)))
	}
	worst, at := 0.0, -1
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if math.IsNaN(d) {
			return math.Inf(1), i
		}
		if d > worst {
			worst, at = d, i
		}
	}
	return worst / scale, at
}

func shapeString(s []int64) string { return fmt.Sprint(s) }

// maxAbs returns the index and size of the largest |x|.
func maxAbs(x []float32) (int, float64) {
	at, m := -1, 0.0
	for i, v := range x {
		if a := math.Abs(float64(v)); a > m || at < 0 {
			at, m = i, a
		}
	}
	return at, m
}

const (
	elemFloat   = int32(onnx.TensorProto_FLOAT)
	elemFloat16 = int32(onnx.TensorProto_FLOAT16)
	elemInt64   = int32(onnx.TensorProto_INT64)
)
