package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
)

// Hostile and broken inputs: each must end in its documented exit code with
// one line on stderr that names the offending file; none may panic, hang or
// exhaust memory. The inputs are made in the test's temporary folder.

// saveModel writes mp to dir/name and returns the path.
func saveModel(t testing.TB, dir, name string, mp *onnx.ModelProto) string {
	t.Helper()
	data, err := onnx.Marshal(mp)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// reluModel is the smallest valid model: y = Relu(x), x and y [1,4] float.
func reluGraph() *onnx.GraphProto {
	return &onnx.GraphProto{
		Name:   "relu",
		Input:  []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 1, 4)},
		Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 1, 4)},
		Node:   []*onnx.NodeProto{onnx.Node("Relu", "/relu/Relu", []string{"x"}, []string{"y"})},
	}
}

// npyBytes returns a version-1 .npy file with the given header dict and data.
func npyBytes(dict string, data []byte) []byte {
	h := dict
	for (10+len(h)+1)%64 != 0 {
		h += " "
	}
	h += "\n"
	b := append([]byte("\x93NUMPY\x01\x00"), 0, 0)
	binary.LittleEndian.PutUint16(b[8:], uint16(len(h)))
	return append(append(b, h...), data...)
}

func f32bytes(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// externalModel returns a model whose Relu input is added to an external
// initializer stored at location.
func externalModel(location string) *onnx.ModelProto {
	g := reluGraph()
	g.Initializer = []*onnx.TensorProto{onnx.ExternalTensor("bias", onnx.TensorProto_FLOAT, []int64{1, 4}, location, 0, 16)}
	g.Node = []*onnx.NodeProto{
		onnx.Node("Add", "/add/Add", []string{"x", "bias"}, []string{"xb"}),
		onnx.Node("Relu", "/relu/Relu", []string{"xb"}, []string{"y"}),
	}
	return onnx.NewModel(g, 17)
}

// nestedIf returns a model whose output comes from depth If nodes nested
// in each other's then_branch.
func nestedIf(depth int) *onnx.ModelProto {
	branch := func(g *onnx.GraphProto, out string) *onnx.GraphProto {
		g.Output = []*onnx.ValueInfoProto{onnx.TensorValueInfo(out, onnx.TensorProto_FLOAT, 1, 4)}
		return g
	}
	inner := branch(&onnx.GraphProto{Name: "leaf", Node: []*onnx.NodeProto{onnx.Node("Relu", "", []string{"x"}, []string{"r0"})}}, "r0")
	for d := 1; d < depth; d++ {
		out := fmt.Sprintf("r%d", d)
		inner = branch(&onnx.GraphProto{Name: fmt.Sprintf("level%d", d), Node: []*onnx.NodeProto{
			onnx.Node("If", fmt.Sprintf("/if%d/If", d), []string{"cond"}, []string{out},
				onnx.AttrGraph("then_branch", inner),
				onnx.AttrGraph("else_branch", branch(&onnx.GraphProto{Name: fmt.Sprintf("else%d", d),
					Node: []*onnx.NodeProto{onnx.Node("Neg", "", []string{"x"}, []string{out + "_e"})}}, out+"_e")))}}, out)
	}
	g := reluGraph()
	g.Initializer = []*onnx.TensorProto{{Name: "cond", DataType: int32(onnx.TensorProto_BOOL), Int32Data: []int32{1}}}
	g.Node = []*onnx.NodeProto{
		onnx.Node("If", "/if/If", []string{"cond"}, []string{"h"}, onnx.AttrGraph("then_branch", inner),
			onnx.AttrGraph("else_branch", branch(&onnx.GraphProto{Name: "else", Node: []*onnx.NodeProto{onnx.Node("Neg", "", []string{"x"}, []string{"e"})}}, "e"))),
		onnx.Node("Relu", "/relu/Relu", []string{"h"}, []string{"y"}),
	}
	return onnx.NewModel(g, 17)
}

// chainModel returns a model of n nodes: alternating Add (of a shared
// constant) and Relu on a [1,4] tensor.
func chainModel(n int) *onnx.ModelProto {
	g := reluGraph()
	g.Initializer = []*onnx.TensorProto{onnx.FloatTensor("c", []int64{1, 4}, []float32{0.5, -0.25, 0, 1e-3})}
	g.Node = g.Node[:0]
	prev := "x"
	for i := range n {
		out := fmt.Sprintf("v%d", i)
		if i == n-1 {
			out = "y"
		}
		if i%2 == 0 {
			g.Node = append(g.Node, onnx.Node("Add", fmt.Sprintf("/block%d/Add", i), []string{prev, "c"}, []string{out}))
		} else {
			g.Node = append(g.Node, onnx.Node("Relu", fmt.Sprintf("/block%d/Relu", i), []string{prev}, []string{out}))
		}
		prev = out
	}
	return onnx.NewModel(g, 17)
}

func TestHostileInputs(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := saveModel(t, dir, "relu.onnx", onnx.NewModel(reluGraph(), 17))
	goodBatch := write("batch.npy", npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4), }", f32bytes(1, -2, 3, -4)))
	mlp, err := os.ReadFile(models + "mlp.onnx")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	garbage := make([]byte, 4096)
	for i := range garbage {
		garbage[i] = byte(rng.UintN(256))
	}
	garbage[0] = 0xff // not a text file, not a known magic number

	cyclic := reluGraph()
	cyclic.Node = []*onnx.NodeProto{
		onnx.Node("Add", "/a/Add", []string{"x", "b"}, []string{"a"}),
		onnx.Node("Relu", "/b/Relu", []string{"a"}, []string{"b"}),
		onnx.Node("Relu", "/relu/Relu", []string{"a"}, []string{"y"}),
	}
	dangling := reluGraph()
	dangling.Node = []*onnx.NodeProto{onnx.Node("Add", "/add/Add", []string{"x", "nowhere"}, []string{"y"})}
	dupProducer := reluGraph()
	dupProducer.Node = append(dupProducer.Node, onnx.Node("Neg", "/neg/Neg", []string{"x"}, []string{"y"}))
	dupOutput := reluGraph()
	dupOutput.Output = append(dupOutput.Output, onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 1, 4))
	stringInput := reluGraph()
	stringInput.Input = []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_STRING, 1, 4)}

	// External data: a real data file outside the model folder, reached
	// by an absolute path, by .., and through a symlink inside the folder.
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret.bin")
	if err := os.WriteFile(secret, f32bytes(1, 2, 3, 4), 0o644); err != nil {
		t.Fatal(err)
	}
	extDir := filepath.Join(dir, "ext")
	os.Mkdir(extDir, 0o755)
	rel, err := filepath.Rel(extDir, secret)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(extDir, "link.bin")); err != nil {
		t.Fatal(err)
	}
	extAbs := saveModel(t, extDir, "abs.onnx", externalModel(secret))
	extDotDot := saveModel(t, extDir, "dotdot.onnx", externalModel(rel))
	extLink := saveModel(t, extDir, "link.onnx", externalModel("link.bin"))

	cases := []struct {
		name string
		args []string
		code int
		file string   // the file stderr must name
		want []string // more substrings of stderr
	}{
		{"empty model", []string{"run", write("empty.onnx", nil)}, exitModel, "empty.onnx", []string{"empty"}},
		{"truncated model", []string{"run", write("truncated.onnx", mlp[:len(mlp)/2])}, exitModel, "truncated.onnx", []string{"truncated"}},
		{"protobuf garbage", []string{"run", write("garbage.onnx", garbage)}, exitModel, "garbage.onnx", nil},
		{"model is an npy file", []string{"run", goodBatch}, exitModel, "batch.npy", []string{"NumPy"}},
		{"empty batch", []string{"run", good, "-i", write("empty.npy", nil)}, exitUsage, "empty.npy", nil},
		{"truncated batch", []string{"run", good, "-i", write("short.npy", npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4), }", f32bytes(1, 2)))}, exitUsage, "short.npy", nil},
		{"petabyte npy header", []string{"run", good, "-i", write("peta.npy", npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1048576, 1048576, 262144), }", nil))}, exitUsage, "peta.npy", nil},
		{"npy garbage", []string{"run", good, "-i", write("garbage.npy", garbage)}, exitUsage, "garbage.npy", nil},
		{"cycle", []string{"run", saveModel(t, dir, "cycle.onnx", onnx.NewModel(cyclic, 17)), "-i", goodBatch}, exitModel, "cycle.onnx", []string{"cycle"}},
		{"dangling input", []string{"run", saveModel(t, dir, "dangling.onnx", onnx.NewModel(dangling, 17)), "-i", goodBatch}, exitModel, "dangling.onnx", []string{"nowhere"}},
		{"two producers", []string{"run", saveModel(t, dir, "dup_producer.onnx", onnx.NewModel(dupProducer, 17)), "-i", goodBatch}, exitModel, "dup_producer.onnx", []string{`"y"`}},
		{"wrong dtype: complex", []string{"run", good, "-i", write("complex.npy", npyBytes("{'descr': '<c8', 'fortran_order': False, 'shape': (1, 4), }", make([]byte, 32)))}, exitUsage, "complex.npy", nil},
		{"wrong dtype: strings", []string{"run", good, "-i", write("strings.npy", npyBytes("{'descr': '<U3', 'fortran_order': False, 'shape': (1, 4), }", make([]byte, 48)))}, exitUsage, "strings.npy", nil},
		{"wrong dtype: bool for float", []string{"run", good, "-i", write("bool.npy", npyBytes("{'descr': '|b1', 'fortran_order': False, 'shape': (1, 4), }", []byte{1, 0, 1, 0}))}, exitUsage, "bool.npy", nil},
		{"string model input", []string{"run", saveModel(t, dir, "string_input.onnx", onnx.NewModel(stringInput, 17)), "-i", goodBatch}, exitUsage, "batch.npy", []string{"string"}},
		{"zero-size batch", []string{"run", good, "-i", write("zero.npy", npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4), }", nil))}, exitUsage, "zero.npy", nil},
		{"external data: absolute", []string{"run", extAbs, "-i", goodBatch}, exitModel, "abs.onnx", []string{"absolute"}},
		{"external data: ..", []string{"run", extDotDot, "-i", goodBatch}, exitModel, "dotdot.onnx", []string{"escapes"}},
		{"external data: symlink", []string{"run", extLink, "-i", goodBatch}, exitModel, "link.onnx", []string{"symlink"}},
		{"model is a folder", []string{"run", dir}, exitModel, dir, nil},
		{"subgraphs nested 200 deep", []string{"run", saveModel(t, dir, "nested.onnx", nestedIf(200)), "-i", goodBatch}, exitModel, "nested.onnx", []string{"nested"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var before goruntime.MemStats
			goruntime.ReadMemStats(&before)
			start := time.Now()
			code, stdout, stderr := run(t, c.args...)
			if d := time.Since(start); d > 30*time.Second {
				t.Errorf("took %v", d)
			}
			var after goruntime.MemStats
			goruntime.ReadMemStats(&after)
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 256<<20 {
				t.Errorf("allocated %d MiB", grew>>20)
			}
			if code != c.code {
				t.Errorf("exit %d, want %d; stderr: %s", code, c.code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout not empty: %q", stdout)
			}
			lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
			if len(lines) != 1 || !strings.HasPrefix(stderr, "fp16audit") {
				t.Errorf("want one line on stderr, got %d:\n%s", len(lines), stderr)
			}
			if !strings.Contains(stderr, c.file) {
				t.Errorf("stderr does not name %s: %s", c.file, stderr)
			}
			for _, w := range c.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q: %s", w, stderr)
				}
			}
		})
	}
	// A graph output listed twice is harmless: the audit completes.
	code, _, stderr := run(t, "run", saveModel(t, dir, "dup_output.onnx", onnx.NewModel(dupOutput, 17)), "-i", goodBatch)
	if code != exitOK {
		t.Errorf("duplicate graph output: exit %d: %s", code, stderr)
	}
	if data, err := os.ReadFile(secret); err != nil || !bytes.Equal(data, f32bytes(1, 2, 3, 4)) {
		t.Errorf("the file outside the model folder changed")
	}
}

// TestZeroSizeTensors: a model whose graph makes an empty tensor in the
// middle (Slice to nothing, then a reduction) audits cleanly.
func TestZeroSizeTensors(t *testing.T) {
	dir := t.TempDir()
	g := reluGraph()
	g.Initializer = []*onnx.TensorProto{
		onnx.Int64Tensor("starts", []int64{1}, []int64{2}),
		onnx.Int64Tensor("ends", []int64{1}, []int64{2}),
		onnx.Int64Tensor("axes", []int64{1}, []int64{1}),
	}
	g.Node = []*onnx.NodeProto{
		onnx.Node("Slice", "/slice/Slice", []string{"x", "starts", "ends", "axes"}, []string{"empty"}),
		onnx.Node("Relu", "/relu/Relu", []string{"empty"}, []string{"r"}),
		onnx.Node("Concat", "/cat/Concat", []string{"x", "r"}, []string{"y"}, onnx.AttrInt("axis", 1)),
	}
	model := saveModel(t, dir, "zero.onnx", onnx.NewModel(g, 17))
	code, _, stderr := run(t, "run", model, "--format", "json")
	if code != exitOK {
		t.Errorf("exit %d: %s", code, stderr)
	}
}

// TestHugeModel: a 100 000-node model loads, is indexed, upcast, rewritten
// under every policy and serialized, and the CLI audits it (the fp32 pass
// only: ONNX Runtime's session creation dominates and is superlinear in the
// outputs, so the full audit would make the suite long). How long the graph
// work takes is BenchmarkHugeModelGraphWork's to measure, not a test's: a
// wall-clock limit fails on a loaded machine and passes a regression on a
// fast one.
func TestHugeModel(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	dir := t.TempDir()
	model := saveModel(t, dir, "huge.onnx", chainModel(hugeNodes))
	hugeGraphWork(t, model, dir)
	code, _, stderr := run(t, "run", model, "--policy", "fp32", "--no-fixes", "--format", "json", "--threads", "1")
	if code != exitOK {
		t.Errorf("exit %d: %s", code, stderr)
	}
}

// hugeNodes is the size of TestHugeModel's chain.
const hugeNodes = 100_000

// hugeGraphWork is fp16audit's own work on a model before ONNX Runtime
// sees it: load, index, upcast, every policy's assignment and rewrite, and
// the serialization of the instrumented graph.
func hugeGraphWork(tb testing.TB, model, dir string) {
	m, err := onnx.Load(model)
	if err != nil {
		tb.Fatal(err)
	}
	up, _, err := rewrite.Upcast(m.Proto, dir)
	if err != nil {
		tb.Fatal(err)
	}
	upIdx, err := onnx.NewIndex(up.Graph)
	if err != nil {
		tb.Fatal(err)
	}
	var names []string
	for _, ni := range m.Index.Order() {
		names = append(names, m.Proto.Graph.Node[ni].Output...)
	}
	for _, p := range precision.Policies() {
		a := precision.Assign(p, m.Proto.Graph, m.Index.Order(), m.Index.ElemType)
		inst, _ := rewrite.Instrument(rewrite.Emulate(up, m.Proto.Graph, a), names, upIdx.ElemType)
		if _, err := onnx.Marshal(inst); err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkHugeModelGraphWork measures hugeGraphWork on the 100 000-node
// chain (ns/op for the whole model; linear work is a few seconds).
func BenchmarkHugeModelGraphWork(b *testing.B) {
	dir := b.TempDir()
	model := saveModel(b, dir, "huge.onnx", chainModel(hugeNodes))
	b.ResetTimer()
	for range b.N {
		hugeGraphWork(b, model, dir)
	}
}

// TestDeeplyNestedSubgraphs: If inside If, far deeper than ONNX Runtime
// parses (about 30 levels; the CLI's refusal is in TestHostileInputs). The
// loader, the graph index, the policy and the rewrites must handle any depth
// without exhausting the stack; at 30 levels the whole audit completes.
func TestDeeplyNestedSubgraphs(t *testing.T) {
	dir := t.TempDir()
	for _, depth := range []int{200, 3000} {
		data, err := onnx.Marshal(nestedIf(depth))
		if err != nil {
			t.Fatal(err)
		}
		m, err := onnx.LoadBytes(data, filepath.Join(dir, "nested.onnx"))
		if err != nil {
			t.Fatalf("depth %d: %v", depth, err)
		}
		if got := m.Index.ImplicitInputs(0); !slices.Equal(got, []string{"cond", "x"}) {
			t.Errorf("depth %d: implicit inputs %v, want [cond x]", depth, got)
		}
		up, _, err := rewrite.Upcast(m.Proto, dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range precision.Policies() {
			a := precision.Assign(p, m.Proto.Graph, m.Index.Order(), m.Index.ElemType)
			if _, err := onnx.Marshal(rewrite.Emulate(up, m.Proto.Graph, a)); err != nil {
				t.Fatalf("depth %d, %s: %v", depth, p.Name, err)
			}
		}
	}
	model := saveModel(t, dir, "nested30.onnx", nestedIf(30))
	code, _, stderr := run(t, "run", model, "--format", "json")
	if code != exitOK {
		t.Errorf("30 deep: exit %d: %s", code, stderr)
	}
}

// TestPanicIsReported: a panic becomes a short bug-report message and exit
// code 3.
func TestPanicIsReported(t *testing.T) {
	panicHook = func([]string) { panic("test panic") }
	defer func() { panicHook = nil }()
	code, stdout, stderr := run(t, "run", "some model.onnx", "-i", "x.npy")
	if code != exitModel || stdout != "" {
		t.Errorf("exit %d, stdout %q", code, stdout)
	}
	for _, want := range []string{"internal error: test panic", "bug", "fp16audit run 'some model.onnx' -i x.npy"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "goroutine") {
		t.Errorf("stack trace without FP16AUDIT_DEBUG:\n%s", stderr)
	}
}

// snapshot hashes every file under dir, by path.
func snapshot(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	out := map[string][32]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[p] = sha256.Sum256(data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameSnapshot(t *testing.T, what string, before, after map[string][32]byte) {
	t.Helper()
	for p, h := range after {
		if b, ok := before[p]; !ok {
			t.Errorf("%s: new file %s", what, p)
		} else if b != h {
			t.Errorf("%s: %s changed", what, p)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			t.Errorf("%s: %s was removed", what, p)
		}
	}
}

// TestNothingLeftBehind: inputs are not modified, nothing is written next
// to the model or the batches, and the temporary folder stays empty.
func TestNothingLeftBehind(t *testing.T) {
	modelDir, batchDir, outDir, tmp := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	t.Setenv("TMPDIR", tmp)
	for _, name := range []string{"cnn_external.onnx", "cnn_external.bin"} {
		data, err := os.ReadFile(models + name)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(modelDir, name), data, 0o444)
	}
	data, err := os.ReadFile(batches + "cnn_external.npz")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(batchDir, "batch.npz"), data, 0o444)
	beforeModel, beforeBatch := snapshot(t, modelDir), snapshot(t, batchDir)
	for _, format := range []string{"json", "html", "text"} {
		out := filepath.Join(outDir, "render."+format)
		code, _, stderr := run(t, "run", filepath.Join(modelDir, "cnn_external.onnx"), "-i", filepath.Join(batchDir, "batch.npz"), "--format", format, "--output", out)
		if code != exitOK && code != exitFindings {
			t.Fatalf("exit %d: %s", code, stderr)
		}
	}
	sameSnapshot(t, "model folder", beforeModel, snapshot(t, modelDir))
	sameSnapshot(t, "batch folder", beforeBatch, snapshot(t, batchDir))
	entries, _ := os.ReadDir(outDir)
	if len(entries) != 3 {
		t.Errorf("output folder holds %v, want the three reports", entries)
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
		t.Errorf("temporary folder holds %v", entries)
	}
}

// TestInterrupt runs the built binary on a long synthetic audit, sends
// SIGINT mid-run and checks that it stops with exit 3 and "interrupted",
// leaving no report, no temporary file next to it and nothing in the
// temporary folder.
func TestInterrupt(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	work := t.TempDir()
	bin := filepath.Join(work, "fp16audit")
	build := exec.Command("go", "build", "-o", bin, "fp16audit/cmd/fp16audit")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	outDir, tmp := filepath.Join(work, "out"), filepath.Join(work, "tmp")
	os.Mkdir(outDir, 0o755)
	os.Mkdir(tmp, 0o755)
	report := filepath.Join(outDir, "render.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "run", models+"cnn.onnx", "--synthetic-batches", "30000",
		"--threads", "1", "--format", "json", "--output", report)
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until the audit is well into its passes: the synthetic batches
	// are made first, then the runs start.
	time.Sleep(2 * time.Second)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := cmd.Wait()
	code := cmd.ProcessState.ExitCode()
	t.Logf("stopped %v after SIGINT: %v", time.Since(start), err)
	if code != exitModel || !strings.Contains(stderr.String(), "interrupted") {
		t.Errorf("exit %d, want %d with \"interrupted\"; stderr:\n%s", code, exitModel, stderr.String())
	}
	if time.Since(start) > 20*time.Second {
		t.Errorf("took %v to stop after SIGINT", time.Since(start))
	}
	if entries, _ := os.ReadDir(outDir); len(entries) != 0 {
		t.Errorf("output folder holds %v after the interrupt", names(entries))
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
		t.Errorf("temporary folder holds %v after the interrupt", names(entries))
	}
}

func names(entries []os.DirEntry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return slices.Sorted(slices.Values(out))
}
