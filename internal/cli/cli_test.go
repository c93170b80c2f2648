package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"fp16audit/report"
)

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = Main(args, &o, &e)
	return code, o.String(), e.String()
}

const (
	models  = "../../fixtures/models/"
	batches = "../../fixtures/batches/"
)

// readJSON decodes the JSON document a command wrote to path.
func readJSON(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return doc
}

func TestExitCodes(t *testing.T) {
	tmp := t.TempDir()
	garbage := filepath.Join(tmp, "garbage.onnx")
	os.WriteFile(garbage, []byte("this is not a model"), 0o644)
	cases := []struct {
		name   string
		args   []string
		code   int
		stderr string // substring of stderr
	}{
		{"healthy", []string{"run", models + "healthy.onnx", "-i", batches + "healthy.npy"}, 0, ""},
		{"overflow", []string{"run", models + "overflowing_op.onnx", "-i", batches + "overflowing_op.npy", "--no-fixes"}, 1, ""},
		{"overflow fail-on never", []string{"run", models + "overflowing_op.onnx", "-i", batches + "overflowing_op.npy", "--no-fixes", "--fail-on", "never"}, 0, ""},
		// 5.6 bits of headroom: a warning under --headroom-bits 6.
		{"headroom warning", []string{"run", models + "demo_cnn.onnx", "-i", batches + "demo_cnn_standardized.npy", "--headroom-bits", "6"}, 0, ""},
		{"headroom warning fails at warning", []string{"run", models + "demo_cnn.onnx", "-i", batches + "demo_cnn_standardized.npy", "--headroom-bits", "6", "--fail-on", "warning"}, 1, ""},
		{"no model", []string{"run"}, 2, "want exactly one MODEL"},
		{"unknown flag", []string{"run", models + "mlp.onnx", "--bogus"}, 2, "unknown flag"},
		{"bad format", []string{"run", models + "mlp.onnx", "--format", "xml"}, 2, "--format"},
		{"bad policy", []string{"run", models + "mlp.onnx", "--policy", "fp8"}, 2, "autocast-fp16"},
		{"bad fail-on", []string{"run", models + "mlp.onnx", "--fail-on", "sometimes"}, 2, "--fail-on"},
		{"bad autocast device", []string{"run", models + "mlp.onnx", "--autocast-device", "CUDA:0"}, 2, "--autocast-device"},
		{"bad trainer", []string{"run", models + "mlp.onnx", "--trainer", "keras"}, 2, "--trainer \"keras\": want one of fastai, transformers"},
		{"missing batch", []string{"run", models + "mlp.onnx", "-i", batches + "nope.npy"}, 2, "nope.npy"},
		{"wrong shape", []string{"run", models + "mlp.onnx", "-i", batches + "cnn.npy"}, 2, "want shape"},
		{"missing model", []string{"run", filepath.Join(tmp, "none.onnx")}, 3, "none.onnx"},
		{"garbage model", []string{"run", garbage}, 3, "garbage.onnx"},
		{"unknown command", []string{"frobnicate"}, 2, "unknown command"},
		{"help", []string{"run", "--help"}, 0, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := run(t, c.args...)
			if code != c.code {
				t.Errorf("exit %d, want %d; stderr: %s", code, c.code, stderr)
			}
			if c.stderr != "" && !strings.Contains(stderr, c.stderr) {
				t.Errorf("stderr %q does not contain %q", stderr, c.stderr)
			}
		})
	}
}

