package cli

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestProgressBar(t *testing.T) {
	var out bytes.Buffer
	now := time.Unix(0, 0)
	bar := newProgressBar(&out, 60)
	bar.start, bar.now = now, func() time.Time { return now }

	bar.update("fp32", 1, 4)
	if out.Len() != 0 {
		t.Fatalf("bar drawn within the first second: %q", out.String())
	}
	now = now.Add(1500 * time.Millisecond)
	bar.update("fp16", 2, 4)
	line := out.String()
	if !strings.HasPrefix(line, "\r") || !strings.Contains(line, "pass 2 (fp16)") || !strings.Contains(line, "batch 2/4") {
		t.Errorf("bar = %q", line)
	}
	if n := len([]rune(strings.TrimSuffix(strings.TrimPrefix(line, "\r"), "\x1b[K"))); n >= 60 {
		t.Errorf("bar is %d columns on a 60-column terminal", n)
	}
	out.Reset()
	now = now.Add(10 * time.Millisecond)
	bar.update("fp16", 3, 4)
	if out.Len() != 0 {
		t.Errorf("bar redrawn within %v: %q", progressEvery, out.String())
	}
	bar.width = 100
	bar.update("fp16+keep-fp32#2", 4, 4)
	if !strings.Contains(out.String(), "pass 3 (fp16+keep-fp32#2)") || !strings.Contains(out.String(), "▕"+strings.Repeat("█", 40)+"▏") {
		t.Errorf("last batch not drawn in full: %q", out.String())
	}
	out.Reset()
	bar.done()
	if out.String() != "\r\x1b[K" {
		t.Errorf("done wrote %q, want the line erased", out.String())
	}
	var nilBar *progressBar
	nilBar.done()
}

// TestProgressJSON: --progress json writes one JSON line per finished
// batch of a pass on stderr, a pipe included, and the report stays on
// stdout; an unknown mode is a usage error.
func TestProgressJSON(t *testing.T) {
	code, stdout, stderr := run(t, "run", models+"demo_cnn.onnx", "-i", batches+"demo_cnn_raw.npy", "--progress", "json", "--format", "json")
	if code != exitFindings {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var passes []string
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		var p struct {
			Progress struct {
				Pass           string
				Batch, Batches int
			}
		}
		if err := json.Unmarshal([]byte(l), &p); err != nil || p.Progress.Pass == "" || p.Progress.Batches != 1 {
			t.Fatalf("stderr line %q: %v", l, err)
		}
		passes = append(passes, p.Progress.Pass)
	}
	if !slices.Contains(passes, "fp32") || !slices.Contains(passes, "fp16") || !strings.HasPrefix(stdout, "{") {
		t.Errorf("passes %v, stdout %.40q", passes, stdout)
	}
	if code, _, stderr := run(t, "run", models+"demo_cnn.onnx", "-i", batches+"demo_cnn_raw.npy", "--progress", "dots"); code != exitUsage || !strings.Contains(stderr, "--progress") {
		t.Errorf("--progress dots: exit %d, %s", code, stderr)
	}
}
