package replay

import (
	"math"
	"strings"
	"testing"

	"fp16audit/internal/capture"
	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
	"fp16audit/report"
)

// The verdict tree on results built by hand, over a real capture's
// manifest (its trigger, policy and scale).
func TestVerdictOrder(t *testing.T) {
	c, err := capture.Open("../../../fixtures/torch/runs/collapse/captures/step-000021-loss-spike")
	if err != nil {
		t.Fatal(err)
	}
	f := func(v ...float32) *tensor.Tensor { return tensor.FromFloat32s("input", []int64{int64(len(v)), 1}, v) }
	fp32 := report.Origin{Pass: report.PassFP32, Cause: report.CauseFP32, Node: "n", OpType: "Div", Module: "head",
		Samples: []report.Sample{{Batch: 0, Index: 2}}}
	overflow := report.Origin{Pass: "fp16", Cause: report.CauseOverflow, Node: "g", OpType: "Gemm", Module: "fc", Value: "v", FP32MaxAbs: 7e4}
	weight := report.Origin{Pass: "fp16", Cause: report.CauseConstant, Node: "g", OpType: "Gemm", Module: "fc", Value: "v",
		Constant: "fc.weight", ConstantValue: ptrF(7e4), Weight: "fc.weight"}
	fill := weight
	fill.Weight = ""
	// dynamo's val_N: a 3-D Linear's weight transposed for its MatMul
	transposed := report.Origin{Pass: "fp16", Cause: report.CauseConstant, Node: "node_linear", OpType: "MatMul", Module: "fc", Value: "linear",
		Constant: "val_0", ConstantValue: ptrF(-7e4), Weight: "val_0"}
	model, err := onnx.NewIndex(&onnx.GraphProto{Name: "g", Initializer: []*onnx.TensorProto{onnx.FloatTensor("val_0", []int64{8, 1}, make([]float32, 8))}})
	if err != nil {
		t.Fatal(err)
	}
	state := map[string][]int64{"fc.weight": {1, 8}, "head.weight": {1, 8}}
	audit := func(os ...report.Origin) *report.Report {
		return &report.Report{Passes: []string{report.PassFP32, "fp16"}, Origins: os}
	}
	withBackward := func(a *report.Report, b *report.BackwardReport) *report.Report {
		a.Training = &report.TrainingReport{Backward: b}
		return a
	}
	zero := 0
	cases := []struct {
		name      string
		in        Input
		verdict   string
		text      string
		culpritOf string
	}{
		{"nan in the batch", Input{Failing: []*tensor.Tensor{f(1, float32(math.NaN()), 2)}, Audit: audit(overflow)},
			report.ReplayDataNonFinite, "sample 1", ""},
		{"fp32 on this batch only", Input{Failing: []*tensor.Tensor{f(1, 2, 3)}, Audit: audit(fp32), Previous: audit()},
			report.ReplayDataNonFinite, "sample 2", "head"},
		{"fp32 on both batches", Input{Failing: []*tensor.Tensor{f(1, 2, 3)}, Audit: audit(fp32), Previous: audit(fp32)},
			report.ReplayFP32Broken, "previous batch too", "head"},
		{"beyond fp16", Input{Failing: []*tensor.Tensor{f(1, 1e6, 3)}, Audit: audit(overflow)},
			report.ReplayDataRange, "sample 1", "fc"},
		{"activation", Input{Failing: []*tensor.Tensor{f(1, 2)}, Audit: audit(overflow), Previous: audit(overflow)},
			report.ReplayForwardOverflow, "weights have grown", "fc"},
		{"weight", Input{Failing: []*tensor.Tensor{f(1, 2)}, Audit: audit(weight), State: map[string][]int64{"fc.weight": {4, 4}}},
			report.ReplayForwardOverflow, "the weight fc.weight holds", "fc"},
		{"weight the state lacks", Input{Failing: []*tensor.Tensor{f(1, 2)}, Audit: audit(weight)},
			report.ReplayForwardOverflow, "the weight fc.weight holds", "fc"},
		{"transposed weight", Input{Failing: []*tensor.Tensor{f(1, 2)}, Audit: audit(transposed), State: state, Model: model},
			report.ReplayForwardOverflow, "the weight fc.weight (in the graph val_0", "fc"},
		{"mask constant is no weight", Input{Failing: []*tensor.Tensor{f(1, 2)}, Audit: audit(fill), State: map[string][]int64{"fc.weight": {4, 4}}},
			report.ReplayForwardOverflow, "computes in fp16", "fc"},
		{"gradient", Input{Failing: []*tensor.Tensor{f(1, 2)}, Audit: withBackward(audit(), &report.BackwardReport{InitExp: 10, MaxCleanExp: &zero,
			FirstOverflow: &report.GradientReport{Module: "head", Value: "x", Kind: report.GradActivation, FP32MaxAbs: ptrF(100)}})},
			report.ReplayGradientOverflow, "largest scale that passes is 2^0", "head"},
		{"underflow", Input{Failing: []*tensor.Tensor{f(1, 2)}, Audit: withBackward(audit(), &report.BackwardReport{InitExp: -20, SettledExp: ptrI(-20),
			Tolerance: 0.01, LostMass: ptrF(0.9), Underflowing: []string{"fc"},
			Parameters: []report.ParameterReport{{Name: "fc.weight", Module: "fc", LostMass: ptrF(0.9)}}})},
			report.ReplayUnderflow, "fc: 90.0%", "fc"},
		{"clean", Input{Failing: []*tensor.Tensor{f(1, 2)}, Audit: withBackward(audit(), &report.BackwardReport{InitExp: 16, LossValue: ptrF(0.5), LostMass: ptrF(0.001), Tolerance: 0.01})},
			report.ReplayNotReproduced, "loss spike is in fp32 too", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Capture = c
			r := Diagnose(tc.in)
			if r.Verdict != tc.verdict || !strings.Contains(r.VerdictText, tc.text) {
				t.Fatalf("%s: %s; want %s saying %q", r.Verdict, r.VerdictText, tc.verdict, tc.text)
			}
			if tc.culpritOf != "" && (r.Culprit == nil || r.Culprit.Module != tc.culpritOf) {
				t.Errorf("culprit %+v, want module %s", r.Culprit, tc.culpritOf)
			}
			if wantWeight := strings.Contains(tc.text, "the weight"); r.Culprit != nil && (r.Culprit.Kind == report.CulpritWeight) != wantWeight {
				t.Errorf("culprit kind %s", r.Culprit.Kind)
			}
			for _, f := range r.Fixes {
				if f.Words == "" || f.Fastai == "" || f.Torch == "" {
					t.Errorf("fix %s has no words: %+v", f.Kind, f)
				}
			}
		})
	}
}

