package audit_test

import (
	"context"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"fp16audit/checks"
	"fp16audit/fixtures"
	"fp16audit/internal/audit"
	"fp16audit/internal/onnx"
	"fp16audit/report"
)

const fixtureDir = "../../fixtures"

func runAudit(t *testing.T, model string, inputs ...string) *report.Report {
	t.Helper()
	return runConfig(t, audit.Config{ModelPath: filepath.Join(fixtureDir, "models", model), Inputs: inputs})
}

func runConfig(t *testing.T, cfg audit.Config) *report.Report {
	t.Helper()
	r, err := audit.Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("audit %s: %v", cfg.ModelPath, err)
	}
	return r
}

func batchPath(name string) string { return filepath.Join(fixtureDir, "batches", name) }

// TestFixtureOutcomes runs every fixture batch through the full audit and
// checks the outcome its builder documents: verdict, origin node and op,
// and the fp32 max |x| at the origin.
func TestFixtureOutcomes(t *testing.T) {
	type tc struct {
		model, batch string
		want         fixtures.Expect
	}
	var cases []tc
	for _, f := range fixtures.All() {
		for _, b := range f.Batches {
			cases = append(cases, tc{f.Name + ".onnx", b.Name + ".npy", b.Expect})
		}
	}
	for _, te := range fixtures.TorchExports() {
		cases = append(cases, tc{filepath.Base(te.Model), filepath.Base(te.Batch), te.Expect})
	}
	for _, c := range cases {
		t.Run(c.model+"/"+c.batch, func(t *testing.T) {
			r := runAudit(t, c.model, batchPath(c.batch))
			if r.Verdict != c.want.Verdict {
				t.Fatalf("verdict %s (%s), want %s", r.Verdict, r.VerdictText, c.want.Verdict)
			}
			if c.want.Origin == "" {
				if c.want.Verdict == report.VerdictHealthy && len(r.Origins) > 0 {
					t.Errorf("healthy model has origins %+v", r.Origins)
				}
				return
			}
			if len(r.Origins) == 0 {
				t.Fatalf("no origin, want %s", c.want.Origin)
			}
			o := r.Origins[0]
			if o.Node != c.want.Origin || o.OpType != c.want.OriginOp {
				t.Errorf("origin %s (%s), want %s (%s)", o.Node, o.OpType, c.want.Origin, c.want.OriginOp)
			}
			if !math.IsInf(c.want.MaxAbs, 0) && c.want.MaxAbs != 0 &&
				math.Abs(o.FP32MaxAbs-c.want.MaxAbs) > 1e-3*c.want.MaxAbs {
				t.Errorf("origin fp32 max |x| %.6g, want %.4g", o.FP32MaxAbs, c.want.MaxAbs)
			}
		})
	}
}

// TestHealthyHasNoErrors: the healthy controls produce no error-level
// finding and exit-relevant severity stays below error.
func TestHealthyHasNoErrors(t *testing.T) {
	for _, c := range [][2]string{{"healthy.onnx", "healthy.npy"}, {"demo_cnn.onnx", "demo_cnn_standardized.npy"},
		{"cnn.onnx", "cnn.npy"}, {"attention.onnx", "attention.npy"}, {"torch_resnetish.onnx", "torch_resnetish.npy"}} {
		r := runAudit(t, c[0], batchPath(c[1]))
		for _, f := range r.Findings {
			if f.Severity.String() == "error" {
				t.Errorf("%s: error finding %s: %s", c[0], f.Check, f.Message)
			}
		}
	}
}

