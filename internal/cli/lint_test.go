package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"fp16audit/internal/onnx"
	"fp16audit/report"
)

// Models for the lint tests, built with the onnx builders as the
// TorchScript exporter would write them.

func lintGraph(nodes []*onnx.NodeProto, inits []*onnx.TensorProto) *onnx.GraphProto {
	return &onnx.GraphProto{Name: "g", Node: nodes, Initializer: inits,
		Input:  []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 2, 4)},
		Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 2, 4)}}
}

// cleanGraph is a Linear layer with default-scale weights.
func cleanGraph() *onnx.GraphProto {
	w := make([]float32, 16)
	for i := range w {
		w[i] = 0.1 * float32(i%5-2)
	}
	return lintGraph([]*onnx.NodeProto{onnx.Node("Gemm", "/fc/Gemm", []string{"x", "fc.weight"}, []string{"y"}, onnx.AttrInt("transB", 1))},
		[]*onnx.TensorProto{onnx.FloatTensor("fc.weight", []int64{4, 4}, w)})
}

// castGraph is x.half().float(): one warning (FP4003) under every policy.
func castGraph() *onnx.GraphProto {
	return lintGraph([]*onnx.NodeProto{
		onnx.Node("Cast", "/block/Cast", []string{"x"}, []string{"h"}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT16))),
		onnx.Node("Cast", "/block/Cast_1", []string{"h"}, []string{"y"}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT))),
	}, nil)
}

// lnGraph is a LayerNormalization with eps=1e-12: an error under half,
// information under autocast-fp16.
func lnGraph() *onnx.GraphProto {
	return lintGraph([]*onnx.NodeProto{
		onnx.Node("LayerNormalization", "/encoder/norm/LayerNormalization", []string{"x", "g"}, []string{"y"}, onnx.AttrFloat("epsilon", 1e-12)),
	}, []*onnx.TensorProto{onnx.FloatTensor("g", []int64{4}, []float32{1, 1, 1, 1})})
}

func writeModel(t *testing.T, path string, g *onnx.GraphProto) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := onnx.Save(onnx.NewModel(g, 17), path); err != nil {
		t.Fatal(err)
	}
	return path
}

func runMain(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestLintExitCodes(t *testing.T) {
	dir := t.TempDir()
	clean := writeModel(t, filepath.Join(dir, "clean.onnx"), cleanGraph())
	cast := writeModel(t, filepath.Join(dir, "cast.onnx"), castGraph())
	ln := writeModel(t, filepath.Join(dir, "ln.onnx"), lnGraph())
	empty := filepath.Join(dir, "empty.onnx")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string // in stdout
		err  string // in stderr
	}{
		{"clean", []string{clean}, 0, "0 errors, 0 warnings, 0 info (policy autocast-fp16)", ""},
		{"warning shown, passes by default", []string{cast}, 0, `warning FP4003: node "/block/Cast" (module block) casts "x" to FLOAT16`, ""},
		{"fail-on warning", []string{cast, "--fail-on", "warning"}, 1, "1 warning", ""},
		{"info under autocast", []string{ln}, 0, "info FP4005", ""},
		{"error under half", []string{ln, "--policy", "half"}, 1, `error FP4005: node "/encoder/norm/LayerNormalization" (module encoder.norm) has LayerNormalization epsilon=1e-12`, ""},
		{"fail-on never", []string{ln, "--policy", "half", "--fail-on", "never"}, 0, "1 error", ""},
		{"checks deselects", []string{cast, "--checks", "all,-FP4003"}, 0, "checks all,-FP4003", ""},
		{"checks selects", []string{ln, cast, "--policy", "half", "--checks", "FP4005"}, 1, "ln.onnx: error FP4005", ""},
		{"several models, worst code", []string{clean, ln, "--policy", "half"}, 1, "clean.onnx: 0 errors", ""},
		{"load failure", []string{empty}, 3, "empty.onnx: not linted", "file is empty"},
		{"load failure beats findings", []string{cast, empty, clean, "--fail-on", "warning"}, 3, "cast.onnx: warning FP4003", "empty.onnx"},
		{"missing file", []string{filepath.Join(dir, "nope.onnx")}, 3, "", "does not exist"},
		{"no model", nil, 2, "", "want at least one MODEL"},
		{"bad policy", []string{clean, "--policy", "fp8"}, 2, "", "autocast-fp16"},
		{"bad fail-on", []string{clean, "--fail-on", "info"}, 2, "", "--fail-on"},
		{"bad format", []string{clean, "--format", "xml"}, 2, "", "text, json, sarif"},
		{"bad checks", []string{clean, "--checks", "all,-FP4998"}, 2, "", "no check FP4998"},
		{"bad flag", []string{clean, "--nope"}, 2, "", "unknown flag"},
		{"help", []string{"--help"}, 0, "fp16audit lint MODEL...", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := runMain(t, append([]string{"lint"}, tc.args...)...)
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, out, errs)
			}
			if !strings.Contains(out, tc.out) {
				t.Errorf("stdout lacks %q:\n%s", tc.out, out)
			}
			if !strings.Contains(errs, tc.err) {
				t.Errorf("stderr lacks %q:\n%s", tc.err, errs)
			}
		})
	}
}

