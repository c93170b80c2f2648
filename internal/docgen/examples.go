package docgen

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"fp16audit/fixtures"
	"fp16audit/internal/batch"
)

// An example is the report of a fixture that reaches a verdict.
type example struct {
	// Source says where the fixture comes from and who established its
	// outcome; Command is the command line as a user types it.
	Source, Command string
	// Simulated: the input is no real run (a training log the tests
	// simulate), and the page says so.
	Simulated bool
	// Text and HTML are the report as text and as the HTML page; JSON is
	// the document.
	Text, HTML []byte
	JSON       map[string]any
}

// candidate is an invocation that may reach a verdict.
type candidate struct {
	// name is the fixture's name, which examplePreference matches.
	name   string
	source string
	args   []string // fp16audit's arguments, without --format
	shown  string   // the command as the page shows it ("" = args)
	// want are the verdicts its truth expects (nil: any; the candidate is
	// tried for every verdict of its command).
	want      []string
	simulated bool
	// replace rewrites temporary paths in the outputs.
	replace *strings.Replacer
}

// expects reports whether c may show verdict id.
func (c candidate) expects(id string) bool { return c.want == nil || slices.Contains(c.want, id) }

// examplePreference names, by verdict page ("command/verdict"), the
// fixtures a newcomer recognises, tried before the others, which keep
// their order: real PyTorch fixtures first, then generated or simulated
// ones, each folder in name order. A verdict without an entry shows the
// first fixture in that order that reaches it, so a new verdict needs no
// entry to get its page.
var examplePreference = map[string][]string{
	// raw 0-255 image pixels, the classic (before the raw waveform)
	"run/unnormalized-input": {"resnet_raw_pixels"},
	// a normalized ResNet, the model most users start from
	"run/healthy": {"resnet_normalized"},
	// h = fc1(x).half(): the shortest cast a user writes
	"run/explicit-half-cast": {"explicit_cast_after_linear"},
	// a ResNet classifier (the first fixture is an eval export on raw pixels)
	"train/healthy": {"resnet_small"},
	// near-duplicate pairs whose fp16 distance is 0, PyTorch's own class
	// (the first fixture overflows in its forward already)
	"train/backward-overflow-every-scale": {"siamese_near"},
	// a NaN in one sample of a plain loop's batch
	"scales/recovered-nan": {"bad_batch_nan"},
	// the capture at the collapse's onset, where clipping still saves the run
	"replay/gradient-overflow": {"collapse/step-000023-scale-collapse"},
	// an activation that grows with training, in a plain loop
	"replay/forward-overflow": {"forward_growth/step-000045-nonfinite-loss"},
}

// ordered returns cands with the preferred fixtures of page key first,
// in the preference's order, the others after them in theirs.
func ordered(cands []candidate, key string) []candidate {
	pref := examplePreference[key]
	rank := func(c candidate) int {
		if i := slices.Index(pref, c.name); i >= 0 {
			return i
		}
		return len(pref)
	}
	out := slices.Clone(cands)
	sort.SliceStable(out, func(i, j int) bool { return rank(out[i]) < rank(out[j]) })
	return out
}

