package audit_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"fp16audit/internal/audit"
	"fp16audit/internal/testutil/ortinit"
	"fp16audit/internal/trainlog"
	"fp16audit/internal/trainlog/logfile"
	"fp16audit/report"
)

// TestScalesDefersToReplay holds `fp16audit scales` and `fp16audit
// replay` together on the real runs' logs (fixtures/torch/runs): the log
// lists every capture the recorder wrote, by the path its capture line
// gives (relative to the folder the run trained in); exactly one capture
// decides the class, and its replay reproduces the failure with the class
// PyTorch's record gives that step. The plateau run's log alone looks
// healthy (no baseline, no skipped step): its pinned-scale capture decides
// there; with the fp32 twin's losses as the baseline it is a plateau, and
// the capture decides too.
func TestScalesDefersToReplay(t *testing.T) {
	ortinit.Init(t)
	runs, err := filepath.Glob(filepath.Join(runsDir, "*", "truth.json"))
	if err != nil || len(runs) < 6 {
		t.Fatalf("want the run fixtures under %s, found %d (%v)", runsDir, len(runs), err)
	}
	for _, tf := range runs {
		dir := filepath.Dir(tf)
		tr := readRunTruth(t, dir)
		t.Run(tr.Run, func(t *testing.T) {
			log, err := logfile.Read(filepath.Join(dir, "log.jsonl"), logfile.ReadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, baseline := range []bool{false, true} {
				var base *trainlog.Log
				if baseline {
					base = twin(t, dir)
				}
				r, err := trainlog.Analyze(log, base, trainlog.DefaultOptions)
				if err != nil {
					t.Fatal(err)
				}
				if len(r.Captures) != len(tr.Captures) {
					t.Fatalf("scales lists %d captures, the run wrote %d", len(r.Captures), len(tr.Captures))
				}
				var decides []report.Capture
				for i, c := range r.Captures {
					w := tr.Captures[i]
					if c.Step != w.Step || c.Trigger != w.Trigger || c.Path != w.Capture || c.Replay != "fp16audit replay "+w.Capture {
						t.Errorf("capture %+v; the run wrote step %d (%s) at %s", c, w.Step, w.Trigger, w.Capture)
					}
					if c.Decides {
						decides = append(decides, c)
					}
				}
				if len(tr.Captures) == 0 {
					if len(decides) != 0 || strings.Contains(r.VerdictText, "replay") {
						t.Errorf("no capture, yet: %s", r.VerdictText)
					}
					continue
				}
				if len(decides) != 1 {
					t.Fatalf("baseline %v: %d captures decide (%s), want one", baseline, len(decides), r.VerdictText)
				}
				c := decides[0]
				if !strings.Contains(r.VerdictText, c.Replay) {
					t.Errorf("the verdict does not name the replay %q: %s", c.Replay, r.VerdictText)
				}
				if baseline && tr.Run == "plateau" && r.Verdict != report.ScalesPlateauUnderflow && r.Verdict != report.ScalesPlateauUnexplained {
					t.Errorf("with the fp32 twin as baseline the plateau run is %s: %s", r.Verdict, r.VerdictText)
				}
				i := slices.IndexFunc(tr.Captures, func(w capTruth) bool { return w.Step == c.Step && w.Trigger == c.Trigger })
				rp, err := audit.Replay(context.Background(), audit.ReplayConfig{Capture: filepath.Join(dir, filepath.FromSlash(c.Path))})
				if err != nil {
					t.Fatal(err)
				}
				if rp.Verdict != tr.Captures[i].Class {
					t.Errorf("the deciding capture (step %d, %s) replays as %s, PyTorch's record says %s", c.Step, c.Trigger, rp.Verdict, tr.Captures[i].Class)
				}
			}
		})
	}
}

// twin is the run's fp32 twin (truth.json's fp32_losses) as a baseline
// log: a plain list of losses, as a user's fp32 run's history would be.
func twin(t *testing.T, dir string) *trainlog.Log {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "truth.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tr struct {
		FP32 []any `json:"fp32_losses"`
	}
	if err := json.Unmarshal(data, &tr); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, v := range tr.FP32 {
		b, _ := json.Marshal(v)
		lines = append(lines, strings.Trim(string(b), `"`))
	}
	p := filepath.Join(t.TempDir(), "fp32.txt")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := logfile.Read(p, logfile.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}
