package audit_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"fp16audit/internal/audit"
	"fp16audit/internal/render"
	"fp16audit/internal/testutil/ortinit"
	"fp16audit/report"
)

// The run fixtures are real CPU-fp16 training runs that fail by themselves
// (fixtures/torch/runs.py): each holds the recorder's log, its captures and
// PyTorch's record at every captured step.
const runsDir = "../../fixtures/torch/runs"

type runTruth struct {
	Run      string
	Captures []capTruth
}

// capTruth is PyTorch's record at one captured step.
type capTruth struct {
	Trigger, Capture, Class string
	Step                    int
	Data                    struct {
		NonFinite  []int64 `json:"nonfinite_samples"`
		OutOfRange []int64 `json:"out_of_range_samples"`
	}
	FP16Forward struct {
		Reaching  *string  `json:"first_reaching_output"`
		NonFinite []string `json:"nonfinite"`
	} `json:"fp16_forward"`
	FP16Backward struct {
		First *string `json:"first_nonfinite"`
	} `json:"fp16_backward"`
	LargestFiniteExp *int               `json:"largest_finite_exp"`
	LostMass         map[string]float64 `json:"lost_mass"`
	// WeightsBeyondFP16 are the parameters autocast's cast makes
	// infinite (|w| >= 65520), by their state names (absent from the
	// truth of runs made before it was recorded: none).
	WeightsBeyondFP16 []string `json:"weights_beyond_fp16"`
}

// stateMaxAbs is max |w| of the float32 tensor name in a capture's
// state/model.safetensors, which the recorder wrote from the model's
// state_dict at the captured step; -1 where the state lacks it.
func stateMaxAbs(t *testing.T, capDir, name string) float64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(capDir, "state", "model.safetensors"))
	if err != nil || len(data) < 8 {
		t.Fatalf("state of %s: %v", capDir, err)
	}
	n := binary.LittleEndian.Uint64(data[:8])
	var header map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+n], &header); err != nil {
		t.Fatal(err)
	}
	raw, ok := header[name]
	if !ok {
		return -1
	}
	var e struct {
		DType   string  `json:"dtype"`
		Offsets []int64 `json:"data_offsets"`
	}
	if err := json.Unmarshal(raw, &e); err != nil || e.DType != "F32" || len(e.Offsets) != 2 {
		t.Fatalf("state tensor %s: %s (%v)", name, raw, err)
	}
	m := 0.0
	body := data[8+n:]
	for off := e.Offsets[0]; off < e.Offsets[1]; off += 4 {
		m = math.Max(m, math.Abs(float64(math.Float32frombits(binary.LittleEndian.Uint32(body[off:])))))
	}
	return m
}