// forwardCandidates lists the fixtures whose recorded outcome is verdict
// id: first the real PyTorch exports whose truth.json (PyTorch's own
// outcome under autocast-fp16, fixtures/torch/oracle.py) says so, then
// the generated fixtures (fixtures.All) that expect it.
func forwardCandidates(id string) ([]candidate, error) {
	truths, err := filepath.Glob("fixtures/torch/cases*/*/truth.json")
	if err != nil {
		return nil, err
	}
	sort.Strings(truths)
	var out []candidate
	for _, p := range truths {
		var truth struct {
			Title    string `json:"title"`
			MadeWith struct {
				Torch    string `json:"torch"`
				Exporter string `json:"exporter"`
			} `json:"made_with"`
			Model    struct{ File string } `json:"model"`
			Policies map[string]struct {
				Verdict string `json:"verdict"`
			} `json:"policies"`
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, &truth); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		dir := filepath.Dir(p)
		if truth.Policies["autocast-fp16"].Verdict != id || truth.Model.File == "" {
			continue
		}
		if fi, err := os.Stat(filepath.Join(dir, "batches")); err != nil || !fi.IsDir() {
			continue
		}
		out = append(out, candidate{
			name: filepath.Base(dir),
			source: fmt.Sprintf("`%s`: %s, exported by %s under torch %s; PyTorch's own outcome under autocast fp16 (`%s`) is %s.",
				dir, truth.Title, truth.MadeWith.Exporter, truth.MadeWith.Torch, p, id),
			args: []string{"run", filepath.Join(dir, truth.Model.File), "-i", filepath.Join(dir, "batches")},
			want: []string{id},
		})
	}
	for _, f := range fixtures.All() {
		for _, b := range f.Batches {
			if b.Expect.Verdict != id || f.ExternalData != "" {
				continue
			}
			out = append(out, candidate{
				name: f.Name,
				source: fmt.Sprintf("`fixtures/models/%s.onnx`, a model the fixture generator builds (`fixtures/`): %s The batch: %s",
					f.Name, sentence(f.Doc), sentence(b.Doc)),
				args: []string{"run", "fixtures/models/" + f.Name + ".onnx", "-i", "fixtures/batches/" + b.Name + ".npy"},
				want: []string{id},
			})
		}
	}
	return out, nil
}

// trainCandidates lists the training fixtures (fixtures/torch/train*/,
// PyTorch's autograd recorded beside each in manifest.json; a name once,
// from the first folder that has it) in train mode with their loss, at
// GradScaler's default initial scale and at a low one (2^8); the batch and
// targets are written as .npy files to tmp. A fixture whose manifest
// entry records PyTorch's class (truth.class) is tried for that verdict
// only.
func trainCandidates(tmp string) ([]candidate, error) {
	manifests, err := filepath.Glob("fixtures/torch/train*/manifest.json")
	if err != nil {
		return nil, err
	}
	sort.Strings(manifests)
	type fixture struct {
		Name, Model, Data, Loss, Target, Note, Output string
		Inputs                                        []struct{ Key, Name string }
		ClassAxis                                     *int `json:"class_axis"`
		Shift                                         bool
		IgnoreIndex                                   *int `json:"ignore_index"`
		Truth                                         *struct{ Class string }
		dir                                           string
	}
	var all []fixture
	seen := map[string]bool{}
	for _, mp := range manifests {
		b, err := os.ReadFile(mp)
		if err != nil {
			return nil, err
		}
		var manifest struct{ Fixtures []fixture }
		if err := json.Unmarshal(b, &manifest); err != nil {
			return nil, fmt.Errorf("%s: %w", mp, err)
		}
		for _, f := range manifest.Fixtures {
			if seen[f.Name] {
				continue
			}
			seen[f.Name] = true
			f.dir = filepath.Dir(mp)
			all = append(all, f)
		}
	}
	var out []candidate
	for _, init := range []string{"", "256"} {
		for _, f := range all {
			dir := f.dir
			arrays, err := batch.ReadNPZ(filepath.Join(dir, f.Data))
			if err != nil {
				return nil, err
			}
			write := func(key, name string) (string, error) {
				for _, a := range arrays {
					if a.Name == key {
						data, err := batch.EncodeNPY(a)
						if err != nil {
							return "", err
						}
						p := filepath.Join(tmp, f.Name+"_"+name+".npy")
						return p, os.WriteFile(p, data, 0o644)
					}
				}
				return "", fmt.Errorf("%s/%s: no array %q", dir, f.Data, key)
			}
			args := []string{"run", filepath.Join(dir, f.Model)}
			for _, in := range f.Inputs {
				p, err := write(in.Key, in.Name)
				if err != nil {
					return nil, err
				}
				args = append(args, "-i", in.Name+"="+p)
			}
			target, err := write(f.Target, "target")
			if err != nil {
				return nil, err
			}
			args = append(args, "--mode", "train", "--loss", f.Loss, "--target", target, "--loss-output", f.Output)
			if f.ClassAxis != nil && *f.ClassAxis == -1 {
				args = append(args, "--class-axis", "last")
			} else if f.ClassAxis != nil {
				args = append(args, "--class-axis", strconv.Itoa(*f.ClassAxis))
			}
			if f.Shift {
				args = append(args, "--lm-shift")
			}
			if f.IgnoreIndex != nil && *f.IgnoreIndex != -100 {
				args = append(args, "--ignore-index", strconv.Itoa(*f.IgnoreIndex))
			}
			if init != "" {
				args = append(args, "--init-scale", init)
			}
			c := candidate{
				name: f.Name,
				source: fmt.Sprintf("`%s/%s` with the batch and targets of `%s/%s`: %s PyTorch's autograd for it is recorded in `%s/manifest.json`.",
					dir, f.Model, dir, f.Data, sentence(f.Note), dir),
				args:    args,
				replace: strings.NewReplacer(tmp+string(filepath.Separator), ""),
			}
			if f.Truth != nil && f.Truth.Class != "" {
				c.want = []string{f.Truth.Class}
				c.source += fmt.Sprintf(" There PyTorch's own fp16 backward under CPU autocast gives the class %s.", f.Truth.Class)
			}
			out = append(out, c)
		}
	}
	return out, nil
}

