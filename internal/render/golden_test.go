package render

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	goldenfile "fp16audit/internal/golden"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"fp16audit/fixtures"
	"fp16audit/internal/audit"
	"fp16audit/internal/onnxrt"
	"fp16audit/report"
)

// The audit goldens under testdata/audit are made by the real audit of
// every fixture (fixtures.All and fixtures.TorchExports, each batch of each
// model) and a few variations of the run, so they cannot go stale: a change
// of the diagnosis or of a renderer fails TestGolden until
// `go test ./internal/render -update` rewrites them and the diff is
// reviewed. Only this test imports internal/audit; the package itself
// imports report and checks alone. The other tests read the saved JSON and
// need no ONNX Runtime.
const auditGoldens = "testdata/audit"

// repoRoot is where the fixture paths in a case start; the audits run with
// paths relative to it, and the reports say them as the command line run
// from the repository root would.
const repoRoot = "../.."

// goldenCase is one audit whose report and renderings are kept.
type goldenCase struct {
	name   string // file stem under testdata/audit
	model  string // relative to the repository root
	batch  string // relative to the repository root; "" for synthetic inputs
	policy string // "" for the default policy
}

// goldenCases lists every fixture batch (named after the batch, which is
// unique), then the variations: the fp32 policy (a report with one pass),
// the half policy, and synthetic inputs.
func goldenCases(t testing.TB) []goldenCase {
	t.Helper()
	var cases []goldenCase
	for _, f := range fixtures.All() {
		for _, b := range f.Batches {
			cases = append(cases, goldenCase{name: b.Name, model: "fixtures/models/" + f.Name + ".onnx", batch: "fixtures/batches/" + b.Name + ".npy"})
		}
	}
	for _, te := range fixtures.TorchExports() {
		cases = append(cases, goldenCase{name: strings.TrimSuffix(filepath.Base(te.Batch), filepath.Ext(te.Batch)),
			model: "fixtures/" + te.Model, batch: "fixtures/" + te.Batch})
	}
	// Real PyTorch exports (fixtures/torch/cases) chosen for what the
	// renderers must show: the exporter's Identity rows of shared weights
	// and an error finding beside a healthy verdict (a masked_fill PyTorch
	// refuses), an fp16 batch at fault, a half cast upstream of the
	// overflow, two inputs, four batches, an audio input.
	for _, name := range []string{"gpt_mask_fill_1e9", "half_exported_fp16_batch", "explicit_cast_residual",
		"two_inputs_metadata", "outlier_third_batch", "audio_raw_waveform"} {
		dir := "fixtures/torch/cases/" + name
		cases = append(cases, goldenCase{name: "torch_" + name, model: dir + "/model.onnx", batch: dir + "/batches"})
	}
	cases = append(cases,
		goldenCase{name: "demo_cnn_raw.policy-fp32", model: "fixtures/models/demo_cnn.onnx", batch: "fixtures/batches/demo_cnn_raw.npy", policy: "fp32"},
		goldenCase{name: "oversized_logits.policy-half", model: "fixtures/models/oversized_logits.onnx", batch: "fixtures/batches/oversized_logits.npy", policy: "half"},
		goldenCase{name: "torch_resnetish.synthetic", model: "fixtures/models/torch_resnetish.onnx"},
		// A transformer's blocks: the roll-up, the residual stream's
		// growth, the node table grouped by block, a mask constant that
		// must not set the chart's axis (a bf16 checkpoint under half).
		goldenCase{name: "torch_llama_bf16_checkpoint.policy-half", model: "fixtures/torch/cases/llama_bf16_checkpoint/model.onnx",
			batch: "fixtures/torch/cases/llama_bf16_checkpoint/batches", policy: "half"},
	)
	seen := map[string]bool{}
	for _, c := range cases {
		if seen[c.name] {
			t.Fatalf("two golden cases are named %s: batch names must be unique", c.name)
		}
		seen[c.name] = true
	}
	return cases
}

// goldenNames lists the case names, for the tests that read saved reports.
func goldenNames(t testing.TB) []string {
	var names []string
	for _, c := range goldenCases(t) {
		names = append(names, c.name)
	}
	return names
}