func TestHelpShowsExample(t *testing.T) {
	for _, cmd := range []string{"run", "version"} {
		code, out, _ := run(t, cmd, "--help")
		if code != 0 || !strings.Contains(out, "Example:") || !strings.Contains(out, "fp16audit "+cmd) {
			t.Errorf("%s --help (exit %d) lacks an example:\n%s", cmd, code, out)
		}
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := run(t, "version")
	if code != 0 || !strings.Contains(out, "fp16audit "+report.Version) || !strings.Contains(out, "ONNX Runtime 1.30") {
		t.Errorf("version (exit %d):\n%s", code, out)
	}
}

// TestVersionFindsVirtualenv runs `fp16audit version` in a child process
// whose only ONNX Runtime is the real library inside a virtualenv's
// onnxruntime package, laid out as pip installs it: the version names that
// library, its version and the virtualenv.
func TestVersionFindsVirtualenv(t *testing.T) {
	lib, err := filepath.Abs(os.Getenv("ONNXRUNTIME_LIB"))
	if os.Getenv("ONNXRUNTIME_LIB") == "" || err != nil {
		t.Fatalf("ONNXRUNTIME_LIB must name the library (make test sets it): %v", err)
	}
	venv := t.TempDir()
	capi := filepath.Join(venv, "lib", "python3.11", "site-packages", "onnxruntime", "capi")
	if err := os.MkdirAll(capi, 0o755); err != nil {
		t.Fatal(err)
	}
	inVenv := filepath.Join(capi, "libonnxruntime.so.1.30.0")
	if err := os.Symlink(lib, inVenv); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "--", "version")
	cmd.Dir = venv
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ONNXRUNTIME_LIB=") && !strings.HasPrefix(kv, "VIRTUAL_ENV=") && !strings.HasPrefix(kv, "CONDA_PREFIX=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "FP16AUDIT_HELPER_PROCESS=1", "VIRTUAL_ENV="+venv)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("version: %v\n%s", err, out)
	}
	want := "ONNX Runtime 1.30.0 (" + inVenv + ", from the virtualenv " + venv
	if !strings.Contains(string(out), want) {
		t.Errorf("version printed:\n%s\nwant a line with %q", out, want)
	}
}

// TestJSONSchema checks the documented JSON shape: the top-level keys, the
// verdict identifier, origins by node name, per-node statistics per pass.
func TestJSONSchema(t *testing.T) {
	out := filepath.Join(t.TempDir(), "render.json")
	code, stdout, stderr := run(t, "run", models+"demo_cnn.onnx", "-i", batches+"demo_cnn_raw.npy", "--format", "json", "--output", out)
	if code != 1 || stdout != "" {
		t.Fatalf("exit %d (want 1), stdout %q, stderr %s", code, stdout, stderr)
	}
	doc := readJSON(t, out)
	for _, k := range []string{"schema", "tool", "model", "policy", "passes", "batches", "notes", "verdict", "verdict_text",
		"origins", "fixes", "inputs", "nodes", "findings", "summary"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("report lacks %q", k)
		}
	}
	if doc["schema"] != report.ReportSchema || doc["verdict"] != "unnormalized-input" {
		t.Errorf("schema %v verdict %v", doc["schema"], doc["verdict"])
	}
	origins := doc["origins"].([]any)
	if len(origins) != 1 || origins[0].(map[string]any)["node"] != "/conv1/Conv" {
		t.Errorf("origins %v", origins)
	}
	node := doc["nodes"].([]any)[0].(map[string]any)
	stats := node["outputs"].([]any)[0].(map[string]any)["stats"].(map[string]any)
	for _, p := range []string{"fp32", "fp16", "bf16"} {
		s, ok := stats[p].(map[string]any)
		if !ok {
			t.Fatalf("node 0 lacks %s statistics: %v", p, stats)
		}
		for _, k := range []string{"count", "max_abs", "nan", "pos_inf", "neg_inf", "zeros", "above_fp16_max", "fp16_subnormal", "fp16_flush"} {
			if _, ok := s[k]; !ok {
				t.Errorf("%s stats lack %q", p, k)
			}
		}
	}
	if fp16 := stats["fp16"].(map[string]any); fp16["pos_inf"].(float64) == 0 {
		t.Errorf("conv1 fp16 pos_inf = 0, want overflow")
	}
	// Nothing was left beside the render.
	entries, _ := os.ReadDir(filepath.Dir(out))
	if len(entries) != 1 {
		t.Errorf("output folder holds %d entries, want only the report", len(entries))
	}
}

// TestTextLeadsWithVerdict: the text report starts with the verdict, the
// origin and the verified fix before the per-node table.
func TestTextLeadsWithVerdict(t *testing.T) {
	_, out, _ := run(t, "run", models+"overflowing_op.onnx", "-i", batches+"overflowing_op.npy")
	v := strings.Index(out, "verdict: overflowing-op")
	o := strings.Index(out, "origin (fp16 pass): /fc2/Gemm")
	f := strings.Index(out, "fix keep-fp32 (works")
	tbl := strings.Index(out, "per-node statistics")
	if v < 0 || o < v || f < o || tbl < f {
		t.Errorf("order verdict %d origin %d fix %d table %d:\n%s", v, o, f, tbl, out)
	}
	_, flagged, _ := run(t, "run", models+"overflowing_op.onnx", "-i", batches+"overflowing_op.npy", "--only-flagged")
	if strings.Contains(flagged, "/fc1/Gemm ") || !strings.Contains(flagged, "/fc2/Gemm") {
		t.Errorf("--only-flagged lists unflagged nodes or misses fc2:\n%s", flagged)
	}
}