func readRunTruth(t *testing.T, dir string) runTruth {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "truth.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tr runTruth
	if err := json.Unmarshal(data, &tr); err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestReplayRuns replays every capture of the run fixtures and holds the
// replay to PyTorch's record: the class, the culprit module (the overflow
// that reaches the loss, the first gradient to overflow, the modules
// losing their gradients), the largest scale that passes, the samples.
func TestReplayRuns(t *testing.T) {
	ortinit.Init(t)
	runs, err := filepath.Glob(filepath.Join(runsDir, "*", "truth.json"))
	if err != nil || len(runs) < 6 {
		t.Fatalf("want the run fixtures under %s (fixtures/torch/runs.py), found %d (%v)", runsDir, len(runs), err)
	}
	classes := map[string]bool{}
	for _, tf := range runs {
		dir := filepath.Dir(tf)
		tr := readRunTruth(t, dir)
		for _, c := range tr.Captures {
			t.Run(tr.Run+"/"+c.Trigger, func(t *testing.T) {
				r, err := audit.Replay(context.Background(), audit.ReplayConfig{Capture: filepath.Join(dir, filepath.FromSlash(c.Capture))})
				if err != nil {
					t.Fatal(err)
				}
				classes[c.Class] = true
				if r.Verdict != c.Class {
					t.Fatalf("verdict %s, PyTorch's record says %s: %s", r.Verdict, c.Class, r.VerdictText)
				}
				if r.Capture.Step != c.Step {
					t.Errorf("step %d, the truth's %d", r.Capture.Step, c.Step)
				}
				cu := r.Culprit
				switch c.Class {
				case report.ReplayForwardOverflow:
					if cu == nil || c.FP16Forward.Reaching == nil || cu.Module != *c.FP16Forward.Reaching {
						t.Errorf("culprit %+v; PyTorch's first module whose Inf reaches the loss is %v", cu, deref(c.FP16Forward.Reaching))
					}
					beyond := c.WeightsBeyondFP16
					if beyond == nil && cu != nil && cu.Kind == report.CulpritWeight {
						// a run recorded before the truth listed them:
						// the weight as PyTorch saved it at the step
						if stateMaxAbs(t, filepath.Join(dir, filepath.FromSlash(c.Capture)), cu.Weight) >= 65520 {
							beyond = []string{cu.Weight}
						}
					}
					switch {
					case cu == nil:
					case len(beyond) > 0:
						// a weight past fp16: PyTorch's autocast casts the
						// master weight, whatever the activations
						if cu.Kind != report.CulpritWeight || !slices.Contains(beyond, cu.Weight) || cu.WeightMaxAbs == nil || *cu.WeightMaxAbs < 65520 {
							t.Errorf("culprit %s %s (graph %q, max |w| %v); PyTorch's weights past fp16 are %v", cu.Kind, cu.Weight, cu.Initializer, cu.WeightMaxAbs, beyond)
						}
					case cu.Kind != report.CulpritActivation || cu.FP32MaxAbs == nil || *cu.FP32MaxAbs <= 65504:
						t.Errorf("culprit %s, fp32 max %v: want an activation past 65504", cu.Kind, cu.FP32MaxAbs)
					}
					if cu != nil && len(cu.Earlier) == 0 {
						t.Errorf("no logged magnitude before the capture; the log's telemetry has the module's forward maxima")
					}
				case report.ReplayGradientOverflow:
					g := r.Gradient
					if g == nil || c.FP16Backward.First == nil || g.Module != *c.FP16Backward.First {
						t.Errorf("gradient %+v; PyTorch's first non-finite gradient, in backward order, is in %v", g, deref(c.FP16Backward.First))
					}
					if g != nil && (g.MaxCleanExp == nil || c.LargestFiniteExp == nil || *g.MaxCleanExp != *c.LargestFiniteExp) {
						t.Errorf("largest scale without overflow %v, PyTorch's 2^%v", derefInt(g.MaxCleanExp), derefInt(c.LargestFiniteExp))
					}
				case report.ReplayUnderflow:
					u := r.Underflow
					var got []string
					if u != nil {
						for _, m := range u.Modules {
							got = append(got, m.Module)
						}
					}
					for p, lost := range c.LostMass {
						mod := p[:strings.LastIndex(p, ".")]
						if lost > 0.5 && !slices.Contains(got, mod) {
							t.Errorf("PyTorch's fp16 backward loses %.0f%% of %s's gradient norm; the replay names %v", 100*lost, p, got)
						}
					}
					if !hasWorkingFix(r, report.FixBF16) {
						t.Errorf("bf16 not verified to keep the gradients: %+v", r.Fixes)
					}
				case report.ReplayDataNonFinite:
					if r.Data == nil || !slices.Equal(r.Data.Samples, c.Data.NonFinite) {
						t.Errorf("data %+v, PyTorch's non-finite samples %v", r.Data, c.Data.NonFinite)
					}
				case report.ReplayDataRange:
					if r.Data == nil || !slices.Equal(r.Data.Samples, c.Data.OutOfRange) {
						t.Errorf("data %+v, the samples beyond fp16's range %v", r.Data, c.Data.OutOfRange)
					}
				}
				if r.Timeline == nil || len(r.Timeline.Steps) == 0 {
					t.Errorf("no timeline from the capture's log")
				}
				renderReplay(t, r)
			})
		}
	}
	for _, want := range []string{report.ReplayForwardOverflow, report.ReplayGradientOverflow, report.ReplayUnderflow,
		report.ReplayDataNonFinite, report.ReplayDataRange, report.ReplayNotReproduced} {
		if !classes[want] {
			t.Errorf("no run fixture of class %s", want)
		}
	}
}

// TestHealthyRunNoCapture: the healthy run, with its warm-up skips, wrote
// no capture and no capture line.
func TestHealthyRunNoCapture(t *testing.T) {
	dir := filepath.Join(runsDir, "healthy")
	tr := readRunTruth(t, dir)
	if len(tr.Captures) != 0 {
		t.Fatalf("the healthy run has captures: %+v", tr.Captures)
	}
	if _, err := os.Stat(filepath.Join(dir, "captures")); err == nil {
		t.Errorf("the healthy run has a captures folder")
	}
	log, err := os.ReadFile(filepath.Join(dir, "log.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(log), `"kind":"capture"`) {
		t.Errorf("the healthy run's log has a capture line")
	}
	if !strings.Contains(string(log), `"skipped":true`) {
		t.Errorf("the healthy run's log has no warm-up skip: it does not test that warm-up raises no alarm")
	}
}

// TestReplayInTheTrainersWords: a capture says which trainer made it,
// and the replay's fixes, the step's own audit's included, are in that
// trainer's words, from the one table; the text report shows them beside
// PyTorch's.
func TestReplayInTheTrainersWords(t *testing.T) {
	ortinit.Init(t)
	src := filepath.Join(runsDir, "collapse", "captures", "step-000023-scale-collapse")
	for trainer, want := range map[string]string{
		"transformers": "bf16=True in TrainingArguments",
		"lightning":    `Trainer(precision="bf16-mixed")`,
		"accelerate":   `Accelerator(mixed_precision="bf16")`,
		"torch":        "dtype=torch.bfloat16",
	} {
		t.Run(trainer, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "capture")
			if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
				t.Fatal(err)
			}
			// the manifest is the one file the capture does not hash
			var m map[string]any
			data, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
			if err == nil {
				err = json.Unmarshal(data, &m)
			}
			if err != nil {
				t.Fatal(err)
			}
			m["trainer"] = trainer
			if data, err = json.Marshal(m); err == nil {
				err = os.WriteFile(filepath.Join(dir, "manifest.json"), data, 0o644)
			}
			if err != nil {
				t.Fatal(err)
			}
			r, err := audit.Replay(context.Background(), audit.ReplayConfig{Capture: dir})
			if err != nil {
				t.Fatal(err)
			}
			var bf16 []string
			for _, f := range r.Fixes {
				if strings.Contains(f.Summary+f.Words, "learn.") {
					t.Errorf("fix %s is in fastai's words: %q, %q", f.Kind, f.Summary, f.Words)
				}
				if f.Kind == report.FixBF16 {
					bf16 = append(bf16, f.Summary, f.Words)
				}
			}
			if !strings.Contains(strings.Join(bf16, " | "), want) {
				t.Errorf("the bf16 fix says %q, want %q", bf16, want)
			}
			var b bytes.Buffer
			f, err := render.New("text", report.KindReplay, render.Options{})
			if err == nil {
				err = f.Render(&b, r)
			}
			if err != nil || !strings.Contains(b.String(), r.Capture.TrainerLabel+": ") {
				t.Errorf("the text report does not name the trainer %q beside its words (%v)", r.Capture.TrainerLabel, err)
			}
		})
	}
}