// TestLintWithoutORT runs lint with ONNXRUNTIME_LIB naming a missing file:
// lint never loads ONNX Runtime.
func TestLintWithoutORT(t *testing.T) {
	t.Setenv("ONNXRUNTIME_LIB", filepath.Join(t.TempDir(), "missing", "libonnxruntime.so.1"))
	path := writeModel(t, filepath.Join(t.TempDir(), "m.onnx"), lnGraph())
	code, out, errs := runMain(t, "lint", "--policy", "half", path)
	if code != exitFindings || !strings.Contains(out, "FP4005") || errs != "" {
		t.Errorf("exit %d, stdout %q, stderr %q; want 1 with FP4005 and no error", code, out, errs)
	}
}

func TestLintJSON(t *testing.T) {
	dir := t.TempDir()
	ln := writeModel(t, filepath.Join(dir, "ln.onnx"), lnGraph())
	empty := filepath.Join(dir, "empty.onnx")
	os.WriteFile(empty, nil, 0o644)
	out := filepath.Join(dir, "lint.json")
	code, stdout, _ := runMain(t, "lint", "--policy", "half", "--format", "json", "--output", out, ln, empty)
	if code != exitModel || stdout != "" {
		t.Fatalf("exit %d, stdout %q; want 3 and the document in the file", code, stdout)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Schema string
		Tool   struct{ Name, Version string }
		Models []struct {
			Path, Policy, Checks, Error string
			FailOn                      string `json:"fail_on"`
			Findings                    []struct{ Check, Severity, Title, Message, Node, Module, Value string }
		}
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Schema != report.LintSchema || doc.Tool.Name != "fp16audit" || len(doc.Models) != 2 {
		t.Fatalf("document: %s", data)
	}
	m := doc.Models[0]
	if m.Path != ln || m.Policy != "half" || m.Checks != "all" || m.FailOn != "error" || len(m.Findings) != 1 {
		t.Fatalf("model 0: %+v", m)
	}
	f := m.Findings[0]
	if f.Check != "FP4005" || f.Severity != "error" || f.Node != "/encoder/norm/LayerNormalization" || f.Module != "encoder.norm" || f.Value != "epsilon=1e-12" || f.Title == "" {
		t.Errorf("finding: %+v", f)
	}
	if doc.Models[1].Error == "" || doc.Models[1].Findings == nil {
		t.Errorf("model 1 (unloadable): %+v", doc.Models[1])
	}
}

func TestLintSARIF(t *testing.T) {
	dir := t.TempDir()
	cast := writeModel(t, filepath.Join(dir, "a model.onnx"), castGraph())
	t.Chdir(dir)
	code, out, _ := runMain(t, "lint", "--format", "sarif", "--fail-on", "warning", filepath.Base(cast))
	if code != exitFindings {
		t.Fatalf("exit %d", code)
	}
	var log struct {
		Version string
		Runs    []struct {
			Tool struct {
				Driver struct {
					Name  string
					Rules []struct{ ID string }
				}
			}
			Results []struct {
				RuleID    string
				RuleIndex int
				Level     string
				Locations []struct {
					PhysicalLocation struct{ ArtifactLocation struct{ URI string } }
					LogicalLocations []struct{ Name, FullyQualifiedName string }
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &log); err != nil {
		t.Fatal(err)
	}
	run := log.Runs[0]
	if log.Version != "2.1.0" || run.Tool.Driver.Name != "fp16audit" || len(run.Results) != 1 {
		t.Fatalf("log: %s", out)
	}
	r := run.Results[0]
	loc := r.Locations[0]
	if r.RuleID != "FP4003" || run.Tool.Driver.Rules[r.RuleIndex].ID != "FP4003" || r.Level != "warning" ||
		loc.PhysicalLocation.ArtifactLocation.URI != "a%20model.onnx" ||
		loc.LogicalLocations[0].Name != "/block/Cast" || loc.LogicalLocations[0].FullyQualifiedName != "block" {
		t.Errorf("result: %+v", r)
	}
}

// TestHelperProcess is not a test: the git hook test runs the test binary
// as the fp16audit program through it.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("FP16AUDIT_HELPER_PROCESS") != "1" {
		t.Skip("helper process for TestGitHook")
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	os.Exit(Main(args, os.Stdout, os.Stderr))
}

// TestGitHook installs the plain git hook from docs/lint.md in a new
// repository and commits models through it, with fp16audit on PATH.
func TestGitHook(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed")
	}
	doc, err := os.ReadFile("../../docs/lint.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- BEGIN pre-commit hook -->\n```sh\n(.*?)```\n<!-- END pre-commit hook -->").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/lint.md has no pre-commit hook block")
	}
	bin := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	wrapper := "#!/bin/sh\nFP16AUDIT_HELPER_PROCESS=1 exec '" + self + "' -test.run='^TestHelperProcess$' -- \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "fp16audit"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	repo := t.TempDir()
	noConfig := filepath.Join(t.TempDir(), "gitconfig")
	if err := os.WriteFile(noConfig, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"GIT_CONFIG_GLOBAL="+noConfig, "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = repo, env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := git("init", "-q"); err != nil {
		t.Fatal(out)
	}
	if err := os.WriteFile(filepath.Join(repo, ".git", "hooks", "pre-commit"), m[1], 0o755); err != nil {
		t.Fatal(err)
	}
	commit := func(wantOK bool, wantOut string) {
		t.Helper()
		out, err := git("commit", "-q", "-m", "models")
		if (err == nil) != wantOK || !strings.Contains(out, wantOut) {
			t.Errorf("git commit: err %v, want success %v; output lacks %q:\n%s", err, wantOK, wantOut, out)
		}
	}

	writeModel(t, filepath.Join(repo, "README.txt"), cleanGraph())
	git("add", ".")
	commit(true, "") // no .onnx staged: fp16audit is not even run

	writeModel(t, filepath.Join(repo, "models", "clean model.onnx"), cleanGraph())
	git("add", ".")
	commit(true, "")

	// a warning is shown, and the default gate (error) lets it through
	writeModel(t, filepath.Join(repo, "models", "cast.onnx"), castGraph())
	git("add", ".")
	commit(true, `models/cast.onnx: warning FP4003: node "/block/Cast"`)

	// The repository's config raises the gate to warnings; the hook finds
	// it from the model's folder.
	os.WriteFile(filepath.Join(repo, configName), []byte("fail_on = \"warning\"\n"), 0o644)
	writeModel(t, filepath.Join(repo, "models", "cast2.onnx"), castGraph())
	git("add", ".")
	commit(false, `models/cast2.onnx: warning FP4003: node "/block/Cast"`)

	// Back at the default gate, an error refuses the commit.
	os.WriteFile(filepath.Join(repo, configName), []byte("policy = \"half\"\n"), 0o644)
	writeModel(t, filepath.Join(repo, "models", "ln.onnx"), lnGraph())
	git("add", ".")
	commit(false, `models/ln.onnx: error FP4005`)
	git("rm", "-q", "--cached", "models/ln.onnx")
	commit(true, "")
}

// TestPreCommitHooksFile checks the hook declarations pre-commit reads.
func TestPreCommitHooksFile(t *testing.T) {
	data, err := os.ReadFile("../../.pre-commit-hooks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The file is a list of flat mappings; read "key: value" lines per item.
	var hooks []map[string]string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") || strings.TrimSpace(line) == "" {
			continue
		}
		if strings.HasPrefix(line, "- ") {
			hooks = append(hooks, map[string]string{})
			line = "  " + line[2:]
		}
		k, v, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if !ok || len(hooks) == 0 {
			t.Fatalf("unexpected line %q", line)
		}
		hooks[len(hooks)-1][k] = v
	}
	ids := map[string]bool{}
	for _, h := range hooks {
		for _, k := range []string{"id", "name", "entry", "language", "files"} {
			if h[k] == "" {
				t.Errorf("hook %q: no %s", h["id"], k)
			}
		}
		ids[h["id"]] = true
		if h["entry"] != "fp16audit lint" {
			t.Errorf("hook %s: entry %q", h["id"], h["entry"])
		}
		if h["language"] != "golang" && h["language"] != "system" {
			t.Errorf("hook %s: language %q", h["id"], h["language"])
		}
		re, err := regexp.Compile(h["files"])
		if err != nil {
			t.Fatalf("hook %s: files: %v", h["id"], err)
		}
		for name, want := range map[string]bool{"model.onnx": true, "a/b c.onnx": true, "model.onnx.bak": false, "model.onnx_data": false, "notes.txt": false} {
			if re.MatchString(name) != want {
				t.Errorf("hook %s: files %q matches %q: %v", h["id"], h["files"], name, !want)
			}
		}
	}
	if !ids["fp16audit-lint"] {
		t.Error("no fp16audit-lint hook")
	}
}