// TestTrainersWords: the fixes follow the trainer that made the capture,
// from the one table; a trainer the table lacks is a loop of the user's
// own, said in PyTorch's words.
func TestTrainersWords(t *testing.T) {
	c, err := capture.Open("../../../fixtures/torch/runs/collapse/captures/step-000021-loss-spike")
	if err != nil {
		t.Fatal(err)
	}
	gemm := report.Origin{Pass: "fp16", Cause: report.CauseOverflow, Node: "g", OpType: "Gemm", Module: "fc", Value: "v", FP32MaxAbs: 7e4}
	in := Input{Capture: c, Failing: []*tensor.Tensor{tensor.FromFloat32s("input", []int64{2, 1}, []float32{1, 2})},
		Audit: &report.Report{Passes: []string{report.PassFP32, "fp16", report.PassBF16}, Origins: []report.Origin{gemm},
			Fixes: []report.Fix{{Kind: report.FixBF16, Works: true}}}}
	clip := 0.5
	for trainer, want := range map[string][3]string{
		"fastai":       {"fastai", "learn.to_bf16()", "GradientClip(max_norm=0.5)"},
		"transformers": {"Hugging Face Trainer", "bf16=True in TrainingArguments", "max_grad_norm=0.5 in TrainingArguments"},
		"lightning":    {"Lightning", `Trainer(precision="bf16-mixed")`, "Trainer(gradient_clip_val=0.5)"},
		"accelerate":   {"Accelerate", `Accelerator(mixed_precision="bf16")`, "accelerator.clip_grad_norm_(model.parameters(), max_norm=0.5)"},
		"torch":        {"PyTorch", "torch.autocast(device_type=", "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)"},
		"keras":        {"PyTorch", "torch.autocast(device_type=", "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)"},
	} {
		c.Manifest.Trainer = trainer
		r := Diagnose(in)
		if r.Capture.TrainerLabel != want[0] {
			t.Errorf("%s: the report names the trainer %q, want %q", trainer, r.Capture.TrainerLabel, want[0])
		}
		var bf16 *report.ReplayFix
		for i := range r.Fixes {
			if r.Fixes[i].Kind == report.FixBF16 {
				bf16 = &r.Fixes[i]
			}
		}
		if bf16 == nil || !strings.Contains(bf16.Words, want[1]) || bf16.Fastai != "learn.to_bf16()" || !strings.Contains(bf16.Torch, "dtype=torch.bfloat16") {
			t.Errorf("%s: the bf16 fix says %+v; want its words to say %q", trainer, bf16, want[1])
		}
		f := report.ReplayFix{Kind: report.FixClip, ClipNorm: &clip}
		phrasesFor(trainer, "cpu", "autocast-fp16").set(&f, nil)
		if !strings.Contains(f.Words, want[2]) {
			t.Errorf("%s: clipping is %q, want %q", trainer, f.Words, want[2])
		}
	}
}

