package lint

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"fp16audit/internal/onnx"
)

// BenchmarkLint100MB lints a generated MLP whose four weight matrices hold
// 100 MB of float32 initializers in all, loading the model each time as
// the command line does. The target is under 1 s wall time and peak
// memory under twice the file size: onnx.Load holds the file bytes and the
// decoded model at once, and lint reads the initializers in place, so B/op
// stays near 2x the file size.
func BenchmarkLint100MB(b *testing.B) {
	const width, layers = 2560, 4 // 4 x 2560^2 x 4 bytes = 105 MB
	r := rand.New(rand.NewPCG(1, 2))
	var nodes []*onnx.NodeProto
	var inits []*onnx.TensorProto
	in := "x"
	for l := range layers {
		w := make([]float32, width*width)
		for i := range w {
			w[i] = float32(r.NormFloat64()) * 0.02
		}
		name := fmt.Sprintf("fc%d.weight", l)
		out := fmt.Sprintf("/fc%d/Gemm_output_0", l)
		nodes = append(nodes, onnx.Node("Gemm", fmt.Sprintf("/fc%d/Gemm", l), []string{in, name}, []string{out}, onnx.AttrInt("transB", 1)))
		inits = append(inits, onnx.FloatTensor(name, []int64{width, width}, w))
		in = out
	}
	g := graph(nodes, inits, nil, nil)
	g.Input = append(g.Input, onnx.TensorValueInfo("x", F, "batch", width))
	g.Output = append(g.Output, onnx.TensorValueInfo(in, F, "batch", width))
	path := filepath.Join(b.TempDir(), "big.onnx")
	if err := onnx.Save(onnx.NewModel(g, 17), path); err != nil {
		b.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(fi.Size())
	b.ReportAllocs()
	for b.Loop() {
		m, err := onnx.Load(path)
		if err != nil {
			b.Fatal(err)
		}
		fs, err := Run(m, Options{Policy: "half"})
		if err != nil {
			b.Fatal(err)
		}
		if len(fs) != 0 {
			b.Fatalf("unexpected findings: %v", fs)
		}
	}
}
