package statsop_test

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"testing"

	"fp16audit/internal/onnx"
	"fp16audit/internal/statsop"
)

// TestWeightsOnce: the audit's weights are made once: the weights of an
// external data file lie over one mapping, each handed over as the same
// tensor to every session that asks, counted as mapped until Drop gives
// their pages back, and a tensor not among the audit's graphs (one a
// rewrite made) is not held.
func TestWeightsOnce(t *testing.T) {
	rt := runtimes(t)
	path := filepath.Join("..", "..", "fixtures", "bench", "llama_tiny", "model.onnx")
	m, err := onnx.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	w := statsop.NewWeights(rt, m.Dir, "", m.Proto.Graph)
	defer w.Close()
	var external []*onnx.TensorProto
	var bytes int64
	for _, tp := range m.Proto.Graph.Initializer {
		if tp.GetDataLocation() == onnx.TensorProto_EXTERNAL {
			external = append(external, tp)
			bytes += onnx.TensorBytes(tp)
		}
	}
	if len(external) == 0 {
		t.Fatal("the fixture has no external weights")
	}
	for _, tp := range external {
		if !w.Held(tp) {
			t.Fatalf("%s is not held", tp.Name)
		}
		a, err := statsop.WeightValue(w, tp)
		if err != nil || a == nil {
			t.Fatalf("%s: %v, %v", tp.Name, a, err)
		}
		b, _ := statsop.WeightValue(w, tp)
		if a != b {
			t.Fatalf("%s: two tensors for one weight", tp.Name)
		}
	}
	if got := w.Mapped(); got != bytes {
		t.Errorf("mapped %d bytes, want the %d of the external weights", got, bytes)
	}
	w.Drop(external[:1])
	if got := w.Mapped(); got != bytes-onnx.TensorBytes(external[0]) {
		t.Errorf("after dropping %s: mapped %d", external[0].Name, got)
	}
	if _, err := statsop.WeightValue(w, external[0]); err != nil || w.Mapped() != bytes {
		t.Errorf("handed over again: mapped %d, %v", w.Mapped(), err)
	}
	other := &onnx.TensorProto{Name: external[0].Name, DataType: external[0].DataType, Dims: external[0].Dims,
		DataLocation: onnx.TensorProto_EXTERNAL, ExternalData: external[0].ExternalData}
	if w.Held(other) {
		t.Error("a tensor outside the audit's graphs is held")
	}
	w.Close()
	if w.Mapped() != 0 {
		t.Errorf("mapped %d after Close", w.Mapped())
	}
}

// TestWeightsFloatView: a FLOAT view of bf16 weights in an external file
// (the upcast of a model stored in 16 bits) is handed over converted,
// counted as its stored bytes and its fp32 copy until Drop frees the copy,
// and converted again for the next session that asks.
func TestWeightsFloatView(t *testing.T) {
	rt := runtimes(t)
	dir := t.TempDir()
	raw := make([]byte, 2*1024)
	for i := range 1024 {
		binary.LittleEndian.PutUint16(raw[2*i:], uint16(math.Float32bits(float32(i))>>16))
	}
	if err := os.WriteFile(filepath.Join(dir, "w.data"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	bf := &onnx.TensorProto{Name: "W", DataType: int32(onnx.TensorProto_BFLOAT16), Dims: []int64{32, 32}, DataLocation: onnx.TensorProto_EXTERNAL,
		ExternalData: []*onnx.StringStringEntryProto{{Key: "location", Value: "w.data"}, {Key: "offset", Value: "0"}, {Key: "length", Value: "2048"}}}
	view := onnx.FloatView(bf)
	w := statsop.NewWeights(rt, dir, "", &onnx.GraphProto{Initializer: []*onnx.TensorProto{view}})
	defer w.Close()
	a, err := statsop.WeightValue(w, view)
	if err != nil || a == nil {
		t.Fatalf("view: %v, %v", a, err)
	}
	if got := w.Mapped(); got != 2048+4096 {
		t.Errorf("mapped %d bytes, want 2048 stored and 4096 converted", got)
	}
	w.Drop([]*onnx.TensorProto{view})
	if got := w.Mapped(); got != 0 {
		t.Errorf("after Drop: %d bytes", got)
	}
	b, err := statsop.WeightValue(w, view)
	if err != nil || b == nil || w.Mapped() != 2048+4096 {
		t.Errorf("handed over again: %v, %v, mapped %d", b, err, w.Mapped())
	}
}
