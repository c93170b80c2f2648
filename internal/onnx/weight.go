package onnx

import "fp16audit/internal/onnx/ops"

// Weight returns the initializer that value, an input of node i, reads
// when it is a trainable weight: the op is one autocast computes in
// lower precision (Conv, Gemm, MatMul, … : ops.Lower) and the value is
// an initializer, directly or through the exporter's Identity (a shared
// weight) or Transpose (a Linear's weight laid out for MatMul; the dynamo
// exporter with its constants folded makes that transpose an initializer
// of its own, val_N, which this finds as it is). Such a value is a
// parameter: autocast casts its fp32 master copy to the lower precision
// for the op, so one that grew past 65504 in training is Inf there,
// whatever the activations. A constant the model writes (a mask fill)
// is read by other ops and is not one. This is the one rule by which
// fp16audit run and fp16audit replay tell a weight.
func (ix *Index) Weight(i int, value string) (string, bool) {
	nodes := ix.g.GetNode()
	if i < 0 || i >= len(nodes) || value == "" {
		return "", false
	}
	n := nodes[i]
	if op := ops.Lookup(n.GetDomain(), n.GetOpType()); op == nil || op.Autocast != ops.Lower {
		return "", false
	}
	name := value
	for range 8 {
		if ix.IsInitializer(name) {
			return name, true
		}
		p := ix.Producer(name)
		if p < 0 {
			return "", false
		}
		pn := nodes[p]
		if !IsDefaultDomain(pn.GetDomain()) || (pn.GetOpType() != "Identity" && pn.GetOpType() != "Transpose") || len(pn.GetInput()) == 0 {
			return "", false
		}
		name = pn.GetInput()[0]
	}
	return "", false
}