// sentence ends s with a full stop.
func sentence(s string) string {
	s = strings.TrimSpace(s)
	if s != "" && !strings.HasSuffix(s, ".") {
		s += "."
	}
	return s
}

// scalesCandidates lists training logs for the scales diagnosis, real
// runs first: each real CPU-fp16 run of fixtures/torch/scaleruns beside
// its fp32 twin (tried for the class PyTorch's record gives it) and
// alone, its loss column alone (a metrics table without the loss scale,
// written to tmp), the logs of the capture fixtures' runs
// (fixtures/torch/runs); then the simulated logs of the diagnosis's tests
// (internal/trainlog/testdata), alone and beside their fp32 baseline.
func scalesCandidates(tmp string) ([]candidate, error) {
	truths, err := filepath.Glob("fixtures/torch/scaleruns/*/truth.json")
	if err != nil {
		return nil, err
	}
	sort.Strings(truths)
	type run struct {
		dir, name string
		truth     struct {
			About   string `json:"about"`
			Trainer string `json:"trainer"`
			Class   string `json:"class"`
		}
	}
	var runs []run
	for _, p := range truths {
		r := run{dir: filepath.Dir(p), name: filepath.Base(filepath.Dir(p))}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, &r.truth); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		runs = append(runs, r)
	}
	about := func(r run) string {
		return fmt.Sprintf("`%s/run.jsonl`, a real CPU-fp16 training run (torch.autocast on the CPU with GradScaler: real fp16 kernels; %s) recorded by fp16audit's recorder: %s PyTorch's record of it (`%s/truth.json`) classes it %s",
			r.dir, r.truth.Trainer, sentence(r.truth.About), r.dir, r.truth.Class)
	}
	var out []candidate
	for _, r := range runs {
		want := []string{r.truth.Class}
		if r.truth.Class == "healthy" {
			// a healthy run beside its twin is healthy, or noise within the tolerance
			want = append(want, "fp16-noise")
		}
		out = append(out, candidate{name: r.name, want: want,
			source: about(r) + fmt.Sprintf("; `%s/fp32.jsonl` is its fp32 twin (the same seed, data and schedule without autocast), the baseline.", r.dir),
			args:   []string{"scales", filepath.Join(r.dir, "run.jsonl"), "--baseline", filepath.Join(r.dir, "fp32.jsonl")}})
	}
	for _, r := range runs {
		out = append(out, candidate{name: r.name, source: about(r) + "; here without its fp32 baseline.",
			args: []string{"scales", filepath.Join(r.dir, "run.jsonl")}})
	}
	for _, r := range runs {
		p, err := lossColumn(filepath.Join(r.dir, "run.csv"), filepath.Join(tmp, r.name+"_losses.csv"))
		if err != nil {
			return nil, err
		}
		out = append(out, candidate{name: r.name,
			source: fmt.Sprintf("the loss column of `%s/run.csv` alone (`%s`: step, epoch and loss, as a logger that records no loss scale leaves them) of %s.",
				r.dir, filepath.Base(p), strings.TrimPrefix(about(r), "`"+r.dir+"/run.jsonl`, ")),
			args:    []string{"scales", p},
			replace: strings.NewReplacer(tmp+string(filepath.Separator), "")})
	}
	logs, err := filepath.Glob("fixtures/torch/runs/*/log.jsonl")
	if err != nil {
		return nil, err
	}
	sort.Strings(logs)
	for _, l := range logs {
		var truth struct{ Doc, Trainer string }
		tp := filepath.Join(filepath.Dir(l), "truth.json")
		b, err := os.ReadFile(tp)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, &truth); err != nil {
			return nil, fmt.Errorf("%s: %w", tp, err)
		}
		out = append(out, candidate{name: filepath.Base(filepath.Dir(l)),
			source: fmt.Sprintf("`%s`, the log fp16audit's recorder wrote (its captures armed) of a real CPU-fp16 training run (%s; `fixtures/torch/runs.py`): %s PyTorch's record of the run is `%s`.",
				l, truth.Trainer, sentence(truth.Doc), tp),
			args: []string{"scales", l}})
	}
	const dir = "internal/trainlog/testdata"
	sims, err := filepath.Glob(dir + "/*.json")
	if err != nil {
		return nil, err
	}
	sort.Strings(sims)
	for _, base := range []string{"", dir + "/baseline_fp32.json"} {
		for _, l := range sims {
			if strings.HasPrefix(filepath.Base(l), "baseline") {
				continue
			}
			args := []string{"scales", l}
			if base != "" {
				args = append(args, "--baseline", base)
			}
			out = append(out, candidate{name: strings.TrimSuffix(filepath.Base(l), ".json"), simulated: true,
				source: fmt.Sprintf("`%s`, a training log of the scales diagnosis's tests (`%s`: loss and GradScaler scale of every step, simulated as GradScaler updates the scale)", l, dir),
				args:   args})
		}
	}
	return out, nil
}