// TestFixes checks, per verdict fixture, whether each verified fix works
// and what the keep-fp32 search keeps.
func TestFixes(t *testing.T) {
	cases := []struct {
		model, batch string
		works        map[string]bool // fix kind → works; a kind not listed must be absent
		keep         []string        // keep-fp32 modules
	}{
		// Standardized inputs work, so no keep-fp32 search runs.
		{"demo_cnn.onnx", "demo_cnn_raw.npy", map[string]bool{report.FixStandardize: true, report.FixBF16: true}, nil},
		{"overflowing_op.onnx", "overflowing_op.npy", map[string]bool{report.FixBF16: true, report.FixKeepFP32: true}, []string{"fc2"}},
		{"oversized_logits.onnx", "oversized_logits.npy", map[string]bool{report.FixBF16: true, report.FixKeepFP32: true}, []string{"head"}},
		// to_bf16() cannot help: the model's own cast to FLOAT16 is honoured
		// under every policy; removing the cast does.
		{"explicit_half_cast.onnx", "explicit_half_cast.npy", map[string]bool{report.FixBF16: false, report.FixRemoveCast: true}, nil},
		{"healthy.onnx", "healthy.npy", map[string]bool{}, nil},
	}
	for _, c := range cases {
		t.Run(c.model, func(t *testing.T) {
			r := runAudit(t, c.model, batchPath(c.batch))
			got := map[string]bool{}
			for _, f := range r.Fixes {
				got[f.Kind] = f.Works
				if f.Works && f.NonFiniteAfter != 0 || !f.Works && f.NonFiniteAfter == 0 {
					t.Errorf("fix %s: works=%v with %d non-finite after", f.Kind, f.Works, f.NonFiniteAfter)
				}
				if f.NonFiniteBefore == 0 {
					t.Errorf("fix %s: no non-finite values before the fix", f.Kind)
				}
				if f.Kind == report.FixKeepFP32 && !slices.Equal(f.Modules, c.keep) {
					t.Errorf("keep-fp32 modules %v, want %v", f.Modules, c.keep)
				}
				if strings.Contains(strings.ToLower(f.Summary), "init_scale") {
					t.Errorf("fix %s offers init_scale for a forward overflow: %s", f.Kind, f.Summary)
				}
			}
			if len(got) != len(c.works) {
				t.Errorf("fixes %v, want %v", got, c.works)
			}
			for k, w := range c.works {
				if g, ok := got[k]; !ok || g != w {
					t.Errorf("fix %s: works=%v (present %v), want %v", k, g, ok, w)
				}
			}
		})
	}
}

// TestStandardizeStats: the standardize fix reports the batch's channel
// statistics, and for raw pixels the fastai call divides them by 255.
func TestStandardizeStats(t *testing.T) {
	r := runAudit(t, "demo_cnn.onnx", batchPath("demo_cnn_raw.npy"))
	var fix *report.Fix
	for i := range r.Fixes {
		if r.Fixes[i].Kind == report.FixStandardize {
			fix = &r.Fixes[i]
		}
	}
	if fix == nil || len(fix.Normalize) != 1 {
		t.Fatalf("standardize fix missing: %+v", r.Fixes)
	}
	n := fix.Normalize[0]
	ch := r.Inputs[0].Channels
	if len(n.Mean) != 3 || len(ch) != 3 {
		t.Fatalf("want 3 channels, got mean %v channels %v", n.Mean, ch)
	}
	for c := 0; c < 3; c++ {
		if n.Mean[c] != ch[c].Mean || n.Std[c] != ch[c].Std {
			t.Errorf("channel %d: fix uses %g/%g, input report %g/%g", c, n.Mean[c], n.Std[c], ch[c].Mean, ch[c].Std)
		}
		if n.Mean[c] < 100 || n.Mean[c] > 160 {
			t.Errorf("channel %d mean %g: not raw-pixel scale", c, n.Mean[c])
		}
	}
	if !strings.HasPrefix(n.Fastai, "Normalize.from_stats([0.") || !r.Inputs[0].RawPixels {
		t.Errorf("fastai call %q (raw pixels %v): want statistics scaled to [0,1]", n.Fastai, r.Inputs[0].RawPixels)
	}
}

// TestBatchFormatsAgree: the same batch as .npy, stored and deflated .npz
// and an ONNX test-data folder gives identical statistics.
func TestBatchFormatsAgree(t *testing.T) {
	var ref *report.Report
	for _, in := range []string{"cnn.npy", "cnn.npz", "cnn_deflate.npz", "cnn_pb"} {
		r := runAudit(t, "cnn.onnx", batchPath(in))
		if ref == nil {
			ref = r
			continue
		}
		for i, n := range r.Nodes {
			for j, o := range n.Outputs {
				a, b := o.Stats["fp32"], ref.Nodes[i].Outputs[j].Stats["fp32"]
				if !reflect.DeepEqual(a, b) {
					t.Fatalf("%s: %s differs from cnn.npy: %+v vs %+v", in, o.Name, a, b)
				}
			}
		}
	}
}