// TestAutocastDevice: the keep-fp32 fix names the device_type the model
// trains on (cuda unless told).
func TestAutocastDevice(t *testing.T) {
	for _, c := range []struct{ args []string }{{nil}, {[]string{"--autocast-device", "cpu"}}, {[]string{"--autocast-device", "mps"}}} {
		want := `torch.autocast(device_type="cuda", enabled=False)`
		if c.args != nil {
			want = `torch.autocast(device_type="` + c.args[1] + `", enabled=False)`
		}
		_, out, _ := run(t, append([]string{"run", models + "overflowing_op.onnx", "-i", batches + "overflowing_op.npy"}, c.args...)...)
		if !strings.Contains(out, want) {
			t.Errorf("%v: the fix does not say %s:\n%s", c.args, want, out)
		}
	}
}

// TestTrainerWords: the same audit with --trainer gives the same verdict
// and fixes, and only their wording follows the trainer: bf16 and the
// keep-fp32 fix as its users write them.
func TestTrainerWords(t *testing.T) {
	cases := []struct{ trainer, bf16, keep string }{
		{"", "learn.to_bf16() removes every overflow", `wrap it in torch.autocast(device_type="cuda", enabled=False)`},
		{"transformers", "bf16=True in TrainingArguments removes every overflow", "_keep_in_fp32_modules does not do it under fp16=True"},
		{"lightning", `Trainer(precision="bf16-mixed") removes every overflow`, "enabled=False) and cast its input with .float() in the LightningModule"},
		{"accelerate", `Accelerator(mixed_precision="bf16") removes every overflow`, "Accelerator.autocast(AutocastKwargs(enabled=False))"},
		{"torch", `torch.autocast(device_type="cuda", dtype=torch.bfloat16) without a GradScaler removes every overflow`, `wrap it in torch.autocast(device_type="cuda", enabled=False)`},
	}
	var verdicts []string
	for _, c := range cases {
		args := []string{"run", models + "overflowing_op.onnx", "-i", batches + "overflowing_op.npy", "--format", "json"}
		if c.trainer != "" {
			args = append(args, "--trainer", c.trainer)
		}
		_, out, errOut := run(t, args...)
		var r report.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%s: %v: %s", c.trainer, err, errOut)
		}
		var summaries []string
		for _, f := range r.Fixes {
			summaries = append(summaries, f.Kind+": "+f.Summary)
		}
		all := strings.Join(summaries, "\n")
		if !strings.Contains(all, c.bf16) || !strings.Contains(all, c.keep) {
			t.Errorf("--trainer %q: want %q and %q among the fixes:\n%s", c.trainer, c.bf16, c.keep, all)
		}
		verdicts = append(verdicts, fmt.Sprintf("%s %d %v", r.Verdict, len(r.Fixes), r.Origins[0].Module))
	}
	for _, v := range verdicts[1:] {
		if v != verdicts[0] {
			t.Errorf("the verdict follows the trainer: %q, fastai's %q", v, verdicts[0])
		}
	}
}

// TestOutputToDevice: --output naming a device writes into it; the atomic
// rename used for regular files must never replace the device.
func TestOutputToDevice(t *testing.T) {
	code, _, stderr := run(t, "run", models+"mlp.onnx", "-i", batches+"mlp.npy", "--format", "json", "--output", os.DevNull)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	fi, err := os.Stat(os.DevNull)
	if err != nil || fi.Mode()&os.ModeDevice == 0 {
		t.Fatalf("%s is no longer a device: %v %v", os.DevNull, fi.Mode(), err)
	}
}

// TestChecksBeforeAudit: a check switched off with --checks does not run,
// so it cannot make the verdict or the exit code; the verdict text says an
// overflow went unreported.
func TestChecksBeforeAudit(t *testing.T) {
	code, out, errOut := run(t, "run", models+"overflowing_op.onnx", "-i", batches+"overflowing_op.npy", "--checks", "all,-FP2001", "--format", "json")
	if code != 0 {
		t.Fatalf("exit %d, want 0 with FP2001 off: %s", code, errOut)
	}
	if strings.Contains(out, `"FP2001"`) || !strings.Contains(out, `"verdict": "healthy"`) || !strings.Contains(out, "went unreported") {
		t.Errorf("report with FP2001 off:\n%.2000s", out)
	}
}
