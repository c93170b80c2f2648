package render

import (
	"fmt"
	"math"
	"math/rand/v2"

	"fp16audit/checks"
	"fp16audit/report"
)

// syntheticReport builds a transformer-like report of n nodes for size and
// speed measurements: magnitudes climb with depth, the fp32 values cross
// 65504 at 60% of the graph, the fp16 pass is NaN/Inf from there on and
// bf16 stays finite.
func syntheticReport(n int) *report.Report {
	rng := rand.New(rand.NewPCG(1, 2))
	ops := []struct{ op, mod string }{
		{"LayerNormalization", "input_layernorm"}, {"MatMul", "self_attn.q_proj"}, {"MatMul", "self_attn.k_proj"},
		{"MatMul", "self_attn.v_proj"}, {"MatMul", "self_attn"}, {"Softmax", "self_attn"}, {"MatMul", "self_attn"},
		{"MatMul", "self_attn.o_proj"}, {"Add", ""}, {"LayerNormalization", "post_attention_layernorm"},
		{"MatMul", "mlp.up_proj"}, {"Mul", "mlp.act_fn"}, {"MatMul", "mlp.down_proj"}, {"Add", ""},
	}
	r := &report.Report{
		Schema:  report.ReportSchema,
		Tool:    report.ToolInfo{Version: "0.0.0-test", ORTVersion: "0.0.0-test", Device: "cpu"},
		Model:   report.ModelInfo{Path: "synthetic.onnx", Producer: "pytorch", ProducerVersion: "2.5.0", IRVersion: 8, Opsets: map[string]int64{"ai.onnx": 17}, NodeCount: n},
		Policy:  "autocast-fp16",
		Passes:  []string{"fp32", "fp16", "bf16"},
		Batches: []report.Batch{{Source: "batch.npy", Shapes: []string{"input_ids[8,512]"}}},
		Verdict: report.VerdictOverflow, VerdictText: "an op overflows in fp16 on normalized inputs",
	}
	origin := n * 6 / 10
	for i := range n {
		o := ops[i%len(ops)]
		layer := i / len(ops)
		mod := fmt.Sprintf("model.layers.%d", layer)
		if o.mod != "" {
			mod += "." + o.mod
		}
		name := fmt.Sprintf("/model/layers.%d/%s/%s_%d", layer, o.mod, o.op, i%len(ops))
		lg := 2 + 15*float64(i)/float64(n)*1.1 + rng.NormFloat64()*1.5
		if o.op == "LayerNormalization" || o.op == "Softmax" {
			lg = 1 + rng.NormFloat64()
		}
		mx := math.Exp2(lg)
		stats := func(pass string) report.StatsReport {
			s := report.StatsReport{Count: 8 * 512 * 768, Finite: 8 * 512 * 768, MaxAbs: &mx}
			h := math.Log2(65504 / mx)
			if pass == "fp32" {
				s.HeadroomBits = &h
				if mx > 65504 {
					s.AboveFP16Max = 3
				}
			}
			if pass == "fp16" && i >= origin {
				s.MaxAbs, s.Finite, s.NaN, s.PosInf = nil, 0, s.Count-7, 7
			}
			return s
		}
		nr := report.NodeReport{Index: i, Name: name, OpType: o.op, Module: mod, Precision: "fp16", Flagged: i >= origin,
			Outputs: []report.ValueReport{{Name: name + "_output_0", DType: "float32", Shape: "[8,512,768]",
				Stats: map[string]report.StatsReport{"fp32": stats("fp32"), "fp16": stats("fp16"), "bf16": stats("bf16")}}}}
		r.Nodes = append(r.Nodes, nr)
		if i >= origin {
			r.Findings = append(r.Findings, checks.Finding{Check: "FP2002", Severity: checks.SevWarning, Title: "non-finite value",
				Message: fmt.Sprintf("%s (%s) is NaN/Inf in fp16", name, o.op), Node: name, Module: mod, Pass: "fp16"})
		}
	}
	on := r.Nodes[origin]
	r.Origins = []report.Origin{{Pass: "fp16", Node: on.Name, Index: origin, OpType: on.OpType, Module: on.Module, Precision: "fp16",
		Value: on.Outputs[0].Name, FP32MaxAbs: *on.Outputs[0].Stats["fp32"].MaxAbs, NonFinite: 7, Cause: report.CauseOverflow}}
	return r
}
