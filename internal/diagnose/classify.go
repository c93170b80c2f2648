package diagnose

import (
	"fp16audit/internal/diagnose/evidence"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/precision"
	"fp16audit/report"
)

// originClass is what an origin of the emulated pass is, for its finding
// and the verdict.
type originClass int

const (
	classOverflow  originClass = iota // an op overflows (FP2001)
	classLogits                       // the final layer overflows (FP2003)
	classHalfCast                     // the model's own half cast makes it overflow (FP4001)
	classConstant                     // an out-of-range constant is written (FP4004)
	classInput                        // the batch holds NaN/Inf (FP1001)
	classPrecision                    // nothing overflows, rounding makes the outputs wrong (FP2006)
)

// classify says what origin o of the emulated pass is.
func classify(f *evidence.Facts, o report.Origin) originClass {
	switch {
	case o.Cause == report.CauseInput:
		return classInput
	case o.Index < 0:
		return classOverflow
	case o.Cause == report.CauseConstant:
		return classConstant
	case o.Cause == report.CausePrecision:
		return classPrecision
	case o.ExplicitCast && overflowsAsWritten(f, o):
		return classHalfCast
	case isFinalLayer(f, o.Index) || isFinalBias(f, o.Index):
		return classLogits
	}
	return classOverflow
}

// overflowsAsWritten reports whether an emulated-pass origin overflows in
// the run without mixed precision too (the as-written pass: fp32 but for
// the model's own half casts): that run has an origin reaching an output
// at the same node or at one of the casts the origin's precision comes
// from. Only then is the model's cast to blame; an overflow that only
// autocast's lower precision causes stays an overflowing op, whatever
// casts lie upstream. Without the as-written pass (--passes none) the
// provenance alone decides.
func overflowsAsWritten(f *evidence.Facts, o report.Origin) bool {
	if o.Index < 0 {
		return false
	}
	if f.Passes[report.PassAsWritten] == nil {
		return true
	}
	at := map[int]bool{o.Index: true}
	for _, c := range f.Static.Assign.Casts[o.Value] {
		at[c] = true
	}
	for _, a := range f.Deciding(f.Origins(report.PassAsWritten)) {
		if a.Index >= 0 && at[a.Index] {
			return true
		}
	}
	return false
}

// isFinalBias reports whether node ni is the bias Add of the final layer
// (the exporter's split of a Linear on a 3-D input): the overflow then
// starts in the head as well.
func isFinalBias(f *evidence.Facts, ni int) bool {
	n := f.Graph().Node[ni]
	if n.OpType != "Add" || !onnx.IsDefaultDomain(n.Domain) {
		return false
	}
	idx := f.Static.Model.Index
	for _, in := range n.Input {
		if p := idx.Producer(in); p >= 0 && isFinalLayer(f, p) {
			return true
		}
	}
	return false
}

// isFinalLayer reports whether node ni is the last layer op (one autocast
// runs in its lower precision: Gemm, MatMul, Conv...) before a graph
// output: every path from its outputs reaches a graph output through ops
// that may follow a final layer (ops.Tail: shape ops, activations,
// softmax, casts, the Linear bias) only. It does not depend on the policy: the same head is the final
// layer under autocast and under half.
func isFinalLayer(f *evidence.Facts, ni int) bool {
	g := f.Graph()
	n := g.Node[ni]
	if !precision.IsLowerPrecisionOp(n.Domain, n.OpType) {
		return false
	}
	isOut := map[string]bool{}
	for _, o := range g.Output {
		isOut[o.Name] = true
	}
	reached := false
	seen := map[int]bool{}
	var walk func(values []string) bool
	walk = func(values []string) bool {
		for _, v := range values {
			if isOut[v] {
				reached = true
			}
			for _, c := range f.Static.Model.Index.Consumers(v) {
				if seen[c] {
					continue
				}
				seen[c] = true
				if !ops.Lookup(ops.Default, g.Node[c].OpType).Is(ops.Tail) {
					return false
				}
				if !walk(g.Node[c].Output) {
					return false
				}
			}
		}
		return true
	}
	return walk(n.Output) && reached
}
