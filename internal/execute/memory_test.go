package execute

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
	"fp16audit/internal/tensor"
)

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"512M", 512 << 20}, {"4G", 4 << 30}, {"4g", 4 << 30}, {"1.5G", 3 << 29}, {"64KiB", 64 << 10},
		{"2GB", 2 << 30}, {"1T", 1 << 40}, {"1048576", 1 << 20}, {" 8M ", 8 << 20},
	} {
		got, err := ParseSize(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "M", "-1G", "0", "12X", "1e30T", "four"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
	for n, want := range map[int64]string{512: "512 B", 1536: "1.5 KiB", 320 << 20: "320 MiB", 3 << 29: "1.5 GiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestAvailableMemory(t *testing.T) {
	n, src, ok := availableMemory()
	if !ok {
		t.Skip("no /proc/meminfo")
	}
	if n <= 0 || src == "" {
		t.Errorf("available %d from %q", n, src)
	}
}

// TestRefuseAboveAvailable: passes that need more than the available
// memory stop with a *BudgetError that names the sizes and --max-memory.
func TestRefuseAboveAvailable(t *testing.T) {
	defer func(f func() (int64, string, bool)) { memAvailable = f }(memAvailable)
	memAvailable = func() (int64, string, bool) { return 4 << 10, "the test", true }
	lib, err := onnxrt.FindLibrary("")
	if err != nil {
		t.Fatal(err)
	}
	if err := onnxrt.Init(lib); err != nil {
		t.Fatal(err)
	}
	m, err := onnx.Load(filepath.Join("..", "..", "fixtures", "models", "cnn.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	specs := batch.Specs(m.Proto.Graph, m.Index)
	bs, _, err := batch.Load(specs, batch.Options{Args: []string{filepath.Join("..", "..", "fixtures", "batches", "cnn.npy")}})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ni := range m.Index.Order() {
		names = append(names, m.Proto.Graph.Node[ni].Output...)
	}
	e := &Engine{Library: lib, Inputs: batch.Names(specs), Order: m.Index.Order(), Nodes: len(m.Proto.Graph.Node),
		Observe: names, ElemType: m.Index.ElemType, MaxMemory: 1 << 30,
		Session: onnxrt.SessionOptions{ExternalDataDir: m.Dir, Optimization: "none"}}
	_, _, err = e.Run(context.Background(), []Pass{{Name: "fp32", Model: m.Proto}}, bs)
	var be *BudgetError
	if !errors.As(err, &be) || !strings.Contains(err.Error(), "--max-memory") || !strings.Contains(err.Error(), "4 KiB") {
		t.Fatalf("got %v, want a budget error naming the 4 KiB available and --max-memory", err)
	}
}

// engineFor sets up an engine for the fp32 pass and the autocast-fp16
// emulation of a fixture model, as the audit does.
func engineFor(t *testing.T, model, batchFile string) (*Engine, []Pass, []batch.Batch) {
	t.Helper()
	lib, err := onnxrt.FindLibrary("")
	if err != nil {
		t.Fatal(err)
	}
	m, err := onnx.Load(filepath.Join("..", "..", "fixtures", model))
	if err != nil {
		t.Fatal(err)
	}
	specs := batch.Specs(m.Proto.Graph, m.Index)
	if !filepath.IsAbs(batchFile) {
		batchFile = filepath.Join("..", "..", "fixtures", batchFile)
	}
	bs, _, err := batch.Load(specs, batch.Options{Args: []string{batchFile}})
	if err != nil {
		t.Fatal(err)
	}
	up, _, err := rewrite.Upcast(m.Proto, m.Dir)
	if err != nil {
		t.Fatal(err)
	}
	upIdx, err := onnx.NewIndex(up.Graph)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := precision.PolicyByName("autocast-fp16")
	order := m.Index.Order()
	a := precision.Assign(p, m.Proto.Graph, order, m.Index.ElemType)
	var names []string
	for _, ni := range order {
		for _, o := range m.Proto.Graph.Node[ni].Output {
			if onnx.IsFloatType(upIdx.ElemType(o)) {
				names = append(names, o)
			}
		}
	}
	e := &Engine{Library: lib, Inputs: batch.Names(specs), Order: order, Nodes: len(m.Proto.Graph.Node),
		Observe: names, ElemType: upIdx.ElemType, MaxMemory: 1 << 40,
		Session: onnxrt.SessionOptions{ExternalDataDir: m.Dir, Optimization: "none", Threads: 1}}
	passes := []Pass{{Name: "fp32", Model: up}, {Name: "fp16", Model: rewrite.Emulate(up, m.Proto.Graph, a), Ref: "fp32"}}
	return e, passes, bs
}

// TestSplitEqualsWhole: a batch run in parts of one sample (as a small
// budget makes it) gives the whole batch's counts and shapes, its maxima
// where the whole batch has them, and its magnitudes up to the rounding
// ONNX Runtime's kernels change with the batch size.
func TestSplitEqualsWhole(t *testing.T) {
	for _, c := range [][2]string{{"models/mlp_dynamic.onnx", "batches/mlp_dynamic_b5.npy"}, {"models/torch_resnetish.onnx", "batches/torch_resnetish.npy"},
		{"torch/cases/resnet_raw_pixels/model.onnx", "torch/cases/resnet_raw_pixels/batches"},
		{"torch/cases/token_transformer_overflow/model.onnx", "torch/cases/token_transformer_overflow/batches"}} {
		t.Run(c[0], func(t *testing.T) {
			e, passes, bs := engineFor(t, c[0], c[1])
			whole, mp, err := e.Run(context.Background(), passes, bs)
			if err != nil {
				t.Fatal(err)
			}
			if mp.parts != 1 {
				t.Fatalf("the unbounded run ran in %d parts", mp.parts)
			}
			e.forceStep = 1
			split, mp, err := e.Run(context.Background(), passes, bs)
			if err != nil {
				t.Fatal(err)
			}
			if want := bs[0].Size(); mp.parts != int(want) {
				t.Fatalf("ran in %d parts, want one per sample (%d)", mp.parts, want)
			}
			if !strings.Contains(strings.Join(e.Notes(), "\n"), "ran in parts of 1 samples") {
				t.Errorf("notes do not say the batch ran in parts: %q", e.Notes())
			}
			for p := range passes {
				for v, w := range whole[p].Stats {
					g := split[p].Stats[v]
					// ONNX Runtime's Gemm and Conv round a sample's values
					// differently at another batch size, so values agree to
					// fp32 rounding, and counts at a class boundary may move.
					close := func(a, b float64) bool { return math.Abs(a-b) <= 1e-5*math.Max(math.Abs(b), 1e-30) }
					if g.Count != w.Count || g.Finite != w.Finite || g.NaN != w.NaN || g.PosInf != w.PosInf || g.NegInf != w.NegInf ||
						!close(float64(g.MaxAbs), float64(w.MaxAbs)) || g.ArgMaxBatch != w.ArgMaxBatch ||
						!close(g.SumSq, w.SumSq) {
						t.Errorf("%s %s: split %+v, whole %+v", passes[p].Name, v, *g, *w)
					}
					if g.MaxAbs == w.MaxAbs && g.ArgMax != w.ArgMax {
						t.Errorf("%s %s: maximum at %d, whole batch at %d", passes[p].Name, v, g.ArgMax, w.ArgMax)
					}
					if fmt.Sprint(split[p].Shapes[v]) != fmt.Sprint(whole[p].Shapes[v]) {
						t.Errorf("%s %s: shape %v, whole %v", passes[p].Name, v, split[p].Shapes[v], whole[p].Shapes[v])
					}
				}
				for v, w := range whole[p].Diffs {
					g := split[p].Diffs[v]
					if g.NewNonFinite != w.NewNonFinite || g.BothFinite != w.BothFinite {
						t.Errorf("%s %s: diff %+v, whole %+v", passes[p].Name, v, *g, *w)
					}
				}
			}
		})
	}
}

// TestBudgetSplits: a budget below the estimate of one run makes the batch
// run in parts; one below a single sample is refused.
func TestBudgetSplits(t *testing.T) {
	e, passes, bs := engineFor(t, "torch/cases/resnet_raw_pixels/model.onnx", "torch/cases/resnet_raw_pixels/batches")
	mp, err := e.memoryPlan(passes, bs, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func(f func() (int64, bool)) { memResident = f }(memResident)
	memResident = func() (int64, bool) { return 0, false }
	per := int64(partMargin * float64((mp.peak-mp.weights)/mp.samples))
	e.MaxMemory = mp.weights + 2*per
	if _, mp, err = e.Run(context.Background(), passes, bs); err != nil || mp.step != 2 {
		t.Fatalf("budget for 2 samples: %v, %v", mp, err)
	}
	if n := mp.Note(); !strings.Contains(n, "parts of 2 samples") || !strings.Contains(n, "--max-memory") {
		t.Errorf("note %q", n)
	}
	e.MaxMemory = mp.weights + per/2
	_, _, err = e.Run(context.Background(), passes, bs)
	var be *BudgetError
	if !errors.As(err, &be) || !strings.Contains(err.Error(), "one sample") {
		t.Errorf("budget below one sample: %v", err)
	}
}

// TestFixedBatchRefused: a model whose batch dimension is fixed cannot run
// in parts; over the budget it is refused with the export to fix it.
func TestFixedBatchRefused(t *testing.T) {
	e, passes, bs := engineFor(t, "models/demo_cnn.onnx", "batches/demo_cnn_raw.npy")
	mp, err := e.memoryPlan(passes, bs, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.MaxMemory = mp.weights + (mp.peak-mp.weights)/2
	_, _, err = e.Run(context.Background(), passes, bs)
	var be *BudgetError
	if !errors.As(err, &be) || !strings.Contains(err.Error(), "dynamic_axes") {
		t.Errorf("fixed batch over budget: %v", err)
	}
}

// TestProbeCompletesEstimate: the benchmark transformer (a PyTorch export)
// computes its attention reshapes from the data, so shape inference cannot
// size the attention scores and the estimate is partial. Under a budget,
// two runs of one and two samples measure them: the estimate grows to
// count them, the batch runs in parts, and the note says the estimate is
// complete.
func TestProbeCompletesEstimate(t *testing.T) {
	x := make([]float32, 8*256*64)
	for i := range x {
		x[i] = float32(i%13)/13 - 0.5
	}
	npy, err := batch.EncodeNPY(tensor.FromFloat32s("x", []int64{8, 256, 64}, x))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "x.npy")
	if err := os.WriteFile(file, npy, 0o644); err != nil {
		t.Fatal(err)
	}
	e, passes, bs := engineFor(t, "bench/transformer.onnx", file)
	partial, err := e.memoryPlan(passes, bs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if partial.unknown == 0 {
		t.Fatal("the shape inference sized every value: this test needs one it cannot size")
	}
	defer func(f func() (int64, bool)) { memResident = f }(memResident)
	memResident = func() (int64, bool) { return 0, false }
	// A budget the partial estimate fits twice over.
	e.MaxMemory = 2 * partial.peak
	_, mp, err := e.Run(context.Background(), passes, bs)
	if err != nil {
		t.Fatal(err)
	}
	if !mp.probed || mp.unknown != 0 {
		t.Errorf("after the probe: probed %v, %d values of unknown size", mp.probed, mp.unknown)
	}
	if mp.peak < 2*partial.peak {
		t.Errorf("measured estimate %s, partial %s: the attention scores should more than double it", FormatSize(mp.peak), FormatSize(partial.peak))
	}
	if mp.parts < 2 {
		t.Errorf("ran in %d part(s) under a budget of %s for an estimate of %s", mp.parts, FormatSize(e.MaxMemory), FormatSize(mp.peak))
	}
	if n := mp.Note(); strings.Contains(n, "partial") || !strings.Contains(n, "parts of") {
		t.Errorf("note %q", n)
	}
}
