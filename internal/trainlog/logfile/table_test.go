package logfile

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestColumnsRecognised: names by meaning, ambiguity noted, validation
// columns left alone, --columns winning.
func TestColumnsRecognised(t *testing.T) {
	for name, want := range map[string]string{
		"iteration": colStep, "Global Step": colStep, "train/loss": colLoss, "Loss/train": colLoss, "val/loss": "",
		"valid_loss": "", "amp/scale": colScale, "loss_scale": colScale, "found_inf": colSkipped, "lr": "", "eval_loss": "",
	} {
		if got, _ := meaningOf(name); got != want {
			t.Errorf("meaningOf(%q) = %q, want %q", name, got, want)
		}
	}
	data := "iter,step,train_loss,valid_loss,scale\n0,0,2.5,2.6,65536\n1,1,2.4,2.5,65536\n"
	l, err := Read(write(t, t.TempDir(), "m.csv", []byte(data)), ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Losses[1] != 2.4 || !slices.ContainsFunc(l.Notes, func(s string) bool { return strings.Contains(s, `"iter" also look like the step`) }) {
		t.Errorf("losses %v notes %q", l.Losses, l.Notes)
	}
	if _, err := Read(write(t, t.TempDir(), "m.csv", []byte(data)), ReadOptions{Columns: map[string]string{"scale": "amp"}}); err == nil ||
		!strings.Contains(err.Error(), `--columns scale=amp: no such column; the header names are "iter", "step"`) {
		t.Errorf("a mapped column that is missing: %v", err)
	}
	if m, err := ParseMapping("step=iteration, loss=train_loss"); err != nil || m["step"] != "iteration" || m["loss"] != "train_loss" {
		t.Errorf("ParseMapping: %v %v", m, err)
	}
	for _, bad := range []string{"lr=x", "loss", "loss=a,loss=b"} {
		if _, err := ParseMapping(bad); err == nil {
			t.Errorf("ParseMapping(%q) accepted", bad)
		}
	}
}

func write(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
