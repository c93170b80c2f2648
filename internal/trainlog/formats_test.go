package trainlog_test

// The logs people have, made from the GradScaler simulator's scenarios
// (gen_test.go) in every form `fp16audit scales` reads: each must get the
// scenario's class, with the simulator's numbers where the form holds
// every step and honest bounds where it does not.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"fp16audit/internal/batch"
	"fp16audit/internal/tensor"
	"fp16audit/internal/testutil/eventfile"
	"fp16audit/internal/trainlog"
	"fp16audit/internal/trainlog/logfile"
	"fp16audit/report"
)

// expected is a scenario's class and its baseline, when it needs one.
var expected = []struct {
	scenario, baseline, verdict string
}{
	{"early_nan", "", report.ScalesEarlyNaN},
	{"gradient_overflow_nan", "", report.ScalesGradientOverflowNaN},
	{"forward_overflow_nan", "", report.ScalesForwardOverflowNaN},
	{"plateau_underflow", "baseline_fp32", report.ScalesPlateauUnderflow},
	{"fp16_noise", "baseline_fp32", report.ScalesFP16Noise},
	{"wasted_warmup", "", report.ScalesWastedWarmup},
	{"healthy", "", report.ScalesHealthy},
}

// sample is one step of a simulated run.
type sample struct {
	step, epoch int
	loss        float64
	scale       float64 // NaN: the run has no scaler
	skipped     bool
}

// samples lists the steps of a simulated run, every `every` steps from
// `phase`.
func samples(sc scenario, sim simulated, every, phase int) []sample {
	var out []sample
	prev := float64(sc.init)
	for t := range sc.steps {
		s := sample{step: t, epoch: t / sc.stepsPerEpoch, loss: sim.losses[t], scale: math.NaN()}
		if sim.scales != nil {
			s.scale = sim.scales[t]
			s.skipped = s.scale < prev
			prev = s.scale
		}
		if t%every == phase {
			out = append(out, s)
		}
	}
	return out
}

// writeTable writes samples as a delimited table whose columns carry the names
// given (meaning -> header); NaN losses are written as nanWord.
func writeTable(ss []sample, sep string, names map[string]string, nanWord string) []byte {
	var cols []string
	for _, m := range logfile.Meanings {
		if _, ok := names[m]; ok {
			cols = append(cols, m)
		}
	}
	var b bytes.Buffer
	var head []string
	for _, m := range cols {
		head = append(head, names[m])
	}
	b.WriteString(strings.Join(head, sep) + "\n")
	for _, s := range ss {
		var row []string
		for _, m := range cols {
			switch m {
			case "step":
				row = append(row, strconv.Itoa(s.step))
			case "epoch":
				row = append(row, strconv.Itoa(s.epoch))
			case "loss":
				if math.IsNaN(s.loss) {
					row = append(row, nanWord)
				} else {
					row = append(row, pyFloat(s.loss, true))
				}
			case "scale":
				row = append(row, pyFloat(s.scale, true))
			case "skipped":
				row = append(row, strconv.FormatBool(s.skipped))
			}
		}
		b.WriteString(strings.Join(row, sep) + "\n")
	}
	return b.Bytes()
}

// jsonNum writes a float as JSON would hold it: null for NaN (pandas'
// to_json), the bare token Python writes for ±Inf.
func jsonNum(v float64) string {
	switch {
	case math.IsNaN(v):
		return "null"
	case math.IsInf(v, 1):
		return "Infinity"
	case math.IsInf(v, -1):
		return "-Infinity"
	}
	return pyFloat(v, false)
}

func records(ss []sample, loss, scale string) []map[string]string {
	var out []map[string]string
	for _, s := range ss {
		r := map[string]string{"iter": strconv.Itoa(s.step), "epoch": strconv.Itoa(s.epoch), loss: jsonNum(s.loss), "lr": "0.001"}
		if !math.IsNaN(s.scale) {
			r[scale] = jsonNum(s.scale)
		}
		out = append(out, r)
	}
	return out
}

