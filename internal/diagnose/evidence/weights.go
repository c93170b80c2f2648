package evidence

import (
	"fp16audit/report"
)

// WeightConstant reports whether the out-of-range constant of origin o is
// a trainable weight rather than a value the model writes (a mask fill),
// by the graph's rule (onnx.Index.Weight: an initializer, directly or
// through the exporter's Identity or Transpose, that an op autocast
// computes in lower precision takes), and returns that initializer. Such
// a weight outgrew fp16 in training: autocast casts the fp32 master
// weight to fp16 for the op, where it is Inf, and torch.finfo is no fix
// for it.
func (f *Facts) WeightConstant(o report.Origin) (string, bool) {
	if o.Cause != report.CauseConstant || o.Constant == "" {
		return "", false
	}
	return f.Static.Model.Index.Weight(o.Index, o.Constant)
}
