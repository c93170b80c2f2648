package conformance

import (
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"fp16audit/internal/onnxrt"
	"fp16audit/internal/tensor"
)

var (
	update = flag.Bool("update", false, "rewrite testdata/baseline.json and docs/conformance.md")
	root   = flag.String("root", DefaultRoot, "folder of the ONNX backend test data")
)

// Baseline is the committed outcome of the full sweep.
type Baseline struct {
	Counts Counts             `json:"counts"`
	Cases  map[string]Outcome `json:"cases"`
}

const baselineFile = "testdata/baseline.json"

func initRuntime(t *testing.T) {
	t.Helper()
	lib, err := onnxrt.FindLibrary("")
	if err != nil {
		t.Skipf("ONNX Runtime not installed (make ort): %v", err)
	}
	if err := onnxrt.Init(lib); err != nil {
		t.Fatal(err)
	}
}

func selectCases(t *testing.T) []Case {
	t.Helper()
	cases, err := Cases(*root)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("backend test data missing (apt-get install libonnx-testdata): %v", err)
		}
		t.Skipf("backend test data missing (apt-get install libonnx-testdata): %v", err)
	}
	return cases
}

// TestSweep audits every backend test model (about three seconds on two
// cores) and fails when a model fails, when any model's outcome is worse
// than in the baseline, or when a count is worse. With -update it rewrites
// the baseline and docs/conformance.md.
func TestSweep(t *testing.T) {
	initRuntime(t)
	cases := selectCases(t)
	start := time.Now()
	results := Sweep(cases, Options{Timeout: 2 * time.Minute})
	elapsed := time.Since(start)
	counts := Count(results)
	t.Logf("%d models in %.1fs: %+v", len(results), elapsed.Seconds(), counts)

	slow := slices.Clone(results)
	slices.SortFunc(slow, func(a, b Result) int { return int((b.Secs - a.Secs) * 1e6) })
	for _, r := range slow[:min(5, len(slow))] {
		t.Logf("slowest: %s %.2fs", r.Case, r.Secs)
	}

	if *update {
		b := Baseline{Counts: counts, Cases: map[string]Outcome{}}
		for _, r := range results {
			b.Cases[r.Case] = r.Outcome
		}
		data, err := json.MarshalIndent(b, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(baselineFile, append(data, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		doc := Markdown(results, onnxrt.Version())
		if err := os.WriteFile(filepath.Join("..", "..", "docs", "conformance.md"), []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	base := readBaseline(t)
	for _, r := range results {
		if r.Outcome == Failed {
			t.Errorf("%s: failed (%s): %s", r.Case, r.Reason, r.Detail)
			continue
		}
		want, ok := base.Cases[r.Case]
		if !ok {
			t.Logf("%s: %s (%s), not in the baseline", r.Case, r.Outcome, r.Reason)
			continue
		}
		if r.Outcome.Worse(want) {
			t.Errorf("%s: %s (%s: %s), baseline %s", r.Case, r.Outcome, r.Reason, r.Detail, want)
		}
	}
	{
		for _, c := range []struct {
			name      string
			got, base int
			moreIsBad bool
		}{
			{"completed", counts.Completed, base.Counts.Completed, false},
			{"matched", counts.Matched, base.Counts.Matched, false},
			{"failed", counts.Failed, base.Counts.Failed, true},
			{"total", counts.Total, base.Counts.Total, false},
		} {
			if c.moreIsBad && c.got > c.base || !c.moreIsBad && c.got < c.base {
				t.Errorf("%s: %d, baseline %d", c.name, c.got, c.base)
			}
		}
	}
}

func readBaseline(t *testing.T) Baseline {
	t.Helper()
	var b Baseline
	data, err := os.ReadFile(baselineFile)
	if err != nil {
		t.Fatalf("%v (run go test ./conformance -run TestSweep -update)", err)
	}
	if err := json.Unmarshal(data, &b); err != nil {
		t.Fatalf("%s: %v", baselineFile, err)
	}
	return b
}

// TestCompare pins the tolerance rules.
func TestCompare(t *testing.T) {
	f := func(vals ...float32) []float32 { return vals }
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	cases := []struct {
		got, want []float32
		ok        bool
	}{
		{f(1, 2), f(1, 2), true},
		{f(1.0005), f(1), true},
		{f(1.002), f(1), false},
		{f(1e-8), f(0), true},
		{f(1e-6), f(0), false},
		{f(nan), f(nan), true},
		{f(nan), f(1), false},
		{f(inf), f(inf), true},
		{f(inf), f(-inf), false},
	}
	for _, c := range cases {
		got := tensor.FromFloat32s("got", []int64{int64(len(c.got))}, c.got)
		want := tensor.FromFloat32s("want", []int64{int64(len(c.want))}, c.want)
		if d := Compare(got, want); (d == "") != c.ok {
			t.Errorf("Compare(%v, %v) = %q, want ok=%v", c.got, c.want, d, c.ok)
		}
	}
}

func TestMarkdownIsStable(t *testing.T) {
	rs := []Result{
		{Case: "node/test_a", Outcome: Matched},
		{Case: "node/test_b", Outcome: Unsupported, Reason: "no kernel"},
		{Case: "simple/test_c", Outcome: OutOfScope, Reason: "non-tensor input"},
	}
	a := Markdown(rs, "1.30.0")
	if a != Markdown(slices.Clone(rs), "1.30.0") {
		t.Error("Markdown is not deterministic")
	}
	for _, want := range []string{"| node | 2 | 1 | 1 | 0 | 1 | 0 | 0 |", "| unsupported | no kernel | 1 | node/test_b |"} {
		if !strings.Contains(a, want) {
			t.Errorf("table lacks %q:\n%s", want, a)
		}
	}
}
