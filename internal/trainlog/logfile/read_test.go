package logfile

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
	l, err := parseJSON("run.json", []byte(data), ReadOptions{})
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
	l, err := parseDelimited("run.csv", []byte(data), ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.FirstStep != 10 || l.Len() != 3 || !math.IsNaN(l.Losses[1]) || !math.IsInf(l.Losses[2], 1) || l.Scales[2] != 16384 || l.Epochs[2] != 1 {
		t.Errorf("parsed %+v", l)
	}
}

func TestZeroScaleAfterUnderflow(t *testing.T) {
	if _, err := parseJSON("run.json", []byte(`{"scales": [1e-45, 0]}`), ReadOptions{}); err != nil {
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
		{"noheader.csv", "0,2.3,65536\n1,2.2,65536\n", []string{"noheader.csv:1:", "want a header naming the columns step,loss,scale", `found "0,2.3,65536"`, "add a header line"}},
		{"unknown.csv", "when,what,how\n0,2.3,65536\n", []string{"unknown.csv:1:", "no column holds the loss or the loss scale", `"when", "what", "how"`, "--columns loss=NAME,scale=NAME"}},
		{"back.csv", "iteration,train_loss\n0,2.3\n5,2.2\n3,2.1\n", []string{"back.csv:4: iteration: want steps in increasing order, found 3 after 5", "--columns step=NAME"}},
		{"headeronly.csv", "step,loss,scale\n", []string{"no rows"}},
		{"badloss.csv", "step,loss,scale\n0,2.3,65536\n1,abc,65536\n", []string{"badloss.csv:3: loss: want a number", `found "abc"`}},
		{"badscale.csv", "step,loss,scale\n0,2.3,65536\n1,2.2,-4\n", []string{"badscale.csv:3: scale: want a positive finite loss scale, found -4"}},
		{"badstep.csv", "step,loss\n0,2.3\n1.5,2.2\n", []string{"badstep.csv:3: step: want an integer step", `found "1.5"`}},
		{"fields.csv", "step,loss,scale\n0,2.3\n", []string{"fields.csv:2:", "wrong number of fields"}},
		{"strings.json", `{"scales": ["65536", "32768"]}`, []string{"strings.json: scales[0]: want a number, found string \"65536\""}},
		{"nanscale.json", `{"scales": [65536, NaN]}`, []string{"scales[1]: want a positive finite number, found NaN"}},
		{"zero.json", `{"scales": [0, 1]}`, []string{"scales[0]: want a positive finite loss scale, found 0"}},
		{"negative.json", `{"scales": [65536, -2]}`, []string{"scales[1]: want a positive finite loss scale, found -2"}},
		{"syntax.json", "{\n\"losses\": [1, 2,\n]}", []string{"syntax.json:3: invalid JSON"}},
		{"array.json", `[1, "x"]`, []string{"array.json: [1]: want a number (a plain list of losses or scales) or a record"}},
		{"lines.json", "{\"step\": 0, \"loss\": 2}\n{\"step\": 1, \"loss\": 2}\n{\"step\": 2 \"loss\": 2}\n", []string{"lines.json:3: want one JSON object per line"}},
		{"scalar.json", `3`, []string{"want a JSON object at the top"}},
		{"nodata.json", `{"lr": [0.1]}`, []string{"neither losses nor scales", `"lr"`, "--columns"}},
		{"columns.json", `{"step": [0, 1], "loss": [1, 2, 3]}`, []string{"columns.json: step: has 2 entries and loss 3"}},
		{"records.json", `[{"step": 0, "loss": 1}, {"step": 1, "loss": "x"}]`, []string{"records.json: [1].loss: want a number", `found "x"`}},
		{"list.txt", "2.5\n2.4\n# comment\nabc\n", []string{"list.txt:4: want one number per line", `found "abc"`, "header line"}},
		{"history.csv", "epoch,train_loss,valid_loss,accuracy,time\n0,1.2,1.1,0.5,00:05\n0,1.0,0.9,0.6,00:05\n", []string{"history.csv:3: epoch: want epochs in increasing order", "keep one"}},
		{"v2.jsonl", `{"kind":"header","format":"fp16audit.trainlog","version":2}` + "\n", []string{"v2.jsonl:1: want fp16audit.trainlog version 1, found version 2", "python -m fp16audit.convert"}},
		{"nohead.jsonl", `{"kind":"header","format":"fp16audit.trainlog","version":1}` + "\n" + `{"kind":"step","step":0,"loss":1,"scale":"big"}` + "\n", []string{"nohead.jsonl:2: scale: want a number or one of"}},
		{"badtele.jsonl", `{"kind":"header","format":"fp16audit.trainlog","version":1}` + "\n" + `{"kind":"step","step":0,"loss":1}` + "\n" + `{"kind":"telemetry","step":5,"modules":[]}` + "\n", []string{"badtele.jsonl:3: telemetry line: want the step of the step line before it (0), found 5"}},
		{"records.jsonl", "{\"step\": 0, \"loss\": 1}\n[1]\n", []string{"records.jsonl:2: want one JSON object per line"}},
		{"scalarlosses.json", `{"losses": 3}`, []string{"losses: want an array of numbers, found a value 3"}},
		{"objloss.json", `{"losses": [1, {"x": 1}]}`, []string{"losses[1]: want a number, found an object"}},
		{"mismatch.json", `{"losses": [1, 2, 3], "scales": [65536, 65536]}`, []string{"scales has 2 entries and losses 3", "--series fastai-scales"}},
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
			_, err := Read(path, ReadOptions{})
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

func TestReadSniffs(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "log.txt")
	if err := os.WriteFile(js, []byte(` {"scales": [65536]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if l, err := Read(js, ReadOptions{}); err != nil || len(l.Scales) != 1 {
		t.Errorf("sniffed JSON: %v %v", l, err)
	}
	if _, err := Read(filepath.Join(dir, "missing.json"), ReadOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}
