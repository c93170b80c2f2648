package trainlog_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"fp16audit/internal/trainlog"
	"fp16audit/internal/trainlog/logfile"
	"fp16audit/report"
)

// The capture lines below are written by hand from docs/capture.md ("The
// training log points to its captures"): the recorder that writes them is
// built elsewhere (issue 42), and these tests hold the reading side to
// the contract.

// handLog is a companion log of 40 steps, 10 a epoch, written by hand: a
// NaN loss at step 23 that GradScaler skipped, finite losses after it,
// and the lines extra inserted after the step line of their step.
func handLog(t *testing.T, extra map[int][]string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"kind":"header","format":"fp16audit.trainlog","version":1,"source":"torch","grad_scaler":{"enabled":true,"class":"GradScaler","init_scale":65536.0,"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":2000},"steps_per_epoch":10}` + "\n")
	scale := 65536.0
	for s := 0; s < 40; s++ {
		loss, skipped := fmt.Sprint(2.0-0.03*float64(s)), false
		if s == 0 || s == 23 {
			scale /= 2
			skipped = true
		}
		if s == 23 {
			loss = `"NaN"`
		}
		fmt.Fprintf(&b, `{"kind":"step","step":%d,"epoch":%d,"iter":%d,"loss":%s,"scale":%g,"skipped":%t}`+"\n", s, s/10, s%10, loss, scale, skipped)
		for _, l := range extra[s] {
			b.WriteString(l + "\n")
		}
	}
	b.WriteString(`{"kind":"end","steps":40,"skipped":2}` + "\n")
	return writeTemp(t, "run.jsonl", b.String())
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func textOf(t *testing.T, r *report.ScalesReport) string {
	t.Helper()
	var b bytes.Buffer
	if err := renderAs(&b, r, "text"); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestCaptureOfRecoveredNaN: the capture of a NaN step the run went on
// from holds that failure: scales names it and the command, and defers
// the class to its replay; a failed capture is said and the log decides.
func TestCaptureOfRecoveredNaN(t *testing.T) {
	written := `{"kind": "capture", "step": 23, "trigger": "nonfinite-loss", "path": "captures/step-000023-nonfinite-loss"}`
	r := analyze(t, readLog(t, handLog(t, map[int][]string{23: {written}}), logfile.ReadOptions{}), nil, trainlog.DefaultOptions)
	if r.Verdict != report.ScalesRecoveredNaN || len(r.Captures) != 1 {
		t.Fatalf("verdict %s, captures %+v", r.Verdict, r.Captures)
	}
	c := r.Captures[0]
	if c.Step != 23 || c.Trigger != "nonfinite-loss" || !c.Decides || c.Replay != "fp16audit replay captures/step-000023-nonfinite-loss" {
		t.Errorf("capture %+v", c)
	}
	if !strings.Contains(r.VerdictText, "its replay decides the class") || !strings.HasPrefix(r.Fix, "run 'fp16audit replay captures/step-000023-nonfinite-loss'") {
		t.Errorf("verdict %q, fix %q", r.VerdictText, r.Fix)
	}
	if txt := textOf(t, r); !strings.Contains(txt, "captures: step 23 (nonfinite-loss): fp16audit replay captures/step-000023-nonfinite-loss — holds the failure") {
		t.Errorf("text report does not name the capture:\n%s", txt)
	}

	failed := `{"kind": "capture", "step": 23, "trigger": "nonfinite-loss", "error": "OSError: [Errno 28] No space left on device"}`
	r = analyze(t, readLog(t, handLog(t, map[int][]string{23: {failed}}), logfile.ReadOptions{}), nil, trainlog.DefaultOptions)
	c = r.Captures[0]
	if r.Verdict != report.ScalesRecoveredNaN || c.Replay != "" || !c.Decides || c.Error == "" {
		t.Fatalf("verdict %s, capture %+v", r.Verdict, c)
	}
	if !strings.Contains(r.VerdictText, "failed to write (OSError: [Errno 28] No space left on device), so the log decides") || strings.Contains(r.Fix, "replay") {
		t.Errorf("verdict %q, fix %q", r.VerdictText, r.Fix)
	}
	if txt := textOf(t, r); !strings.Contains(txt, "step 23 (nonfinite-loss): failed to write: OSError") {
		t.Errorf("text report does not say the capture failed:\n%s", txt)
	}
}

// TestCaptureOfCollapse: in the real collapse run, captures written by hand
// at the onset of the collapse and at the NaN: the verdict defers to the
// onset, the earlier state; a capture on request earlier in the run and
// one of a healthy run are listed with their command but decide nothing.
func TestCaptureOfCollapse(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(realRuns, "collapse_nan", "run.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	extra := map[int]string{
		5:   `{"kind": "capture", "step": 5, "trigger": "request", "path": "/runs/exp 1/captures/step-000005-request"}`,
		179: `{"kind": "capture", "step": 179, "trigger": "scale-collapse", "path": "captures/step-000179-scale-collapse"}`,
		190: `{"kind": "capture", "step": 190, "trigger": "nonfinite-loss", "path": "captures/step-000190-nonfinite-loss"}`,
	}
	var b strings.Builder
	for _, line := range strings.SplitAfter(string(data), "\n") {
		b.WriteString(line)
		for s, l := range extra {
			if strings.HasPrefix(line, fmt.Sprintf(`{"kind":"step","step":%d,`, s)) {
				b.WriteString(l + "\n")
			}
		}
	}
	r := analyze(t, readLog(t, writeTemp(t, "run.jsonl", b.String()), logfile.ReadOptions{}), nil, trainlog.DefaultOptions)
	if r.Verdict != report.ScalesGradientOverflowNaN || len(r.Captures) != 3 {
		t.Fatalf("verdict %s, captures %+v", r.Verdict, r.Captures)
	}
	var decides []int
	for _, c := range r.Captures {
		if c.Decides {
			decides = append(decides, c.Step)
		}
	}
	if len(decides) != 1 || decides[0] != 179 {
		t.Errorf("deciding captures %v, want the onset 179", decides)
	}
	if got := r.Captures[0].Replay; got != `fp16audit replay '/runs/exp 1/captures/step-000005-request'` {
		t.Errorf("replay command %q", got)
	}
	if !strings.Contains(r.VerdictText, "the capture of step 179 (scale-collapse) holds this failure") {
		t.Errorf("verdict %q", r.VerdictText)
	}

	healthy := handLog(t, map[int][]string{30: {`{"kind": "capture", "step": 30, "trigger": "request", "path": "c/step-000030-request"}`}})
	l := readLog(t, healthy, logfile.ReadOptions{})
	l.Losses[23] = 1.3 // no NaN: nothing fails
	r = analyze(t, l, nil, trainlog.DefaultOptions)
	if len(r.Captures) != 1 || r.Captures[0].Decides || strings.Contains(r.VerdictText, "replay") {
		t.Errorf("a run without a failure: verdict %s (%s), captures %+v", r.Verdict, r.VerdictText, r.Captures)
	}
}

// TestCaptureLineRefused: a capture line without its step, or with
// neither the folder nor the reason it failed, is refused with its line.
func TestCaptureLineRefused(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{`{"kind": "capture", "trigger": "request", "path": "c"}`, ":26: capture line: want the captured step"},
		{`{"kind": "capture", "step": 23, "trigger": "request"}`, ":26: capture line of step 23: want the capture folder (path) or why it failed (error), found neither"},
		{`{"kind": "capture", "step": "23", "path": "c"}`, ":26: capture line: cannot unmarshal"},
	} {
		_, err := logfile.Read(handLog(t, map[int][]string{23: {c.line}}), logfile.ReadOptions{})
		var pe *logfile.ParseError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.line, err, c.want)
		}
	}
}
