package cli

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"fp16audit/report"
)

const savedReport = "../render/testdata/audit/demo_cnn_raw.json"

func TestRenderFormats(t *testing.T) {
	for _, c := range []struct {
		format string
		want   []string
	}{
		{"text", []string{"verdict: unnormalized-input", "origin (fp16 pass): /conv1/Conv", "per-node statistics"}},
		{"markdown", []string{"## fp16audit: ❌ `unnormalized-input`", "### Flagged nodes (13 of 13)"}},
		{"html", []string{"<!DOCTYPE html>", `<svg id="chart"`, "unnormalized-input"}},
		{"json", []string{`"schema": "` + report.ReportSchema + `"`}},
	} {
		var stdout, stderr bytes.Buffer
		if code := Main([]string{"render", savedReport, "--format", c.format}, &stdout, &stderr); code != exitOK {
			t.Fatalf("render --format %s: exit %d: %s", c.format, code, stderr.String())
		}
		for _, w := range c.want {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("render --format %s: output lacks %q", c.format, w)
			}
		}
		if strings.Contains(stdout.String(), "\x1b[") {
			t.Errorf("render --format %s: colour escapes in output that is not a terminal", c.format)
		}
	}
}

// TestRenderNonFinite: a saved report holding -Inf and NaN (written as
// "-inf" and "nan") renders in every format, and its JSON keeps them.
func TestRenderNonFinite(t *testing.T) {
	data, err := os.ReadFile(savedReport)
	if err != nil {
		t.Fatal(err)
	}
	var r report.Report
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	ninf, nan := math.Inf(-1), math.NaN()
	r.Origins[0].ConstantValue = &ninf
	r.Summary.MinHeadroomBits = &nan
	saved := filepath.Join(t.TempDir(), "nonfinite.json")
	if data, err = json.Marshal(&r); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(saved, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"text", "markdown", "html", "json"} {
		var stdout, stderr bytes.Buffer
		if code := Main([]string{"render", saved, "--format", format}, &stdout, &stderr); code != exitOK {
			t.Fatalf("render --format %s: exit %d: %s", format, code, stderr.String())
		}
		if format == "json" && (!strings.Contains(stdout.String(), `"constant_value": "-inf"`) || !strings.Contains(stdout.String(), `"min_headroom_bits": "nan"`)) {
			t.Errorf("render --format json lost the non-finite numbers:\n%s", stdout.String())
		}
	}
}

func TestRenderOutputFile(t *testing.T) {
	out := filepath.Join(t.TempDir(), "render.html")
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"render", savedReport, "--format", "html", "-o", out}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	data, err := os.ReadFile(out)
	if err != nil || !bytes.Contains(data, []byte(`id="fp16audit-data"`)) {
		t.Fatalf("render.html not written: %v", err)
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout holds %d bytes with --output", stdout.Len())
	}
}

func TestRenderErrors(t *testing.T) {
	dir := t.TempDir()
	other := filepath.Join(dir, "other.json")
	os.WriteFile(other, []byte(`{"schema": "fp16audit.report/v0", "nodes": []}`), 0o644)
	none := filepath.Join(dir, "none.json")
	os.WriteFile(none, []byte(`{"nodes": []}`), 0o644)
	broken := filepath.Join(dir, "broken.json")
	os.WriteFile(broken, []byte(`{"schema": `), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"render"}, "want exactly one REPORT.json argument, got 0"},
		{[]string{"render", savedReport, "--format", "pdf"}, `--format "pdf": want one of text, json, markdown, html`},
		{[]string{"render", other}, `want schema "fp16audit.report/v1.2" (fp16audit run), "fp16audit.scales/v1.2" (fp16audit scales), "fp16audit.replay/v1" (fp16audit replay) or "fp16audit.lint/v1" (fp16audit lint), found schema "fp16audit.report/v0"; re-create it`},
		{[]string{"render", none}, `found no schema field`},
		{[]string{"render", savedReport, "--format", "sarif"}, "format sarif has no audit rendering (want text, json, markdown, html)"},
		{[]string{"render", broken}, "want a report written by 'fp16audit run --format json'"},
		{[]string{"render", filepath.Join(dir, "missing.json")}, "no such file"},
		{[]string{"render", savedReport, "--pass", "fp8"}, `--pass "fp8": the report has passes fp32, fp16, bf16`},
	} {
		var stdout, stderr bytes.Buffer
		if code := Main(c.args, &stdout, &stderr); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", c.args, code, exitUsage)
		}
		if !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v: stderr %q lacks %q", c.args, stderr.String(), c.want)
		}
	}
}

func TestTerminalStyle(t *testing.T) {
	if color, width := terminalStyle(&bytes.Buffer{}, false); color || width != 0 {
		t.Errorf("terminalStyle(buffer) = %v, %d; want no colour and no width", color, width)
	}
}

// TestRenderScales: a diagnosis saved by `fp16audit scales --format json`
// renders in every format, as the scales command itself would write it.
func TestRenderScales(t *testing.T) {
	dir := t.TempDir()
	saved := filepath.Join(dir, "scales.json")
	if code, _, stderr := runScales(t, scalesData+"plateau_underflow.json", "--baseline", scalesData+"baseline_fp32.json",
		"--format", "json", "-o", saved, "--fail-on", "never"); code != exitOK {
		t.Fatalf("scales: exit %d: %s", code, stderr)
	}
	for _, c := range []struct {
		format string
		want   string
	}{
		{"text", "verdict: plateau-underflow"},
		{"markdown", "## fp16audit scales: ⚠️ `plateau-underflow`"},
		{"html", `<svg id="scale-chart"`},
		{"json", `"schema": "fp16audit.scales/v1.2"`},
	} {
		_, direct, _ := runScales(t, scalesData+"plateau_underflow.json", "--baseline", scalesData+"baseline_fp32.json", "--format", c.format)
		var stdout, stderr bytes.Buffer
		if code := Main([]string{"render", saved, "--format", c.format}, &stdout, &stderr); code != exitOK {
			t.Fatalf("render --format %s: exit %d: %s", c.format, code, stderr.String())
		}
		if !strings.Contains(stdout.String(), c.want) {
			t.Errorf("render --format %s: output lacks %q", c.format, c.want)
		}
		if stdout.String() != direct {
			t.Errorf("render --format %s of the saved diagnosis differs from scales --format %s", c.format, c.format)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"render", saved, "--pass", "fp16"}, "apply to audit reports"},
		{[]string{"render", saved, "--format", "sarif"}, "format sarif has no scales rendering"},
	} {
		var stdout, stderr bytes.Buffer
		if code := Main(c.args, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", c.args, code, stderr.String(), exitUsage, c.want)
		}
	}
}
