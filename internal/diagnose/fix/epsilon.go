package fix

import (
	"context"
	"fmt"

	"fp16audit/internal/batch"
	"fp16audit/internal/diagnose/evidence"
	"fp16audit/internal/onnx"
	"fp16audit/report"
)

// rerunEpsilon is the epsilon the missing-epsilon fix puts inside the
// root: BERT's, the smallest common one (a zero-variance row then
// normalizes to 0 in fp32).
const rerunEpsilon = 1e-12

// Epsilon reruns the fp32 reference with an epsilon put back inside
// the roots the origins divide by; nil when no origin is such a division.
func Epsilon(ctx context.Context, f *evidence.Facts, run Runner, batches []batch.Batch, origins []report.Origin) (*report.Fix, error) {
	eps := map[string]float32{}
	fix := &report.Fix{Kind: report.FixEpsilon, NonFiniteBefore: f.NonFinite(f.Passes[report.PassFP32], report.PassFP32)}
	var roots []string
	for _, o := range origins {
		r, ok := f.MissingEpsilon(o.Index)
		if !ok || r.Radicand == "" {
			continue
		}
		eps[r.Radicand] = rerunEpsilon
		roots = append(roots, f.NodeName(r.Root))
		fix.Nodes = append(fix.Nodes, f.NodeName(r.Root))
		if m := onnx.ModulePath(f.Graph().Node[r.Root]); m != "" {
			fix.Modules = append(fix.Modules, m)
		}
	}
	if len(eps) == 0 {
		return nil, nil
	}
	fix.Pass = report.PassFP32 + "+epsilon"
	res, err := run.Rerun(ctx, Rerun{Name: fix.Pass, Reference: true, Batches: batches, Epsilon: eps})
	if err != nil {
		return nil, err
	}
	// judged as the verdict was: by NaN/Inf that reach a graph output,
	// with the infinities the model writes on purpose left out
	origins, deliberate, _ := f.PassOrigins(report.PassFP32, res, f.Assignment(report.PassFP32))
	fix.NonFiniteAfter = f.CountNonFinite(res, deliberate)
	fix.Works = len(f.Deciding(origins)) == 0
	where := listed(roots, 4)
	if fix.Works {
		fix.Summary = fmt.Sprintf("with an epsilon of %g added inside the square root at %s no NaN/Inf of the fp32 pass reaches an output", rerunEpsilon, where)
		if onnx.FromDynamo(f.Graph()) {
			fix.Summary += ": export with torch.onnx.export(..., optimize=False) to keep your epsilon, then audit again"
		} else {
			fix.Summary += ": add one to the normalization (or use torch.nn.LayerNorm or torch.nn.RMSNorm), export again and audit again"
		}
	} else {
		fix.Summary = fmt.Sprintf("an epsilon of %g inside the square root at %s still leaves NaN/Inf reaching the outputs of the fp32 pass (%d in all): the root is not the only cause", rerunEpsilon, where, fix.NonFiniteAfter)
	}
	return fix, nil
}
