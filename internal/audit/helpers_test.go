package audit

import (
	"os"
	"path/filepath"
	"testing"

	"fp16audit/fixtures"
	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
)

// writeFixture saves f's model and its first batch (first input) under dir.
func writeFixture(tb testing.TB, f *fixtures.Fixture, dir string) (model, batchFile string) {
	tb.Helper()
	model = filepath.Join(dir, f.Name+".onnx")
	if err := onnx.Save(f.Model, model); err != nil {
		tb.Fatal(err)
	}
	npy, err := batch.EncodeNPY(f.Batches[0].Inputs[0])
	if err != nil {
		tb.Fatal(err)
	}
	batchFile = filepath.Join(dir, f.Name+".npy")
	if err := os.WriteFile(batchFile, npy, 0o644); err != nil {
		tb.Fatal(err)
	}
	return model, batchFile
}

// outputNames lists m's graph outputs.
func outputNames(m *onnx.ModelProto) []string {
	var out []string
	for _, o := range m.Graph.Output {
		out = append(out, o.Name)
	}
	return out
}
