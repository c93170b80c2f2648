package statsop_test

import (
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
