package audit

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"fp16audit/fixtures"
	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/tensor"
)

// BenchmarkTrainingAudit times the training audit (--mode train --loss:
// the train-mode forward passes, then the fp32 backward and the emulated
// fp16 backward at the scales it confirms) against the forward audit of
// the same model and batch (eval mode, no loss), both end to end through
// audit.Run without fix reruns, in the same iteration, and reports the
// ratio training/forward, by the wall clock and by the CPU time the
// process used (steadier on a shared machine). runs/op counts the
// backward runs: the fp32 one and the confirming ones.
// Models: a ResNet-18 on 64×64 images (BatchNorm, batch 8), a 2-layer
// transformer encoder (d=256, sequence 64, batch 4) and a 3-layer MLP
// (batch 256), sized for 2 shared cores.
func BenchmarkTrainingAudit(b *testing.B) {
	initRuntime(b)
	for _, c := range []struct {
		f    *fixtures.Fixture
		loss string
	}{
		{fixtures.BigResNet(64, 8), "cross-entropy"},
		{fixtures.BigTransformer(2, 256, 64, 4), "mse"},
		{fixtures.MLP(256, 512, 10, 3, 256), "cross-entropy"},
	} {
		b.Run(c.f.Name, func(b *testing.B) {
			dir := b.TempDir()
			modelPath, batchPath := writeFixture(b, c.f, dir)
			targetPath := writeTarget(b, c.f, c.loss, dir)
			forward := Config{ModelPath: modelPath, Inputs: []string{batchPath}, NoFixes: true}
			train := forward
			train.Train = TrainConfig{Mode: "train", Loss: c.loss, Target: targetPath}
			var tFwd, tTrain, tBack, cFwd, cTrain time.Duration
			runs := 0
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0, c0 := time.Now(), cpuTime()
				if _, err := Run(context.Background(), forward); err != nil {
					b.Fatal(err)
				}
				t1, c1 := time.Now(), cpuTime()
				r, err := Run(context.Background(), train)
				if err != nil {
					b.Fatal(err)
				}
				tFwd += t1.Sub(t0)
				tTrain += time.Since(t1)
				cFwd += c1 - c0
				cTrain += cpuTime() - c1
				bw := r.Training.Backward
				tBack += time.Duration(bw.ElapsedSecs * float64(time.Second))
				runs += bw.Runs
			}
			n := float64(b.N)
			b.ReportMetric(float64(tFwd.Milliseconds())/n, "ms/forward-audit")
			b.ReportMetric(float64(tTrain.Milliseconds())/n, "ms/training-audit")
			b.ReportMetric(float64(tBack.Milliseconds())/n, "ms/backward")
			b.ReportMetric(float64(runs)/n, "runs/op")
			b.ReportMetric(float64(tTrain)/float64(tFwd), "training/forward")
			b.ReportMetric(float64(cTrain)/float64(cFwd), "cpu-training/forward")
		})
	}
}

// writeTarget saves a target for f's first batch: class 1 for
// cross-entropy (logits [N, C]), zeros of the output's shape otherwise.
func writeTarget(b testing.TB, f *fixtures.Fixture, loss, dir string) string {
	data, err := onnx.Marshal(f.Model)
	if err != nil {
		b.Fatal(err)
	}
	in := f.Batches[0].Inputs[0]
	s, err := onnxrt.NewSession(data, []string{in.Name}, outputNames(f.Model)[:1], onnxrt.SessionOptions{})
	if err != nil {
		b.Fatal(err)
	}
	outs, err := s.Run([]*tensor.Tensor{in})
	s.Close()
	if err != nil {
		b.Fatal(err)
	}
	shape := outs[0].Shape
	var t *tensor.Tensor
	if loss == "cross-entropy" {
		ids := make([]int64, shape[0])
		for i := range ids {
			ids[i] = 1
		}
		t = tensor.FromInt64s("target", []int64{shape[0]}, ids)
	} else {
		t = tensor.FromFloat32s("target", shape, make([]float32, tensor.NumElements(shape)))
	}
	npy, err := batch.EncodeNPY(t)
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(dir, "target.npy")
	if err := os.WriteFile(path, npy, 0o644); err != nil {
		b.Fatal(err)
	}
	return path
}
