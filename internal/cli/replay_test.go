package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const runCaptures = "../../fixtures/torch/runs/"

func TestReplayCommand(t *testing.T) {
	capture := runCaptures + "data_range/captures/step-000040-nonfinite-loss"
	empty := t.TempDir()
	out := filepath.Join(t.TempDir(), "replay.json")
	tests := []struct {
		name           string
		args           []string
		code           int
		stdout, stderr string
	}{
		{"reproduced", []string{capture, "--no-color"}, exitFindings, "verdict: data-out-of-range", ""},
		{"markdown", []string{capture, "--format", "markdown"}, exitFindings, "**✗ data-out-of-range**", ""},
		{"json to a file", []string{capture, "--format", "json", "-o", out}, exitFindings, "", ""},
		{"not a capture", []string{empty}, exitUsage, "", "manifest.json: missing: this is not a capture folder"},
		{"no argument", nil, exitUsage, "", "want exactly one CAPTURE folder"},
		{"bad format", []string{capture, "--format", "sarif"}, exitUsage, "", "--format \"sarif\""},
		{"from without continuations", []string{capture, "--from", out}, exitUsage, "", "give --continuations too"},
		{"help", []string{"--help"}, exitOK, "fp16audit replay captures/step-000412-scale-collapse", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, append([]string{"replay"}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, stdout, stderr)
			}
			if !strings.Contains(stdout, tc.stdout) || !strings.Contains(stderr, tc.stderr) {
				t.Errorf("stdout %q\nstderr %q\nwant %q and %q", stdout, stderr, tc.stdout, tc.stderr)
			}
		})
	}
	// a saved replay renders again, in every format
	if _, err := os.Stat(out); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"text", "markdown", "html"} {
		code, stdout, stderr := run(t, "render", out, "--format", f)
		if code != exitOK || !strings.Contains(stdout, "data-out-of-range") {
			t.Errorf("render --format %s: exit %d, %s", f, code, stderr)
		}
	}
}
