package statsop_test

import (
	"bytes"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

// benchModel is one of the two models testdata/export.py exports with
// torch 1.13, with the shape of one batch of its single input.
type benchModel struct {
	name  string
	model *onnx.Model
	shape func(batch int) []int64
	// batch is the benchmark's batch size.
	batch int
}

func benchModels(t testing.TB) []benchModel {
	t.Helper()
	load := func(name string) *onnx.Model {
		m, err := onnx.Load(filepath.Join("..", "..", "fixtures", "bench", name+".onnx"))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	return []benchModel{
		// A 2-layer encoder (d=64, 4 heads, FFN 256), sequence 256.
		{name: "transformer", model: load("transformer"), shape: func(b int) []int64 { return []int64{int64(b), 256, 64} }, batch: 64},
		// A ResNet-18-shaped CNN on 32x32 images.
		{name: "resnet", model: load("resnet"), shape: func(b int) []int64 { return []int64{int64(b), 3, 32, 32} }, batch: 64},
	}
}

// batches draws n standard-normal batches of size batch from a fixed seed.
func (m benchModel) batches(n, batch int) [][]*tensor.Tensor {
	r := rand.New(rand.NewPCG(7, uint64(batch)))
	name := m.model.Proto.Graph.Input[0].Name
	var out [][]*tensor.Tensor
	for range n {
		shape := m.shape(batch)
		v := make([]float32, tensor.NumElements(shape))
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		out = append(out, []*tensor.Tensor{tensor.FromFloat32s(name, shape, v)})
	}
	return out
}
