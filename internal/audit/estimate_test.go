package audit

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"fp16audit/internal/batch"
	"fp16audit/internal/grad"
	"fp16audit/report"
)

const trainFixtures = "../../fixtures/torch/train"

// trainCase writes the input and target of a training fixture as .npy
// files and returns its audit configuration (train mode, its loss).
func trainCase(t *testing.T, name string) Config {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(trainFixtures, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Fixtures []struct{ Name, Model, Data, Loss string }
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for _, f := range m.Fixtures {
		if f.Name != name {
			continue
		}
		ts, err := batch.ReadNPZ(filepath.Join(trainFixtures, f.Data))
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		for _, x := range ts {
			if x.Name != "input_0" && x.Name != "target" {
				continue
			}
			b, err := batch.EncodeNPY(x)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, x.Name+".npy"), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return Config{ModelPath: filepath.Join(trainFixtures, f.Model), Inputs: []string{filepath.Join(dir, "input_0.npy")},
			Threads: 1, NoFixes: true, Train: TrainConfig{Mode: "train", Loss: f.Loss, Target: filepath.Join(dir, "target.npy")}}
	}
	t.Fatalf("no training fixture %s", name)
	return Config{}
}

// TestEstimateAgainstRuns: on every training fixture with a loss, the
// estimate of mass lost the report gives at a scale it did not run (the
// fp32 backward's mass by exponent, calibrated by the measured runs) is
// checked against an emulated run there: the measured worst loss is
// within a factor of 5 of the estimate either way (measured 0.66–4.6 on
// these fixtures), and a scale the clean window counts on its estimate
// (four times the estimate within the tolerance) is clean when run. The
// window's start and the three scales below it are run as well.
func TestEstimateAgainstRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: one audit and a dozen backward runs per fixture")
	}
	for _, name := range []string{"regression", "regression_big", "resnet_small", "deep_mlp", "transformer_o17", "cnn_bn_train", "activations"} {
		t.Run(name, func(t *testing.T) {
			a, err := run(context.Background(), trainCase(t, name))
			if err != nil {
				t.Fatal(err)
			}
			br := a.report.Training.Backward
			if br.SettledExp == nil {
				t.Fatalf("no settled scale: %s", br.VerdictText)
			}
			noise := map[string]bool{}
			for _, p := range br.Parameters {
				noise[p.Name] = p.Noise
			}
			rows := map[int]report.ScaleReport{}
			for _, r := range br.Scales {
				rows[r.Exp] = r
			}
			exps := []int{}
			for _, r := range br.Scales {
				if !r.Measured && !r.Overflow {
					exps = append(exps, r.Exp)
				}
			}
			if br.Window != nil {
				for x := br.Window.From - 3; x <= br.Window.From; x++ {
					if r, ok := rows[x]; !ok || !r.Measured {
						exps = append(exps, x)
					}
				}
			}
			slices.Sort(exps)
			exps = slices.Compact(exps)
			_, sess, err := a.backwardSession(t.Context(), a.rounding(a.static.Assign), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			// the audit's reference: the backward at the values the fp16
			// forward saved
			ref, err := sess.RunSaved(false)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range exps {
				r, err := sess.Run(x, true)
				if err != nil {
					t.Fatal(err)
				}
				worst, finite := 0.0, true
				for p, g := range r.Params {
					if noise[p] {
						continue
					}
					l, ok := grad.LostMass(g, ref.Params[p], x)
					finite = finite && ok
					worst = max(worst, l)
				}
				if !finite {
					t.Errorf("2^%d overflows when run; the fp32 maxima said it does not", x)
					continue
				}
				if br.Window != nil && x >= br.Window.From && x <= br.Window.To && worst > br.Tolerance {
					t.Errorf("2^%d: in the clean window from 2^%d, but the run loses %.3g%%", x, br.Window.From, 100*worst)
				}
				est, ok := rows[x]
				if !ok {
					continue
				}
				if ratio := worst / est.LostMass; ratio > 5 || ratio < 0.2 {
					t.Errorf("2^%d: estimated %.3g%%, the run loses %.3g%% (×%.2f)", x, 100*est.LostMass, 100*worst, ratio)
				}
			}
		})
	}
}
