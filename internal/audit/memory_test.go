package audit

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"fp16audit/fixtures"
	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/shapes"
	"fp16audit/internal/rewrite"
	"fp16audit/internal/tensor"
	"fp16audit/report"
)

// shapeCases are models whose every value the shape inference must get
// right: the fixtures and miniature versions of the benchmark models.
func shapeCases() []*fixtures.Fixture {
	return append(fixtures.All(), fixtures.BigTransformer(2, 128, 16, 2), fixtures.BigResNet(40, 1))
}

// TestInferShapesMatchRuntime compares the inferred shape of every observed
// value with the shape ONNX Runtime produced, in every pass graph: on the
// fixtures, miniature versions of the benchmark models, and real PyTorch
// exports whose reshapes and masks are computed from Shape (a Llama-style
// decoder, GPT, ViT), which the inference must follow without a probe.
func TestInferShapesMatchRuntime(t *testing.T) {
	dir := t.TempDir()
	type shapeCase struct{ name, model, batch string }
	var cases []shapeCase
	for _, f := range shapeCases() {
		model, batchFile := writeFixture(t, f, dir)
		cases = append(cases, shapeCase{f.Name, model, batchFile})
	}
	for _, c := range []string{"bench/llama_tiny/model.onnx:bench/llama_tiny/batches", "torch/cases/gpt_mask_additive_finfo/model.onnx:torch/cases/gpt_mask_additive_finfo/batches",
		"torch/cases/vit_tiny/model.onnx:torch/cases/vit_tiny/batches", "torch/cases/token_transformer_overflow/model.onnx:torch/cases/token_transformer_overflow/batches"} {
		model, batches, _ := strings.Cut(c, ":")
		cases = append(cases, shapeCase{model, filepath.Join("..", "..", "fixtures", model), filepath.Join("..", "..", "fixtures", batches)})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := Run(context.Background(), Config{ModelPath: c.model, Inputs: []string{c.batch}, NoFixes: true})
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(strings.Join(r.Notes, "\n"), "probe") {
				t.Errorf("shapes needed a probe: %v", r.Notes)
			}
			m, err := onnx.Load(c.model)
			if err != nil {
				t.Fatal(err)
			}
			up, _, err := rewrite.Upcast(m.Proto, m.Dir)
			if err != nil {
				t.Fatal(err)
			}
			idx, err := onnx.NewIndex(up.Graph)
			if err != nil {
				t.Fatal(err)
			}
			bs, _, err := batch.Load(batch.Specs(m.Proto.Graph, m.Index), batch.Options{Args: []string{c.batch}})
			if err != nil {
				t.Fatal(err)
			}
			in := map[string][]int64{}
			for _, x := range bs[0].Inputs {
				in[x.Name] = x.Shape
			}
			inferred := shapes.Infer(up.Graph, idx, in, nil)
			n := 0
			for _, node := range r.Nodes {
				for _, o := range node.Outputs {
					got, ok := inferred[o.Name]
					if !ok {
						t.Errorf("%s: no shape inferred, runtime gave %s", o.Name, o.Shape)
						continue
					}
					if tensor.ShapeString(got) != o.Shape {
						t.Errorf("%s: inferred %s, runtime gave %s", o.Name, tensor.ShapeString(got), o.Shape)
					}
					n++
				}
			}
			if n == 0 {
				t.Fatal("no values compared")
			}
		})
	}
}

// padModel is x [2,4] → Pad (which the shape inference does not know) →
// Relu → MatMul [6,3] → Exp: its shapes after Pad come from a probe run.
func padModel(t *testing.T) (string, string) {
	g := &onnx.GraphProto{
		Name: "pad",
		Node: []*onnx.NodeProto{
			onnx.Node("Pad", "/Pad", []string{"x", "pads"}, []string{"p"}),
			onnx.Node("Relu", "/Relu", []string{"p"}, []string{"r"}),
			onnx.Node("MatMul", "/MatMul", []string{"r", "w"}, []string{"m"}),
			onnx.Node("Exp", "/Exp", []string{"m"}, []string{"y"}),
		},
		Initializer: []*onnx.TensorProto{
			onnx.Int64Tensor("pads", []int64{4}, []int64{0, 1, 0, 1}),
			onnx.FloatTensor("w", []int64{6, 3}, []float32{1, -1, 2, 0.5, 0.25, -3, 1, 1, 1, 2, 2, 2, -1, 0, 1, 3, 2, 1}),
		},
		Input:  []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 2, 4)},
		Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 2, 3)},
	}
	dir := t.TempDir()
	model := filepath.Join(dir, "pad.onnx")
	if err := onnx.Save(onnx.NewModel(g, 17), model); err != nil {
		t.Fatal(err)
	}
	f := &fixtures.Fixture{Name: "pad", Model: onnx.NewModel(g, 17), Batches: []fixtures.Batch{{
		Inputs: []*tensor.Tensor{tensor.FromFloat32s("x", []int64{2, 4}, []float32{1, 2, 3, 4, -1, -2, -3, -4})}}}}
	return writeFixture(t, f, dir)
}

// TestPartialEstimate: values the shape inference cannot size (after a
// Pad it does not know) make the memory estimate partial, and the report
// says so when the budget is near; the audit itself is unaffected.
func TestPartialEstimate(t *testing.T) {
	model, batchFile := padModel(t)
	// A budget near the estimate, which counts what the process holds
	// before the passes: only then does a partial estimate matter, and
	// the report says so.
	// A first audit loads ONNX Runtime, so that the process holds about
	// what it holds when the second one plans.
	if _, err := Run(context.Background(), Config{ModelPath: model, Inputs: []string{batchFile}}); err != nil {
		t.Fatal(err)
	}
	statm, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Skip("needs /proc/self/statm")
	}
	pages, _ := strconv.ParseInt(strings.Fields(string(statm))[1], 10, 64)
	resident := pages * int64(os.Getpagesize())
	r, err := Run(context.Background(), Config{ModelPath: model, Inputs: []string{batchFile}, MaxMemory: resident * 3 / 2})
	if err != nil {
		t.Fatal(err)
	}
	if notes := strings.Join(r.Notes, "\n"); !strings.Contains(notes, "partial: 3 value(s) of unknown size") {
		t.Errorf("notes do not say the estimate is partial: %q", r.Notes)
	}
	if r.Verdict != report.VerdictHealthy || len(r.Nodes) != 4 {
		t.Errorf("verdict %s, %d nodes", r.Verdict, len(r.Nodes))
	}
}
