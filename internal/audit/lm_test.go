package audit_test

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"fp16audit/internal/audit"
	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
	"fp16audit/report"
)

// lmFixture is a training fixture with its inputs written as .npy files
// (as -i NAME=PATH arguments) and its target beside them.
type lmFixture struct {
	trainFixture
	LossValue   float64 `json:"loss_value"`
	Scored      int64   `json:"scored"`
	IgnoreIndex int64   `json:"ignore_index"`
	Inputs      []struct{ Name, Key string }
	model       string
	inputs      []string
	target      string
}

func lmFixtureByName(t *testing.T, name string) lmFixture {
	t.Helper()
	f := manifestEntry[lmFixture](t, name, func(f lmFixture) string { return f.Name })
	ts, err := batch.ReadNPZ(filepath.Join(trainDir, f.Data))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	names := map[string]string{}
	for _, in := range f.Inputs {
		names[in.Key] = in.Name
	}
	for _, x := range ts {
		in, isInput := names[x.Name]
		if !isInput && x.Name != "target" {
			continue
		}
		b, err := batch.EncodeNPY(x)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, x.Name+".npy")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if isInput {
			f.inputs = append(f.inputs, in+"="+p)
		} else {
			f.target = p
		}
	}
	f.model = filepath.Join(trainDir, f.Model)
	return f
}

func (f lmFixture) audit(t *testing.T, tc audit.TrainConfig) (*report.Report, error) {
	t.Helper()
	return audit.Run(t.Context(), audit.Config{ModelPath: f.model, Inputs: f.inputs, Threads: 1, NoFixes: true, Train: tc})
}

// TestLanguageModelLoss audits the committed Llama-style decoder with the
// causal language model's loss, as Hugging Face computes it from
// labels: logits [2, 16, 256] against the labels shifted by one, the
// padded tail labelled -100. The loss equals torch's (gen.py), the report
// says how the loss read the logits, and no op of the decoder is left
// without a gradient. With the token ids themselves as the target (the
// default of --lm-shift) every shifted position is scored.
func TestLanguageModelLoss(t *testing.T) {
	f := lmFixtureByName(t, "llama")
	r, err := f.audit(t, audit.TrainConfig{Loss: "cross-entropy", Target: f.target, LMShift: true})
	if err != nil {
		t.Fatal(err)
	}
	b := r.Training.Backward
	if b.LossValue == nil || math.Abs(*b.LossValue-f.LossValue) > 1e-5*f.LossValue {
		t.Errorf("loss %v, torch %g", b.LossValue, f.LossValue)
	}
	want := report.CrossEntropyReport{ClassAxis: -1, Classes: 256, IgnoreIndex: -100, LMShift: true, Scored: f.Scored, Targets: 32}
	if b.CrossEntropy == nil || *b.CrossEntropy != want {
		t.Errorf("cross-entropy %+v, want %+v", b.CrossEntropy, want)
	}
	if len(b.Unsupported) != 0 {
		t.Errorf("ops without a gradient: %+v", b.Unsupported)
	}
	if b.Output != "logits" || b.Verdict == "" {
		t.Errorf("output %q verdict %q", b.Output, b.Verdict)
	}

	ids, err := f.audit(t, audit.TrainConfig{Loss: "cross-entropy", LMShift: true})
	if err != nil {
		t.Fatal(err)
	}
	ib := ids.Training.Backward
	if ib.Target != "input_ids" || ib.CrossEntropy == nil || ib.CrossEntropy.Scored != 30 {
		t.Errorf("target %q, cross-entropy %+v: want input_ids with all 2×15 shifted positions scored", ib.Target, ib.CrossEntropy)
	}
	if ib.LossValue == nil || *ib.LossValue == *b.LossValue {
		t.Errorf("loss on the token ids %v: want another than on the labels (%v)", ib.LossValue, *b.LossValue)
	}
}

// TestClassAxisOneAndIgnoreIndex audits the tagger: PyTorch's own layout
// ([N, C, S] logits, [N, S] tags) with ignore_index -1, on the first of
// its two outputs.
func TestClassAxisOneAndIgnoreIndex(t *testing.T) {
	f := lmFixtureByName(t, "tagger")
	ignore := f.IgnoreIndex
	r, err := f.audit(t, audit.TrainConfig{Loss: "cross-entropy", Target: f.target, Output: "logits", IgnoreIndex: &ignore})
	if err != nil {
		t.Fatal(err)
	}
	b := r.Training.Backward
	if b.LossValue == nil || math.Abs(*b.LossValue-f.LossValue) > 1e-5*f.LossValue {
		t.Errorf("loss %v, torch %g", b.LossValue, f.LossValue)
	}
	want := report.CrossEntropyReport{ClassAxis: 1, Classes: 5, IgnoreIndex: -1, Scored: f.Scored, Targets: 36}
	if b.CrossEntropy == nil || *b.CrossEntropy != want {
		t.Errorf("cross-entropy %+v, want %+v", b.CrossEntropy, want)
	}
}

