package audit

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"fp16audit/fixtures"
	"fp16audit/internal/batch"
	"fp16audit/internal/execute/backward"
	"fp16audit/report"
)

// TestBackwardFactsFromFP32Pass: the shapes the fp32 pass recorded give
// the backward graph the Facts the probe's forward run measures, and on
// the benchmark's models they suffice (no probe).
func TestBackwardFactsFromFP32Pass(t *testing.T) {
	initRuntime(t)
	for _, c := range []struct {
		f     *fixtures.Fixture
		loss  string
		known bool
	}{
		{fixtures.BigResNet(32, 2), "cross-entropy", true},
		{fixtures.BigTransformer(1, 64, 8, 2), "mse", true},
		{fixtures.MLP(16, 32, 4, 2, 8), "cross-entropy", true},
	} {
		t.Run(c.f.Name, func(t *testing.T) {
			dir := t.TempDir()
			modelPath, batchPath := writeFixture(t, c.f, dir)
			cfg := Config{ModelPath: modelPath, Inputs: []string{batchPath}, NoFixes: true,
				Train: TrainConfig{Mode: "train", Loss: c.loss, Target: writeTarget(t, c.f, c.loss, dir)}}
			if known := sameFacts(t, cfg); known != c.known {
				t.Errorf("facts from the fp32 pass: got %v, want %v", known, c.known)
			}
		})
	}
	// PyTorch's exports of the training fixtures with one input and a
	// plain loss.
	data, err := os.ReadFile("../../fixtures/torch/train/manifest.json")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Fixtures []struct {
			Name, Model, Data, Loss string
			Inputs                  []struct{ Key, Name string }
			ClassAxis               any `json:"class_axis"`
		}
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for _, f := range m.Fixtures {
		if len(f.Inputs) != 1 || f.ClassAxis != nil {
			continue // the language models' losses need more flags
		}
		t.Run(f.Name, func(t *testing.T) {
			ts, err := batch.ReadNPZ(filepath.Join("../../fixtures/torch/train", f.Data))
			if err != nil {
				t.Fatal(err)
			}
			paths := map[string]string{}
			for _, x := range ts {
				if x.Name == "input_0" || x.Name == "target" {
					b, err := batch.EncodeNPY(x)
					if err != nil {
						t.Fatal(err)
					}
					paths[x.Name] = filepath.Join(t.TempDir(), x.Name+".npy")
					if err := os.WriteFile(paths[x.Name], b, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			cfg := Config{ModelPath: filepath.Join("../../fixtures/torch/train", f.Model), Inputs: []string{paths["input_0"]},
				Threads: 1, NoFixes: true, Train: TrainConfig{Mode: "train", Loss: f.Loss, Target: paths["target"]}}
			// Only the fixture that computes shapes at run time (Shape,
			// Gather, Concat into a Slice's starts and a Tile's repeats)
			// needs the probe.
			if known, want := sameFacts(t, cfg), f.Name != "shapes"; known != want {
				t.Errorf("facts from the fp32 pass: got %v, want %v", known, want)
			}
		})
	}
}

// sameFacts runs the training audit cfg and reports whether the fp32
// pass's shapes give the backward its Facts; when they do, they must be
// the probe's.
func sameFacts(t *testing.T, cfg Config) bool {
	t.Helper()
	a, err := run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	known := backward.Known(a.up, a.train.inputs, a.passes[report.PassFP32].Shapes)
	if known == nil {
		return false
	}
	probed, err := backward.Probe(t.Context(), a.engine.Library, a.up, a.model.Path, a.train.inputs, a.engine.Session)
	if err != nil {
		t.Fatal(err)
	}
	if len(probed.Values) != 0 {
		t.Errorf("the probe fetched %d parameters computed at run time; Known must leave such graphs to it", len(probed.Values))
	}
	if !reflect.DeepEqual(known.Shapes, probed.Shapes) {
		for v, s := range probed.Shapes {
			if !reflect.DeepEqual(known.Shapes[v], s) {
				t.Errorf("shape of %q: pass %v, probe %v", v, known.Shapes[v], s)
			}
		}
		t.Errorf("%d shapes from the pass, %d probed", len(known.Shapes), len(probed.Shapes))
	}
	return true
}
