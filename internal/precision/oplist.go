package precision

import "fp16audit/internal/onnx/ops"

// The ops fp16audit knows, and the autocast list each is on, are entries
// of the registry internal/onnx/ops: one entry per op for every stage.
// This file reads them as the policy's Categories.

// autocastCategory maps an entry's autocast list to the policy's category.
var autocastCategory = map[ops.Autocast]Category{
	ops.Lower:   LowerPrecision,
	ops.FP32:    AlwaysFP32,
	ops.Promote: Promote,
}

// autocastList returns the category autocast puts an op of the default
// domain in, and whether it is on one of autocast's lists.
func autocastList(opType string) (Category, bool) {
	o := ops.Lookup(ops.Default, opType)
	if o == nil {
		return FollowInputs, false
	}
	c, ok := autocastCategory[o.Autocast]
	return c, ok
}

// isStandard reports whether an op belongs to the ONNX standard (ai.onnx or
// ai.onnx.ml), whose semantics fp16audit knows.
func isStandard(domain, opType string) bool { return ops.Standard(domain, opType) }