// textVariants are the terminal views kept as goldens for one case each:
// --only-flagged, colour, tables fitted to a width, another pass, and the
// constant-only rows shown.
var textVariants = []struct {
	name, report string
	opt          TextOptions
}{
	{"only-flagged", "demo_cnn_raw", TextOptions{OnlyFlagged: true}},
	{"color-w100", "demo_cnn_raw", TextOptions{Color: true, Width: 100}},
	{"w80", "demo_cnn_raw", TextOptions{Width: 80}},
	{"pass-bf16", "demo_cnn_raw", TextOptions{Pass: "bf16", OnlyFlagged: true}},
	{"constant-nodes", "torch_half_cast", TextOptions{ConstantNodes: true}},
}

// goldenFormats are the renderings kept for every case.
var goldenFormats = []struct{ format, ext string }{{"text", "txt"}, {"markdown", "md"}, {"html", "html"}}

// audited is one case's report as the audit returned it and as JSON.
type audited struct {
	r  *report.Report
	js []byte
}

var (
	auditMu    sync.Mutex
	auditCache = map[string]audited{}
)

// auditCase runs the audit of one case (once per test binary) and returns
// its report with what changes from run to run blanked, and that report as
// JSON.
func auditCase(t testing.TB, c goldenCase) (*report.Report, []byte) {
	t.Helper()
	auditMu.Lock()
	defer auditMu.Unlock()
	if a, ok := auditCache[c.name]; ok {
		return a.r, a.js
	}
	cfg := audit.Config{ModelPath: filepath.Join(repoRoot, c.model), Policy: c.policy, Seed: 1, SyntheticBatches: 1,
		// One thread: ONNX Runtime's sums then do not depend on the
		// machine's number of cores.
		Threads: 1}
	if c.batch != "" {
		cfg.Inputs = []string{filepath.Join(repoRoot, c.batch)}
	}
	r, err := audit.Run(context.Background(), cfg)
	var missing *onnxrt.LibraryNotFoundError
	switch {
	case errors.As(err, &missing) && os.Getenv("CI") == "":
		t.Skipf("ONNX Runtime is not installed (make ort); CI requires it: %v", err)
	case err != nil:
		t.Fatalf("audit %s: %v", c.name, err)
	}
	blankRun(r)
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	// Six significant digits: ONNX Runtime's kernels may round the last
	// bits differently on another CPU, and a golden is about behaviour.
	if js, err = roundFloats(js); err != nil {
		t.Fatal(err)
	}
	r = decodeReport(t, c.name, js)
	abs, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{abs + "/", repoRoot + "/"} {
		if i := bytes.Index(js, []byte(p)); i >= 0 {
			t.Fatalf("%s: the report holds the path %s, which depends on where the test runs: blank it in blankRun\n%s",
				c.name, p, goldenfile.Short(string(js[max(0, i-100):])))
		}
	}
	auditCache[c.name] = audited{r, js}
	return r, js
}

