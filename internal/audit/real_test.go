package audit_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"fp16audit/internal/audit"
	"fp16audit/report"
)

// TestRealInputAdvice: what the verdict does not say of issue 41's input
// cases (fixtures/torch/cases_real.py), in every family: resized float
// pixels are raw pixels (FP1003) and the standardization fix divides by
// 255; int16 audio frames are a signal, standardized as 16-bit PCM, not a
// table with fastai's tabular procs.
func TestRealInputAdvice(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	for _, root := range []string{torchCases, torchDynamoCases, torchScript2Cases} {
		for _, tc := range []struct {
			name, kind, finding, advice string
		}{
			{"raw_pixels_float", report.KindImage, "FP1003", "/ 255"},
			{"audio_frames_int16", report.KindAudio, "FP1006", "/ 32768"},
		} {
			t.Run(filepath.Base(root)+"/"+tc.name, func(t *testing.T) {
				dir := filepath.Join(root, tc.name)
				r, err := audit.Run(context.Background(), audit.Config{ModelPath: filepath.Join(dir, "model.onnx"),
					Inputs: []string{filepath.Join(dir, "batches")}, Policy: "autocast-fp16", Threads: 1})
				if err != nil {
					t.Fatal(err)
				}
				if len(r.Inputs) != 1 || r.Inputs[0].Kind != tc.kind {
					t.Errorf("inputs %+v, want one of kind %s", r.Inputs, tc.kind)
				}
				if len(findingsOf(r, tc.finding)) != 1 {
					t.Errorf("no %s finding:\n%s", tc.finding, findingLines(r))
				}
				var advice []string
				for _, fx := range r.Fixes {
					if fx.Kind != report.FixStandardize {
						continue
					}
					for _, n := range fx.Normalize {
						advice = append(advice, n.Fastai, n.Torch)
					}
				}
				all := strings.Join(advice, "\n")
				if !strings.Contains(all, tc.advice) || strings.Contains(all, "procs=") {
					t.Errorf("standardization advice %q, want it to say %q and nothing of tabular procs", all, tc.advice)
				}
			})
		}
	}
}

// TestPretrainedMomentumZero: a network frozen as pretrained ones are
// (every BatchNorm's momentum 0.0, ONNX's 1.0: no update moves its
// statistics), exported in training mode and audited in eval mode on
// normalized pixels, far below the raw pixels its statistics were trained
// on (fixtures/torch/folded_bn.py's momentum0): its trained statistics,
// every variance of bn1 above 1, are not taken for one update from the
// defaults (FP6001).
func TestPretrainedMomentumZero(t *testing.T) {
	dir := "../../fixtures/torch/folded_bn/momentum0"
	r := runConfig(t, audit.Config{ModelPath: filepath.Join(dir, "model.onnx"), Inputs: []string{filepath.Join(dir, "batches")}, Threads: 1,
		Train: audit.TrainConfig{Mode: "eval"}})
	if fs := findingsOf(r, "FP6001"); len(fs) != 0 {
		t.Errorf("FP6001 on a pretrained network's statistics: %+v", fs)
	}
	if r.Training == nil || len(r.Training.BatchNorms) != 3 {
		t.Fatalf("training section %+v: want the 3 BatchNorm nodes", r.Training)
	}
	for _, bn := range r.Training.BatchNorms {
		if bn.RunningStats != "trained" || bn.Statistics != "running" {
			t.Errorf("%s: %s statistics, read as %s; want trained running statistics", bn.Node, bn.Statistics, bn.RunningStats)
		}
	}
}
