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
	if !filepath.IsAbs(model) {
		model = filepath.Join("..", "..", "fixtures", model)
	}
	m, err := onnx.Load(model)
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
			if onnx.IsFloatType(upIdx.ElemType(o)) && upIdx.Tensor(o) {
				names = append(names, o)
			}
		}
	}
	e := &Engine{Library: lib, Inputs: batch.Names(specs), Order: order, Nodes: len(m.Proto.Graph.Node),
		Observe: names, ElemType: upIdx.ElemType, Contents: upIdx.Contents(), MaxMemory: 1 << 40, ModelFile: m.Path,
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
// run in parts; one below the weights and a single sample makes the model
// run in blocks.
func TestBudgetSplits(t *testing.T) {
	e, passes, bs := engineFor(t, "torch/cases/resnet_raw_pixels/model.onnx", "torch/cases/resnet_raw_pixels/batches")
	mp, err := e.memoryPlan(passes, bs, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func(f func() (int64, bool)) { memResident = f }(memResident)
	memResident = func() (int64, bool) { return 0, false }
	per := int64(partMargin * float64((mp.peak-mp.weights-mp.rounded)/mp.samples))
	e.MaxMemory = mp.weights + mp.rounded + 2*per
	if _, mp, err = e.Run(context.Background(), passes, bs); err != nil || mp.step != 2 || mp.blocks != nil {
		t.Fatalf("budget for 2 samples: %v, %v", mp, err)
	}
	if n := mp.Note(); !strings.Contains(n, "parts of 2 samples") || !strings.Contains(n, "--max-memory") {
		t.Errorf("note %q", n)
	}
	e.MaxMemory = mp.weights + mp.rounded + per/2
	if _, mp, err = e.Run(context.Background(), passes, bs); err != nil || mp.blocks == nil {
		t.Fatalf("budget below the weights and one sample: %v, %v", mp, err)
	}
	if n := mp.Note(); !strings.Contains(n, "blocks of consecutive nodes") {
		t.Errorf("note %q", n)
	}
}

// TestFixedBatchRefused: a model whose batch dimension is fixed cannot run
// in parts; over the budget it is refused with the export to fix it.
func TestFixedBatchRefused(t *testing.T) {
	e, passes, bs := engineFor(t, "models/demo_cnn.onnx", "batches/demo_cnn_raw.npy")
	// What the test process holds is not the point: the budget leaves
	// room for the weights and half a run.
	defer func(f func() (int64, bool)) { memResident = f }(memResident)
	memResident = func() (int64, bool) { return 0, false }
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

// padAttention writes a model whose attention-like values the shape
// inference cannot size: x [N, 256, 64] → Pad (an op it does not know) →
// scores p·pᵀ [N, 256, 256] → Softmax → ·p; it returns the model's path.
func padAttention(t *testing.T, dir string) string {
	g := &onnx.GraphProto{
		Name: "pad_attention",
		Node: []*onnx.NodeProto{
			onnx.Node("Pad", "/Pad", []string{"x", "pads"}, []string{"p"}),
			onnx.Node("Transpose", "/Transpose", []string{"p"}, []string{"pt"}, onnx.AttrInts("perm", 0, 2, 1)),
			onnx.Node("MatMul", "/MatMul", []string{"p", "pt"}, []string{"s"}),
			onnx.Node("Softmax", "/Softmax", []string{"s"}, []string{"sm"}, onnx.AttrInt("axis", -1)),
			onnx.Node("MatMul", "/MatMul_1", []string{"sm", "p"}, []string{"y"}),
		},
		Initializer: []*onnx.TensorProto{onnx.Int64Tensor("pads", []int64{6}, make([]int64, 6))},
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, "batch", 256, 64)},
		Output:      []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, "batch", 256, 64)},
	}
	path := filepath.Join(dir, "pad_attention.onnx")
	if err := onnx.Save(onnx.NewModel(g, 17), path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestProbeCompletesEstimate: a model whose attention scores the shape
// inference cannot size (they follow an op it does not know, as values
// computed from the data would) makes the estimate partial. Under a
// budget, two runs of one and two samples measure them: the estimate grows
// to count them, the batch runs in parts, and the note says the estimate
// is complete.
func TestProbeCompletesEstimate(t *testing.T) {
	x := make([]float32, 8*256*64)
	for i := range x {
		x[i] = float32(i%13)/13 - 0.5
	}
	npy, err := batch.EncodeNPY(tensor.FromFloat32s("x", []int64{8, 256, 64}, x))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "x.npy")
	if err := os.WriteFile(file, npy, 0o644); err != nil {
		t.Fatal(err)
	}
	e, passes, bs := engineFor(t, padAttention(t, dir), file)
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

// TestBlocksEqualWhole: the model cut into blocks of consecutive nodes,
// each in a session of its own with the values crossing a cut handed on,
// gives every pass's statistics of every value bit for bit as one session
// does, whole batches and batches in parts alike (the last model's values
// need the shape probe to merge parts).
func TestBlocksEqualWhole(t *testing.T) {
	dir := t.TempDir()
	x := make([]float32, 3*256*64)
	for i := range x {
		x[i] = float32(i%11)/11 - 0.5
	}
	npy, err := batch.EncodeNPY(tensor.FromFloat32s("x", []int64{3, 256, 64}, x))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "x.npy"), npy, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][2]string{{"models/mlp_dynamic.onnx", "batches/mlp_dynamic_b5.npy"}, {"models/torch_resnetish.onnx", "batches/torch_resnetish.npy"},
		{"torch/cases/token_transformer_overflow/model.onnx", "torch/cases/token_transformer_overflow/batches"},
		{"torch/cases/gpt_mask_additive_finfo/model.onnx", "torch/cases/gpt_mask_additive_finfo/batches"},
		{"torch/cases/two_inputs_metadata/model.onnx", "torch/cases/two_inputs_metadata/batches"}, {"torch/cases/vit_tiny/model.onnx", "torch/cases/vit_tiny/batches"},
		{padAttention(t, dir), filepath.Join(dir, "x.npy")},
		// sequences (SplitToSequence) live across the cuts cutEvery would
		// make: the cuts move past them, as ONNX Runtime hands on tensors
		{"torch/cases_seq_dynamo/lstm_gates_chunk/model.onnx", "torch/cases_seq_dynamo/lstm_gates_chunk/batches"},
		{"torch/cases_seq_dynamo/glu_proj_overflow/model.onnx", "torch/cases_seq_dynamo/glu_proj_overflow/batches"}} {
		t.Run(c[0], func(t *testing.T) {
			e, passes, bs := engineFor(t, c[0], c[1])
			for _, step := range []int64{0, 1} {
				e.forceStep, e.forceBlocks = step, 0
				whole, _, err := e.Run(context.Background(), passes, bs)
				if err != nil {
					t.Fatal(err)
				}
				e.forceBlocks = 3
				blocks, mp, err := e.Run(context.Background(), passes, bs)
				if err != nil {
					t.Fatal(err)
				}
				if mp.blocks == nil || len(mp.blocks.starts) != 3 {
					t.Fatalf("step %d: ran in blocks %+v, want 3", step, mp.blocks)
				}
				if n := mp.Note(); !strings.Contains(n, "ran in 3 blocks") {
					t.Errorf("the note does not say the model ran in blocks: %q", n)
				}
				for p := range passes {
					if len(blocks[p].Stats) != len(whole[p].Stats) {
						t.Errorf("step %d, %s: %d values in blocks, %d whole", step, passes[p].Name, len(blocks[p].Stats), len(whole[p].Stats))
					}
					for v, w := range whole[p].Stats {
						if g := blocks[p].Stats[v]; *g != *w {
							t.Errorf("step %d, %s %s: in blocks %+v, whole %+v", step, passes[p].Name, v, *g, *w)
						}
						if g, w := fmt.Sprint(blocks[p].Shapes[v]), fmt.Sprint(whole[p].Shapes[v]); g != w {
							t.Errorf("step %d, %s %s: shape %s in blocks, %s whole", step, passes[p].Name, v, g, w)
						}
					}
					for v, w := range whole[p].Diffs {
						if g := blocks[p].Diffs[v]; *g != *w {
							t.Errorf("step %d, %s %s: diff in blocks %+v, whole %+v", step, passes[p].Name, v, *g, *w)
						}
					}
					// The graph outputs come back from the last block and
					// compare with fp32's as they do in one session.
					if passes[p].Ref != "" && (len(whole[p].Outputs) == 0 || len(blocks[p].Outputs) != len(whole[p].Outputs)) {
						t.Errorf("step %d, %s: %d outputs compared in blocks, %d whole", step, passes[p].Name, len(blocks[p].Outputs), len(whole[p].Outputs))
						continue
					}
					for k, w := range whole[p].Outputs {
						if g := blocks[p].Outputs[k]; *g != *w || w.Samples == 0 {
							t.Errorf("step %d, %s output %s: in blocks %+v, whole %+v", step, passes[p].Name, w.Name, *g, *w)
						}
					}
				}
			}
		})
	}
}

