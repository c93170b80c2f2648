package grad

import (
	"fmt"

	"fp16audit/internal/grad/vjp"
	"fp16audit/internal/tensor"
)

// ScoredTargets checks a target against the loss Build made and counts
// the targets the loss averages over. For cross-entropy every target must
// be a class index in [0, Classes) or the ignored index — PyTorch raises
// otherwise, and ONNX Runtime would read out of range — and the count
// leaves out the ignored targets and, with the shift, the first position
// of every sequence, which no logits predict (and which the loss never
// reads). For the other losses it is
// the number of target elements.
func (r *Result) ScoredTargets(t *tensor.Tensor) (int64, error) {
	if t.Elements() != tensor.NumElements(r.TargetShape) {
		return 0, fmt.Errorf("target shape %v: the backward graph was built for %v", t.Shape, r.TargetShape)
	}
	ce := r.CrossEntropy
	if ce == nil {
		return t.Elements(), nil
	}
	v, err := vjp.Int64s(t)
	if err != nil {
		return 0, fmt.Errorf("target: %w; cross-entropy wants class indices", err)
	}
	seq := ce.Labels[len(ce.Labels)-1]
	scored := int64(0)
	for i, x := range v {
		if x == ce.IgnoreIndex || ce.Shift && int64(i)%seq == 0 {
			continue
		}
		if x < 0 || x >= ce.Classes {
			return 0, fmt.Errorf("target element %d (at %v of %v) is %d: cross-entropy on %q wants class indices 0 to %d (%d classes) or the ignored index %d",
				i, unravel(int64(i), ce.Labels), ce.Labels, x, r.Output, ce.Classes-1, ce.Classes, ce.IgnoreIndex)
		}
		scored++
	}
	return scored, nil
}

// unravel turns a flat index into its position in shape.
func unravel(i int64, shape []int64) []int64 {
	pos := make([]int64, len(shape))
	for k := len(shape) - 1; k >= 0; k-- {
		if shape[k] > 0 {
			pos[k] = i % shape[k]
			i /= shape[k]
		}
	}
	return pos
}
