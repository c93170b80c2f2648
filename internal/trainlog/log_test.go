package trainlog

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseJSONNonFinite(t *testing.T) {
	data := `{"note": "NaN and Infinity in a string stay", "losses": [1.5, NaN, Infinity, -Infinity, null, "nan", "inf"], "steps_per_epoch": 3}`
	l, err := ParseJSON("run.json", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{1.5, math.NaN(), math.Inf(1), math.Inf(-1), math.NaN(), math.NaN(), math.Inf(1)}
	if len(l.Losses) != len(want) {
		t.Fatalf("losses %v", l.Losses)
	}
	for i, w := range want {
		if g := l.Losses[i]; !(g == w || math.IsNaN(g) && math.IsNaN(w)) {
			t.Errorf("losses[%d] = %v, want %v", i, g, w)
		}
	}
	if l.Scales != nil || l.StepsPerEpoch != 3 || len(l.Epochs) != 7 || l.Epochs[6] != 2 {
		t.Errorf("scales %v steps_per_epoch %d epochs %v", l.Scales, l.StepsPerEpoch, l.Epochs)
	}
}

func TestParseCSV(t *testing.T) {
	data := "# written by torch_scales_loop.py\nstep,epoch,loss,scale,lr\n10,0,2.5,65536.0,0.1\n11,0,nan,32768.0,0.1\n12,1,inf,16384,0.1\n"
	l, err := ParseCSV("run.csv", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if l.FirstStep != 10 || l.Len() != 3 || !math.IsNaN(l.Losses[1]) || !math.IsInf(l.Losses[2], 1) || l.Scales[2] != 16384 || l.Epochs[2] != 1 {
		t.Errorf("parsed %+v", l)
	}
}

func TestZeroScaleAfterUnderflow(t *testing.T) {
	if _, err := ParseJSON("run.json", []byte(`{"scales": [1e-45, 0]}`)); err != nil {
		t.Errorf("a scale halved to zero in float32: %v", err)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, data string
		want       []string // substrings of the error
	}{
		{"empty.json", "  \n", []string{"empty.json: empty file", `"scales"`}},
		{"empty.csv", "", []string{"empty.csv: empty file", "step,loss,scale"}},
		{"noheader.csv", "0,2.3,65536\n1,2.2,65536\n", []string{"noheader.csv:1:", "want a header naming the columns step,loss,scale", `found "0,2.3,65536"`}},
		{"nostep.csv", "loss,scale\n2.3,65536\n", []string{"want a header", `found "loss,scale"`}},
		{"headeronly.csv", "step,loss,scale\n", []string{"no rows"}},
		{"badloss.csv", "step,loss,scale\n0,2.3,65536\n1,abc,65536\n", []string{"badloss.csv:3: loss: want a number", `found "abc"`}},
		{"badscale.csv", "step,loss,scale\n0,2.3,65536\n1,2.2,-4\n", []string{"badscale.csv:3: scale: want a positive finite loss scale, found -4"}},
		{"gap.csv", "step,loss\n0,2.3\n1,2.2\n5,2.1\n", []string{"gap.csv:4: step: want 2", "found 5"}},
		{"fields.csv", "step,loss,scale\n0,2.3\n", []string{"fields.csv:2:", "wrong number of fields"}},
		{"strings.json", `{"scales": ["65536", "32768"]}`, []string{"strings.json: scales[0]: want a number, found string \"65536\""}},
		{"nanscale.json", `{"scales": [65536, NaN]}`, []string{"scales[1]: want a positive finite number, found NaN"}},
		{"zero.json", `{"scales": [0, 1]}`, []string{"scales[0]: want a positive finite loss scale, found 0"}},
		{"negative.json", `{"scales": [65536, -2]}`, []string{"scales[1]: want a positive finite loss scale, found -2"}},
		{"syntax.json", "{\n\"losses\": [1, 2,\n]}", []string{"syntax.json:3: invalid JSON"}},
		{"array.json", `[1, 2]`, []string{"want a JSON object at the top, found array"}},
		{"nodata.json", `{"lr": [0.1]}`, []string{"neither losses nor scales"}},
		{"scalarlosses.json", `{"losses": 3}`, []string{"losses: want an array of numbers, found a value 3"}},
		{"objloss.json", `{"losses": [1, {"x": 1}]}`, []string{"losses[1]: want a number, found an object"}},
		{"mismatch.json", `{"losses": [1, 2, 3], "scales": [65536, 65536]}`, []string{"scales has 2 entries and losses 3", "fastai_scales_callback.py"}},
		{"spe.json", `{"losses": [1], "steps_per_epoch": "100"}`, []string{"steps_per_epoch: want a positive integer"}},
		{"scaler.json", `{"scales": [1], "grad_scaler": {"growth_interval": 2.5}}`, []string{"grad_scaler: growth_interval: want a positive integer"}},
		{"backoff.json", `{"scales": [1], "grad_scaler": {"backoff_factor": 2}}`, []string{"backoff_factor: want a number below 1"}},
	}
	dir := t.TempDir()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, tt.name)
			if err := os.WriteFile(path, []byte(tt.data), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := ReadFile(path)
			if err == nil {
				t.Fatal("no error")
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Errorf("error %T, want *ParseError", err)
			}
			msg := strings.ReplaceAll(err.Error(), dir+string(filepath.Separator), "")
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
		})
	}
}

func TestReadFileSniffs(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "log.txt")
	if err := os.WriteFile(js, []byte(` {"scales": [65536]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if l, err := ReadFile(js); err != nil || len(l.Scales) != 1 {
		t.Errorf("sniffed JSON: %v %v", l, err)
	}
	if _, err := ReadFile(filepath.Join(dir, "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}
