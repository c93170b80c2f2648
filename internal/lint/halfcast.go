package lint

import (
	"fmt"

	"fp16audit/checks"
	"fp16audit/internal/onnx"
)

var checkHalfCast = checks.Register(&checks.Check{ID: "FP4003", Title: "explicit half cast in the graph", Severity: checks.SevWarning, Doc: `The graph casts a value to FLOAT16 or BFLOAT16 itself: user code such as
x.half(), x.to(torch.float16) or a tensor created with dtype=torch.float16
exports as Cast(to=FLOAT16). Autocast cannot override an explicit cast, so
the value is held in 16 bits under every policy, including plain fp32, and
anything above 65504 there is Inf. This is the static half of FP4001: lint
reports every such cast; 'fp16audit run' reports (FP4001) the ones that
overflow on real batches. Remove the cast and let autocast choose the
precision, or scale or clamp first (x.clamp(-65504, 65504).half()).`})

var halfCastAnalyzer = &Analyzer{Check: checkHalfCast, Run: runHalfCast}

func runHalfCast(f *Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, i := range f.Order {
		n := f.node(i)
		if !onnx.IsDefaultDomain(n.GetDomain()) || len(n.GetInput()) == 0 {
			continue
		}
		var to int32
		switch n.GetOpType() {
		case "Cast":
			for _, a := range n.GetAttribute() {
				if a.GetName() == "to" {
					to = int32(a.GetI())
				}
			}
		case "CastLike":
			if len(n.GetInput()) > 1 {
				to = f.Model.Index.ElemType(n.GetInput()[1])
			}
		default:
			continue
		}
		// A cast to the type a half-stored model is stored in is
		// x.to(self.weight.dtype): it follows the policy, not user code.
		if to != int32(onnx.TensorProto_FLOAT16) && to != int32(onnx.TensorProto_BFLOAT16) || to == f.Storage {
			continue
		}
		in := n.GetInput()[0]
		out = append(out, f.finding(checkHalfCast, checks.SevWarning, i, in, fmt.Sprintf(
			"%s casts %q to %s itself (user code such as x.half()); autocast cannot override it, so the value is %s under every policy",
			f.where(i), in, onnx.DataTypeName(to), halfName(to))))
	}
	return out, nil
}

func halfName(dt int32) string {
	if dt == int32(onnx.TensorProto_BFLOAT16) {
		return "bf16"
	}
	return "fp16"
}