// renderReplay renders r in every format and reads its JSON back.
func renderReplay(t *testing.T, r *report.ReplayReport) {
	t.Helper()
	for _, format := range render.Formats(report.KindReplay) {
		f, err := render.New(format, report.KindReplay, render.Options{})
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := f.Render(&b, r); err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		out := b.String()
		if !strings.Contains(out, r.Verdict) {
			t.Errorf("%s rendering does not say the verdict %s", format, r.Verdict)
		}
		if format == "json" {
			var back report.ReplayReport
			if err := json.Unmarshal(b.Bytes(), &back); err != nil || back.Verdict != r.Verdict || back.Schema != report.ReplaySchema {
				t.Errorf("json: read back %v (%v)", back.Verdict, err)
			}
		}
		if format == "html" && (!strings.Contains(out, "<svg") || !strings.Contains(out, "srcdoc=")) {
			t.Errorf("html: no timeline chart or no training audit")
		}
	}
}

func hasWorkingFix(r *report.ReplayReport, kind string) bool {
	return slices.ContainsFunc(r.Fixes, func(f report.ReplayFix) bool { return f.Kind == kind && f.Works != nil && *f.Works })
}

func deref(s *string) string {
	if s == nil {
		return "<none>"
	}
	return *s
}

func derefInt(p *int) any {
	if p == nil {
		return "<none>"
	}
	return *p
}
