package lint

import (
	"fmt"

	"fp16audit/checks"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/precision"
)

var checkEpsilon = checks.Register(&checks.Check{ID: "FP4005", Title: "normalization epsilon vanishes in fp16", Severity: checks.SevError,
	Policies: []string{"autocast-fp16", "half"}, Doc: `A normalization adds an epsilon smaller than 2^-24 (about 5.96e-8), fp16's
smallest subnormal: the epsilon attribute of LayerNormalization,
InstanceNormalization, BatchNormalization or GroupNormalization, or the
Add(eps) of a layer norm or RMS norm the exporter decomposed (opset < 17:
ReduceMean, Sub, Pow, ReduceMean, Add(eps), Sqrt, Div). In fp16 such an
epsilon is 0 (or 2^-24 at best), so a row with zero variance divides by
zero and gives Inf or NaN. eps=1e-12 (BERT-style) is the usual case.

It is an error when the normalization computes in fp16 under the policy
(half: model.half()), and information when the policy computes it in fp32
(autocast keeps layer_norm and group_norm in fp32, so the epsilon is
harmless there). Fix: use eps >= 1e-5 (nn.LayerNorm(d, eps=1e-5)), or keep
the normalization in fp32.`})

var epsilonAnalyzer = &Analyzer{Check: checkEpsilon, Run: runEpsilon}

// epsSite is a normalization epsilon: an attribute of node, or the
// constant value added by a decomposed norm's Add node.
type epsSite struct {
	node  int
	value string // the epsilon constant's name; "" for an attribute
	eps   float64
}

// epsSites returns the normalization epsilons of the graph, in order.
func (f *Facts) epsSites() []epsSite {
	f.epsOnce.Do(func() {
		ix := f.Model.Index
		for _, i := range f.Order {
			n := f.node(i)
			if !onnx.IsDefaultDomain(n.GetDomain()) {
				continue
			}
			switch {
			case ops.Epsilon(n.GetDomain(), n.GetOpType()):
				for _, a := range n.GetAttribute() {
					if a.GetName() == "epsilon" {
						f.eps = append(f.eps, epsSite{node: i, eps: float64(a.GetF())})
					}
				}
			case n.GetOpType() == "Add" && len(n.GetInput()) == 2 && len(n.GetOutput()) == 1 && feedsSqrt(f, n.GetOutput()[0]):
				for j, in := range n.GetInput() {
					p := ix.Producer(n.GetInput()[1-j])
					if p < 0 || f.node(p).GetOpType() != "ReduceMean" {
						continue
					}
					if v, ok := f.scalarValue(in); ok {
						f.eps = append(f.eps, epsSite{node: i, value: in, eps: v})
						break
					}
				}
			}
		}
	})
	return f.eps
}

func feedsSqrt(f *Facts, value string) bool {
	for _, c := range f.Model.Index.Consumers(value) {
		if n := f.node(c); n.GetOpType() == "Sqrt" && onnx.IsDefaultDomain(n.GetDomain()) {
			return true
		}
	}
	return false
}

func runEpsilon(f *Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, s := range f.epsSites() {
		if s.eps <= 0 || s.eps >= fp16Subnormal {
			continue
		}
		n := f.node(s.node)
		held := f.Assign.Node[s.node]
		what := fmt.Sprintf("%s has %s epsilon=%s", f.where(s.node), n.GetOpType(), fmtVal(s.eps))
		value := "epsilon=" + fmtVal(s.eps)
		if s.value != "" {
			held = f.HeldAt(s.value, s.node)
			what = fmt.Sprintf("%s adds epsilon %q = %s after a ReduceMean (a decomposed layer norm)", f.where(s.node), s.value, fmtVal(s.eps))
			value = s.value
		}
		in16 := "0"
		if s.eps > fp16Flush {
			in16 = "2^-24, a subnormal"
		}
		sev, why := checks.SevInfo, fmt.Sprintf("it computes in %s under %s, where the epsilon is harmless", held, f.Policy.Name)
		if held == precision.FP16 {
			sev, why = checks.SevError, fmt.Sprintf("it computes in fp16 under %s, where the epsilon is %s: a zero-variance row divides by zero", f.Policy.Name, in16)
		}
		out = append(out, f.finding(checkEpsilon, sev, s.node, value,
			fmt.Sprintf("%s, below fp16's smallest subnormal 2^-24; %s", what, why)))
	}
	return out, nil
}
