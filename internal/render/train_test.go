package render

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"fp16audit/checks"
	"fp16audit/report"
)

// TestGoldenTraining renders the training audit of the deep sigmoid MLP
// (testdata/train_deep_mlp.json: fp16audit run
// fixtures/torch/train/deep_mlp.onnx --mode train --loss cross-entropy)
// in every format: the backward verdict naming the underflowing modules,
// the verified bf16 fix, the scales run and the gradients per module.
func TestGoldenTraining(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "train_deep_mlp.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r *report.Report
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	r.Tool.Version, r.Tool.ORTVersion = "0.0.0-test", "0.0.0-test"
	if r.Training == nil || r.Training.Backward == nil {
		t.Fatal("testdata/train_deep_mlp.json has no backward audit")
	}
	for _, c := range []struct{ format, ext string }{{"text", "txt"}, {"markdown", "md"}, {"html", "html"}} {
		t.Run(c.ext, func(t *testing.T) {
			var b bytes.Buffer
			if err := Render(&b, r, c.format, Options{}); err != nil {
				t.Fatal(err)
			}
			out := b.String()
			for _, want := range []string{report.BackwardUnderflow, "layers.fc0", "2^18", "bf16"} {
				if !strings.Contains(out, want) {
					t.Errorf("%s output does not mention %q", c.format, want)
				}
			}
			golden(t, "train_deep_mlp."+c.ext+".golden", b.Bytes())
		})
	}
}

// TestTrainingQuiet: an eval-mode audit of a model without BatchNorm or
// Dropout, and without a loss, adds no training section.
func TestTrainingQuiet(t *testing.T) {
	r := loadReport(t, "healthy")
	r.Training = &report.TrainingReport{Mode: report.ModeEval, BatchNorms: []report.BatchNormReport{}, Notes: []string{}}
	for _, format := range []string{"text", "markdown", "html"} {
		var b bytes.Buffer
		if err := Render(&b, r, format, Options{}); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(strings.ToLower(b.String()), "backward") || strings.Contains(b.String(), "forward in eval mode") {
			t.Errorf("%s: a training section for an eval audit with nothing to say", format)
		}
	}
}

// TestHeadlineStatesBoth: with a training audit the report opens with the
// forward and the backward verdict, the one that fails the run first; a
// backward error does not turn the forward verdict into a caution.
func TestHeadlineStatesBoth(t *testing.T) {
	load := func() *report.Report {
		data, err := os.ReadFile(filepath.Join("testdata", "train_deep_mlp.json"))
		if err != nil {
			t.Fatal(err)
		}
		var r *report.Report
		if err := json.Unmarshal(data, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	backwardHealthy := func(r *report.Report) {
		r.Training.Backward.Verdict, r.Training.Backward.VerdictText = report.BackwardHealthy, "the initial loss scale is clean"
		var fs []checks.Finding
		for _, f := range r.Findings {
			if !strings.HasPrefix(f.Check, "FP6") {
				fs = append(fs, f)
			}
		}
		r.Findings = fs
	}
	forwardFails := func(r *report.Report) {
		r.Verdict, r.VerdictText = report.VerdictOverflow, "fc0 (MatMul) overflows fp16"
	}
	for _, tc := range []struct {
		name  string
		edit  []func(*report.Report)
		first string // the outcome stated first
		text  []string
		md    string
		card  string
	}{
		{"backward fails", nil, "backward", []string{"✗ backward: backward-underflow", "✓ forward: healthy"},
			"## fp16audit: ❌ backward `backward-underflow` · ✅ forward `healthy`", `class="card fail"`},
		{"both healthy", []func(*report.Report){backwardHealthy}, "forward", []string{"✓ forward: healthy", "✓ backward: healthy"},
			"## fp16audit: ✅ forward `healthy` · ✅ backward `healthy`", `class="card ok"`},
		{"both fail", []func(*report.Report){forwardFails}, "forward", []string{"✗ forward: overflowing-op", "✗ backward: backward-underflow"},
			"## fp16audit: ❌ forward `overflowing-op` · ❌ backward `backward-underflow`", `class="card fail"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := load()
			for _, e := range tc.edit {
				e(r)
			}
			out := map[string]string{}
			for _, format := range []string{"text", "markdown", "html"} {
				var b bytes.Buffer
				if err := Render(&b, r, format, Options{}); err != nil {
					t.Fatal(err)
				}
				out[format] = b.String()
			}
			lines := strings.Split(out["text"], "\n")
			if len(lines) < 4 || lines[2] != tc.text[0]+" — "+headText(r, tc.first) || !strings.HasPrefix(lines[3], tc.text[1]+" — ") {
				t.Errorf("text headline:\n%s\nwant %q then %q", strings.Join(lines[:min(4, len(lines))], "\n"), tc.text[0], tc.text[1])
			}
			if !strings.HasPrefix(out["markdown"], tc.md+"\n") {
				t.Errorf("markdown title %q, want %q", strings.SplitN(out["markdown"], "\n", 2)[0], tc.md)
			}
			html := out["html"]
			if !strings.Contains(html, tc.card) || strings.Index(html, "</span> "+tc.first+": ") > strings.Index(html, "</span> "+other(tc.first)+": ") {
				t.Errorf("html: want %s and the %s outcome first", tc.card, tc.first)
			}
		})
	}
}

func other(label string) string {
	if label == "forward" {
		return "backward"
	}
	return "forward"
}

// headText is the verdict text of the named outcome.
func headText(r *report.Report, label string) string {
	if label == "backward" {
		return r.Training.Backward.VerdictText
	}
	return r.VerdictText
}
