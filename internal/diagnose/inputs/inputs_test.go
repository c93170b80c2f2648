package inputs

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
	"fp16audit/report"
)

// analyzeOne runs the input analysis on one float input x of the given
// shape, read by a Relu.
func analyzeOne(t *testing.T, name string, shape []int64, x []float32) *Input {
	t.Helper()
	g := &onnx.GraphProto{Name: "g", Input: []*onnx.ValueInfoProto{onnx.TensorValueInfo(name, onnx.TensorProto_FLOAT)},
		Node: []*onnx.NodeProto{onnx.Node("Relu", "relu", []string{name}, []string{"y"})}, Output: []*onnx.ValueInfoProto{{Name: "y"}}}
	ix, err := onnx.NewIndex(g)
	if err != nil {
		t.Fatal(err)
	}
	spec := batch.InputSpec{Name: name, DType: tensor.Float32}
	b := batch.Batch{Inputs: []*tensor.Tensor{tensor.FromFloat32s(name, shape, x)}}
	return Analyze([]batch.InputSpec{spec}, []batch.Batch{b}, ix, 10)[0]
}

func fill(n int, f func(i int) float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(f(i))
	}
	return out
}

// TestRawPixels: raw pixels are told by range and spread, not by
// integrality: decoded integers and resized or augmented floats in 0..255
// are raw; standardized images, 0..1 images and a dark image are not.
func TestRawPixels(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 1))
	shape := []int64{4, 3, 16, 16}
	n := 4 * 3 * 16 * 16
	for _, tc := range []struct {
		name string
		x    []float32
		raw  bool
	}{
		{"decoded integers", fill(n, func(int) float64 { return math.Round(r.Float64() * 255) }), true},
		{"uniform*255 floats", fill(n, func(int) float64 { return r.Float64() * 255 }), true},
		{"bicubic overshoot", fill(n, func(i int) float64 { return 127.5 + 131*math.Sin(float64(i)/7) }), true},
		{"standardized", fill(n, func(int) float64 { return r.NormFloat64() }), false},
		{"0..1 floats", fill(n, func(int) float64 { return r.Float64() }), false},
		{"[-1, 1] floats", fill(n, func(int) float64 { return 2*r.Float64() - 1 }), false},
		{"dark image", fill(n, func(int) float64 { return r.Float64() * 10 }), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := analyzeOne(t, "pixels", shape, tc.x)
			if in.Kind != report.KindImage || in.RawPixels != tc.raw {
				t.Errorf("kind %s, raw pixels %v; want image, %v (values in [%g, %g])", in.Kind, in.RawPixels, tc.raw, in.Min, in.Max)
			}
		})
	}
}

// TestFramesOrTable: a 2-D batch is frames of a signal when its
// neighbouring columns move together, or when its int16 samples look
// alike in every column; a table's columns are each their own quantity.
func TestFramesOrTable(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 2))
	const rows, frame = 8, 512
	speech := fill(rows*frame, func(i int) float64 {
		k := float64(i % frame)
		return math.Round(9000*math.Sin(k/9+float64(i/frame)) + 3000*math.Sin(k/2.3) + 500*r.NormFloat64())
	})
	noise := fill(rows*frame, func(int) float64 { return math.Round(6000 * r.NormFloat64()) })
	scales := []float64{1, 40, 1e3, 0.01, 5e4, 3, 70, 2e5, 12, 0.5, 900, 33}
	table := func(cols int) []float32 {
		return fill(64*cols, func(i int) float64 {
			s := scales[(i%cols)%len(scales)]
			return s*float64(i%cols+1) + s*r.NormFloat64()
		})
	}
	for _, tc := range []struct {
		name  string
		input string
		shape []int64
		x     []float32
		kind  string
	}{
		{"int16 speech frames", "x", []int64{rows, frame}, speech, report.KindAudio},
		{"int16 noise frames", "x", []int64{rows, frame}, noise, report.KindAudio},
		{"float frames", "x", []int64{rows, frame}, fill(rows*frame, func(i int) float64 { return math.Sin(float64(i%frame) / 5) }), report.KindAudio},
		{"12-column table", "x", []int64{64, 12}, table(12), report.KindTabular},
		{"96-column table", "x", []int64{64, 96}, table(96), report.KindTabular},
		{"96 standardized columns", "x", []int64{64, 96}, fill(64*96, func(int) float64 { return r.NormFloat64() }), report.KindTabular},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := analyzeOne(t, tc.input, tc.shape, tc.x)
			if in.Kind != tc.kind {
				t.Errorf("kind %s, want %s", in.Kind, tc.kind)
			}
		})
	}
}

// TestFramesAdvice: int16 frames get a signal's advice (x / 32768), not
// fastai's tabular procs.
func TestFramesAdvice(t *testing.T) {
	x := fill(8*512, func(i int) float64 { return math.Round(12000 * math.Sin(float64(i%512)/6)) })
	in := analyzeOne(t, "frames", []int64{8, 512}, x)
	ns := in.NormalizeAdvice()
	if in.Kind != report.KindAudio || ns.Fastai != "" || ns.Torch == "" || !strings.Contains(ns.Torch, "/ 32768") {
		t.Errorf("kind %s, advice %+v; want audio with x / 32768", in.Kind, ns)
	}
}
