package trainlog_test

import (
	"bytes"
	"encoding/json"
	goldenfile "fp16audit/internal/golden"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"fp16audit/checks"
	"fp16audit/internal/render"
	"fp16audit/internal/trainlog"
	"fp16audit/internal/trainlog/logfile"
	"fp16audit/report"
)

// scalesVerdicts lists every verdict identifier of the scales diagnosis in
// decision order.
var scalesVerdicts = []string{report.ScalesGradientOverflowNaN, report.ScalesEarlyNaN, report.ScalesLateNaN,
	report.ScalesForwardOverflowNaN, report.ScalesPlateauUnderflow, report.ScalesPlateauUnexplained, report.ScalesRecoveredNaN,
	report.ScalesWastedWarmup, report.ScalesFP16Noise, report.ScalesHealthy}

// renderAs writes the diagnosis r in the named format.
func renderAs(w io.Writer, r *report.ScalesReport, format string) error {
	f, err := render.New(format, r.Kind(), render.Options{})
	if err != nil {
		return err
	}
	return f.Render(w, r)
}

// TestFixtureVerdicts runs every simulated log, in both formats, and checks
// the verdict, the findings and the key numbers against the values the
// simulator counted.
func TestFixtureVerdicts(t *testing.T) {
	tests := []struct {
		log, baseline string
		verdict       string
		findings      []string
		skipped       int // -1: the log has no scales
		minScale      float64
		firstNaN      int // -1: none
		warmup        int
		fix           string // a substring of Report.Fix
	}{
		{log: "early_nan", verdict: report.ScalesEarlyNaN, findings: []string{"FP5001"}, skipped: 36, minScale: 0x1p-20, firstNaN: 37, warmup: 3, fix: "fp16audit run model.onnx -i batch.npy"},
		{log: "early_nan_scales_only", verdict: report.ScalesEarlyNaN, findings: []string{"FP5001"}, skipped: 36, minScale: 0x1p-20, firstNaN: 37, warmup: 3, fix: "fp16audit run"},
		{log: "gradient_overflow_nan", verdict: report.ScalesGradientOverflowNaN, findings: []string{"FP5002", "FP5009", "FP5010"}, skipped: 55, minScale: 0x1p-30, firstNaN: 700, warmup: 2, fix: "clip gradients"},
		{log: "gradient_overflow_nan_scales_only", verdict: report.ScalesGradientOverflowNaN, findings: []string{"FP5002", "FP5009", "FP5010"}, skipped: 55, minScale: 0x1p-30, firstNaN: 700, warmup: 2, fix: "to_bf16()"},
		{log: "forward_overflow_nan", verdict: report.ScalesForwardOverflowNaN, findings: []string{"FP5003"}, skipped: 68, minScale: 0x1p-36, firstNaN: 850, warmup: 2, fix: "checkpoint from just before step 850"},
		{log: "forward_overflow_nan_losses_only", verdict: report.ScalesLateNaN, findings: []string{"FP5004"}, skipped: -1, firstNaN: 850, fix: "record the loss scale"},
		{log: "plateau_underflow", baseline: "baseline_fp32", verdict: report.ScalesPlateauUnderflow, findings: []string{"FP5005", "FP5009", "FP5010"}, skipped: 44, minScale: 0x1p-27, firstNaN: -1, warmup: 2, fix: "to_bf16()"},
		{log: "plateau_underflow", verdict: report.ScalesHealthy, findings: []string{"FP5009", "FP5010"}, skipped: 44, minScale: 0x1p-27, firstNaN: -1, warmup: 2},
		{log: "fp16_noise", baseline: "baseline_fp32", verdict: report.ScalesFP16Noise, findings: []string{"FP5007"}, skipped: 21, minScale: 16384, firstNaN: -1, warmup: 2},
		{log: "wasted_warmup", verdict: report.ScalesWastedWarmup, findings: []string{"FP5008"}, skipped: 24, minScale: 128, firstNaN: -1, warmup: 9, fix: "to_fp16(init_scale=2**7)"},
		{log: "healthy", verdict: report.ScalesHealthy, findings: nil, skipped: 17, minScale: 16384, firstNaN: -1, warmup: 2},
		{log: "healthy", baseline: "baseline_fp32", verdict: report.ScalesFP16Noise, findings: []string{"FP5007"}, skipped: 17, minScale: 16384, firstNaN: -1, warmup: 2},
		{log: "healthy_losses_only", verdict: report.ScalesHealthy, findings: nil, skipped: -1, firstNaN: -1},
		{log: "healthy_scales_only", verdict: report.ScalesHealthy, findings: nil, skipped: 17, minScale: 16384, firstNaN: -1, warmup: 2},
	}
	for _, tt := range tests {
		for _, ext := range []string{".json", ".csv"} {
			name := tt.log + ext
			if tt.baseline != "" {
				name += "+" + tt.baseline
			}
			t.Run(name, func(t *testing.T) {
				run := mustRead(t, tt.log+ext)
				var base *trainlog.Log
				if tt.baseline != "" {
					base = mustRead(t, tt.baseline+ext)
				}
				r := analyze(t, run, base, trainlog.DefaultOptions)
				if r.Verdict != tt.verdict {
					t.Fatalf("verdict %s (%s), want %s", r.Verdict, r.VerdictText, tt.verdict)
				}
				var ids []string
				for _, f := range r.Findings {
					ids = append(ids, f.Check)
				}
				if !slices.Equal(ids, tt.findings) {
					t.Errorf("findings %v, want %v", ids, tt.findings)
				}
				if tt.skipped < 0 {
					if r.Scales != nil {
						t.Errorf("scale statistics from a log without scales")
					}
				} else {
					s := r.Scales
					if s == nil {
						t.Fatal("no scale statistics")
					}
					if s.Skipped != tt.skipped || s.MinScale != tt.minScale || s.WarmupSkipped != tt.warmup {
						t.Errorf("skipped %d, min scale %g, warm-up %d; want %d, %g, %d", s.Skipped, s.MinScale, s.WarmupSkipped, tt.skipped, tt.minScale, tt.warmup)
					}
					if len(s.SkippedAt) != s.Skipped {
						t.Errorf("%d skipped steps listed, want %d", len(s.SkippedAt), s.Skipped)
					}
				}
				if got := firstNaN(r); got != tt.firstNaN {
					t.Errorf("first NaN at step %d, want %d", got, tt.firstNaN)
				}
				if !strings.Contains(r.Fix, tt.fix) {
					t.Errorf("fix %q does not mention %q", r.Fix, tt.fix)
				}
				if _, err := json.Marshal(r); err != nil {
					t.Errorf("report does not encode: %v", err)
				}
			})
		}
	}
}

