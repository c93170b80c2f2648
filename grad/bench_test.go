package grad

import (
	"testing"

	"fp16audit/fixtures"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/tensor"
)

// benchModels are the repository's benchmark models at sizes a laptop
// runs in well under a second, with the loss each is trained with.
func benchModels() []struct {
	name string
	f    *fixtures.Fixture
	loss Loss
} {
	return []struct {
		name string
		f    *fixtures.Fixture
		loss Loss
	}{
		{"resnet18_64px_b8", fixtures.BigResNet(64, 8), CrossEntropy},
		{"transformer_2x256_seq64_b4", fixtures.BigTransformer(2, 256, 64, 4), MSE},
		{"mlp_512x3_b256", fixtures.MLP(256, 512, 10, 3, 256), CrossEntropy},
	}
}

// target returns a target of the shape and type res expects: class 1
// everywhere, or zeros.
func target(res *Result) *tensor.Tensor {
	n := numel(res.TargetShape)
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
		loss Loss
	}{
		{"resnet18", fixtures.BigResNet(32, 2), CrossEntropy},
		{"transformer", fixtures.BigTransformer(1, 128, 8, 2), MSE},
	} {
		t.Run(c.name, func(t *testing.T) {
			facts, err := Probe(c.f.Model, c.f.Batches[0].Inputs, sessionOptions)
			if err != nil {
				t.Fatal(err)
			}
			res, err := Build(c.f.Model, facts, Options{Loss: c.loss})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Unsupported) > 0 || len(res.Blocked) > 0 {
				t.Errorf("unsupported %+v, blocked %v", res.Unsupported, res.Blocked)
			}
			params := 0
			for _, g := range res.Grads {
				if g.Kind == Parameter {
					params++
				}
			}
			t.Logf("%d gradients (%d parameters), %d backward nodes", len(res.Grads), params, len(res.Model.Graph.Node)-len(c.f.Model.Graph.Node))
		})
	}
}

// BenchmarkGradient times one run of the backward graph (forward, loss and
// every activation and parameter gradient copied out) against one plain
// forward run of the same model, both on 2 threads.
func BenchmarkGradient(b *testing.B) {
	requireORT(b)
	opt := onnxrt.SessionOptions{Threads: 2}
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
			for b.Loop() {
				if _, err := s.Run(inputs); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/backward", func(b *testing.B) {
			facts, err := Probe(c.f.Model, inputs, opt)
			if err != nil {
				b.Fatal(err)
			}
			res, err := Build(c.f.Model, facts, Options{Loss: c.loss})
			if err != nil {
				b.Fatal(err)
			}
			s, err := NewSession(res, opt)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			tg := target(res)
			for b.Loop() {
				if _, err := s.Run(inputs, tg, 65536); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
