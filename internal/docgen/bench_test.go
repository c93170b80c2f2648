package docgen

import (
	"slices"
	"testing"
)

// TestParseBench reads what `make bench` writes: configuration lines,
// results of several packages, sub-benchmarks, a benchmark run twice
// (a range on the page), a skipped one with its reason, and the lines
// go test prints between them.
func TestParseBench(t *testing.T) {
	out := `date: 2026-12-07T10:00:00Z
machine: 2 cores, 24 GiB, Linux 6.1
load-average: 8.1 7.9 7.5
goos: linux
pkg: fp16audit/internal/lint
cpu: AMD EPYC
BenchmarkLint100MB-2   	       1	 249955229 ns/op	 419.51 MB/s	         1.070 peak-rss/file
PASS
ok  	fp16audit/internal/lint	1.565s
pkg: fp16audit/internal/audit
BenchmarkFullAudit/transformer-2         	       1	21509923451 ns/op	         1.367 audit/3plain	      9087 ms/3plain
BenchmarkFullAudit/transformer-2         	       1	21509923451 ns/op	         1.5 audit/3plain	      9087 ms/3plain
BenchmarkFullAudit/resnet-2              	       1	7254752528 ns/op	         1.380 audit/3plain	      3047 ms/3plain
BenchmarkLLM
--- SKIP: BenchmarkLLM
    bench_test.go:390: fixtures/bench/llama is missing: make llama-bench.
load-average-after: 9.0 8.0 7.6
`
	r, err := parseBench([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if r.config["date"] != "2026-12-07T10:00:00Z" || r.config["cpu"] != "AMD EPYC" || r.config["load-average-after"] != "9.0 8.0 7.6" {
		t.Errorf("config %v", r.config)
	}
	if !slices.Equal(r.pkgs, []string{"fp16audit/internal/lint", "fp16audit/internal/audit"}) {
		t.Fatalf("packages %v", r.pkgs)
	}
	full := r.benches["fp16audit/internal/audit"][0]
	if full.name != "BenchmarkFullAudit" || !slices.Equal(full.cases, []string{"transformer", "resnet"}) ||
		!slices.Equal(full.units, []string{"ns/op", "audit/3plain", "ms/3plain"}) {
		t.Fatalf("FullAudit %+v", full)
	}
	if got := benchValue("audit/3plain", full.vals["transformer"]["audit/3plain"]); got != "1.37–1.5" {
		t.Errorf("two runs: %q, want the range 1.37–1.5", got)
	}
	if got := benchValue("ns/op", full.vals["resnet"]["ns/op"]); got != "7.25s" {
		t.Errorf("time %q, want 7.25s", got)
	}
	if s := r.skipped["fp16audit/internal/audit"]; len(s) != 1 || s[0][0] != "BenchmarkLLM" || s[0][1] != "fixtures/bench/llama is missing: make llama-bench." {
		t.Errorf("skipped %v", s)
	}
	for unit, want := range map[string]bool{"audit/3plain": true, "rss-bounded/(budget+weights)": true, "peak-rss/file": true,
		"ms/audit": false, "MB/s": false, "GB/s": false, "B/op": false, "cpu-ms/op": false, "ns/op": false, "runs/op": false, "MB-rss-plain": false} {
		if ratio(unit) != want {
			t.Errorf("ratio(%q) = %v", unit, !want)
		}
	}
}
