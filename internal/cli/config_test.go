package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"fp16audit/internal/precision"
)

func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestFindConfig(t *testing.T) {
	root := t.TempDir()
	outer := writeFile(t, filepath.Join(root, configName), "policy = \"half\"\n")
	repo := filepath.Join(root, "repo")
	os.MkdirAll(filepath.Join(repo, ".git"), 0o755)
	model := filepath.Join(repo, "models", "deep", "m.onnx")
	os.MkdirAll(filepath.Dir(model), 0o755)

	// Inside a repository without a config, the walk stops at its root and
	// never reaches the file above it.
	if got, err := findConfig(model); err != nil || got != "" {
		t.Errorf("no config in the repository: got %q, %v; want none", got, err)
	}
	// Outside a repository the walk goes up to the filesystem root.
	if got, err := findConfig(filepath.Join(root, "elsewhere", "m.onnx")); err != nil || got != outer {
		t.Errorf("outside a repository: got %q, %v; want %s", got, err, outer)
	}
	atRoot := writeFile(t, filepath.Join(repo, configName), "")
	if got, _ := findConfig(model); got != atRoot {
		t.Errorf("config at the repository root: got %q, want %s", got, atRoot)
	}
	nearer := writeFile(t, filepath.Join(repo, "models", configName), "")
	if got, _ := findConfig(model); got != nearer {
		t.Errorf("the nearest config wins: got %q, want %s", got, nearer)
	}
	// A relative model path resolves against the working folder.
	t.Chdir(filepath.Join(repo, "models"))
	if got, _ := findConfig("deep/m.onnx"); got != nearer {
		t.Errorf("relative model path: got %q, want %s", got, nearer)
	}
	// A .git file (worktrees, submodules) marks a repository root too.
	sub := filepath.Join(repo, "models", "sub")
	writeFile(t, filepath.Join(sub, ".git"), "gitdir: ../../.git/modules/sub\n")
	if got, _ := findConfig(filepath.Join(sub, "m.onnx")); got != "" {
		t.Errorf("a submodule without config: got %q, want none", got)
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, filepath.Join(dir, configName), `
policy = "half"
checks = ["all", "-FP4002"]
fail_on = "error"

[models."models/resnet.onnx"]
inputs = ["input=batches/x.npy", "batches/y.npz", "/abs/z.npy"]
`)
	c, err := loadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Policy != "half" || c.Checks != "all,-FP4002" || c.FailOn != "error" {
		t.Errorf("config: %+v", c.fileConfig)
	}
	got := c.inputs(filepath.Join(dir, "models", "..", "models", "resnet.onnx"))
	want := []string{"input=" + filepath.Join(dir, "batches", "x.npy"), filepath.Join(dir, "batches", "y.npz"), "/abs/z.npy"}
	if !slices.Equal(got, want) {
		t.Errorf("inputs: got %q, want %q", got, want)
	}
	if in := c.inputs(filepath.Join(dir, "other.onnx")); in != nil {
		t.Errorf("another model got inputs %q", in)
	}
}

func TestLoadConfigErrors(t *testing.T) {
	for _, tc := range []struct{ content, want string }{
		{`polcy = "half"`, `unknown key "polcy"`},
		{"[models.\"m.onnx\"]\ninputz = [\"x.npy\"]", `unknown key "inputz" in [models."m.onnx"]`},
		{`policy = "fp8"`, `policy: unknown policy "fp8"`},
		{`fail_on = "info"`, `fail_on "info"`},
		{`checks = "all,-FP4998"`, "no check FP4998"},
		{`checks = 3`, "checks: want a string"},
		{`checks = ["all", 3]`, "not a string"},
		{`policy = 3`, "policy"},
		{`policy = "half`, "line 1"},
		{"[models.\"m.onnx\"]\ninputs = [\"\"]", "empty entry"},
	} {
		p := writeFile(t, filepath.Join(t.TempDir(), configName), tc.content)
		_, err := loadConfig(p)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%q: got %v, want an error naming %s and containing %q", tc.content, err, p, tc.want)
		}
	}
}