// TestBudgetBelowWeights: a Llama-style decoder (4 layers, weights in an
// external data file) under a budget of 60 % of its weights runs in blocks
// cut between its layers, with the statistics of one session, and a budget
// below its largest single node is refused naming both sizes.
func TestBudgetBelowWeights(t *testing.T) {
	e, passes, bs := engineFor(t, "bench/llama_tiny/model.onnx", "bench/llama_tiny/batches/input_ids.npy")
	whole, _, err := e.Run(context.Background(), passes, bs)
	if err != nil {
		t.Fatal(err)
	}
	defer func(f func() (int64, bool)) { memResident = f }(memResident)
	memResident = func() (int64, bool) { return 0, false }
	mp, err := e.memoryPlan(passes, bs, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.MaxMemory = mp.weights * 6 / 10
	blocks, mp, err := e.Run(context.Background(), passes, bs)
	if err != nil {
		t.Fatal(err)
	}
	if mp.blocks == nil || len(mp.blocks.starts) < 2 {
		t.Fatalf("a budget of %s for %s of weights ran in blocks %+v", FormatSize(e.MaxMemory), FormatSize(mp.weights), mp.blocks)
	}
	g := passes[0].Model.Graph
	for b, s := range mp.blocks.starts[1:] {
		name := g.Node[mp.prof.order[s]].Name
		if !strings.Contains(name, "/input_layernorm/") && !strings.Contains(name, "/post_attention_layernorm/") && !strings.HasPrefix(name, "/model/norm/") {
			t.Errorf("block %d starts at %s, not at a layer's norm", b+1, name)
		}
		if c := mp.blocks.cost[b]; c > e.MaxMemory {
			t.Errorf("block %d estimated at %s, over the budget of %s", b, FormatSize(c), FormatSize(e.MaxMemory))
		}
	}
	if n := mp.Note(); !strings.Contains(n, fmt.Sprintf("ran in %d blocks", len(mp.blocks.starts))) || !strings.Contains(n, "--max-memory") || strings.Contains(n, "partial") {
		t.Errorf("note %q", n)
	}
	for p := range passes {
		for v, w := range whole[p].Stats {
			if g := blocks[p].Stats[v]; *g != *w {
				t.Errorf("%s %s: in blocks %+v, whole %+v", passes[p].Name, v, *g, *w)
			}
		}
	}
	e.MaxMemory = mp.weights / 10
	_, _, err = e.Run(context.Background(), passes, bs)
	var be *BudgetError
	if !errors.As(err, &be) || !strings.Contains(err.Error(), "alone needs an estimated") || !strings.Contains(err.Error(), FormatSize(e.MaxMemory)) {
		t.Errorf("budget below one node: %v", err)
	}
}

// TestHandOverEqualsCopy: weights the model stores inline, handed to ONNX
// Runtime over the loaded model's memory, give the statistics ONNX
// Runtime's own copy gives, and the estimate counts them with what the
// process already holds.
func TestHandOverEqualsCopy(t *testing.T) {
	e, passes, bs := engineFor(t, "torch/cases/resnet_raw_pixels/model.onnx", "torch/cases/resnet_raw_pixels/batches")
	handed, mp, err := e.Run(context.Background(), passes, bs)
	if err != nil {
		t.Fatal(err)
	}
	if mp.handed == 0 {
		t.Fatal("no weight was handed over")
	}
	e.ModelFile = ""
	copied, mc, err := e.Run(context.Background(), passes, bs)
	if err != nil {
		t.Fatal(err)
	}
	if mc.handed != 0 || mc.weights != mp.weights+mp.handed {
		t.Errorf("weights %d and %d handed over, without: %d and %d", mp.weights, mp.handed, mc.weights, mc.handed)
	}
	for p := range passes {
		for v, w := range copied[p].Stats {
			if g := handed[p].Stats[v]; *g != *w {
				t.Errorf("%s %s: handed over %+v, copied %+v", passes[p].Name, v, *g, *w)
			}
		}
	}
}

// TestBudgetBelowResident: a --max-memory below what the process already
// holds is refused naming both sizes, with no negative room in the
// message (it read "above the -33337344 B the budget leaves").
func TestBudgetBelowResident(t *testing.T) {
	e, passes, bs := engineFor(t, "models/demo_cnn.onnx", "batches/demo_cnn_raw.npy")
	defer func(f func() (int64, bool)) { memResident = f }(memResident)
	memResident = func() (int64, bool) { return 64 << 20, true }
	e.MaxMemory = 1 << 20
	_, _, err := e.Run(context.Background(), passes, bs)
	var be *BudgetError
	if !errors.As(err, &be) {
		t.Fatalf("want a budget error, got %v", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "1 MiB") || !strings.Contains(msg, "64 MiB") || strings.Contains(msg, "-") && strings.Contains(msg, " B the budget leaves") {
		t.Errorf("message %q", msg)
	}
}
