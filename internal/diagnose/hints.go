package diagnose

import (
	"context"
	"fmt"
	"strings"

	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/report"
)

// reductions are the ops whose output is a mean or sum over an axis: the
// variance or squared norm a normalization takes the square root of.
var reductions = map[string]bool{"ReduceMean": true, "ReduceSum": true, "ReduceSumSquare": true}

// rerunEpsilon is the epsilon the missing-epsilon fix puts inside the
// root: BERT's, the smallest common one (a zero-variance row then
// normalizes to 0 in fp32).
const rerunEpsilon = 1e-12

// rootWithoutEps is a division by the square root of a mean or sum with
// no epsilon: Node divides by Root's output; Radicand is what Root takes
// the square root of ("" for ReduceL2, which the fix cannot reach).
type rootWithoutEps struct {
	Node, Root int
	Radicand   string
}

// missingEpsilon finds whether node ni divides by the square root of a
// mean or sum (a hand-written LayerNorm, RMSNorm or L2 normalization)
// with no epsilon added inside or outside the root, where a row whose
// values are all equal (a zero pad embedding) makes 0/0.
func (f *Facts) missingEpsilon(ni int) (rootWithoutEps, bool) {
	g := f.graph()
	ix := f.Static.Model.Index
	if ni < 0 || ni >= len(g.Node) {
		return rootWithoutEps{}, false
	}
	n := g.Node[ni]
	var den string
	switch {
	case n.OpType == "Div" && len(n.Input) == 2:
		den = n.Input[1]
	case n.OpType == "Reciprocal" && len(n.Input) == 1:
		den = n.Input[0]
	default:
		return rootWithoutEps{}, false
	}
	p := ix.Producer(den)
	if p < 0 {
		return rootWithoutEps{}, false
	}
	root := g.Node[p]
	switch {
	case root.OpType == "ReduceL2":
		return rootWithoutEps{Node: ni, Root: p}, true
	case root.OpType == "Sqrt" && len(root.Input) == 1:
		if q := ix.Producer(root.Input[0]); q >= 0 && reductions[g.Node[q].OpType] {
			return rootWithoutEps{Node: ni, Root: p, Radicand: root.Input[0]}, true
		}
	}
	return rootWithoutEps{}, false
}

// epsilonHint is what the fp32-broken finding adds when its node divides
// by a root without epsilon. On a dynamo export it adds what was measured
// with torch 2.9.1 (onnxscript 0.7.2): the exporter's optimizer folds away
// an Add of a constant of 1e-8 or less, so BERT's sqrt(var + 1e-12) is
// exported as sqrt(var). "" when the node is not such a division.
func (f *Facts) epsilonHint(ni int) string {
	r, ok := f.missingEpsilon(ni)
	if !ok {
		return ""
	}
	hint := fmt.Sprintf("; %s divides by the square root of a mean or sum with no epsilon added, so a row whose values are all equal (a zero pad embedding) divides by zero", f.nodeName(r.Node))
	if onnx.FromDynamo(f.graph()) {
		hint += ". " + dynamoEpsilon
	}
	return hint
}

// dynamoEpsilon says what the dynamo exporter does to a small epsilon.
const dynamoEpsilon = "If the PyTorch code adds an epsilon of 1e-8 or less inside the root (BERT's 1e-12), torch.onnx.export's optimizer removed it (measured with torch 2.9.1): export again with optimize=False, or use torch.nn.LayerNorm or torch.nn.RMSNorm, whose epsilon is exported as an attribute"

// fixEpsilon reruns the fp32 reference with an epsilon put back inside
// the roots the origins divide by; nil when no origin is such a division.
func (f *Facts) fixEpsilon(ctx context.Context, run Runner, batches []batch.Batch, origins []report.Origin) (*report.Fix, error) {
	eps := map[string]float32{}
	fix := &report.Fix{Kind: report.FixEpsilon, NonFiniteBefore: f.nonFinite(f.Passes[PassFP32], PassFP32)}
	var roots []string
	for _, o := range origins {
		r, ok := f.missingEpsilon(o.Index)
		if !ok || r.Radicand == "" {
			continue
		}
		eps[r.Radicand] = rerunEpsilon
		roots = append(roots, f.nodeName(r.Root))
		fix.Nodes = append(fix.Nodes, f.nodeName(r.Root))
		if m := onnx.ModulePath(f.graph().Node[r.Root]); m != "" {
			fix.Modules = append(fix.Modules, m)
		}
	}
	if len(eps) == 0 {
		return nil, nil
	}
	fix.Pass = PassFP32 + "+epsilon"
	res, err := run.Rerun(ctx, Rerun{Name: fix.Pass, Reference: true, Batches: batches, Epsilon: eps})
	if err != nil {
		return nil, err
	}
	// judged as the verdict was: by NaN/Inf that reach a graph output,
	// with the infinities the model writes on purpose left out
	origins, deliberate, _ := f.passOrigins(PassFP32, res, f.assign[PassFP32])
	fix.NonFiniteAfter = f.countNonFinite(res, deliberate)
	fix.Works = len(f.deciding(origins)) == 0
	where := strings.Join(limitList(roots, 4), ", ")
	if fix.Works {
		fix.Summary = fmt.Sprintf("with an epsilon of %g added inside the square root at %s no NaN/Inf of the fp32 pass reaches an output", rerunEpsilon, where)
		if onnx.FromDynamo(f.graph()) {
			fix.Summary += ": export with torch.onnx.export(..., optimize=False) to keep your epsilon, then audit again"
		} else {
			fix.Summary += ": add one to the normalization (or use torch.nn.LayerNorm or torch.nn.RMSNorm), export again and audit again"
		}
	} else {
		fix.Summary = fmt.Sprintf("an epsilon of %g inside the square root at %s still leaves NaN/Inf reaching the outputs of the fp32 pass (%d in all): the root is not the only cause", rerunEpsilon, where, fix.NonFiniteAfter)
	}
	return fix, nil
}
