package batch

import (
	"fmt"

	"fp16audit/internal/tensor"
)

// Size is the number of samples in b: the first axis of its first input
// that has one (1 for a batch of scalars).
func (b Batch) Size() int64 {
	for _, t := range b.Inputs {
		if len(t.Shape) > 0 {
			return t.Shape[0]
		}
	}
	return 1
}

// Samples returns samples [lo, lo+n) of b, every input cut along its first
// axis, sharing b's memory.
func (b Batch) Samples(lo, n int64) (Batch, error) {
	inputs, err := Cut(b.Inputs, lo, n)
	if err != nil {
		return Batch{}, err
	}
	return Batch{Source: fmt.Sprintf("%s [samples %d:%d]", b.Source, lo, lo+n), Inputs: inputs, Saved: b.Saved}, nil
}

// Cut returns samples [lo, lo+n) of every input along its first axis,
// sharing the inputs' memory. An input without that many samples cannot be
// cut.
func Cut(inputs []*tensor.Tensor, lo, n int64) ([]*tensor.Tensor, error) {
	out := make([]*tensor.Tensor, len(inputs))
	for i, t := range inputs {
		if len(t.Shape) == 0 || t.Shape[0] < lo+n {
			return nil, fmt.Errorf("input %q of shape %s cannot be cut along its first axis", t.Name, tensor.ShapeString(t.Shape))
		}
		per := int64(len(t.Data)) / t.Shape[0]
		shape := append([]int64{n}, t.Shape[1:]...)
		out[i] = &tensor.Tensor{Name: t.Name, DType: t.DType, Shape: shape, Data: t.Data[lo*per : (lo+n)*per]}
	}
	return out, nil
}
