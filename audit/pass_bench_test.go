package audit

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"fp16audit/batch"
	"fp16audit/fixtures"
	"fp16audit/onnx"
	ort "fp16audit/runtime"
	"fp16audit/tensor"
)

// The benchmarks below time fp16audit against plain ONNX Runtime inference
// of the same model and batch in the same process, and report the ratio as
// a metric. "plain" is what a user's own inference does: ONNX Runtime's
// default session (all graph optimizations), only the model's outputs.

func benchModels() []*fixtures.Fixture {
	return []*fixtures.Fixture{fixtures.BigMLP(), fixtures.BigCNN()}
}

func outputNames(m *onnx.ModelProto) []string {
	var out []string
	for _, o := range m.Graph.Output {
		out = append(out, o.Name)
	}
	return out
}

func mustSession(b *testing.B, m *onnx.ModelProto, in, out []string, opt ort.SessionOptions) *ort.Session {
	b.Helper()
	data, err := onnx.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	s, err := ort.NewSession(data, in, out, opt)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkFP32Pass: one batch through the fp32 reference pass (every float
// intermediate returned and summarised) against one plain run. Sessions are
// created before timing. Metrics: ms per plain run, ms per pass batch, and
// their ratio (target ≤ 1.3).
func BenchmarkFP32Pass(b *testing.B) {
	lib, err := ort.FindLibrary("")
	if err != nil {
		b.Fatal(err)
	}
	if err := ort.Init(lib); err != nil {
		b.Fatal(err)
	}
	for _, f := range benchModels() {
		b.Run(f.Name, func(b *testing.B) {
			m := f.Model
			idx, err := onnx.NewIndex(m.Graph)
			if err != nil {
				b.Fatal(err)
			}
			specs := inputSpecs(m.Graph, idx)
			inputs := f.Batches[0].Inputs
			plain := mustSession(b, m, inputNames(specs), outputNames(m), ort.SessionOptions{})
			defer plain.Close()
			var names []string
			for _, ni := range idx.Order() {
				for _, o := range m.Graph.Node[ni].Output {
					if isFloat(idx.ElemType(o)) {
						names = append(names, o)
					}
				}
			}
			inst, obs := Instrument(m, names, idx.ElemType)
			outNames := make([]string, len(obs))
			for i, o := range obs {
				outNames[i] = o.Output
			}
			sess := mustSession(b, inst, inputNames(specs), outNames, ort.SessionOptions{Optimization: Optimization})
			run := newPassRun("fp32", sess, obs, nil)
			defer sess.Close()
			batches := []batch.Batch{{Source: "bench", Inputs: inputs}}
			var tPlain, tPass time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				if _, err := plain.Run(inputs); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := runPasses(context.Background(), []*passRun{run}, batches, nil); err != nil {
					b.Fatal(err)
				}
				tPass += time.Since(t1)
				tPlain += t1.Sub(t0)
			}
			b.ReportMetric(float64(tPlain.Milliseconds())/float64(b.N), "ms/plain")
			b.ReportMetric(float64(tPass.Milliseconds())/float64(b.N), "ms/pass")
			b.ReportMetric(float64(tPass)/float64(tPlain), "pass/plain")
		})
	}
}

// BenchmarkFullAudit: audit.Run end to end (load, fp32, fp16 and bf16
// passes, statistics, diagnosis; no fix reruns) against three plain
// inferences, each with its session creation (target ≤ 1.25).
func BenchmarkFullAudit(b *testing.B) {
	lib, err := ort.FindLibrary("")
	if err != nil {
		b.Fatal(err)
	}
	if err := ort.Init(lib); err != nil {
		b.Fatal(err)
	}
	for _, f := range benchModels() {
		b.Run(f.Name, func(b *testing.B) {
			dir := b.TempDir()
			modelPath := filepath.Join(dir, "model.onnx")
			if err := onnx.Save(f.Model, modelPath); err != nil {
				b.Fatal(err)
			}
			in := f.Batches[0].Inputs[0]
			npy, err := batch.EncodeNPY(in)
			if err != nil {
				b.Fatal(err)
			}
			batchPath := filepath.Join(dir, "batch.npy")
			if err := os.WriteFile(batchPath, npy, 0o644); err != nil {
				b.Fatal(err)
			}
			data, _ := onnx.Marshal(f.Model)
			inNames := []string{in.Name}
			outs := outputNames(f.Model)
			var tPlain, tAudit time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				for k := 0; k < 3; k++ {
					s, err := ort.NewSession(data, inNames, outs, ort.SessionOptions{})
					if err != nil {
						b.Fatal(err)
					}
					if _, err := s.Run([]*tensor.Tensor{in}); err != nil {
						b.Fatal(err)
					}
					s.Close()
				}
				t1 := time.Now()
				if _, err := Run(context.Background(), Config{ModelPath: modelPath, Inputs: []string{batchPath}, NoFixes: true}); err != nil {
					b.Fatal(err)
				}
				tAudit += time.Since(t1)
				tPlain += t1.Sub(t0)
			}
			b.ReportMetric(float64(tPlain.Milliseconds())/float64(b.N), "ms/3plain")
			b.ReportMetric(float64(tAudit.Milliseconds())/float64(b.N), "ms/audit")
			b.ReportMetric(float64(tAudit)/float64(tPlain), "audit/3plain")
		})
	}
}
