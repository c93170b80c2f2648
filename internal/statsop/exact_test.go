package statsop_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"fp16audit/fixtures"
	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/ortcapi"
	"fp16audit/internal/tensor"
)

var (
	rtOnce sync.Once
	rtLib  *ortcapi.Runtime
	rtErr  error
)

// runtimes loads ONNX Runtime through both bindings, onnxruntime_go (for
// audit's path) and ortcapi, in one process, as fp16audit would while both
// are in use.
func runtimes(t testing.TB) *ortcapi.Runtime {
	t.Helper()
	rtOnce.Do(func() {
		var lib string
		lib, rtErr = onnxrt.FindLibrary("")
		if rtErr != nil {
			return
		}
		if rtErr = onnxrt.Init(lib); rtErr != nil {
			return
		}
		rtLib, rtErr = ortcapi.Open(lib)
	})
	if rtErr != nil {
		t.Fatalf("ONNX Runtime is required for this test: %v", rtErr)
	}
	return rtLib
}

// exactCase is a model with batches to audit.
type exactCase struct {
	name    string
	model   *onnx.Model
	batches [][]*tensor.Tensor
}

func exactCases(t *testing.T) []exactCase {
	var cases []exactCase
	for _, f := range fixtures.All() {
		data, err := onnx.Marshal(f.Model)
		if err != nil {
			t.Fatal(err)
		}
		m, err := onnx.LoadBytes(data, f.Name+".onnx")
		if err != nil {
			t.Fatal(err)
		}
		c := exactCase{name: f.Name, model: m}
		for _, b := range f.Batches {
			c.batches = append(c.batches, b.Inputs)
		}
		cases = append(cases, c)
	}
	for _, te := range fixtures.TorchExports() {
		root := filepath.Join("..", "..", "fixtures")
		m, err := onnx.Load(filepath.Join(root, te.Model))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(root, te.Batch))
		if err != nil {
			t.Fatal(err)
		}
		x, err := batch.DecodeNPY(bytesReader(b), int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		x.Name = m.Proto.Graph.Input[0].Name
		cases = append(cases, exactCase{name: te.Model, model: m, batches: [][]*tensor.Tensor{{x}}})
	}
	for _, bm := range benchModels(t) {
		// Small batches: the exactness does not depend on their size.
		cases = append(cases, exactCase{name: bm.name, model: bm.model, batches: bm.batches(2, 2)})
	}
	return cases
}

// TestOpsEqualToday: for every fixture, the PyTorch exports and the
// benchmark models, the combined graph with Observe yields the statistics,
// differences and shapes of audit's passes today (separate instrumented
// sessions, values copied out, Go kernels), bit for bit, at the
// optimization level audit uses: with today's chunks, and with shorter
// ones on both sides (1000 elements cuts even the fixtures' values).
func TestOpsEqualToday(t *testing.T) {
	rt := runtimes(t)
	var nonfinite int64
	for _, c := range exactCases(t) {
		t.Run(c.name, func(t *testing.T) {
			ap := newAuditPasses(t, c.model)
			var inputs []string
			for _, x := range c.batches[0] {
				inputs = append(inputs, x.Name)
			}
			for _, chunk := range []int{chunkLen, shortChunk, 1000} {
				want := todayResults(t, ap, inputs, c.batches, chunk)
				got := opResults(t, rt, ap, inputs, c.batches, ortcapi.LevelNone, chunk)
				for _, b := range compareResults(ap, got, want) {
					t.Errorf("chunk %d: %s", chunk, b)
				}
				nonfinite += nonFinite(want)
			}
		})
	}
	if nonfinite == 0 {
		t.Error("no model produced a NaN or Inf: the non-finite paths went untested")
	}
}
