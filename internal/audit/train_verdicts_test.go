package audit_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"fp16audit/internal/audit"
	"fp16audit/internal/batch"
	"fp16audit/internal/rewrite"
	"fp16audit/report"
)

// trainVerdictsDir holds the training fixtures of the backward verdicts
// no other fixture reaches (fixtures/torch/train_verdicts.py), each with
// PyTorch's record: autograd's fp32 gradients and the fp16 backward under
// CPU autocast at every exponent from 2^-126 to 2^24.
const trainVerdictsDir = "../../fixtures/torch/train_verdicts"

// TestTrainVerdictFixtures holds the training audit's backward verdict
// to PyTorch's class of each fixture of train_verdicts: a pair at
// distance 0 makes the fp32 backward NaN (backward-fp32-broken) while the
// forward is finite; near-duplicate pairs, 1e-5 apart in fp32, are at
// distance 0 in fp16, and PyTorch's fp16 backward is non-finite at every
// scale from 2^-126 to 2^24 (backward-overflow-every-scale): the audit
// reaches it only by differentiating at the values the fp16 forward
// saved, and its fp32 backward, like PyTorch's, is finite.
func TestTrainVerdictFixtures(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(trainVerdictsDir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Fixtures []struct {
			Name, Model, Data, Loss, Target, Output string
			Inputs                                  []struct{ Key, Name string }
			Truth                                   struct {
				Class string
				FP32  struct {
					NonFiniteGrads []string `json:"nonfinite_grads"`
				}
				FP16 struct {
					CleanExps []int `json:"clean_exps"`
				}
			}
		}
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Fixtures) < 2 {
		t.Fatalf("want the fixtures of backward-fp32-broken and backward-overflow-every-scale, found %d", len(m.Fixtures))
	}
	for _, f := range m.Fixtures {
		t.Run(f.Name, func(t *testing.T) {
			arrays, err := batch.ReadNPZ(filepath.Join(trainVerdictsDir, f.Data))
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			paths := map[string]string{}
			for _, a := range arrays {
				b, err := batch.EncodeNPY(a)
				if err != nil {
					t.Fatal(err)
				}
				paths[a.Name] = filepath.Join(dir, a.Name+".npy")
				if err := os.WriteFile(paths[a.Name], b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var inputs []string
			for _, in := range f.Inputs {
				inputs = append(inputs, in.Name+"="+paths[in.Key])
			}
			r := runConfig(t, audit.Config{ModelPath: filepath.Join(trainVerdictsDir, f.Model), Inputs: inputs, Threads: 1,
				Train: audit.TrainConfig{Mode: rewrite.ModeTrain, Loss: f.Loss, Target: paths[f.Target], Output: f.Output}})
			if r.Training == nil || r.Training.Backward == nil {
				t.Fatal("no backward audit")
			}
			b := r.Training.Backward
			if b.Verdict != f.Truth.Class {
				t.Fatalf("backward verdict %s (%s), PyTorch's class %s", b.Verdict, b.VerdictText, f.Truth.Class)
			}
			switch f.Truth.Class {
			case report.BackwardOverflowEveryScale:
				if len(f.Truth.FP16.CleanExps) != 0 || len(f.Truth.FP32.NonFiniteGrads) != 0 {
					t.Errorf("the truth's fp16 backward is clean at %v, its fp32 gradients non-finite in %v, yet its class is %s", f.Truth.FP16.CleanExps, f.Truth.FP32.NonFiniteGrads, f.Truth.Class)
				}
				if b.MaxCleanExp != nil || len(b.FP32NonFinite) != 0 || len(findingsOf(r, "FP6006")) != 1 {
					t.Errorf("largest clean scale %v, fp32 non-finite %v, FP6006 %v: PyTorch's fp32 backward is finite and no scale its fp16 one", derefInt(b.MaxCleanExp), b.FP32NonFinite, findingsOf(r, "FP6006"))
				}
			case report.BackwardFP32Broken:
				if len(f.Truth.FP32.NonFiniteGrads) == 0 {
					t.Errorf("the truth's fp32 gradients are finite, yet its class is %s", f.Truth.Class)
				}
				if r.Verdict != report.VerdictHealthy {
					t.Errorf("forward verdict %s (%s): PyTorch's forward and loss are finite", r.Verdict, r.VerdictText)
				}
			}
		})
	}
}
