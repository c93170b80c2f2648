package audit_test

import (
	"math"
	"path/filepath"
	"slices"
	"testing"

	"fp16audit/internal/audit"
	"fp16audit/report"
)

// TestBlocksOfLlama: the roll-up of the bf16-stored Llama-style decoder
// under half — layer 1's residual Add overflows — against PyTorch's truth:
// each layer's output is the residual stream (4.3e4 after layer 0, 8.6e4
// after layer 1 in fp32, NaN/Inf from layer 1 on in fp16), and layer 1's
// first NaN/Inf is the origin.
func TestBlocksOfLlama(t *testing.T) {
	dir := filepath.Join(torchCases, "llama_bf16_checkpoint")
	tr := readTruth(t, dir)
	var mags struct {
		Policies map[string]struct {
			FP32MaxAbs float64 `json:"fp32_max_abs"`
		} `json:"policies"`
	}
	readJSON(t, filepath.Join(dir, "truth.json"), &mags)
	// Each down_proj writes 0.66 × 65504 into the massive channel
	// (realcases.py); after layer 1 the residual holds both.
	resid := mags.Policies["half"].FP32MaxAbs
	r := runConfig(t, audit.Config{ModelPath: filepath.Join(dir, "model.onnx"), Inputs: []string{filepath.Join(dir, "batches")}, Policy: "half", NoFixes: true})
	var names []string
	nodes := 0
	for _, b := range r.Blocks {
		names = append(names, b.Module)
		nodes += b.Nodes
	}
	for _, want := range []string{"model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm", "lm_head"} {
		if !slices.Contains(names, want) {
			t.Errorf("blocks %v lack %s", names, want)
		}
	}
	if nodes != len(r.Nodes) {
		t.Errorf("the blocks hold %d nodes, the report %d", nodes, len(r.Nodes))
	}
	for _, n := range r.Nodes {
		if !slices.Contains(names, n.Block) {
			t.Fatalf("node %s is in block %q, which the report lacks", n.Name, n.Block)
		}
	}
	block := func(m string) report.Block {
		i := slices.IndexFunc(r.Blocks, func(b report.Block) bool { return b.Module == m })
		return r.Blocks[i]
	}
	l0, l1 := block("model.layers.0"), block("model.layers.1")
	if !l0.Repeated || !l1.Repeated || block("model.norm").Repeated {
		t.Errorf("repeated: layers %v %v, norm %v", l0.Repeated, l1.Repeated, block("model.norm").Repeated)
	}
	want := tr.Policies["half"]
	if l1.FirstOverflow != want.OriginNode || !l1.Origin || l0.FirstOverflow != "" {
		t.Errorf("first NaN/Inf: layer 0 %q, layer 1 %q (origin %v); want none, then %s (origin)", l0.FirstOverflow, l1.FirstOverflow, l1.Origin, want.OriginNode)
	}
	for _, c := range []struct {
		b       report.Block
		value   string
		fp32    float64
		nonfin  bool
		heldMax float64
	}{
		{l0, "/model/layers.0/Add_1_output_0", 0.66 * 65504, false, 0.66 * 65504},
		{l1, "/model/layers.1/Add_1_output_0", resid, true, resid},
	} {
		o := c.b.Output
		if o == nil || o.Name != c.value {
			t.Errorf("%s: output %+v, want %s", c.b.Module, o, c.value)
			continue
		}
		ref, half := o.Stats[report.PassFP32], o.Stats[report.PassFP16]
		if ref.MaxAbs == nil || math.Abs(*ref.MaxAbs/c.fp32-1) > 0.01 {
			t.Errorf("%s: output fp32 max |x| %v, want %.4g within 1%%", c.b.Module, ref.MaxAbs, c.fp32)
		}
		if (half.NonFinite() > 0) != c.nonfin {
			t.Errorf("%s: output non-finite in fp16 %d, want %v", c.b.Module, half.NonFinite(), c.nonfin)
		}
		if c.b.MaxAbs == nil || math.Abs(*c.b.MaxAbs/c.heldMax-1) > 0.01 || c.b.HeadroomBits == nil ||
			math.Abs(*c.b.HeadroomBits-math.Log2(65504 / *c.b.MaxAbs)) > 1e-9 {
			t.Errorf("%s: max |x| held in 16 bit %v (headroom %v), want %.4g", c.b.Module, c.b.MaxAbs, c.b.HeadroomBits, c.heldMax)
		}
	}
	if b := block("model.embed_tokens"); b.Output == nil || b.Output.Name != "/model/embed_tokens/Gather_output_0" {
		t.Errorf("embedding block output %+v", b.Output)
	}
}
