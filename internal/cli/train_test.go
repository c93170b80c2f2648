package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"fp16audit/internal/batch"
	"fp16audit/report"
)

func TestParseScale(t *testing.T) {
	for in, want := range map[string]float64{"65536": 65536, "2^16": 65536, "2**8": 256, "2.**3": 8, " 1024 ": 1024} {
		if got, err := parseScale(in); err != nil || got != want {
			t.Errorf("parseScale(%q) = %g, %v; want %g", in, got, err, want)
		}
	}
	for _, in := range []string{"3^4", "2^x", "big", "2^99"} {
		if _, err := parseScale(in); err == nil {
			t.Errorf("parseScale(%q): no error", in)
		}
	}
}

// trainFixture writes the batch and the target of a training fixture
// into dir as .npy files and returns the model's path and theirs.
func trainFixture(t *testing.T, name, dir string) (model, in, target string) {
	t.Helper()
	ts, err := batch.ReadNPZ("../../fixtures/torch/train/" + name + ".npz")
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ts {
		if x.Name == "input_0" || x.Name == "target" {
			b, err := batch.EncodeNPY(x)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, x.Name+".npy"), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return "../../fixtures/torch/train/" + name + ".onnx", filepath.Join(dir, "input_0.npy"), filepath.Join(dir, "target.npy")
}

// TestRunTrainingFlags runs the backward audit of the regression fixture
// from the command line: the scaled loss gradient overflows at the default
// 2^16 (a warning: the GradScaler recovers), the JSON carries the training
// section, and a scale that is no power of two is a usage error.
func TestRunTrainingFlags(t *testing.T) {
	dir := t.TempDir()
	model, in, tg := trainFixture(t, "regression", dir)
	out := filepath.Join(dir, "r.json")
	code, _, stderr := run(t, "run", model, "-i", in, "--mode", "train", "--loss", "mse", "--target", tg, "--format", "json", "-o", out)
	if code != exitOK {
		t.Fatalf("exit %d, stderr %s", code, stderr)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var r report.Report
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	if r.Training == nil || r.Training.Backward == nil || r.Training.Backward.Verdict != report.BackwardHealthy ||
		r.Training.Schema != report.TrainingSchema || r.Training.Backward.SettledExp == nil || *r.Training.Backward.SettledExp != 3 {
		t.Fatalf("training %+v: want healthy, settled at 2^3, schema %s", r.Training, report.TrainingSchema)
	}
	if code, _, _ := run(t, "run", model, "-i", in, "--mode", "train", "--loss", "mse", "--target", tg, "--fail-on", "warning"); code != exitOK {
		t.Errorf("--fail-on warning: exit %d, want %d (FP6004, the scaler settling, is info)", code, exitOK)
	}
	code, _, stderr = run(t, "run", model, "-i", in, "--loss", "mse", "--target", tg, "--grad-underflow-fraction", "0.05")
	if code != exitUsage || !strings.Contains(stderr, "--lost-mass-tolerance 0.05") {
		t.Errorf("--grad-underflow-fraction: exit %d, stderr %q; want a usage error naming --lost-mass-tolerance", code, stderr)
	}
	code, _, stderr = run(t, "run", model, "-i", in, "--loss", "mse", "--target", tg, "--init-scale", "1000")
	if code != exitUsage || !strings.Contains(stderr, "power of two") {
		t.Errorf("--init-scale 1000: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = run(t, "run", model, "-i", in, "--loss", "mse")
	if code != exitUsage || !strings.Contains(stderr, "--target") {
		t.Errorf("--loss without --target: exit %d, stderr %q", code, stderr)
	}
}

// TestRunCrossEntropyFlags runs the tagger fixture (logits [3, 5, 12] in
// PyTorch's class-axis-1 layout, tags with ignore_index -1, two outputs)
// from the command line: the JSON says how the loss read the logits, and
// the options only cross-entropy reads are refused elsewhere.
func TestRunCrossEntropyFlags(t *testing.T) {
	dir := t.TempDir()
	model, in, tg := trainFixture(t, "tagger", dir)
	out := filepath.Join(dir, "r.json")
	code, _, stderr := run(t, "run", model, "-i", in, "--loss", "cross-entropy", "--target", tg, "--loss-output", "logits",
		"--class-axis", "1", "--ignore-index", "-1", "--no-fixes", "--format", "json", "-o", out)
	if code != exitOK && code != exitFindings {
		t.Fatalf("exit %d, stderr %s", code, stderr)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var r report.Report
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	want := report.CrossEntropyReport{ClassAxis: 1, Classes: 5, IgnoreIndex: -1, Scored: 33, Targets: 36}
	if r.Training == nil || r.Training.Backward == nil || r.Training.Backward.CrossEntropy == nil || *r.Training.Backward.CrossEntropy != want {
		t.Fatalf("training %+v: want cross-entropy %+v", r.Training, want)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--loss", "cross-entropy", "--target", tg, "--class-axis", "2"}, `--class-axis: "2": want 1`},
		{[]string{"--loss", "mse", "--target", tg, "--ignore-index", "-1"}, "configure --loss cross-entropy"},
		{[]string{"--loss", "cross-entropy", "--target", tg, "--ignore-index", "-1"}, "(--loss-output NAME)"},
	} {
		code, _, stderr := run(t, append([]string{"run", model, "-i", in}, c.args...)...)
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want a usage error containing %q", c.args, code, stderr, c.want)
		}
	}
}
