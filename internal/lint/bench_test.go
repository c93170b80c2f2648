package lint

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"fp16audit/internal/onnx"
)

// BenchmarkLint100MB lints a generated MLP whose four weight matrices hold
// 100 MB of float32 initializers in all, loading the model each time as
// the command line does. Targets: under 0.5 s and a peak under 1.5x the
// file. onnx.Load keeps the weights where the file's bytes are (the
// decoded initializers alias them) and lint reads them in place, so B/op
// is about the file size; the metric peak-rss/file is the peak resident
// memory of a child process that loads and lints the model once.
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
	b.StopTimer()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLintChild$", "-test.v")
	cmd.Env = append(os.Environ(), lintChildEnv+"="+path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("child lint: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "hwm_kb "); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			b.ReportMetric(float64(kb<<10)/float64(fi.Size()), "peak-rss/file")
		}
	}
}

// lintChildEnv makes TestLintChild lint a model in a process of its own,
// so that BenchmarkLint100MB can read its peak memory.
const lintChildEnv = "FP16AUDIT_LINT_CHILD"

// TestLintChild is not a test: BenchmarkLint100MB runs the test binary with
// it selected to lint one model and print the process's peak RSS.
func TestLintChild(t *testing.T) {
	path := os.Getenv(lintChildEnv)
	if path == "" {
		t.Skip("runs only as BenchmarkLint100MB's child process")
	}
	m, err := onnx.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(m, Options{Policy: "half"}); err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmHWM:" {
			fmt.Printf("hwm_kb %s\n", f[1])
		}
	}
}
