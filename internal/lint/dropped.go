package lint

import (
	"fmt"

	"fp16audit/checks"
	"fp16audit/internal/onnx"
)

var checkDroppedEpsilon = checks.Register(&checks.Check{ID: "FP4008", Title: "the exporter dropped an epsilon", Severity: checks.SevWarning,
	Doc: `A square root in a dynamo export (torch.onnx.export(..., dynamo=True), the
default from torch 2.9) reads a value directly, while the PyTorch op it was
translated from read a sum: its FX record (pkg.torch.onnx.fx_node) says
aten.sqrt(%add_24), and no node of the graph computes add_24.
torch.onnx.export's optimizer folds x + c into x when c is so small that
the sum rounds to x in float32 for most x: an epsilon of 1e-8 or less
inside a hand-written normalization's root, such as BERT's
sqrt(var + 1e-12) (measured with torch 2.9.1 and onnxscript 0.7.2). The
exported file then divides by zero on a row whose values are all equal (a
zero pad embedding) even in fp32, where the PyTorch model does not.

fp16audit run audits the model as PyTorch computes it: it puts an epsilon
of 1e-12 back inside each such root (any epsilon of 1e-8 or less is 0 in
fp16 and nonzero in fp32 and bf16, so the verdicts do not depend on its
value) and says so in a note. Fix: export with
torch.onnx.export(..., optimize=False), or use torch.nn.LayerNorm or
torch.nn.RMSNorm, whose epsilon is an attribute of the exported op.`})

// DroppedEpsilonAnalyzer reports the roots whose epsilon the dynamo
// exporter's optimizer folded away.
var DroppedEpsilonAnalyzer = &Analyzer{Check: checkDroppedEpsilon, Run: runDroppedEpsilon}

// dropped returns the roots whose sum the export lost: Facts.Dropped
// where the caller set it (the audit, which restores them before it
// builds these facts), else those of the model.
func (f *Facts) dropped() []onnx.DroppedAdd {
	if f.Dropped != nil {
		return f.Dropped
	}
	return onnx.DroppedAdds(f.Model.Proto.GetGraph(), f.Model.Index)
}

func runDroppedEpsilon(f *Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, d := range f.dropped() {
		where := fmt.Sprintf("node %q", d.Name)
		if d.Module != "" {
			where += fmt.Sprintf(" (module %s)", d.Module)
		}
		src := ""
		if d.Source != "" {
			src = fmt.Sprintf(" (%s)", d.Source)
		}
		fd := checkDroppedEpsilon.Finding(fmt.Sprintf("%s takes the square root of %q, but the PyTorch op it was exported from%s read %s, a sum no node of the export computes: torch.onnx.export's optimizer folded away an addition of a constant of 1e-8 or less, so the exported file divides by zero on a row whose values are all equal, where the PyTorch model does not; export with torch.onnx.export(..., optimize=False) to keep the epsilon",
			where, d.Radicand, src, d.FXArg))
		fd.Node, fd.Module, fd.Value = d.Name, d.Module, d.Radicand
		out = append(out, fd)
	}
	return out, nil
}
