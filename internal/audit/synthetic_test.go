package audit_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"fp16audit/internal/audit"
	"fp16audit/internal/batch"
	"fp16audit/internal/tensor"
	"fp16audit/report"
)

// TestSyntheticLanguageInputs: without -i, a language model's inputs hold
// what a tokenizer gives, so the audit of a BERT-style model with the
// additive mask (1 − mask) · −10000 agrees with PyTorch on tokenizer
// inputs under every policy, and no value of it comes near fp16's range. The
// integers in [0, 10) that every int64 input used to get make that mask
// up to +80 000 (NaN/Inf under half in PyTorch: truth.json's
// uniform_0_10_mask; the export holds mask.to(h.dtype) as a cast to
// FLOAT, which the emulation keeps in fp32).
func TestSyntheticLanguageInputs(t *testing.T) {
	dir := filepath.Join(fixtureDir, "torch", "synthetic")
	type outcome map[string]struct {
		OutputsNonfinite *bool `json:"outputs_nonfinite"`
	}
	var tr struct {
		Models map[string]struct {
			Seq       int64   `json:"seq"`
			Tokenizer outcome `json:"tokenizer_inputs"`
			Mask      outcome `json:"uniform_0_10_mask"`
		} `json:"models"`
	}
	readJSON(t, filepath.Join(dir, "truth.json"), &tr)
	for name, m := range tr.Models {
		model := filepath.Join(dir, name+".onnx")
		for policy, o := range m.Tokenizer {
			r := runConfig(t, audit.Config{ModelPath: model, Policy: policy, Shapes: map[string][]int64{"input_ids": {1, m.Seq}}, NoFixes: true})
			if healthy := r.Verdict == report.VerdictHealthy; o.OutputsNonfinite == nil || healthy == *o.OutputsNonfinite {
				t.Errorf("%s %s, synthetic inputs: verdict %s, PyTorch's outputs non-finite %v", name, policy, r.Verdict, o.OutputsNonfinite)
			}
			if big := largestFP32(r); m.Mask != nil && big > 1e4 {
				t.Errorf("%s %s: a value reaches %g with tokenizer inputs", name, policy, big)
			}
			notes := strings.Join(r.Notes, "\n")
			for _, want := range []string{`input "input_ids": synthetic int64 [1,16], token ids uniform in [0,`, `input "attention_mask": synthetic int64 [1,16], attention mask: ones`} {
				if !strings.Contains(notes, want) {
					t.Errorf("%s: the notes lack %q:\n%s", name, want, notes)
				}
			}
		}
		if m.Mask == nil {
			continue
		}
		// The mask as the uniform integers made it, the rest as a
		// tokenizer gives it: what PyTorch does with that, fp16audit says.
		ids, mask, types := make([]int64, m.Seq), make([]int64, m.Seq), make([]int64, m.Seq)
		for i := range ids {
			ids[i], mask[i] = int64(i)%10, int64(i)%10
		}
		mk := func(n string, v []int64) *tensor.Tensor { return tensor.FromInt64s(n, []int64{1, m.Seq}, v) }
		npz, err := batch.EncodeNPZ([]*tensor.Tensor{mk("input_ids", ids), mk("attention_mask", mask), mk("token_type_ids", types)}, false)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "uniform_mask.npz")
		if err := os.WriteFile(path, npz, 0o644); err != nil {
			t.Fatal(err)
		}
		r := runConfig(t, audit.Config{ModelPath: model, Inputs: []string{path}, NoFixes: true})
		if big := largestFP32(r); big < 65504 {
			t.Errorf("%s: with a mask of integers in [0,10) the largest value is %g, want the mask beyond 65504", name, big)
		}
	}
}

// largestFP32 is the largest fp32 max |x| over the report's node outputs.
func largestFP32(r *report.Report) float64 {
	var big float64
	for _, n := range r.Nodes {
		for _, o := range n.Outputs {
			if s, ok := o.Stats[report.PassFP32]; ok && s.MaxAbs != nil {
				big = max(big, *s.MaxAbs)
			}
		}
	}
	return big
}