// TestPolicies: the same model under each policy. fp32 runs one pass; bf16
// has no fp16 overflow; half also flags what autocast keeps in fp32.
func TestPolicies(t *testing.T) {
	model := filepath.Join(fixtureDir, "models", "overflowing_op.onnx")
	in := []string{batchPath("overflowing_op.npy")}
	cases := []struct {
		policy, verdict string
		passes          []string
	}{
		{"fp32", report.VerdictHealthy, []string{"fp32"}},
		{"autocast-bf16", report.VerdictHealthy, []string{"fp32", "bf16"}},
		{"autocast-fp16", report.VerdictOverflow, []string{"fp32", "fp16", "bf16"}},
		{"half", report.VerdictOverflow, []string{"fp32", "fp16", "bf16"}},
	}
	for _, c := range cases {
		r := runConfig(t, audit.Config{ModelPath: model, Inputs: in, Policy: c.policy, NoFixes: true})
		if r.Verdict != c.verdict || !slices.Equal(r.Passes, c.passes) {
			t.Errorf("%s: verdict %s passes %v, want %s %v", c.policy, r.Verdict, r.Passes, c.verdict, c.passes)
		}
	}
	// Under half the LayerNormalization after fc2 computes in fp16 too.
	r := runConfig(t, audit.Config{ModelPath: model, Inputs: in, Policy: "half", NoFixes: true})
	for _, n := range r.Nodes {
		if n.OpType == "LayerNormalization" && n.Precision != "fp16" {
			t.Errorf("half: %s precision %s, want fp16", n.Name, n.Precision)
		}
	}
}

// TestSynthetic: without -i the audit generates inputs and says so.
func TestSynthetic(t *testing.T) {
	r := runAudit(t, "mlp_dynamic.onnx")
	if len(r.Batches) != 1 || !r.Batches[0].Synthetic {
		t.Fatalf("batches %+v: want one synthetic batch", r.Batches)
	}
	if !strings.Contains(strings.Join(r.Notes, "\n"), "synthetic") {
		t.Errorf("notes %v do not mention synthetic data", r.Notes)
	}
}

// TestTorchModulePaths: module paths come from the TorchScript exporter's
// scoped node names of a real PyTorch export.
func TestTorchModulePaths(t *testing.T) {
	r := runAudit(t, "torch_resnetish.onnx", batchPath("torch_resnetish.npy"))
	want := map[string]string{
		"/conv1/Conv":                                   "conv1",
		"/layer1/layer1.0/conv1/Conv":                   "layer1.0.conv1",
		"/layer1/layer1.0/relu_1/Relu":                  "layer1.0.relu_1",
		"/layer2/layer2.0/downsample/downsample.0/Conv": "layer2.0.downsample.0",
		"/fc/Gemm": "fc",
		"/Flatten": "",
	}
	seen := 0
	for _, n := range r.Nodes {
		if m, ok := want[n.Name]; ok {
			seen++
			if n.Module != m {
				t.Errorf("%s: module %q, want %q", n.Name, n.Module, m)
			}
		}
	}
	if seen != len(want) {
		t.Errorf("found %d of the %d expected nodes", seen, len(want))
	}
}