// TestFixturesMatchSimulator ties the hand-written numbers above to the
// simulator's own counts, so a change of the scenarios cannot leave them
// stale unnoticed.
func TestFixturesMatchSimulator(t *testing.T) {
	for _, sc := range scenarios {
		if sc.fp32 {
			continue
		}
		sim := sc.run()
		r := analyze(t, mustRead(t, sc.name+".json"), nil, trainlog.DefaultOptions)
		if r.Scales.Skipped != sim.skipped || r.Scales.MinScale != sim.minScale {
			t.Errorf("%s: skipped %d, min scale %g; the simulator skipped %d, min %g", sc.name, r.Scales.Skipped, r.Scales.MinScale, sim.skipped, sim.minScale)
		}
		if got := firstNaN(r); got != sim.firstNaN {
			t.Errorf("%s: first NaN at %d, the simulator's at %d", sc.name, got, sim.firstNaN)
		}
	}
}

func firstNaN(r *report.ScalesReport) int {
	if r.Losses != nil && r.Losses.FirstNonFiniteStep != nil {
		return *r.Losses.FirstNonFiniteStep
	}
	if r.Scales != nil && r.Scales.InferredNaNStep != nil {
		return *r.Scales.InferredNaNStep
	}
	return -1
}

func mustRead(t *testing.T, name string) *trainlog.Log {
	t.Helper()
	l, err := logfile.Read(filepath.Join("testdata", name), logfile.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Path = name
	return l
}

// TestGolden compares the text and JSON reports of the JSON fixtures with
// testdata/golden; -update rewrites them.
func TestGolden(t *testing.T) {
	cases := map[string]string{
		"early_nan": "", "gradient_overflow_nan": "", "forward_overflow_nan": "", "plateau_underflow": "baseline_fp32",
		"fp16_noise": "baseline_fp32", "wasted_warmup": "", "healthy": "", "healthy_scales_only": "", "forward_overflow_nan_losses_only": "",
	}
	for name, baseline := range cases {
		run := mustRead(t, name+".json")
		var base *trainlog.Log
		if baseline != "" {
			base = mustRead(t, baseline+".json")
		}
		r := analyze(t, run, base, trainlog.DefaultOptions)
		var txt, js bytes.Buffer
		if err := renderAs(&txt, r, "text"); err != nil {
			t.Fatal(err)
		}
		if err := renderAs(&js, r, "json"); err != nil {
			t.Fatal(err)
		}
		golden(t, filepath.Join("testdata", "golden", name+".txt"), txt.Bytes())
		golden(t, filepath.Join("testdata", "golden", name+".json"), js.Bytes())
	}
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	goldenfile.Check(t, path, got, *update, "go test ./internal/trainlog -update")
}

// TestReconstruction checks the reconstruction on hand-written series.
func TestReconstruction(t *testing.T) {
	// Interval 3: two warm-up skips, growth after three clean steps, a
	// probe that backs off, then the NaN tail.
	l := &trainlog.Log{Path: "hand.json", Scaler: report.ScalerConfig{GrowthInterval: 3},
		Scales: []float64{32768, 16384, 16384, 16384, 16384, 32768, 16384, 16384, 8192, 4096},
		Losses: []float64{3, 3, 2.9, 2.8, 2.7, 2.6, 2.5, 2.4, math.NaN(), math.Inf(1)}}
	opt := trainlog.DefaultOptions
	opt.EarlySteps = 5
	r := analyze(t, l, nil, opt)
	s := r.Scales
	if s.Skipped != 5 || s.WarmupSkipped != 2 || s.WarmupScale != 16384 || s.Growths != 1 || s.LongestBackoffRun != 2 {
		t.Errorf("skipped %d warm-up %d at %g growths %d longest run %d; want 5, 2 at 16384, 1, 2",
			s.Skipped, s.WarmupSkipped, s.WarmupScale, s.Growths, s.LongestBackoffRun)
	}
	if !slices.Equal(s.SkippedAt, []int{0, 1, 6, 8, 9}) {
		t.Errorf("skipped at %v", s.SkippedAt)
	}
	if s.ScaleAtFirstNaN == nil || *s.ScaleAtFirstNaN != 16384 {
		t.Errorf("scale at first NaN %v, want 16384", s.ScaleAtFirstNaN)
	}
	if r.Losses.NonFinite != 2 || r.Losses.FirstNonFiniteValue != "NaN" {
		t.Errorf("non-finite %d first %q", r.Losses.NonFinite, r.Losses.FirstNonFiniteValue)
	}
	if r.Verdict != report.ScalesForwardOverflowNaN {
		t.Errorf("verdict %s, want %s", r.Verdict, report.ScalesForwardOverflowNaN)
	}
	if r.GradScaler.InitScaleFrom != "default" || r.GradScaler.GrowthIntervalFrom != "log" {
		t.Errorf("scaler sources %+v", r.GradScaler)
	}
}

// TestPlateauUnexplained: a run 20% above its baseline with a clean scale
// history is not blamed on the scaler.
func TestPlateauUnexplained(t *testing.T) {
	run := mustRead(t, "healthy.json")
	base := &trainlog.Log{Path: "base", Losses: make([]float64, len(run.Losses))}
	for i, v := range run.Losses {
		base.Losses[i] = v / 1.2
	}
	r := analyze(t, run, base, trainlog.DefaultOptions)
	if r.Verdict != report.ScalesPlateauUnexplained || len(r.Findings) != 1 || r.Findings[0].Check != "FP5006" {
		t.Fatalf("verdict %s findings %v", r.Verdict, r.Findings)
	}
	if g := r.Comparison.Gap; math.Abs(g-0.2) > 1e-9 {
		t.Errorf("gap %g, want 0.2", g)
	}
}

func TestGrowthIntervalInferred(t *testing.T) {
	l := &trainlog.Log{Path: "x", Scales: []float64{65536, 65536, 65536, 131072, 65536, 65536, 65536, 65536, 131072}}
	r := analyze(t, l, nil, trainlog.DefaultOptions)
	if r.GradScaler.GrowthInterval != 4 || r.GradScaler.GrowthIntervalFrom != "inferred" {
		t.Errorf("growth interval %d from %s, want 4 inferred", r.GradScaler.GrowthInterval, r.GradScaler.GrowthIntervalFrom)
	}
}

func TestCustomInitScale(t *testing.T) {
	l := &trainlog.Log{Path: "x", Scales: []float64{1024, 512, 512}}
	r := analyze(t, l, nil, trainlog.DefaultOptions)
	if r.GradScaler.InitScale != 1024 || r.Scales.Skipped != 1 || len(r.Notes) == 0 {
		t.Errorf("init %g skipped %d notes %v", r.GradScaler.InitScale, r.Scales.Skipped, r.Notes)
	}
}

func TestChecksDocumented(t *testing.T) {
	n := 0
	for _, c := range checks.All() {
		if !strings.HasPrefix(c.ID, "FP5") {
			continue
		}
		n++
		if len(c.Doc) < 200 || c.Title == "" || c.Title != strings.ToLower(c.Title) || strings.HasSuffix(c.Title, ".") {
			t.Errorf("%s: title %q, doc of %d characters", c.ID, c.Title, len(c.Doc))
		}
	}
	if n != 12 {
		t.Errorf("%d FP5xxx checks, want 12", n)
	}
}

// TestTinyLogs: degenerate logs give a verdict and a report that encodes.
func TestTinyLogs(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	logs := []*trainlog.Log{
		{Path: "one-scale", Scales: []float64{65536}},
		{Path: "one-nan", Losses: []float64{nan}},
		{Path: "nan-first", Losses: []float64{nan, nan}, Scales: []float64{32768, 16384}},
		{Path: "one-loss", Losses: []float64{1}},
		{Path: "to-zero", Scales: append(halvings(160), 0)},
		{Path: "inf-losses", Losses: []float64{inf, 1, 2}, Epochs: []int{0, 0, 1}},
	}
	base := &trainlog.Log{Path: "base", Losses: []float64{1, inf}}
	for _, l := range logs {
		for _, b := range []*trainlog.Log{nil, base} {
			r := analyze(t, l, b, trainlog.DefaultOptions)
			if !slices.Contains(scalesVerdicts, r.Verdict) {
				t.Errorf("%s: verdict %q", l.Path, r.Verdict)
			}
			if err := renderAs(io.Discard, r, "json"); err != nil {
				t.Errorf("%s: %v", l.Path, err)
			}
			if err := renderAs(io.Discard, r, "text"); err != nil {
				t.Errorf("%s: %v", l.Path, err)
			}
		}
	}
}

func halvings(n int) []float64 {
	out := make([]float64, n)
	s := float32(32768)
	for i := range out {
		out[i] = float64(s)
		s /= 2
	}
	return out
}

// analyze runs the diagnosis, failing the test on an error.
func analyze(t testing.TB, run, baseline *trainlog.Log, opt trainlog.Options) *report.ScalesReport {
	t.Helper()
	r, err := trainlog.Analyze(run, baseline, opt)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestAnalyzersCoverTheChecks: one analyzer per FP5xxx check, in ID order.
func TestAnalyzersCoverTheChecks(t *testing.T) {
	var want, got []string
	for _, c := range checks.All() {
		if strings.HasPrefix(c.ID, "FP5") {
			want = append(want, c.ID)
		}
	}
	for _, a := range trainlog.Analyzers() {
		got = append(got, a.Check.ID)
		if len(a.Requires) == 0 {
			t.Errorf("%s: no Requires", a.Check.ID)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("analyzers %v, want one per check %v", got, want)
	}
}

// TestChecksSwitchedOff switches off, one at a time, every check a fixture
// reports: its finding goes, the other findings stay as they were, and the
// verdict it decided falls to the next the remaining findings decide.
func TestChecksSwitchedOff(t *testing.T) {
	// decides maps a check to the verdict its finding decides.
	decides := map[string]string{
		"FP5001": report.ScalesEarlyNaN, "FP5002": report.ScalesGradientOverflowNaN, "FP5003": report.ScalesForwardOverflowNaN,
		"FP5004": report.ScalesLateNaN, "FP5005": report.ScalesPlateauUnderflow, "FP5006": report.ScalesPlateauUnexplained,
		"FP5007": report.ScalesFP16Noise, "FP5008": report.ScalesWastedWarmup,
	}
	cases := []struct {
		log, baseline string
		// off is the check switched off; verdict what the rest decide.
		off, verdict string
		text         string // a substring of the verdict text
	}{
		{"early_nan", "", "FP5001", report.ScalesHealthy, "the loss became NaN at step 37, unjudged: --checks -FP5001 switched off FP5001 (loss is nan early in training)"},
		{"gradient_overflow_nan", "", "FP5002", report.ScalesHealthy, "unjudged: --checks -FP5002 switched off FP5002"},
		{"gradient_overflow_nan", "", "FP5009", report.ScalesGradientOverflowNaN, "collapsed"},
		{"forward_overflow_nan", "", "FP5003", report.ScalesHealthy, "switched off FP5003"},
		{"forward_overflow_nan_losses_only", "", "FP5004", report.ScalesHealthy, "switched off FP5004"},
		{"plateau_underflow", "baseline_fp32", "FP5005", report.ScalesHealthy, "85.3% above the fp32 baseline's 0.3031, unjudged: --checks -FP5005 switched off FP5005"},
		{"plateau_underflow", "baseline_fp32", "FP5010", report.ScalesPlateauUnderflow, "4.2% of the steps after the warm-up skipped"},
		{"fp16_noise", "baseline_fp32", "FP5007", report.ScalesHealthy, "switched off FP5007"},
		{"wasted_warmup", "", "FP5008", report.ScalesHealthy, "24 of 800 steps skipped"},
	}
	for _, c := range cases {
		t.Run(c.log+"-"+c.off, func(t *testing.T) {
			run := mustRead(t, c.log+".json")
			var base *trainlog.Log
			if c.baseline != "" {
				base = mustRead(t, c.baseline+".json")
			}
			all := analyze(t, run, base, trainlog.DefaultOptions)
			opt := trainlog.DefaultOptions
			var err error
			if opt.Checks, err = checks.ParseSelection("-" + c.off); err != nil {
				t.Fatal(err)
			}
			r := analyze(t, run, base, opt)
			var want, got []string
			for _, f := range all.Findings {
				if f.Check != c.off {
					want = append(want, f.Check+": "+f.Message)
				}
			}
			if len(want) == len(all.Findings) {
				t.Fatalf("the fixture reports no %s: %v", c.off, all.Findings)
			}
			for _, f := range r.Findings {
				got = append(got, f.Check+": "+f.Message)
			}
			if !slices.Equal(got, want) {
				t.Errorf("findings\n%v\nwant\n%v", got, want)
			}
			if r.Verdict != c.verdict || r.Verdict == decides[c.off] || !strings.Contains(r.VerdictText, c.text) {
				t.Errorf("verdict %s (%s), want %s with %q", r.Verdict, r.VerdictText, c.verdict, c.text)
			}
			if r.Checks != "-"+c.off {
				t.Errorf("report records checks %q", r.Checks)
			}
		})
	}
}