// lossColumn writes the step, epoch and loss columns of a run's metrics
// table (iteration,epoch,train_loss,loss_scale) to out.
func lossColumn(in, out string) (string, error) {
	b, err := os.ReadFile(in)
	if err != nil {
		return "", err
	}
	var w strings.Builder
	for i, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		f := strings.Split(line, ",")
		if len(f) < 3 {
			return "", fmt.Errorf("%s: line %d: want the columns iteration, epoch, train_loss and more", in, i+1)
		}
		w.WriteString(strings.Join(f[:3], ",") + "\n")
	}
	return out, os.WriteFile(out, []byte(w.String()), 0o644)
}

// replayCandidates lists the captures of the real runs in
// fixtures/torch/runs, each tried for the class PyTorch's record at the
// captured step gives it (truth.json).
func replayCandidates() ([]candidate, error) {
	truths, err := filepath.Glob("fixtures/torch/runs/*/truth.json")
	if err != nil {
		return nil, err
	}
	sort.Strings(truths)
	var out []candidate
	for _, p := range truths {
		var truth struct {
			Run, Doc, Trainer string
			Captures          []struct {
				Step           int
				Scale          float64
				Class, Trigger string
				Capture        string
			}
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, &truth); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		dir := filepath.Dir(p)
		for _, c := range truth.Captures {
			capture := filepath.Join(dir, filepath.FromSlash(c.Capture))
			out = append(out, candidate{
				name: filepath.Base(dir) + "/" + filepath.Base(capture),
				want: []string{c.Class},
				source: fmt.Sprintf("`%s`, the capture fp16audit's recorder wrote at step %d (trigger `%s`) of a real CPU-fp16 training run (%s; `fixtures/torch/runs.py`): %s PyTorch's record at that step (`%s`: hooks, the scaled fp16 backward, fp32 and the previous batch at the same weights) classes it %s.",
					capture, c.Step, c.Trigger, truth.Trainer, sentence(truth.Doc), p, c.Class),
				args: []string{"replay", capture},
			})
		}
	}
	return out, nil
}
