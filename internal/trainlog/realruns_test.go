package trainlog_test

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"fp16audit/checks"
	"fp16audit/internal/trainlog"
	"fp16audit/internal/trainlog/logfile"
	"fp16audit/report"
)

// realRuns holds the real CPU-fp16 training runs fixtures/torch/scaleruns.py
// wrote, each with PyTorch's record beside it (truth.json).
const realRuns = "../../fixtures/torch/scaleruns"

// realTruth is the part of a run's truth.json the tests read.
type realTruth struct {
	Class       string `json:"class"`
	FailingStep *int   `json:"failing_step"`
	Steps       int    `json:"steps"`
	FP16        struct {
		NonFiniteLossSteps []int `json:"nonfinite_loss_steps"`
		SkippedSteps       []int `json:"skipped_steps"`
	} `json:"fp16"`
}

// verdictsFor are the verdicts that give a run PyTorch's class: the class
// itself; for a healthy run, a gap to the baseline within the tolerance
// (fp16-noise) too. A verdict alarms when it is neither healthy nor noise.
var verdictsFor = map[string][]string{
	report.ScalesGradientOverflowNaN: {report.ScalesGradientOverflowNaN},
	report.ScalesEarlyNaN:            {report.ScalesEarlyNaN},
	report.ScalesForwardOverflowNaN:  {report.ScalesForwardOverflowNaN},
	report.ScalesPlateauUnderflow:    {report.ScalesPlateauUnderflow},
	report.ScalesPlateauUnexplained:  {report.ScalesPlateauUnexplained},
	report.ScalesRecoveredNaN:        {report.ScalesRecoveredNaN},
	"healthy":                        {report.ScalesHealthy, report.ScalesFP16Noise},
}

func readTruth(t *testing.T, dir string) realTruth {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "truth.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tr realTruth
	if err := json.Unmarshal(data, &tr); err != nil {
		t.Fatalf("%s/truth.json: %v", dir, err)
	}
	return tr
}

func readLog(t *testing.T, path string, opt logfile.ReadOptions) *trainlog.Log {
	t.Helper()
	l, err := logfile.Read(path, opt)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestRealRuns holds `fp16audit scales` to PyTorch's class of every real
// run, in the recorder's log and as a metrics table, against its fp32
// twin: by the evidence, not by when the loss went NaN (a collapse in the
// first epoch is gradient overflow; NaN steps the run went on from are no
// NaN verdict; a pinned scale after NaN steps is a plateau). The failing
// step, the NaN steps the run recovered from and the skipped steps are
// PyTorch's.
func TestRealRuns(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join(realRuns, "*", "truth.json"))
	if err != nil || len(dirs) < 8 {
		t.Fatalf("want the 8 real runs of fixtures/torch/scaleruns, found %d (%v)", len(dirs), err)
	}
	classes := map[string]bool{}
	for _, p := range dirs {
		dir := filepath.Dir(p)
		tr := readTruth(t, dir)
		classes[tr.Class] = true
		want, ok := verdictsFor[tr.Class]
		if !ok {
			t.Errorf("%s: PyTorch's class %q has no verdict", dir, tr.Class)
			continue
		}
		for _, form := range []string{"run.jsonl", "run.csv"} {
			t.Run(filepath.Base(dir)+"/"+form, func(t *testing.T) {
				run := readLog(t, filepath.Join(dir, form), logfile.ReadOptions{})
				base := readLog(t, filepath.Join(dir, "fp32.jsonl"), logfile.ReadOptions{Baseline: true, Series: logfile.SeriesLoss})
				r := analyze(t, run, base, trainlog.DefaultOptions)
				if !slices.Contains(want, r.Verdict) {
					t.Fatalf("verdict %s (%s), want %v: PyTorch's class is %s", r.Verdict, r.VerdictText, want, tr.Class)
				}
				l := r.Losses
				if got := l.FailingStep; (got == nil) != (tr.FailingStep == nil) || got != nil && *got != *tr.FailingStep {
					t.Errorf("failing step %v, PyTorch's %v", deref(got), deref(tr.FailingStep))
				}
				var recovered []int
				for _, s := range tr.FP16.NonFiniteLossSteps {
					if tr.FailingStep == nil || s < *tr.FailingStep {
						recovered = append(recovered, s)
					}
				}
				if !slices.Equal(l.RecoveredAt, recovered) {
					t.Errorf("NaN/Inf losses the run went on from %v, PyTorch's %v", l.RecoveredAt, recovered)
				}
				if s := r.Scales; s == nil || !slices.Equal(s.SkippedAt, tr.FP16.SkippedSteps) {
					t.Errorf("skipped steps %v, PyTorch's found_inf %v", s.SkippedAt, tr.FP16.SkippedSteps)
				}
			})
		}
	}
	for c := range verdictsFor {
		if !classes[c] {
			t.Errorf("no real run of class %s", c)
		}
	}
}