// TestLintConfigPrecedence lints through Main: the config file beats the
// defaults, flags beat the config file, and a bad config file is a usage
// error naming the file and the key.
func TestLintConfigPrecedence(t *testing.T) {
	repo := t.TempDir()
	os.MkdirAll(filepath.Join(repo, ".git"), 0o755)
	ln := writeModel(t, filepath.Join(repo, "models", "ln.onnx"), lnGraph())
	cast := writeModel(t, filepath.Join(repo, "models", "cast.onnx"), castGraph())
	cfg := writeFile(t, filepath.Join(repo, configName), "policy = \"half\"\nfail_on = \"warning\"\nchecks = \"all,-FP4002\"\n")

	code, out, _ := runMain(t, "lint", ln)
	if code != exitFindings || !strings.Contains(out, "error FP4005") || !strings.Contains(out, "policy half, checks all,-FP4002, config") {
		t.Errorf("config policy half: exit %d\n%s", code, out)
	}
	code, out, _ = runMain(t, "lint", ln, "--policy", "autocast-fp16")
	if code != exitOK || !strings.Contains(out, "info FP4005") {
		t.Errorf("--policy beats the config: exit %d\n%s", code, out)
	}
	code, out, _ = runMain(t, "lint", cast)
	if code != exitFindings || !strings.Contains(out, "warning FP4003") {
		t.Errorf("config fail_on warning: a warning must fail: exit %d\n%s", code, out)
	}
	code, _, _ = runMain(t, "lint", cast, "--fail-on", "error")
	if code != exitOK {
		t.Errorf("--fail-on beats the config: exit %d", code)
	}
	code, out, _ = runMain(t, "lint", ln, "--checks", "all,-FP4005")
	if code != exitOK || strings.Contains(out, "FP4005:") {
		t.Errorf("--checks beats the config: exit %d\n%s", code, out)
	}

	writeFile(t, cfg, "policy = \"half\"\nfailon = \"error\"\n")
	code, _, errs := runMain(t, "lint", ln)
	if code != exitUsage || !strings.Contains(errs, cfg) || !strings.Contains(errs, `unknown key "failon"`) {
		t.Errorf("unknown key: exit %d, stderr %q", code, errs)
	}
}

// TestApplyRunConfig checks what run takes from the config file: policy,
// checks, fail_on and the model's inputs, each unless its flag is set.
func TestApplyRunConfig(t *testing.T) {
	repo := t.TempDir()
	os.MkdirAll(filepath.Join(repo, ".git"), 0o755)
	model := filepath.Join(repo, "models", "resnet.onnx")
	writeFile(t, filepath.Join(repo, configName), `policy = "autocast-bf16"
checks = "FP2*"
fail_on = "warning"
[models."models/resnet.onnx"]
inputs = ["input=batches/x.npy"]
`)
	parse := func(args ...string) (*pflag.FlagSet, *runOptions) {
		o := &runOptions{policy: precision.DefaultPolicy, checks: "all", failOn: "error"}
		fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
		fs.StringArrayVarP(&o.inputs, "input", "i", nil, "")
		fs.StringVar(&o.policy, "policy", o.policy, "")
		fs.StringVar(&o.checks, "checks", o.checks, "")
		fs.StringVar(&o.failOn, "fail-on", o.failOn, "")
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return fs, o
	}
	var stderr bytes.Buffer
	fs, o := parse(model)
	if code := applyRunConfig(fs, o, &stderr); code >= 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if o.policy != "autocast-bf16" || o.checks != "FP2*" || o.failOn != "warning" || !slices.Equal(o.inputs, []string{"input=" + filepath.Join(repo, "batches", "x.npy")}) {
		t.Errorf("from the config: %+v", *o)
	}
	fs, o = parse(model, "--policy", "half", "-i", "b.npy", "--checks", "all", "--fail-on", "never")
	applyRunConfig(fs, o, &stderr)
	if o.policy != "half" || o.checks != "all" || o.failOn != "never" || !slices.Equal(o.inputs, []string{"b.npy"}) {
		t.Errorf("flags win: %+v", *o)
	}
	fs, o = parse(model, "--checks", "FP9")
	if code := applyRunConfig(fs, o, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "--checks") {
		t.Errorf("bad --checks: exit %d, stderr %q", code, stderr.String())
	}
}