// roundFloats rewrites every non-integral number of a JSON document with
// six significant digits.
func roundFloats(js []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	var walk func(any) any
	walk = func(x any) any {
		switch x := x.(type) {
		case map[string]any:
			for k, e := range x {
				x[k] = walk(e)
			}
		case []any:
			for i, e := range x {
				x[i] = walk(e)
			}
		case json.Number:
			if strings.ContainsAny(string(x), ".eE") {
				if f, err := x.Float64(); err == nil {
					return json.Number(strconv.FormatFloat(f, 'g', 6, 64))
				}
			}
		}
		return x
	}
	out, err := json.MarshalIndent(walk(v), "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// blankRun clears what differs between two runs of the same audit (the
// versions, the thread count, the elapsed time) and says the paths of the
// model and batches as from the repository root.
func blankRun(r *report.Report) {
	r.Tool.Version, r.Tool.ORTVersion, r.Tool.ORTThreads, r.Tool.ElapsedSecs = "0.0.0-test", "0.0.0-test", 0, 0
	r.Tool.Timing = nil
	fromRoot := func(p string) string { return strings.TrimPrefix(filepath.ToSlash(p), repoRoot+"/") }
	r.Model.Path = fromRoot(r.Model.Path)
	for i := range r.Batches {
		r.Batches[i].Source = fromRoot(r.Batches[i].Source)
	}
}

func decodeReport(t testing.TB, name string, js []byte) *report.Report {
	t.Helper()
	var r report.Report
	if err := json.Unmarshal(js, &r); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return &r
}

// loadReport returns a case's report: the saved JSON golden, or with
// -update a fresh audit, so that every test of an -update run sees the
// reports it writes.
func loadReport(t testing.TB, name string) *report.Report {
	t.Helper()
	if *update {
		for _, c := range goldenCases(t) {
			if c.name == name {
				_, js := auditCase(t, c)
				return decodeReport(t, name, js)
			}
		}
		t.Fatalf("no golden case %s", name)
	}
	data, err := os.ReadFile(filepath.Join(auditGoldens, name+".json"))
	if err != nil {
		t.Fatalf("%v (run go test ./internal/render -update)", err)
	}
	return decodeReport(t, name, data)
}

// TestGolden audits every case and compares the JSON report and each
// rendering with its golden. Each rendering is made twice, from the report
// the audit returned and from its JSON decoded again, and the two must be
// equal: `fp16audit render` shows what `fp16audit run` showed.
func TestGolden(t *testing.T) {
	if _, err := onnxrt.FindLibrary(""); err != nil && os.Getenv("CI") == "" {
		t.Skipf("ONNX Runtime is not installed (make ort); CI requires it: %v", err)
	}
	cases := goldenCases(t)
	want := map[string]bool{}
	for _, c := range cases {
		want[c.name+".json"] = true
		for _, f := range goldenFormats {
			want[c.name+"."+f.ext+".golden"] = true
		}
	}
	for _, v := range textVariants {
		want[v.report+"."+v.name+".txt.golden"] = true
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fresh, js := auditCase(t, c)
			golden(t, filepath.Join("audit", c.name+".json"), js)
			saved := decodeReport(t, c.name, js)
			for _, f := range goldenFormats {
				var a, b bytes.Buffer
				if err := Render(&a, fresh, f.format, Options{}); err != nil {
					t.Fatal(err)
				}
				if err := Render(&b, saved, f.format, Options{}); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(a.Bytes(), b.Bytes()) {
					t.Errorf("%s: the rendering of the saved JSON differs from the audit's: %s", f.format,
						goldenfile.Diff(a.String(), b.String()))
				}
				golden(t, filepath.Join("audit", c.name+"."+f.ext+".golden"), a.Bytes())
			}
		})
	}
	for _, v := range textVariants {
		t.Run(v.report+"/"+v.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := Render(&b, loadReport(t, v.report), "text", Options{Text: v.opt}); err != nil {
				t.Fatal(err)
			}
			golden(t, filepath.Join("audit", v.report+"."+v.name+".txt.golden"), b.Bytes())
		})
	}
	if t.Failed() {
		return
	}
	// A golden no case writes any more is stale: it goes with -update.
	entries, err := os.ReadDir(auditGoldens)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if want[e.Name()] {
			continue
		}
		if *update {
			if err := os.Remove(filepath.Join(auditGoldens, e.Name())); err != nil {
				t.Fatal(err)
			}
			continue
		}
		t.Errorf("%s/%s belongs to no golden case (run go test ./internal/render -update)", auditGoldens, e.Name())
	}
}

// TestGoldenCasesCoverFixtures: every model and batch under fixtures/ is
// audited by some case, so a new fixture gets goldens by itself.
func TestGoldenCasesCoverFixtures(t *testing.T) {
	used := map[string]bool{}
	for _, c := range goldenCases(t) {
		used[c.model], used[c.batch] = true, true
	}
	models, _ := filepath.Glob(filepath.Join(repoRoot, "fixtures", "models", "*.onnx"))
	batches, _ := filepath.Glob(filepath.Join(repoRoot, "fixtures", "batches", "*.npy"))
	if len(models) == 0 || len(batches) == 0 {
		t.Fatal("no fixtures found")
	}
	for _, p := range append(models, batches...) {
		rel := strings.TrimPrefix(p, repoRoot+"/")
		if !used[rel] {
			t.Errorf("%s is in no golden case", rel)
		}
	}
}