func object(r map[string]string) string {
	keys := make([]string, 0, len(r))
	for k := range r {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%q: %s", k, r[k]))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// companion writes samples as the Python companion's log (python/README.md).
func companion(sc scenario, ss []sample) []byte {
	var b bytes.Buffer
	gs := "null"
	if !sc.fp32 {
		gs = fmt.Sprintf(`{"enabled":true,"class":"GradScaler","init_scale":%s,"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":%d}`, pyFloat(float64(sc.init), false), sc.interval)
	}
	fmt.Fprintf(&b, `{"kind":"header","format":"fp16audit.trainlog","version":1,"source":"torch","created":"2025-01-31T12:00:00Z","grad_scaler":%s,"steps_per_epoch":%d,"telemetry":null,"torch_version":"1.13.0"}`+"\n", gs, sc.stepsPerEpoch)
	prev := float64(sc.init)
	skipped := 0
	for _, s := range ss {
		loss := jsonNum(s.loss)
		if math.IsNaN(s.loss) {
			loss = `"NaN"`
		} else if math.IsInf(s.loss, 1) {
			loss = `"Infinity"`
		}
		scale, used := "null", "null"
		if !math.IsNaN(s.scale) {
			scale, used = jsonNum(s.scale), jsonNum(prev)
			prev = s.scale
		}
		if s.skipped {
			skipped++
		}
		fmt.Fprintf(&b, `{"kind":"step","step":%d,"epoch":%d,"iter":%d,"loss":%s,"scale":%s,"scale_used":%s,"skipped":%t}`+"\n",
			s.step, s.epoch, s.step%sc.stepsPerEpoch, loss, scale, used, s.skipped)
	}
	fmt.Fprintf(&b, `{"kind":"end","steps":%d,"skipped":%d,"telemetry_lines":0}`+"\n", len(ss), skipped)
	return b.Bytes()
}

// tensorboard writes samples as a TensorBoard event file with the given
// tags, in one of the scalar encodings.
func tensorboard(t *testing.T, dir string, ss []sample, lossTag, scaleTag string, enc eventfile.ScalarEncoding) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := eventfile.Create(dir, time.Unix(1700000000, 0), "host")
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range ss {
		wall := 1700000000 + float64(i)
		if err := w.AddScalar(lossTag, int64(s.step), wall, float32(s.loss), enc); err != nil {
			t.Fatal(err)
		}
		if !math.IsNaN(s.scale) {
			if err := w.AddScalar(scaleTag, int64(s.step), wall, float32(s.scale), enc); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.AddScalar("train/lr", int64(s.step), wall, 1e-3, enc); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return w.Path()
}

func npy(t *testing.T, vals []float64, dtype tensor.DType) []byte {
	t.Helper()
	tt := &tensor.Tensor{DType: dtype, Shape: []int64{int64(len(vals))}}
	for _, v := range vals {
		switch dtype {
		case tensor.Float64:
			tt.Data = binary.LittleEndian.AppendUint64(tt.Data, math.Float64bits(v))
		default:
			tt.Data = binary.LittleEndian.AppendUint32(tt.Data, math.Float32bits(float32(v)))
		}
	}
	b, err := batch.EncodeNPY(tt)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func isFinite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func write(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// form is one way of writing a simulated run to disk.
type form struct {
	name string
	// every is the sampling interval (1: every step).
	every int
	write func(t *testing.T, dir string, sc scenario, ss []sample) (string, logfile.ReadOptions)
}

var forms = []form{
	{"csv-other-names", 1, func(t *testing.T, dir string, sc scenario, ss []sample) (string, logfile.ReadOptions) {
		names := map[string]string{"step": "iteration", "epoch": "epoch", "loss": "train_loss"}
		if !sc.fp32 {
			names["scale"] = "loss_scale"
		}
		return write(t, dir, sc.name+".csv", writeTable(ss, ",", names, "nan")), logfile.ReadOptions{}
	}},
	{"tsv-pandas-empty-nan", 1, func(t *testing.T, dir string, sc scenario, ss []sample) (string, logfile.ReadOptions) {
		names := map[string]string{"step": "global_step", "epoch": "Epoch", "loss": "Loss"}
		if !sc.fp32 {
			names["scale"], names["skipped"] = "amp_scale", "found_inf"
		}
		return write(t, dir, sc.name+".tsv", writeTable(ss, "\t", names, "")), logfile.ReadOptions{}
	}},
	{"csv-mapped-columns", 1, func(t *testing.T, dir string, sc scenario, ss []sample) (string, logfile.ReadOptions) {
		names := map[string]string{"step": "n", "loss": "objective"}
		if !sc.fp32 {
			names["scale"] = "s"
		}
		return write(t, dir, sc.name+".log", writeTable(ss, ",", names, "NaN")), logfile.ReadOptions{Columns: map[string]string{"step": "n", "loss": "objective", "scale": "s"}}
	}},
	{"json-records", 1, func(t *testing.T, dir string, sc scenario, ss []sample) (string, logfile.ReadOptions) {
		var objs []string
		for _, r := range records(ss, "train_loss", "grad_scale") {
			objs = append(objs, object(r))
		}
		return write(t, dir, sc.name+".json", []byte("["+strings.Join(objs, ",\n")+"]\n")), logfile.ReadOptions{}
	}},
	{"jsonl-records", 1, func(t *testing.T, dir string, sc scenario, ss []sample) (string, logfile.ReadOptions) {
		var b bytes.Buffer
		for _, r := range records(ss, "loss", "scale") {
			b.WriteString(object(r) + "\n")
		}
		return write(t, dir, sc.name+".jsonl", b.Bytes()), logfile.ReadOptions{}
	}},
	{"pandas-to-json", 1, func(t *testing.T, dir string, sc scenario, ss []sample) (string, logfile.ReadOptions) {
		cols := map[string][]string{}
		for i, r := range records(ss, "train_loss", "loss_scale") {
			for k, v := range r {
				cols[k] = append(cols[k], fmt.Sprintf("%q: %s", strconv.Itoa(i), v))
			}
		}
		top := map[string]string{}
		for k, vs := range cols {
			top[k] = "{" + strings.Join(vs, ", ") + "}"
		}
		return write(t, dir, sc.name+".json", []byte(object(top))), logfile.ReadOptions{}
	}},
	{"companion-jsonl", 1, func(t *testing.T, dir string, sc scenario, ss []sample) (string, logfile.ReadOptions) {
		return write(t, dir, sc.name+".jsonl", companion(sc, ss)), logfile.ReadOptions{}
	}},
	{"tfevents-simple-value", 1, func(t *testing.T, dir string, sc scenario, ss []sample) (string, logfile.ReadOptions) {
		d := filepath.Join(dir, sc.name)
		tensorboard(t, d, ss, "train/loss", "amp/loss_scale", eventfile.SimpleValue)
		return d, logfile.ReadOptions{}
	}},
	{"tfevents-tensor-tagged", 1, func(t *testing.T, dir string, sc scenario, ss []sample) (string, logfile.ReadOptions) {
		return tensorboard(t, dir, ss, "Loss/objective", "scaler", eventfile.TensorContent), logfile.ReadOptions{Columns: map[string]string{"loss": "Loss/objective", "scale": "scaler"}}
	}},
	{"csv-every-10", 10, func(t *testing.T, dir string, sc scenario, ss []sample) (string, logfile.ReadOptions) {
		names := map[string]string{"step": "step", "epoch": "epoch", "loss": "loss"}
		if !sc.fp32 {
			names["scale"] = "scale"
		}
		return write(t, dir, sc.name+".csv", writeTable(ss, ",", names, "nan")), logfile.ReadOptions{}
	}},
	{"json-columns-every-10", 10, func(t *testing.T, dir string, sc scenario, ss []sample) (string, logfile.ReadOptions) {
		var steps, losses, scales []string
		for _, s := range ss {
			steps, losses, scales = append(steps, strconv.Itoa(s.step)), append(losses, jsonNum(s.loss)), append(scales, jsonNum(s.scale))
		}
		doc := fmt.Sprintf(`{"global_step": [%s], "train_loss": [%s], "steps_per_epoch": %d`, strings.Join(steps, ","), strings.Join(losses, ","), sc.stepsPerEpoch)
		if !sc.fp32 {
			doc += fmt.Sprintf(`, "loss_scale": [%s], "grad_scaler": {"init_scale": %s, "growth_interval": %d}`, strings.Join(scales, ","), pyFloat(float64(sc.init), false), sc.interval)
		}
		return write(t, dir, sc.name+".json", []byte(doc+"}")), logfile.ReadOptions{}
	}},
}

// TestFormatsGetTheirClass writes every scenario in every form and checks
// the class, and the simulator's counts: exact when the form holds every
// step, bounds that hold the truth when it holds every tenth.
func TestFormatsGetTheirClass(t *testing.T) {
	for _, f := range forms {
		for _, e := range expected {
			t.Run(f.name+"/"+e.scenario, func(t *testing.T) {
				dir := t.TempDir()
				sc := scenarioByName(t, e.scenario)
				sim := sc.run()
				// Sampled logs are written at steps 9, 19, …: the step
				// after every tenth optimizer step.
				path, opt := f.write(t, dir, sc, samples(sc, sim, f.every, f.every-1))
				run, err := logfile.Read(path, opt)
				if err != nil {
					t.Fatal(err)
				}
				var base *trainlog.Log
				if e.baseline != "" {
					bsc := scenarioByName(t, e.baseline)
					bpath, bopt := f.write(t, filepath.Join(dir, "base"), bsc, samples(bsc, bsc.run(), f.every, f.every-1))
					bopt.Baseline, bopt.Series = true, logfile.SeriesLoss
					if base, err = logfile.Read(bpath, bopt); err != nil {
						t.Fatal(err)
					}
				}
				r := analyze(t, run, base, trainlog.DefaultOptions)
				if r.Verdict != e.verdict {
					t.Fatalf("verdict %s (%s), want %s\nnot derived: %q\nnotes: %q", r.Verdict, r.VerdictText, e.verdict, r.NotDerived, r.Notes)
				}
				if r.Scales == nil {
					t.Fatal("no scale reconstruction")
				}
				if f.every == 1 {
					if r.Scales.Skipped != sim.skipped || r.Scales.MinScale != sim.minScale || r.Scales.SkippedLowerBound {
						t.Errorf("skipped %d, min %g (lower bound %v); the simulator skipped %d, min %g", r.Scales.Skipped, r.Scales.MinScale, r.Scales.SkippedLowerBound, sim.skipped, sim.minScale)
					}
					if got := firstNaN(r); got != sim.firstNaN {
						t.Errorf("first NaN at %d, the simulator's at %d", got, sim.firstNaN)
					}
					return
				}
				s := r.Scales
				if !s.SkippedLowerBound || s.SkippedMax == nil || s.Skipped > sim.skipped || len(s.SkippedAt) != 0 {
					t.Errorf("skipped %d (lower bound %v, listed %d), the simulator skipped %d", s.Skipped, s.SkippedLowerBound, len(s.SkippedAt), sim.skipped)
				}
				if r.GradScaler.GrowthIntervalFrom == "log" && *s.SkippedMax < sim.skipped {
					t.Errorf("at most %d skipped with the log's growth_interval, the simulator skipped %d", *s.SkippedMax, sim.skipped)
				}
				if r.Run.Samples != len(run.Losses) || r.Run.SampleEvery != 10 || r.Run.Steps != sc.steps || r.Run.FirstStep != 0 {
					t.Errorf("run %+v", r.Run)
				}
				if !slices.ContainsFunc(r.NotDerived, func(s string) bool { return strings.Contains(s, "which steps were skipped") }) {
					t.Errorf("not derived %q does not say the skipped steps are bounds", r.NotDerived)
				}
				if sim.firstNaN >= 0 {
					// The first NaN lies within one gap before the sample
					// that shows it.
					if got := firstNaN(r); got < sim.firstNaN || got >= sim.firstNaN+10 {
						t.Errorf("first NaN at %d, the simulator's at %d", got, sim.firstNaN)
					}
				}
			})
		}
	}
}

// TestSampledScalesOnly: a log of every tenth scale and no loss still shows
// the NaN (all steps skipped to the end) and the collapse before it.
func TestSampledScalesOnly(t *testing.T) {
	sc := scenarioByName(t, "gradient_overflow_nan")
	sim := sc.run()
	var b bytes.Buffer
	b.WriteString("step,scale\n")
	for _, s := range samples(sc, sim, 10, 9) {
		fmt.Fprintf(&b, "%d,%s\n", s.step, pyFloat(s.scale, true))
	}
	run, err := logfile.Read(write(t, t.TempDir(), "scales.csv", b.Bytes()), logfile.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := analyze(t, run, nil, trainlog.DefaultOptions)
	if r.Verdict != report.ScalesGradientOverflowNaN || r.Scales.InferredNaNStep == nil || *r.Scales.InferredNaNStep != sim.firstNaN {
		t.Fatalf("verdict %s, inferred NaN %v; want %s at %d", r.Verdict, r.Scales.InferredNaNStep, report.ScalesGradientOverflowNaN, sim.firstNaN)
	}
}

// TestSparseBounds checks the bounds on hand-made gaps: growth_interval 4,
// samples every 5 steps.
func TestSparseBounds(t *testing.T) {
	l := &trainlog.Log{Path: "gaps", Scaler: report.ScalerConfig{InitScale: 1024, GrowthInterval: 4}, Steps: []int{4, 9, 14, 19, 24}, FirstStep: 4,
		// 1024 -> 256: two backoffs at least, in five steps; -> 256: none
		// proven (a growth and a backoff may cancel); -> 512: a growth;
		// -> 16: five halvings in five steps, all skipped.
		Scales: []float64{256, 256, 512, 512, 16}}
	r := analyze(t, l, nil, trainlog.DefaultOptions)
	s := r.Scales
	// Lower bounds: 2 + 0 + 0 + 0 + 5. Upper: a gap of 5 steps with net n
	// allows (5+n+3)/5 growths (1, 1, 1, 1, 0), so growths − n backoffs:
	// 3, 1, 0, 1, 5.
	if s.Skipped != 7 || *s.SkippedMax != 10 || s.Growths != 1 || s.LongestBackoffRun != 5 || s.LongestBackoffRunStart != 20 {
		t.Errorf("skipped %d..%d, growths %d, longest run %d from %d; want 7..10, 1, 5 from 20", s.Skipped, *s.SkippedMax, s.Growths, s.LongestBackoffRun, s.LongestBackoffRunStart)
	}
	if s.WarmupSkipped != 2 || s.WarmupScale != 256 {
		t.Errorf("warm-up %d to %g, want 2 to 256", s.WarmupSkipped, s.WarmupScale)
	}
}

// TestHistoryCSV: fastai's CSVLogger history.csv, per epoch, against an
// fp32 history.csv.
func TestHistoryCSV(t *testing.T) {
	history := func(sc scenario) []byte {
		sim := sc.run()
		var b bytes.Buffer
		b.WriteString("epoch,train_loss,valid_loss,accuracy,time\n")
		for e := 0; e*sc.stepsPerEpoch < sc.steps; e++ {
			part := sim.losses[e*sc.stepsPerEpoch : min((e+1)*sc.stepsPerEpoch, sc.steps)]
			// fastai's train_loss is a smoothed loss: NaN once a NaN came.
			loss := math.NaN()
			if len(part) > 0 && !slices.ContainsFunc(part, func(v float64) bool { return !isFinite(v) }) {
				sum := 0.0
				for _, v := range part {
					sum += v
				}
				loss = sum / float64(len(part))
			}
			valid := "#na#"
			if isFinite(loss) {
				valid = fmt.Sprintf("%.6f", loss*1.05)
			}
			fmt.Fprintf(&b, "%d,%.6f,%s,0.5,00:12\n", e, loss, valid)
		}
		return b.Bytes()
	}
	dir := t.TempDir()
	read := func(name string) *trainlog.Log {
		l, err := logfile.Read(write(t, dir, name+"/history.csv", history(scenarioByName(t, name))), logfile.ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	base := read("baseline_fp32")
	tests := []struct {
		run, verdict string
		baseline     *trainlog.Log
	}{
		{"plateau_underflow", report.ScalesPlateauUnexplained, base},
		{"fp16_noise", report.ScalesFP16Noise, base},
		{"early_nan", report.ScalesEarlyNaN, nil},
		{"forward_overflow_nan", report.ScalesLateNaN, nil},
	}
	for _, tt := range tests {
		run := read(tt.run)
		if !run.PerEpoch || run.Format != "fastai-history" || run.ValidLosses == nil {
			t.Fatalf("%s: read as %+v", tt.run, run)
		}
		r := analyze(t, run, tt.baseline, trainlog.DefaultOptions)
		if r.Verdict != tt.verdict {
			t.Errorf("%s: verdict %s (%s), want %s", tt.run, r.Verdict, r.VerdictText, tt.verdict)
		}
		if !slices.ContainsFunc(r.NotDerived, func(s string) bool {
			return strings.Contains(s, "history.csv holds one loss per epoch and no loss scale") && strings.Contains(s, "FP5005")
		}) {
			t.Errorf("%s: not derived %q does not say what per-step scales would tell", tt.run, r.NotDerived)
		}
		if tt.baseline != nil && !slices.ContainsFunc(r.Notes, func(s string) bool { return strings.HasPrefix(s, "valid_loss at epoch 4") }) {
			t.Errorf("%s: notes %q lack the valid_loss comparison", tt.run, r.Notes)
		}
	}
	// A per-step baseline cannot be compared with a per-epoch run.
	r := analyze(t, read("plateau_underflow"), mustRead(t, "baseline_fp32.json"), trainlog.DefaultOptions)
	if r.Comparison != nil || !slices.ContainsFunc(r.NotDerived, func(s string) bool { return strings.Contains(s, "same form") }) {
		t.Errorf("mixed per-epoch and per-step logs compared: %+v %q", r.Comparison, r.NotDerived)
	}
}

// TestPlainLists: np.save'd lists, JSON arrays and one number per line,
// losses or scales decided from the values or by --series.
func TestPlainLists(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		scenario, name, verdict string
		data                    func(sim simulated) []byte
		opt                     logfile.ReadOptions
		wantScales              bool
	}{
		{"gradient_overflow_nan", "scales.npy", report.ScalesGradientOverflowNaN, func(sim simulated) []byte { return npy(t, sim.scales, tensor.Float64) }, logfile.ReadOptions{}, true},
		{"early_nan", "learn_scales.npy", report.ScalesEarlyNaN, func(sim simulated) []byte { return npy(t, sim.scales, tensor.Float32) }, logfile.ReadOptions{}, true},
		{"wasted_warmup", "scales.json", report.ScalesWastedWarmup, func(sim simulated) []byte {
			var parts []string
			for _, v := range sim.scales {
				parts = append(parts, jsonNum(v))
			}
			return []byte("[" + strings.Join(parts, ", ") + "]")
		}, logfile.ReadOptions{}, true},
		{"forward_overflow_nan", "losses.npy", report.ScalesLateNaN, func(sim simulated) []byte { return npy(t, sim.losses, tensor.Float32) }, logfile.ReadOptions{}, false},
		{"healthy", "losses.txt", report.ScalesHealthy, func(sim simulated) []byte {
			var b bytes.Buffer
			b.WriteString("# learn.recorder.losses\n")
			for _, v := range sim.losses {
				b.WriteString(pyFloat(v, true) + "\n")
			}
			return b.Bytes()
		}, logfile.ReadOptions{}, false},
		{"healthy", "values.txt", report.ScalesHealthy, func(sim simulated) []byte {
			var b bytes.Buffer
			for _, v := range sim.scales {
				b.WriteString(pyFloat(v, true) + "\n")
			}
			return b.Bytes()
		}, logfile.ReadOptions{Series: logfile.SeriesLoss}, false},
	}
	for _, tt := range tests {
		sim := scenarioByName(t, tt.scenario).run()
		l, err := logfile.Read(write(t, dir, tt.scenario+"/"+tt.name, tt.data(sim)), tt.opt)
		if err != nil {
			t.Fatalf("%s/%s: %v", tt.scenario, tt.name, err)
		}
		if (l.Scales != nil) != tt.wantScales || (l.Losses != nil) == tt.wantScales {
			t.Errorf("%s/%s: read scales %v, losses %v", tt.scenario, tt.name, l.Scales != nil, l.Losses != nil)
		}
		if r := analyze(t, l, nil, trainlog.DefaultOptions); r.Verdict != tt.verdict {
			t.Errorf("%s/%s: verdict %s (%s), want %s", tt.scenario, tt.name, r.Verdict, r.VerdictText, tt.verdict)
		}
	}
	if _, err := logfile.Read(write(t, dir, "neg.txt", []byte("65536\n-1\n")), logfile.ReadOptions{Series: logfile.SeriesScale}); err == nil ||
		!strings.Contains(err.Error(), "neg.txt:2: want a positive finite loss scale, found -1") || !strings.Contains(err.Error(), "--series loss") {
		t.Errorf("a negative scale: %v", err)
	}
}

// fastaiList is what fastai's MixedPrecision.scales holds for a run: the
// scale used by every step that was not skipped.
func fastaiList(sc scenario, sim simulated) []float64 {
	var out []float64
	used := float64(sc.init)
	for _, s := range sim.scales {
		if s >= used {
			out = append(out, used)
		}
		used = s
	}
	return out
}

// TestFastaiScalesRebuilt: the skipped steps between the entries of
// fastai's list follow from their ratios; once a growth shows the
// interval, the rebuilt series is the simulator's, up to its last step
// that was not skipped.
func TestFastaiScalesRebuilt(t *testing.T) {
	// Gradients shrinking over training: the scale grows and keeps its
	// growths, with overflows when it overshoots.
	sc := scenario{name: "shrinking", steps: 600, stepsPerEpoch: 100, init: 65536, interval: 20, nanFrom: -1, penalty: 1, seed: 9,
		gmax: func(t int) float64 { return 300 * math.Pow(2, -float64(t)/40) }, forceInf: hashed(0, 0.02)}
	sim := sc.run()
	list := fastaiList(sc, sim)
	l, err := logfile.Read(write(t, t.TempDir(), "mixed_precision_scales.npy", npy(t, list, tensor.Float32)), logfile.ReadOptions{Series: logfile.SeriesFastaiScales})
	if err != nil {
		t.Fatal(err)
	}
	last := len(sim.scales) - 1
	for last >= 0 && sim.scales[last] < prevScale(sc, sim, last) {
		last--
	}
	if !slices.Equal(l.Scales, sim.scales[:last+1]) {
		t.Fatalf("rebuilt %d scales, want the simulator's %d; first difference at %d", len(l.Scales), last+1, firstDiff(l.Scales, sim.scales[:last+1]))
	}
	r := analyze(t, l, nil, trainlog.DefaultOptions)
	if r.GradScaler.GrowthInterval != 20 {
		t.Errorf("growth interval %d, want 20", r.GradScaler.GrowthInterval)
	}
	// The healthy run's growths are all undone by the next step: the list
	// never grows, the interval is unknown, and those pairs are not
	// counted; the rest is.
	hsc := scenarioByName(t, "healthy")
	hsim := hsc.run()
	var parts []string
	for _, v := range fastaiList(hsc, hsim) {
		parts = append(parts, jsonNum(v))
	}
	l, err = logfile.Read(write(t, t.TempDir(), "scales.json", []byte("["+strings.Join(parts, ",")+"]")), logfile.ReadOptions{Series: logfile.SeriesFastaiScales})
	if err != nil {
		t.Fatal(err)
	}
	r = analyze(t, l, nil, trainlog.DefaultOptions)
	if r.Verdict != report.ScalesHealthy || r.Scales.Skipped > hsim.skipped || r.Scales.WarmupSkipped != 2 ||
		!slices.ContainsFunc(r.NotDerived, func(s string) bool { return strings.Contains(s, "cancelled") }) {
		t.Errorf("healthy fastai list: %s, skipped %d (simulator %d), warm-up %d, not derived %q", r.Verdict, r.Scales.Skipped, hsim.skipped, r.Scales.WarmupSkipped, r.NotDerived)
	}
}

func prevScale(sc scenario, sim simulated, i int) float64 {
	if i == 0 {
		return float64(sc.init)
	}
	return sim.scales[i-1]
}

func firstDiff(a, b []float64) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestTensorBoardTags: without a recognisable tag the refusal lists the
// tags found; a restarted run's points are dropped the way TensorBoard
// drops them; a damaged file names its byte offset.
func TestTensorBoardTags(t *testing.T) {
	dir := t.TempDir()
	sc := scenarioByName(t, "healthy")
	ss := samples(sc, sc.run(), 1, 0)
	path := tensorboard(t, dir, ss, "objective", "amp_state", eventfile.TensorFloatVal)
	_, err := logfile.Read(path, logfile.ReadOptions{})
	var pe *logfile.ParseError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), `"amp_state", "objective", "train/lr"`) || !strings.Contains(err.Error(), "--tag loss=TAG,scale=TAG") {
		t.Errorf("no recognisable tag: %v", err)
	}
	if _, err := logfile.Read(path, logfile.ReadOptions{Columns: map[string]string{"loss": "train/loss"}}); err == nil || !strings.Contains(err.Error(), "--tag loss=train/loss: no such scalar tag") {
		t.Errorf("a tag that is not there: %v", err)
	}

	// Two event files in one directory: the second run restarts at 500.
	rdir := filepath.Join(dir, "restart")
	if err := os.MkdirAll(rdir, 0o755); err != nil {
		t.Fatal(err)
	}
	w1, _ := eventfile.Create(rdir, time.Unix(1700000000, 0), "a")
	w2, _ := eventfile.Create(rdir, time.Unix(1700000100, 0), "a")
	for _, s := range ss[:700] {
		if err := w1.AddScalar("loss", int64(s.step), 0, 9, eventfile.SimpleValue); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range ss[500:] {
		if err := w2.AddScalar("loss", int64(s.step), 0, float32(s.loss), eventfile.SimpleValue); err != nil {
			t.Fatal(err)
		}
	}
	w1.Close()
	w2.Close()
	l, err := logfile.Read(rdir, logfile.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Len() != 800 || l.Losses[600] != ss[600].loss || l.Losses[400] != 9 || !slices.ContainsFunc(l.Notes, func(s string) bool { return strings.Contains(s, "200 points of an earlier run") }) {
		t.Errorf("restart: %d entries, loss[600] %g, loss[400] %g, notes %q", l.Len(), l.Losses[600], l.Losses[400], l.Notes)
	}

	data, _ := os.ReadFile(path)
	data[40] ^= 0xff
	bad := write(t, dir, "events.out.tfevents.1.bad", data)
	if _, err := logfile.Read(bad, logfile.ReadOptions{}); err == nil || !strings.Contains(err.Error(), "events.out.tfevents.1.bad: record at byte") || !strings.Contains(err.Error(), "SummaryWriter") {
		t.Errorf("a damaged event file: %v", err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.MkdirAll(filepath.Join(empty, "run1"), 0o755); err != nil {
		t.Fatal(err)
	}
	tensorboard(t, filepath.Join(empty, "run1"), ss[:5], "loss", "scale", eventfile.SimpleValue)
	if _, err := logfile.Read(empty, logfile.ReadOptions{}); err == nil || !strings.Contains(err.Error(), "run1") || !strings.Contains(err.Error(), "pass one of them") {
		t.Errorf("a log directory of runs: %v", err)
	}
}

// TestEmptyCells: pandas writes NaN as an empty cell; a loss logged less
// often than the scale leaves empty cells that are no NaN.
func TestEmptyCells(t *testing.T) {
	dir := t.TempDir()
	l, err := logfile.Read(write(t, dir, "pandas.csv", []byte("step,loss,scale\n0,2.5,65536\n1,,32768\n2,2.4,32768\n")), logfile.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !math.IsNaN(l.Losses[1]) || l.Len() != 3 {
		t.Errorf("losses %v", l.Losses)
	}
	var b bytes.Buffer
	b.WriteString("step,loss,scale\n")
	for i := range 100 {
		loss := ""
		if i%10 == 0 {
			loss = "2.5"
		}
		fmt.Fprintf(&b, "%d,%s,65536\n", i, loss)
	}
	l, err = logfile.Read(write(t, dir, "merged.csv", b.Bytes()), logfile.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Len() != 10 || slices.ContainsFunc(l.Losses, math.IsNaN) || l.Steps[1] != 10 {
		t.Errorf("a loss logged every 10 rows: %d entries, losses %v", l.Len(), l.Losses)
	}
	// Hugging Face's trainer_state.json: evaluation records among the
	// training ones, fractional epochs.
	hf := `{"global_step": 30, "log_history": [{"epoch": 0.33, "learning_rate": 1e-4, "loss": 2.5, "step": 10},
		{"epoch": 0.67, "learning_rate": 1e-4, "loss": 2.1, "step": 20}, {"epoch": 1.0, "learning_rate": 1e-4, "loss": 1.9, "step": 30},
		{"epoch": 1.0, "eval_loss": 2.0, "step": 30}]}`
	l, err = logfile.Read(write(t, dir, "trainer_state.json", []byte(hf)), logfile.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(l.Steps, []int{10, 20, 30}) || !slices.Equal(l.Losses, []float64{2.5, 2.1, 1.9}) || !slices.Equal(l.Epochs, []int{0, 0, 0}) {
		t.Errorf("trainer_state.json: steps %v losses %v epochs %v", l.Steps, l.Losses, l.Epochs)
	}
}

// TestCompanionLog: the companion's own fields: an unfinished run, a
// disabled scaler, skipped flags against the scale.
func TestCompanionLog(t *testing.T) {
	dir := t.TempDir()
	head := `{"kind":"header","format":"fp16audit.trainlog","version":1,"source":"fastai","grad_scaler":{"enabled":true,"class":"GradScaler","init_scale":65536.0,"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":2000},"steps_per_epoch":3,"telemetry":null,"future_field":1}` + "\n"
	steps := `{"kind":"step","step":0,"epoch":0,"iter":0,"loss":2.5,"scale":32768.0,"scale_used":65536.0,"skipped":true}
{"kind":"future","x":1}
{"kind":"step","step":1,"epoch":0,"iter":1,"loss":"NaN","scale":32768.0,"scale_used":32768.0,"skipped":true}
{"kind":"step","step":2,"epoch":0,"iter":2,"loss":Infinity,"scale":16384.0,"scale_used":32768.0,"skipped":true}
`
	l, err := logfile.Read(write(t, dir, "run.jsonl", []byte(head+steps)), logfile.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Scaler.GrowthInterval != 2000 || !math.IsNaN(l.Losses[1]) || !math.IsInf(l.Losses[2], 1) || !slices.Equal(l.Skipped, []int8{1, 1, 1}) ||
		!slices.ContainsFunc(l.Notes, func(s string) bool { return strings.Contains(s, "no end line") }) {
		t.Errorf("read %+v", l)
	}
	r := analyze(t, l, nil, trainlog.DefaultOptions)
	if !slices.ContainsFunc(r.Notes, func(s string) bool { return strings.Contains(s, "marks 1 steps skipped whose scale did not back off") }) {
		t.Errorf("notes %q", r.Notes)
	}
	fp32 := strings.Replace(head, `{"enabled":true,"class":"GradScaler","init_scale":65536.0,"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":2000}`, `{"enabled":false,"class":"GradScaler"}`, 1) +
		`{"kind":"step","step":0,"epoch":0,"iter":0,"loss":2.5,"scale":null,"scale_used":null,"skipped":false}` + "\n"
	l, err = logfile.Read(write(t, dir, "fp32.jsonl", []byte(fp32)), logfile.ReadOptions{})
	if err != nil || l.Scales != nil || l.Losses == nil {
		t.Errorf("an fp32 run: %+v %v", l, err)
	}
}

// TestSkippedColumnOnly: a log that marks skipped steps but records no
// scale: the skipped steps are exact, the scale is rebuilt.
func TestSkippedColumnOnly(t *testing.T) {
	sc := scenarioByName(t, "plateau_underflow")
	sim := sc.run()
	names := map[string]string{"step": "step", "loss": "loss", "skipped": "overflow"}
	l, err := logfile.Read(write(t, t.TempDir(), "run.csv", writeTable(samples(sc, sim, 1, 0), ",", names, "nan")), logfile.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := analyze(t, l, nil, trainlog.DefaultOptions)
	if r.Run.HasScales || r.Scales == nil || r.Scales.Skipped != sim.skipped ||
		!slices.ContainsFunc(r.Notes, func(s string) bool { return strings.Contains(s, "rebuilt with GradScaler's rule") }) {
		t.Errorf("has scales %v, skipped %v (simulator %d), notes %q", r.Run.HasScales, r.Scales, sim.skipped, r.Notes)
	}
}

// TestScaleLoggedLessOften: the loss of every step, the scale of every
// tenth (empty cells between): the NaN step is exact, the skipped steps
// are bounds.
func TestScaleLoggedLessOften(t *testing.T) {
	sc := scenarioByName(t, "gradient_overflow_nan")
	sim := sc.run()
	var b bytes.Buffer
	b.WriteString("step,loss,scale\n")
	for _, s := range samples(sc, sim, 1, 0) {
		scale := ""
		if s.step%10 == 9 {
			scale = pyFloat(s.scale, true)
		}
		fmt.Fprintf(&b, "%d,%s,%s\n", s.step, pyFloat(s.loss, true), scale)
	}
	l, err := logfile.Read(write(t, t.TempDir(), "run.csv", b.Bytes()), logfile.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := analyze(t, l, nil, trainlog.DefaultOptions)
	if r.Verdict != report.ScalesGradientOverflowNaN || firstNaN(r) != sim.firstNaN || !r.Scales.SkippedLowerBound || r.Scales.Skipped > sim.skipped ||
		!strings.Contains(r.VerdictText, fmt.Sprintf("at step %d", sim.firstNaN)) {
		t.Errorf("verdict %s (%s), first NaN %d, skipped %d (lower bound %v); simulator: NaN %d, %d skipped",
			r.Verdict, r.VerdictText, firstNaN(r), r.Scales.Skipped, r.Scales.SkippedLowerBound, sim.firstNaN, sim.skipped)
	}
}

// TestTinySampledLogs: degenerate sampled, per-epoch and telemetry logs
// give a verdict and a report that renders.
func TestTinySampledLogs(t *testing.T) {
	nan := math.NaN()
	logs := []*trainlog.Log{
		{Path: "one-sample", FirstStep: 9, Steps: []int{9}, Scales: []float64{16384}},
		{Path: "far", FirstStep: 5000, Steps: []int{5000, 5010}, Scales: []float64{1024, 512}},
		{Path: "far-one", FirstStep: 5000, Steps: []int{5000}, Scales: []float64{1024}, Losses: []float64{nan}},
		{Path: "nan-samples", FirstStep: 9, Steps: []int{9, 19}, Losses: []float64{nan, nan}, Scales: []float64{32768, 32}},
		{Path: "to-zero", FirstStep: 0, Steps: []int{0, 10, 20}, Scales: []float64{1e-40, 1e-44, 0}},
		{Path: "holes", Scales: []float64{nan, 65536, nan}, Losses: []float64{1, 1, 1}},
		{Path: "epoch", PerEpoch: true, Losses: []float64{nan}, ValidLosses: []float64{nan}, Epochs: []int{0}},
		{Path: "telemetry", Scales: []float64{32768}, TelemetryModules: 2, Telemetry: []trainlog.TelemetryLine{{Step: 0, Skip: true, Full: true, Scale: 65536,
			Modules: []trainlog.ModuleGrads{{Name: "a", Output: &trainlog.GradSummary{NonFinite: 1}}, {Name: "b", Params: &trainlog.GradSummary{Nonzero: new(int)}}}}}},
	}
	for _, l := range logs {
		r := analyze(t, l, nil, trainlog.DefaultOptions)
		if !slices.Contains(scalesVerdicts, r.Verdict) {
			t.Errorf("%s: verdict %q", l.Path, r.Verdict)
		}
		if _, err := json.Marshal(r); err != nil {
			t.Errorf("%s: %v", l.Path, err)
		}
		if err := renderAs(io.Discard, r, "text"); err != nil {
			t.Errorf("%s: %v", l.Path, err)
		}
	}
}
