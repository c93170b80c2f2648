package batch

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

func writePB(t *testing.T, path string, x *tensor.Tensor) {
	t.Helper()
	b, err := proto.Marshal(onnx.EncodeTensor(x))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReadPB(t *testing.T) {
	dir := t.TempDir()
	want := tensor.FromFloat32s("x", []int64{2, 2}, []float32{1, 2, 3, 4})
	path := filepath.Join(dir, "x.pb")
	writePB(t, path, want)
	got, err := ReadPB(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "x" || !slices.Equal(got.Shape, want.Shape) || !slices.Equal(floats(t, got), []float32{1, 2, 3, 4}) {
		t.Errorf("got %s %v %v", got.Name, got.Shape, floats(t, got))
	}
	bad := filepath.Join(dir, "bad.pb")
	os.WriteFile(bad, []byte{0xff, 0xff, 0xff}, 0o644)
	if _, err := ReadPB(bad); err == nil || !strings.HasPrefix(err.Error(), bad+": not an ONNX TensorProto") {
		t.Errorf("garbage: error %v", err)
	}
}

func TestReadTestDataSet(t *testing.T) {
	dir := t.TempDir()
	for i := range 11 {
		writePB(t, filepath.Join(dir, "input_"+strconv.Itoa(i)+".pb"), tensor.FromFloat32s("in", []int64{1}, []float32{float32(i)}))
	}
	writePB(t, filepath.Join(dir, "output_0.pb"), tensor.FromFloat32s("out", []int64{1}, []float32{-1}))
	ins, outs, err := ReadTestDataSet(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ins) != 11 || len(outs) != 1 {
		t.Fatalf("%d inputs, %d outputs", len(ins), len(outs))
	}
	for i, x := range ins {
		// input_10 comes after input_9, not after input_1.
		if v := floats(t, x)[0]; v != float32(i) {
			t.Errorf("input %d holds %v", i, v)
		}
	}
	os.Remove(filepath.Join(dir, "input_3.pb"))
	if _, _, err := ReadTestDataSet(dir); err == nil || !strings.Contains(err.Error(), "missing input_3.pb") {
		t.Errorf("gap: error %v", err)
	}
	if _, _, err := ReadTestDataSet(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no input_0.pb") {
		t.Errorf("empty folder: error %v", err)
	}
}