func deref(p *int) any {
	if p == nil {
		return "none"
	}
	return *p
}

// TestRealRunsWithoutBaseline: without the fp32 twin a plateau cannot be
// judged, but every other class stands, and the plateau run is not
// called a NaN: its NaN steps are ones it went on from, with the pinned
// scale and the skipped steps as warnings.
func TestRealRunsWithoutBaseline(t *testing.T) {
	for _, c := range []struct {
		run, verdict string
		findings     []string
	}{
		{"collapse_nan", report.ScalesGradientOverflowNaN, []string{"FP5002"}},
		{"early_nan", report.ScalesEarlyNaN, []string{"FP5001"}},
		{"forward_overflow_fastai", report.ScalesForwardOverflowNaN, []string{"FP5003"}},
		{"bad_batch_nan", report.ScalesRecoveredNaN, []string{"FP5012"}},
		{"bad_batch_fastai", report.ScalesRecoveredNaN, []string{"FP5012"}},
		{"skip_then_plateau", report.ScalesRecoveredNaN, []string{"FP5009", "FP5010", "FP5012"}},
		{"healthy_long", report.ScalesHealthy, nil},
		// the gap to the baseline is the plateau's only evidence
		{"offset_plateau", report.ScalesHealthy, nil},
	} {
		t.Run(c.run, func(t *testing.T) {
			r := analyze(t, readLog(t, filepath.Join(realRuns, c.run, "run.jsonl"), logfile.ReadOptions{}), nil, trainlog.DefaultOptions)
			if r.Verdict != c.verdict {
				t.Fatalf("verdict %s (%s), want %s", r.Verdict, r.VerdictText, c.verdict)
			}
			for _, id := range c.findings {
				if !slices.ContainsFunc(r.Findings, func(f checks.Finding) bool { return f.Check == id }) {
					t.Errorf("no %s among %v", id, r.Findings)
				}
			}
		})
	}
}

// TestClippedRunHasNoNaN: the collapse run with its gradients clipped from
// the onset of the collapse (truth.json's clip) stays finite, and scales
// says so.
func TestClippedRunHasNoNaN(t *testing.T) {
	r := analyze(t, readLog(t, filepath.Join(realRuns, "collapse_nan", "clip.jsonl"), logfile.ReadOptions{}), nil, trainlog.DefaultOptions)
	if r.Losses.NonFinite != 0 || strings.Contains(r.Verdict, "nan") {
		t.Errorf("clipped run: verdict %s, %d NaN/Inf losses", r.Verdict, r.Losses.NonFinite)
	}
}

// TestHeldDownScale: NaN losses the run went on from halve the scale,
// which GradScaler grows back one doubling per growth interval; a scale
// held low that way to the end explains a gap to the baseline (a plateau)
// even where the skip rate is low and no growth interval passed. The same
// gap with the scale still high is not explained by it.
func TestHeldDownScale(t *testing.T) {
	run := func(nans int) *trainlog.Log {
		l := &trainlog.Log{Path: "held", Scaler: trainlog.DefaultScaler}
		scale := 65536.0
		for s := 0; s < 2000; s++ {
			loss := 1.0 / (1 + float64(s)/100)
			if s%20 == 10 && s/20 < nans {
				loss, scale = math.NaN(), scale/2
			}
			l.Losses, l.Scales = append(l.Losses, 1.1*loss), append(l.Scales, scale)
		}
		return l
	}
	base := &trainlog.Log{Path: "fp32"}
	for s := 0; s < 2000; s++ {
		base.Losses = append(base.Losses, 1.0/(1+float64(s)/100))
	}
	r := analyze(t, run(14), base, trainlog.DefaultOptions)
	st := r.Scales
	if r.Verdict != report.ScalesPlateauUnderflow || !st.Pinned || st.PinnedSince == nil || *st.PinnedSince != 190 || st.PinnedScale != 4 {
		t.Errorf("14 halvings: verdict %s (%s), pinned %v at %g since %v", r.Verdict, r.VerdictText, st.Pinned, st.PinnedScale, deref(st.PinnedSince))
	}
	if st.SkipRateAfterWarmup > trainlog.DefaultOptions.SkipRate {
		t.Errorf("skip rate %g: the test wants a low one", st.SkipRateAfterWarmup)
	}
	r = analyze(t, run(4), base, trainlog.DefaultOptions)
	if r.Verdict != report.ScalesPlateauUnexplained || r.Scales.Pinned {
		t.Errorf("4 halvings: verdict %s, pinned %v", r.Verdict, r.Scales.Pinned)
	}
}
