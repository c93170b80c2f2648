package diagnose

import (
	"fmt"
	"strings"

	"fp16audit/report"
)

// weightAdvice is what to do about a weight that outgrew fp16.
const weightAdvice = "it is a parameter that grew past fp16's range in training, not a constant to write with torch.finfo: weight decay, gradient clipping or a lower learning rate keep it in range, or train in bf16 (learn.to_bf16()), whose range is fp32's"

// weightVerdictText is the verdict of a forward overflow whose origin is
// a trainable weight past fp16's range (Origin.Weight), named as the
// graph holds it.
func weightVerdictText(o report.Origin) string {
	return fmt.Sprintf("%s (%s) takes the weight %s, which holds %s: autocast casts the fp32 master weight to %s for the op, where it is %s, and the %s reaches %s; %s",
		moduleOr(o.Module, o.Node), o.OpType, o.Weight, fmtConst(*o.ConstantValue), o.Precision, infWord(*o.ConstantValue),
		infWord(*o.ConstantValue), strings.Join(o.AffectedOutputs, ", "), weightAdvice)
}

// weightFindingText is FP4004's message where the constant is the weight
// c (the initializer, as the graph holds it).
func weightFindingText(where, op, node, c string, v float64, prec, reach string) string {
	return fmt.Sprintf("%s (%s, %s) takes the weight %s = %s, which autocast casts to %s for the op, where it is %s; %s; %s",
		where, op, node, c, fmtConst(v), prec, infWord(v), reach, weightAdvice)
}
