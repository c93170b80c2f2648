package grad_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"fp16audit/fixtures"
	"fp16audit/internal/execute/backward"
	"fp16audit/internal/grad"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/precision"
	"fp16audit/internal/tensor"
)

// benchModels are the repository's benchmark models at sizes a laptop
// runs in well under a second, with the loss each is trained with.
func benchModels() []struct {
	name string
	f    *fixtures.Fixture
	loss grad.Loss
} {
	return []struct {
		name string
		f    *fixtures.Fixture
		loss grad.Loss
	}{
		{"resnet18_64px_b8", fixtures.BigResNet(64, 8), grad.CrossEntropy},
		{"transformer_2x256_seq64_b4", fixtures.BigTransformer(2, 256, 64, 4), grad.MSE},
		{"mlp_512x3_b256", fixtures.MLP(256, 512, 10, 3, 256), grad.CrossEntropy},
	}
}

// target returns a target of the shape and type res expects: class 1
// everywhere, or zeros.
func target(res *grad.Result) *tensor.Tensor {
	n := tensor.NumElements(res.TargetShape)
	if res.TargetType == elemInt64 {
		data := make([]byte, 8*n)
		for i := range n {
			data[8*i] = 1
		}
		return &tensor.Tensor{DType: tensor.Int64, Shape: res.TargetShape, Data: data}
	}
	return tensor.FromFloat32s("t", res.TargetShape, make([]float32, n))
}

// TestBenchmarkModelsCovered: every op of the benchmark models (ResNet-18
// with BatchNormalization nodes, a BERT-style encoder, an MLP) has a rule.
func TestBenchmarkModelsCovered(t *testing.T) {
	requireORT(t)
	for _, c := range []struct {
		name string
		f    *fixtures.Fixture
		loss grad.Loss
	}{
		{"resnet18", fixtures.BigResNet(32, 2), grad.CrossEntropy},
		{"transformer", fixtures.BigTransformer(1, 128, 8, 2), grad.MSE},
	} {
		t.Run(c.name, func(t *testing.T) {
			facts, err := backward.Probe(context.Background(), ortLib, c.f.Model, "", c.f.Batches[0].Inputs, sessionOptions)
			if err != nil {
				t.Fatal(err)
			}
			res, err := grad.Build(c.f.Model, facts, grad.Options{Loss: c.loss})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Unsupported) > 0 || len(res.Blocked) > 0 {
				t.Errorf("unsupported %+v, blocked %v", res.Unsupported, res.Blocked)
			}
			params := 0
			for _, g := range res.Grads {
				if g.Kind == grad.Parameter {
					params++
				}
			}
			t.Logf("%d gradients (%d parameters), %d backward nodes", len(res.Grads), params, len(res.Model.Graph.Node)-len(c.f.Model.Graph.Node))
		})
	}
}

// cpuTime returns the CPU time the process has used, ONNX Runtime's threads
// included: on a shared machine it measures the work a run does more
// steadily than the wall clock.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loop runs fn b.N times and reports the CPU time per run as cpu-ms/op.
func loop(b *testing.B, fn func() error) {
	start := cpuTime()
	for b.Loop() {
		if err := fn(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime()-start)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
}

// BenchmarkGradient times one run of the backward graph (forward, loss and
// every activation and parameter gradient copied out) against one plain
// forward run of the same model, both on 2 threads without spinning (so
// that CPU time counts work, not waiting), without graph optimizations as
// the audit runs them: at level all ONNX Runtime's layouts and fusions
// hide what the generated graph costs (flipping three 512×512×3×3
// weights for their data gradients took 30 ms of a ResNet-18's 200 ms
// backward run at level none, and barely showed at level all).
func BenchmarkGradient(b *testing.B) {
	requireORT(b)
	opt := onnxrt.SessionOptions{Threads: 2, NoSpinning: true, Optimization: "none"}
	for _, c := range benchModels() {
		inputs := c.f.Batches[0].Inputs
		b.Run(c.name+"/forward", func(b *testing.B) {
			data, err := onnx.Marshal(c.f.Model)
			if err != nil {
				b.Fatal(err)
			}
			var outs []string
			for _, o := range c.f.Model.Graph.Output {
				outs = append(outs, o.Name)
			}
			s, err := onnxrt.NewSession(data, []string{c.f.Model.Graph.Input[0].Name}, outs, opt)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			loop(b, func() error { _, err := s.Run(inputs); return err })
		})
		b.Run(c.name+"/backward", func(b *testing.B) {
			facts, err := backward.Probe(context.Background(), ortLib, c.f.Model, "", inputs, opt)
			if err != nil {
				b.Fatal(err)
			}
			res, err := grad.Build(c.f.Model, facts, grad.Options{Loss: c.loss})
			if err != nil {
				b.Fatal(err)
			}
			s, err := backward.NewSession(res, opt, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			tg := target(res)
			loop(b, func() error { _, err := s.Run(inputs, tg, 65536); return err })
		})
		// The fp16 backward audit: autocast's rounding, and only the
		// in-session summaries of every gradient and Site fetched.
		b.Run(c.name+"/backward-fp16-mass", func(b *testing.B) {
			facts, err := backward.Probe(context.Background(), ortLib, c.f.Model, "", inputs, opt)
			if err != nil {
				b.Fatal(err)
			}
			ix, err := onnx.NewIndex(c.f.Model.Graph)
			if err != nil {
				b.Fatal(err)
			}
			pol, err := precision.PolicyByName("autocast-fp16")
			if err != nil {
				b.Fatal(err)
			}
			a := precision.Assign(pol, c.f.Model.Graph, ix.Order(), ix.ElemType)
			res, err := grad.Build(c.f.Model, facts, grad.Options{Loss: c.loss, Rounding: grad.AutocastRounding(c.f.Model.Graph, a)})
			if err != nil {
				b.Fatal(err)
			}
			lib, err := onnxrt.FindLibrary("")
			if err != nil {
				b.Fatal(err)
			}
			s, err := backward.NewMassSession(lib, res, opt, "", nil, inputs, target(res), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			loop(b, func() error { _, err := s.Run(16, true); return err })
		})
	}
}
