package audit

import (
	"fmt"
	"strings"

	"fp16audit/internal/onnx"
	"fp16audit/internal/rewrite"
)

// restoredEpsilon is the epsilon put back inside a root whose own the
// exporter dropped. Its value is unknown beyond "1e-8 or less" (what the
// optimizer folds); every such epsilon is 0 in fp16 and keeps a zero row
// finite in fp32 and bf16, so the verdicts do not depend on it.
const restoredEpsilon = 1e-12

// restoreEpsilons puts an epsilon back inside each square root whose sum
// the dynamo exporter's optimizer folded away (onnx.DroppedAdds; FP4008),
// so that the audit judges the model as PyTorch computes it rather than
// a file that divides by zero on pad rows even in fp32. The model's file
// is not touched; the report says what was restored.
func (a *audit) restoreEpsilons() error {
	d := onnx.DroppedAdds(a.model.Proto.Graph, a.model.Index)
	if len(d) == 0 {
		return nil
	}
	eps := map[string]float32{}
	var where []string
	for _, x := range d {
		eps[x.Radicand] = restoredEpsilon
		w := x.Name
		if x.Module != "" {
			w += " in " + x.Module
		}
		where = append(where, w)
	}
	proto, err := rewrite.AddEpsilon(a.model.Proto, eps)
	if err != nil {
		return &ModelError{Path: a.cfg.ModelPath, Err: err}
	}
	if err := a.replaceModel(proto); err != nil {
		return err
	}
	a.dropped = d
	a.droppedNote = fmt.Sprintf("the export lost the epsilon inside %d square root(s) (%s): torch.onnx.export's optimizer folded the addition away (FP4008), so the file as exported divides by zero on a row whose values are all equal; audited with %g put back there, as the PyTorch model computes (export with optimize=False to keep your own)",
		len(d), strings.Join(limitList(where, 4), ", "), restoredEpsilon)
	return nil
}
