package precision

import (
	"fmt"
	"slices"
	"testing"

	"fp16audit/internal/onnx"
)

// dynamoNode is a node as the dynamo exporter writes it: its module stack
// (path) of class class, and the line of source it came from.
func dynamoNode(op, in, out, path, class, line string) *onnx.NodeProto {
	nd := n(op, "node_"+out, in, out)
	nd.MetadataProps = []*onnx.StringStringEntryProto{
		{Key: "pkg.torch.onnx.name_scopes", Value: fmt.Sprintf("['', '%s', '%s']", path, out)},
		{Key: "pkg.torch.onnx.class_hierarchy", Value: fmt.Sprintf("['m.Model', '%s', 'aten.%s.default']", class, op)},
		{Key: "pkg.torch.onnx.stack_trace", Value: "File \"m.py\", line 3, in forward\n    x = self.norm(x)\n  File \"m.py\", line 9, in forward\n    " + line},
	}
	return nd
}

// rmsNorm is an RMSNorm of x into y as torch.export traces it in float32,
// its casts gone: y = g * (x * 1/sqrt(mean(x^2) + eps)), then a MatMul
// outside the module.
func rmsNorm(class, powLine string) *onnx.GraphProto {
	const path = "norm"
	return &onnx.GraphProto{
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 2, 4)},
		Initializer: []*onnx.TensorProto{w("two"), w("axes1", 1), w("eps"), w("g", 4), w("W", 4, 4)},
		Node: []*onnx.NodeProto{
			dynamoNode("Pow", "x two", "sq", path, class, powLine),
			dynamoNode("ReduceMean", "sq", "var", path, class, powLine),
			dynamoNode("Add", "var eps", "ve", path, class, "h = h * torch.rsqrt(variance + self.eps)"),
			dynamoNode("Sqrt", "ve", "sd", path, class, "h = h * torch.rsqrt(variance + self.eps)"),
			dynamoNode("Reciprocal", "sd", "r", path, class, "h = h * torch.rsqrt(variance + self.eps)"),
			dynamoNode("Mul", "x r", "h", path, class, "h = h * torch.rsqrt(variance + self.eps)"),
			dynamoNode("Mul", "g h", "y", path, class, "return self.weight * h.to(input_dtype)"),
			dynamoNode("MatMul", "y W", "z", "proj", "torch.nn.modules.linear.Linear", "return self.proj(x)"),
		},
	}
}

// TestUpcastingNorms: under model.half(), a Hugging Face RMSNorm, and a
// norm whose source casts to float32, compute in float32 and hand on
// their weight's fp16; a norm without the cast, a module of another kind
// with one, and every norm under autocast follow the usual rules.
func TestUpcastingNorms(t *testing.T) {
	const square = "variance = h.pow(2).mean(-1, keepdim=True)"
	for _, c := range []struct {
		name, class, line string
		policy            string
		upcast            bool
	}{
		{"Hugging Face's LlamaRMSNorm", "transformers.models.llama.modeling_llama.LlamaRMSNorm", square, "half", true},
		{"Hugging Face's T5LayerNorm", "transformers.models.t5.modeling_t5.T5LayerNorm", square, "half", true},
		{"a hand-written norm with .to(torch.float32)", "models.T5LayerNorm", "variance = h.to(torch.float32).pow(2).mean(-1, keepdim=True)", "half", true},
		{"a hand-written norm with .float()", "mine.RMSNorm", "variance = h.float().pow(2).mean(-1, keepdim=True)", "half", true},
		{"a hand-written norm without a cast", "mine.RMSNorm", square, "half", false},
		{"a cast to float16 is not an upcast", "mine.RMSNorm", "variance = h.to(torch.float16).pow(2).mean(-1)", "half", false},
		{"not a norm", "mine.Scaler", "variance = h.float().pow(2).mean(-1, keepdim=True)", "half", false},
		{"under autocast", "transformers.models.llama.modeling_llama.LlamaRMSNorm", square, fp16, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := rmsNorm(c.class, c.line)
			a := Assign(mustPolicy(t, c.policy), g, nil, nil)
			sq, y := a.Value["sq"], a.Value["y"]
			if !c.upcast {
				if c.policy == "half" && (sq != FP16 || a.Node[0] != FP16) {
					t.Errorf("Pow node %v value %v, want fp16 as the usual rules say", a.Node[0], sq)
				}
				return
			}
			for i, nd := range g.Node[:7] {
				if a.Node[i] != FP32 || slices.Contains(a.CastInputs[i], true) {
					t.Errorf("%s: node %v casts %v, want fp32 reading its inputs as they are", nd.OpType, a.Node[i], a.CastInputs[i])
				}
			}
			for _, v := range []string{"sq", "var", "ve", "sd", "r", "h"} {
				if a.Value[v] != FP32 {
					t.Errorf("%s inside the norm: %v, want fp32", v, a.Value[v])
				}
			}
			if y != FP16 || a.Why["y"] != ReasonHalfPolicy {
				t.Errorf("the norm's output y: %v (%v), want fp16 (the half policy: the weight's dtype)", y, a.Why["y"].Names())
			}
			if a.Node[7] != FP16 || a.Value["z"] != FP16 {
				t.Errorf("the Linear after it: node %v value %v, want fp16", a.Node[7], a.Value["z"])
			}
		})
	}
}
