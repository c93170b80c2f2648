package trainlog_test

import (
	"bytes"
	"encoding/json"
	"fmt"
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

// TestCompanionNamesOverflowingModule reads the log the Python companion
// wrote for a run with a planted overflowing module
// (testdata/companion/make_logs.py, real torch telemetry): the scale
// collapses, the loss turns Inf, and the diagnosis must name `planted`.
func TestCompanionNamesOverflowingModule(t *testing.T) {
	l, err := logfile.Read(filepath.Join("testdata", "companion", "gradient_overflow_nan.jsonl"), logfile.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Format != "trainlog" || l.TelemetryModules != 3 || len(l.Telemetry) == 0 || l.Scaler.GrowthInterval != 20 {
		t.Fatalf("read format %s, %d modules, %d telemetry lines, growth interval %d", l.Format, l.TelemetryModules, len(l.Telemetry), l.Scaler.GrowthInterval)
	}
	r := analyze(t, l, nil, trainlog.DefaultOptions)
	if r.Verdict != report.ScalesGradientOverflowNaN {
		t.Fatalf("verdict %s (%s), want %s", r.Verdict, r.VerdictText, report.ScalesGradientOverflowNaN)
	}
	i := slices.IndexFunc(r.Findings, func(f checks.Finding) bool { return f.Check == "FP5002" })
	if i < 0 {
		t.Fatalf("no FP5002 among %v", r.Findings)
	}
	f := r.Findings[i]
	if f.Module != "planted" || !strings.Contains(f.Message, "module planted (Linear)") || !strings.Contains(f.Message, "keep it in fp32") {
		t.Errorf("FP5002 module %q: %s", f.Module, f.Message)
	}
	if !strings.Contains(r.Fix, "module planted") || !strings.Contains(r.VerdictText, "planted") {
		t.Errorf("verdict %q, fix %q do not name planted", r.VerdictText, r.Fix)
	}
	ts := r.Telemetry
	if ts == nil || len(ts.Overflow) == 0 {
		t.Fatalf("telemetry %+v", ts)
	}
	top := ts.Overflow[0]
	// The window is the collapse before the NaN: the 40 steps (two growth
	// intervals) before it; planted begins nearly every overflow there.
	if top.Module != "planted" || top.Type != "Linear" || 2*top.Steps <= top.OfSteps || ts.OverflowTo != *r.Losses.FirstNonFiniteStep-1 ||
		ts.OverflowFrom != ts.OverflowTo+1-r.Scales.CollapseWindow || top.MaxAbs <= 65504 {
		t.Errorf("overflow %+v in steps %d–%d", top, ts.OverflowFrom, ts.OverflowTo)
	}
	if ts.Lines != len(l.Telemetry) || ts.Modules != 3 || ts.SkippedLines == 0 || ts.FullLines == 0 {
		t.Errorf("telemetry counts %+v", ts)
	}

	// The same run's np.save'd lists.
	scales, err := logfile.Read(filepath.Join("testdata", "companion", "gradient_overflow_nan.scales.npy"), logfile.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(scales.Scales, l.Scales) {
		t.Errorf("the np.save'd scales differ from the log's")
	}
	if r := analyze(t, scales, nil, trainlog.DefaultOptions); r.Verdict != report.ScalesGradientOverflowNaN {
		t.Errorf("scales.npy: verdict %s (%s)", r.Verdict, r.VerdictText)
	}
	losses, err := logfile.Read(filepath.Join("testdata", "companion", "gradient_overflow_nan.losses.npy"), logfile.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r := analyze(t, losses, nil, trainlog.DefaultOptions); r.Verdict != report.ScalesLateNaN || *r.Losses.FirstNonFiniteStep != *analyze(t, l, nil, trainlog.DefaultOptions).Losses.FirstNonFiniteStep {
		t.Errorf("losses.npy: verdict %s (%s)", r.Verdict, r.VerdictText)
	}
}

// underflowLog writes the plateau scenario as a companion log with
// telemetry: every 50 steps a full line where module `tiny` loses 60% of
// its output gradient's elements to underflow and `encoder` 1%; every
// skipped step a line where `encoder`'s output gradient overflowed. With
// mass, the full lines also record the sums of squares: `tiny`'s flushed
// elements hold 0.1% of its mass (the tails of a confident softmax),
// while `encoder` loses massLost(i) of its mass, on a gradient whose
// unscaled squared norm is massNorm(i).
func underflowLog(sc scenario, sim simulated, mass bool) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"kind":"header","format":"fp16audit.trainlog","version":1,"source":"torch","created":"2025-01-31T12:00:00Z","grad_scaler":{"enabled":true,"class":"GradScaler","init_scale":65536.0,"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":%d},"steps_per_epoch":%d,"telemetry":{"every":50,"on_skipped":true,"fp16_max":65504.0,"fp16_min_normal":6.103515625e-05,"fp16_min_subnormal":5.960464477539063e-08,"modules":[{"name":"encoder","type":"Conv2d"},{"name":"tiny","type":"Linear"},{"name":"head","type":"Linear"}]},"torch_version":"1.13.0"}`+"\n",
		sc.interval, sc.stepsPerEpoch)
	used := float64(sc.init)
	for i, s := range sim.scales {
		skipped := s < used
		fmt.Fprintf(&b, `{"kind":"step","step":%d,"epoch":%d,"iter":%d,"loss":%s,"scale":%s,"scale_used":%s,"skipped":%t}`+"\n",
			i, i/sc.stepsPerEpoch, i%sc.stepsPerEpoch, jsonNum(sim.losses[i]), jsonNum(s), jsonNum(used), skipped)
		full := i%50 == 0
		if skipped || full {
			measured, reasons := "overflow", []string{}
			if skipped {
				reasons = append(reasons, `"skipped"`)
			}
			if full {
				measured = "full"
				reasons = append(reasons, `"interval"`)
			}
			grad := func(nonfinite, nonzero, underflow int, norm2, lost float64) string {
				if !full {
					return fmt.Sprintf(`{"dtype":"float32","tensors":1,"numel":100,"nonfinite":%d,"nonfinite_src":0,"max_abs":1000.0,"nonzero":null,"underflow":null,"underflow_fraction":null,"subnormal":null}`, nonfinite)
				}
				sums := ""
				if mass {
					// The companion's sums are of the scaled gradient.
					sumsq := norm2 * used * used
					sums = fmt.Sprintf(`,"sumsq":%g,"lost_sumsq":%g,"lost_mass":%g`, sumsq, lost*lost*sumsq, lost)
				}
				return fmt.Sprintf(`{"dtype":"float32","tensors":1,"numel":100,"nonfinite":%d,"nonfinite_src":0,"max_abs":1000.0,"nonzero":%d,"underflow":%d,"underflow_fraction":%g,"subnormal":0%s}`,
					nonfinite, nonzero, underflow, float64(underflow)/float64(nonzero), sums)
			}
			enc, first := 0, "null"
			if skipped {
				enc, first = 3, `"encoder"`
			}
			fmt.Fprintf(&b, `{"kind":"telemetry","step":%d,"reasons":[%s],"measured":%q,"scale_used":%s,"first_nonfinite_output":%s,"first_nonfinite_params":null,"modules":[`+
				`{"name":"head","type":"Linear","output":%s,"params":%s},{"name":"tiny","type":"Linear","output":%s,"params":null},{"name":"encoder","type":"Conv2d","output":%s,"params":null}]}`+"\n",
				i, strings.Join(reasons, ","), measured, jsonNum(used), first, grad(0, 100, 0, 1, 0), grad(0, 50, 0, 1, 0), grad(0, 100, 60, 2, 0.001), grad(enc, 100, 1, massNorm(i), massLost(i)))
		}
		used = s
	}
	return b.Bytes()
}

// massNorm and massLost are encoder's unscaled squared gradient norm and
// the share of its mass lost on the full line of step i: alternately a
// small gradient losing 10% and a large one losing nothing, so that only
// pooling by unscaled norms gives the expected mass lost.
func massNorm(i int) float64 { return 1 + 3*float64(i/50%2) }

func massLost(i int) float64 { return 0.1 * float64(1-i/50%2) }

// TestTelemetryNamesUnderflowingModules: on a plateau, the modules that
// lose their gradient to underflow are named in FP5005, the module where
// the overflows begin in FP5009.
func TestTelemetryNamesUnderflowingModules(t *testing.T) {
	sc := scenarioByName(t, "plateau_underflow")
	dir := t.TempDir()
	run, err := logfile.Read(write(t, dir, "run.jsonl", underflowLog(sc, sc.run(), false)), logfile.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bsc := scenarioByName(t, "baseline_fp32")
	base, err := logfile.Read(write(t, dir, "base.jsonl", companion(bsc, samples(bsc, bsc.run(), 1, 0))), logfile.ReadOptions{Baseline: true})
	if err != nil {
		t.Fatal(err)
	}
	r := analyze(t, run, base, trainlog.DefaultOptions)
	if r.Verdict != report.ScalesPlateauUnderflow {
		t.Fatalf("verdict %s (%s)", r.Verdict, r.VerdictText)
	}
	byCheck := map[string]checks.Finding{}
	for _, f := range r.Findings {
		byCheck[f.Check] = f
	}
	if f := byCheck["FP5005"]; f.Module != "tiny" || !strings.Contains(f.Message, "tiny (Linear) (60% of its output gradient's nonzero elements flush to zero") ||
		!strings.Contains(f.Message, "module encoder (Conv2d)") {
		t.Errorf("FP5005 module %q: %s", f.Module, f.Message)
	}
	if f := byCheck["FP5009"]; f.Module != "encoder" {
		t.Errorf("FP5009 module %q: %s", f.Module, f.Message)
	}
	if f := byCheck["FP5010"]; f.Module != "tiny" {
		t.Errorf("FP5010 module %q", f.Module)
	}
	u := r.Telemetry.Underflow
	if len(u) != 1 || u[0].Module != "tiny" || u[0].Gradient != "output" || u[0].Measure != "underflow" || u[0].Fraction != 0.6 || u[0].MedianScale <= 0 {
		t.Errorf("underflow %+v", u)
	}
	// Below the default 10%, encoder's 1% is named only with a lower
	// threshold.
	opt := trainlog.DefaultOptions
	opt.UnderflowFraction = 0.005
	if u := analyze(t, run, base, opt).Telemetry.Underflow; len(u) != 2 || u[1].Module != "encoder" {
		t.Errorf("with threshold 0.5%%: %+v", u)
	}
	if o := r.Telemetry.Overflow; len(o) != 1 || o[0].Module != "encoder" || o[0].Steps != o[0].OfSteps || o[0].Steps != r.Scales.Skipped-r.Scales.WarmupSkipped {
		t.Errorf("overflow %+v, %d skipped after a warm-up of %d", o, r.Scales.Skipped, r.Scales.WarmupSkipped)
	}
}

// TestTelemetryJudgesUnderflowByMass: where the companion recorded the
// mass lost, a module is named by it, not by the share of its elements
// flushed: `tiny`, whose flushed elements carry 0.1% of its gradient, is
// not named although 60% of them flush; `encoder`, losing 4–5% of its
// mass on 1% of its elements, is, with the mass pooled by unscaled norms.
func TestTelemetryJudgesUnderflowByMass(t *testing.T) {
	sc := scenarioByName(t, "plateau_underflow")
	dir := t.TempDir()
	run, err := logfile.Read(write(t, dir, "run.jsonl", underflowLog(sc, sc.run(), true)), logfile.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bsc := scenarioByName(t, "baseline_fp32")
	base, err := logfile.Read(write(t, dir, "base.jsonl", companion(bsc, samples(bsc, bsc.run(), 1, 0))), logfile.ReadOptions{Baseline: true})
	if err != nil {
		t.Fatal(err)
	}
	r := analyze(t, run, base, trainlog.DefaultOptions)
	var num, den float64
	lines := 0
	for _, tl := range run.Telemetry {
		if tl.Full && tl.Step >= r.Scales.WarmupSkipped {
			num += massLost(tl.Step) * massLost(tl.Step) * massNorm(tl.Step)
			den += massNorm(tl.Step)
			lines++
		}
	}
	want := math.Sqrt(num / den)
	u := r.Telemetry.Underflow
	if len(u) != 1 || u[0].Module != "encoder" || u[0].Measure != trainlog.MeasureLostMass || u[0].LostMass == nil ||
		math.Abs(*u[0].LostMass-want) > 1e-12 || u[0].Lines != lines || u[0].Fraction != 0.01 {
		t.Fatalf("underflow %+v, want encoder losing %g of its mass over %d lines", u, want, lines)
	}
	if want < 0.04 || want > 0.06 {
		t.Fatalf("the scenario's pooled mass %g is not the 5%% it was made for", want)
	}
	byCheck := map[string]checks.Finding{}
	for _, f := range r.Findings {
		byCheck[f.Check] = f
	}
	if f := byCheck["FP5005"]; f.Module != "encoder" || !strings.Contains(f.Message, fmt.Sprintf("encoder (Conv2d) (%.1f%% of its output gradient's mass (L2 norm) lost to fp16", 100*want)) ||
		strings.Contains(f.Message, "tiny") {
		t.Errorf("FP5005 module %q: %s", f.Module, f.Message)
	}
	if !strings.Contains(r.VerdictText, fmt.Sprintf("module encoder loses %.1f%% of its output gradient's mass to fp16", 100*want)) {
		t.Errorf("verdict text %q", r.VerdictText)
	}
	// A lower tolerance names tiny too, judged by its mass.
	opt := trainlog.DefaultOptions
	opt.LostMassTolerance = 0.0005
	if u := analyze(t, run, base, opt).Telemetry.Underflow; len(u) != 2 || u[1].Module != "tiny" || u[1].Measure != trainlog.MeasureLostMass || math.Abs(*u[1].LostMass-0.001) > 1e-12 {
		t.Errorf("with tolerance 0.05%%: %+v", u)
	}
}

// TestCompanionMassAgainstTorch reads the log the companion wrote for a
// real run (testdata/companion/make_logs.py, underflow_mass) at a scale
// pinned at 2^4: quiet's weight gradient loses mass to fp16, head's output
// gradient only flushes the tails of a confident softmax. The mass lost
// must be what torch's own fp16 cast of autograd's gradients gives
// (underflow_mass.truth.json), and the measure must name quiet alone,
// where the share of elements flushed names head and not quiet.
func TestCompanionMassAgainstTorch(t *testing.T) {
	dir := filepath.Join("testdata", "companion")
	var truth struct {
		LostMass map[string]float64 `json:"lost_mass"`
	}
	data, err := os.ReadFile(filepath.Join(dir, "underflow_mass.truth.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &truth); err != nil {
		t.Fatal(err)
	}
	l, err := logfile.Read(filepath.Join(dir, "underflow_mass.jsonl"), logfile.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := analyze(t, l, nil, trainlog.DefaultOptions)
	u := r.Telemetry.Underflow
	want := truth.LostMass["quiet/params"]
	if len(r.Findings) != 1 || r.Findings[0].Check != "FP5011" || r.Findings[0].Module != "quiet" ||
		!strings.Contains(r.Findings[0].Message, fmt.Sprintf("quiet (Linear)'s parameter gradient loses %.1f%% of its mass (L2 norm) to fp16 at a median scale 2^4 (16) over 8 lines (tolerance 1.0%%)", 100*want)) {
		t.Errorf("findings %+v", r.Findings)
	}
	if r.Verdict != report.ScalesHealthy || !strings.Contains(r.VerdictText, "but see the warnings") {
		t.Errorf("verdict %s (%s)", r.Verdict, r.VerdictText)
	}
	off := trainlog.DefaultOptions
	if off.Checks, err = checks.ParseSelection("-FP5011"); err != nil {
		t.Fatal(err)
	}
	if r := analyze(t, l, nil, off); len(r.Findings) != 0 || strings.Contains(r.VerdictText, "warnings") {
		t.Errorf("with FP5011 off: %+v, %s", r.Findings, r.VerdictText)
	}
	if len(u) != 1 || u[0].Module != "quiet" || u[0].Gradient != "params" || u[0].Measure != trainlog.MeasureLostMass ||
		math.Abs(*u[0].LostMass-want) > 1e-6*want || u[0].MedianScale != 16 {
		t.Fatalf("underflow %+v, want quiet's parameter gradient losing %g (torch)", u, want)
	}
	// head is under the tolerance by the same measure, in the log as in
	// torch: its flushed elements carry nothing.
	opt := trainlog.DefaultOptions
	opt.LostMassTolerance = 1e-15
	all := analyze(t, l, nil, opt).Telemetry.Underflow
	i := slices.IndexFunc(all, func(m report.ModuleUnderflow) bool { return m.Module == "head" && m.Gradient == "output" })
	if i < 0 || math.Abs(*all[i].LostMass-truth.LostMass["head/output"]) > 1e-6*truth.LostMass["head/output"] || all[i].Fraction < 0.8 {
		t.Errorf("head's output gradient %+v, want %g of its mass lost (torch) on 80%% of its elements flushed", all, truth.LostMass["head/output"])
	}

	// The same log without the sums, as the companion wrote it before:
	// judged by elements flushed, head is named and quiet is not.
	for _, tl := range l.Telemetry {
		for _, m := range tl.Modules {
			for _, g := range []*trainlog.GradSummary{m.Output, m.Params} {
				if g != nil {
					g.SumSq, g.LostSumSq = nil, nil
				}
			}
		}
	}
	oldr := analyze(t, l, nil, trainlog.DefaultOptions)
	if len(oldr.Findings) != 0 {
		t.Errorf("elements flushed are no finding: %+v", oldr.Findings)
	}
	old := oldr.Telemetry.Underflow
	if len(old) == 0 || old[0].Module != "head" || old[0].Measure != trainlog.MeasureUnderflow ||
		slices.ContainsFunc(old, func(m report.ModuleUnderflow) bool { return m.Module == "quiet" && m.Gradient == "params" }) {
		t.Errorf("by elements flushed: %+v", old)
	}
}