// underflowModel saves a model whose MatMul outputs sit below fp16's
// smallest subnormal (|y| ~ 1e-8 < 2^-25) and are scaled by 1e6 after it;
// with residual, the input is added to that, so the flushed part is about
// 1 % of the output.
func underflowModel(t *testing.T, residual bool) string {
	t.Helper()
	w := make([]float32, 64*64)
	for i := range w {
		w[i] = 1e-9 * float32(i%7-3)
	}
	out := "output"
	if residual {
		out = "scaled"
	}
	g := &onnx.GraphProto{
		Name: "tiny",
		Node: []*onnx.NodeProto{
			onnx.Node("MatMul", "/tiny/MatMul", []string{"input", "tiny.weight"}, []string{"y"}),
			onnx.Node("Mul", "/scale/Mul", []string{"y", "k"}, []string{out}),
		},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("tiny.weight", []int64{64, 64}, w), onnx.FloatTensor("k", nil, []float32{1e6})},
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("input", onnx.TensorProto_FLOAT, 4, 64)},
		Output:      []*onnx.ValueInfoProto{onnx.TensorValueInfo("output", onnx.TensorProto_FLOAT, 4, 64)},
	}
	if residual {
		g.Node = append(g.Node, onnx.Node("Add", "/residual/Add", []string{"scaled", "input"}, []string{"output"}))
	}
	path := filepath.Join(t.TempDir(), "tiny.onnx")
	if err := onnx.Save(onnx.NewModel(g, 17), path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestUnderflowWarning: a layer whose outputs flush to zero in the fp16
// pass while the graph output, dominated by the residual input, stays
// within the tolerance of fp32's: the audit is healthy and warns (FP3001)
// at that node.
func TestUnderflowWarning(t *testing.T) {
	r := runConfig(t, audit.Config{ModelPath: underflowModel(t, true)})
	if r.Verdict != report.VerdictHealthy {
		t.Fatalf("verdict %s (%s)", r.Verdict, r.VerdictText)
	}
	var found bool
	for _, f := range r.Findings {
		if f.Check == "FP3001" && f.Node == "/tiny/MatMul" && f.Value == "y" {
			found = true
		}
	}
	if !found {
		t.Errorf("no FP3001 at /tiny/MatMul: %+v", r.Findings)
	}
	var y report.StatsReport
	for _, n := range r.Nodes {
		if n.Name == "/tiny/MatMul" {
			y = n.Outputs[0].Stats["fp16"]
		}
	}
	if y.FlushedFraction < 0.9 || y.Zeros == 0 {
		t.Errorf("fp16 flushed fraction %g, zeros %d: want nearly everything flushed", y.FlushedFraction, y.Zeros)
	}
	if len(r.OutputAgreement) == 0 || r.OutputAgreement[0].Outcome != report.OutputAgrees {
		t.Errorf("output agreement %+v, want the fp16 pass's output within the tolerance", r.OutputAgreement)
	}
}

// TestUnderflowLosesOutputs: when what flushes to zero is the whole of
// the output, the outputs are finite but wrong: forward-underflow with
// FP2006, the origin is where the error starts (cause precision, the
// MatMul whose values flush) and keeping it in fp32 is verified to bring
// the outputs back.
func TestUnderflowLosesOutputs(t *testing.T) {
	r := runConfig(t, audit.Config{ModelPath: underflowModel(t, false)})
	if r.Verdict != report.VerdictUnderflow || len(r.Origins) != 1 {
		t.Fatalf("verdict %s (%s), %d origins", r.Verdict, r.VerdictText, len(r.Origins))
	}
	o := r.Origins[0]
	if o.Cause != report.CausePrecision || o.Node != "/tiny/MatMul" || !slices.Equal(o.WrongOutputs, []string{"output"}) {
		t.Errorf("origin %+v, want cause precision at /tiny/MatMul, wrong output \"output\"", o)
	}
	if !strings.Contains(r.VerdictText, "flush") || !strings.Contains(r.VerdictText, "outputs finite but wrong") {
		t.Errorf("verdict text %q does not say the values flush and the outputs are wrong", r.VerdictText)
	}
	var wrong bool
	for _, f := range r.Findings {
		wrong = wrong || (f.Check == "FP2006" && f.Value == "output" && f.Severity == checks.SevError)
	}
	if !wrong {
		t.Errorf("no FP2006 error at output: %+v", r.Findings)
	}
	for _, f := range r.Fixes {
		if f.Kind == report.FixKeepFP32 && (!f.Works || !slices.Equal(f.Nodes, []string{"/tiny/MatMul"})) {
			t.Errorf("keep-fp32 fix %+v, want it to work by keeping /tiny/MatMul", f)
		}
	}
}

// TestTiming: the report says where the audit's time went: one run for
// the main passes and one per fix rerun, each with its sessions, within
// the elapsed time.
func TestTiming(t *testing.T) {
	r := runAudit(t, "demo_cnn.onnx", batchPath("demo_cnn_raw.npy"))
	tm := r.Tool.Timing
	if tm == nil || len(tm.Runs) < 2 {
		t.Fatalf("timing %+v: want the main run and the fix reruns", tm)
	}
	if p := tm.Runs[0].Passes; len(p) != 2 || p[0] != "fp32" || p[1] != "fp16" {
		t.Errorf("first run's passes %v, want fp32 and fp16", p)
	}
	var total, sessions float64
	for _, run := range tm.Runs {
		if run.Sessions < 1 || run.SessionSecs <= 0 || run.SessionSecs > run.Secs {
			t.Errorf("run %v: %d sessions in %.3f s of %.3f s", run.Passes, run.Sessions, run.SessionSecs, run.Secs)
		}
		total += run.Secs
		sessions += run.SessionSecs
	}
	if tm.LoadSecs <= 0 || tm.LoadSecs+total > r.Tool.ElapsedSecs || math.Abs(sessions-tm.SessionSecs) > 1e-9 {
		t.Errorf("load %.3f s and runs %.3f s (sessions %.3f s, total %.3f s) in %.3f s", tm.LoadSecs, total, sessions, tm.SessionSecs, r.Tool.ElapsedSecs)
	}
}
