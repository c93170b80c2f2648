package audit_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"fp16audit/internal/audit"
	"fp16audit/internal/batch"
	"fp16audit/internal/execute"
	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

// TestRunErrorNamesNode: ONNX Runtime failing inside a pass (an
// embedding's Gather fed an id beyond its table) is reported with the
// pass, the model's node and module where it failed, the batch and the
// shapes fed, and what to do; not with the node's internal name in the
// combined graph.
func TestRunErrorNamesNode(t *testing.T) {
	dir := t.TempDir()
	table := make([]float32, 10*4)
	for i := range table {
		table[i] = float32(i%7) / 7
	}
	g := &onnx.GraphProto{Name: "embed",
		Node: []*onnx.NodeProto{
			onnx.Node("Gather", "/emb/Gather", []string{"emb.weight", "ids"}, []string{"e"}),
			onnx.Node("MatMul", "/fc/MatMul", []string{"e", "fc.weight"}, []string{"y"}),
		},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("emb.weight", []int64{10, 4}, table), onnx.FloatTensor("fc.weight", []int64{4, 3}, table[:12])},
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("ids", onnx.TensorProto_INT64, "batch", int64(5))},
		Output:      []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT)},
	}
	data, err := onnx.Marshal(onnx.NewModel(g, 17))
	if err != nil {
		t.Fatal(err)
	}
	model := filepath.Join(dir, "model.onnx")
	if err := os.WriteFile(model, data, 0o644); err != nil {
		t.Fatal(err)
	}
	npy, err := batch.EncodeNPY(tensor.FromInt64s("ids", []int64{2, 5}, []int64{1, 2, 3, 4, 20, 0, 1, 2, 3, 4}))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ids.npy")
	if err := os.WriteFile(path, npy, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = audit.Run(context.Background(), audit.Config{ModelPath: model, Inputs: []string{path}, Policy: "autocast-fp16", Threads: 1})
	var re *execute.RunError
	if !errors.As(err, &re) {
		t.Fatalf("error %v: want an execute.RunError", err)
	}
	if re.Node != "/emb/Gather" || re.OpType != "Gather" || re.Module != "emb" || re.Added || (re.Pass != "fp32" && re.Pass != "fp16") {
		t.Errorf("run error %+v: want node /emb/Gather (Gather, module emb) of the fp32 or fp16 pass", re)
	}
	msg := err.Error()
	for _, want := range []string{"ids int64 [2,5]", "ids.npy", "out of data bounds", "check the batch's values"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "::fp16audit") {
		t.Errorf("%q names an internal node", msg)
	}
}
