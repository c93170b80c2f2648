package evidence

import (
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/report"
)

// WeightConstant reports whether the out-of-range constant of origin o is
// a trainable weight rather than a value the model writes (a mask fill):
// an initializer — directly, or through the exporter's Identity or
// Transpose of one — that an op autocast computes in lower precision
// (Conv, Gemm, MatMul, …) takes as an operand. Such a weight outgrew
// fp16 in training: autocast casts the fp32 master weight to fp16 for the
// op, where it is Inf, and torch.finfo is no fix for it.
func (f *Facts) WeightConstant(o report.Origin) bool {
	if o.Cause != report.CauseConstant || o.Constant == "" || o.Index < 0 || o.Index >= len(f.Graph().Node) {
		return false
	}
	n := f.Graph().Node[o.Index]
	op := ops.Lookup(n.Domain, n.OpType)
	if op == nil || op.Autocast != ops.Lower {
		return false
	}
	ix := f.Static.Model.Index
	name := o.Constant
	for range 8 {
		if ix.IsInitializer(name) {
			return true
		}
		p := ix.Producer(name)
		if p < 0 {
			return false
		}
		pn := f.Graph().Node[p]
		if !onnx.IsDefaultDomain(pn.Domain) || (pn.OpType != "Identity" && pn.OpType != "Transpose") || len(pn.Input) == 0 {
			return false
		}
		name = pn.Input[0]
	}
	return false
}