// TestLanguageModelLossErrors: what the loss options refuse, each with the
// flag or the value to change.
func TestLanguageModelLossErrors(t *testing.T) {
	tagger := lmFixtureByName(t, "tagger")
	llama := lmFixtureByName(t, "llama")
	minus1, zero := int64(-1), int64(0)
	for _, c := range []struct {
		name string
		f    lmFixture
		tc   audit.TrainConfig
		want string
	}{
		{"several outputs", tagger, audit.TrainConfig{Loss: "cross-entropy", Target: tagger.target, IgnoreIndex: &minus1},
			`the model has 2 outputs ("logits" [3 5 12], "features" [3 12 16]); name the one the loss applies to (--loss-output NAME)`},
		{"no such output", tagger, audit.TrainConfig{Loss: "cross-entropy", Target: tagger.target, Output: "scores"},
			`loss output "scores" is not a graph output; the model's outputs are "logits" [3 5 12], "features" [3 12 16]`},
		{"ignored index not said", tagger, audit.TrainConfig{Loss: "cross-entropy", Target: tagger.target, Output: "logits"},
			"is -1: cross-entropy on \"logits\" wants class indices 0 to 4 (5 classes) or the ignored index -100"},
		{"class axis that does not fit", llama, audit.TrainConfig{Loss: "cross-entropy", Target: llama.target, ClassAxis: 1},
			"wants 512 (shape [2 256], the classes on axis 1); --class-axis 1 or last"},
		{"shift without cross-entropy", tagger, audit.TrainConfig{Loss: "mse", Target: tagger.target, LMShift: true}, "configure --loss cross-entropy"},
		{"nothing to score", llama, audit.TrainConfig{Loss: "cross-entropy", LMShift: true, IgnoreIndex: &zero, Target: zeros(t, 2, 16)},
			"every target is the ignored index 0 or the first of its sequence"},
		{"shift, no token input", tagger, audit.TrainConfig{Loss: "cross-entropy", LMShift: true, Output: "logits"}, "--lm-shift needs --target: the model has no input named input_ids"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.f.audit(t, c.tc)
			if err == nil || !audit.IsUsage(err) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v: want a usage error containing %q", err, c.want)
			}
		})
	}
}

// zeros writes an int64 .npy of zeros of the given shape.
func zeros(t *testing.T, shape ...int64) string {
	t.Helper()
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	b, err := batch.EncodeNPY(tensor.FromInt64s("target", shape, make([]int64, n)))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "zeros.npy")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestHFLanguageModelBackward: the training audit of a Hugging Face Llama
// exported by torch 2.9's dynamo exporter, with the causal LM loss on its
// own token ids (--lm-shift). The exporter lifts the constants of the
// module's code into initializers (the 2 of every RMSNorm's pow); none of
// them gets a gradient, as in PyTorch, where the pow's exponent's would
// need the log of negative values and turn the fp32 backward to NaN.
// Truth from torch 2.9.1 and transformers 5.24.0: the loss with
// labels=input_ids on the same model and ids, recorded by cases_hf.py in
// truth.json (extra.lm_loss) for every healthy decoder (GPT-2, Llama at
// both opsets, Qwen2, Mistral); every gradient finite. (The export holds
// fewer weights than the model's parameters: it folds Linear weights into
// transposed copies and merges equal tensors, such as the RMSNorm
// weights, all ones at initialisation.)
//
// The Llama exported at opset 23 writes its attention as Attention and
// its norms as RMSNormalization, whose gradient rules it then takes: the
// same loss, no op without one.
func TestHFLanguageModelBackward(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join("..", "..", "fixtures", "torch", "cases_hf", "*", "truth.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []string
	for _, p := range dirs {
		if lmLoss(t, filepath.Dir(p)) != nil {
			cases = append(cases, filepath.Base(filepath.Dir(p)))
		}
	}
	if len(cases) < 5 {
		t.Fatalf("%d Hugging Face decoders carry PyTorch's LM loss (%v), want GPT-2, both Llamas, Qwen2 and Mistral", len(cases), cases)
	}
	for _, c := range cases {
		t.Run(c, func(t *testing.T) { hfLanguageModelBackward(t, c) })
	}
}

// lmLoss returns the causal LM loss PyTorch computed on a case's batch
// (truth.json's extra.lm_loss), nil when the case has none.
func lmLoss(t *testing.T, dir string) *float64 {
	t.Helper()
	var x struct {
		Extra struct {
			LMLoss *float64 `json:"lm_loss"`
		} `json:"extra"`
	}
	readJSON(t, filepath.Join(dir, "truth.json"), &x)
	return x.Extra.LMLoss
}

func hfLanguageModelBackward(t *testing.T, name string) {
	dir := filepath.Join("..", "..", "fixtures", "torch", "cases_hf", name)
	model := filepath.Join(dir, "model.onnx")
	r, err := audit.Run(context.Background(), audit.Config{ModelPath: model,
		Inputs: []string{filepath.Join(dir, "batches")}, Train: audit.TrainConfig{Loss: "cross-entropy", LMShift: true}})
	if err != nil {
		t.Fatal(err)
	}
	b := r.Training.Backward
	// truth.json holds 6 significant digits
	if want := *lmLoss(t, dir); b.LossValue == nil || math.Abs(*b.LossValue-want) > 1e-5*math.Abs(want) {
		t.Errorf("loss %v, PyTorch's %v", b.LossValue, want)
	}
	if b.Verdict == report.BackwardFP32Broken || len(b.Unsupported) != 0 {
		t.Errorf("verdict %s, ops without a gradient %+v: PyTorch's fp32 backward is finite", b.Verdict, b.Unsupported)
	}
	m, err := onnx.Load(model)
	if err != nil {
		t.Fatal(err)
	}
	scalar := map[string]bool{}
	for _, ti := range m.Proto.Graph.Initializer {
		if tensor.NumElements(ti.Dims) <= 1 {
			scalar[ti.Name] = true
		}
	}
	if len(scalar) == 0 {
		t.Fatal("the export lifted no single-number constant: the test tests nothing")
	}
	if len(b.Parameters) < 3 {
		t.Errorf("%d parameter gradients", len(b.Parameters))
	}
	for _, p := range b.Parameters {
		if scalar[p.Name] {
			t.Errorf("a gradient for the lifted constant %s", p.Name)
		}
	}
}