// Continuations are judged against the fp32 one.
func TestJudge(t *testing.T) {
	nan := capture.Float(math.NaN())
	r := &report.ReplayReport{Fixes: []report.ReplayFix{{Kind: report.FixClip}}}
	Judge(r, &Continuations{Steps: 3, Runs: []Run{
		{Fix: "as-run", Losses: []capture.Float{1, nan, nan}},
		{Fix: report.FixFP32, Losses: []capture.Float{1, 0.9, 0.8}},
		{Fix: report.FixBF16, Losses: []capture.Float{1, 0.9, 0.81}},
		{Fix: report.FixClip, Losses: []capture.Float{1, nan, 1.5}},
		{Fix: report.FixLowerLR, Error: "RuntimeError: no fp16 here"},
	}})
	co := r.Continuations
	if !co.Reproduced {
		t.Errorf("the run as it was diverged: reproduced")
	}
	works := map[string]bool{}
	for _, f := range r.Fixes {
		if f.Verified == report.VerifiedContinuation {
			works[f.Kind] = *f.Works
		}
	}
	want := map[string]bool{report.FixFP32: true, report.FixBF16: true, report.FixClip: false, report.FixLowerLR: false}
	for k, v := range want {
		if works[k] != v {
			t.Errorf("%s works %v, want %v (%+v)", k, works[k], v, r.Fixes)
		}
	}
	if len(r.Fixes) != 4 {
		t.Errorf("the proposed clip fix is replaced, the others added: %d fixes", len(r.Fixes))
	}
	if err := (&Continuations{Format: "x", Version: 1}).Check(""); err == nil {
		t.Errorf("another format accepted")
	}
	if err := (&Continuations{Format: ContinuationsFormat, Version: 1, Manifest: "aa"}).Check("bb"); err == nil || !strings.Contains(err.Error(), "another capture") {
		t.Errorf("continuations of another capture: %v", err)
	}
}

func ptrI(i int) *int { return &i }
