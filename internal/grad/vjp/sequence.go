package vjp

import (
	"slices"

	"fp16audit/internal/onnx"
)

func init() {
	family("sequenceAt", sequenceAt)
	family("splitToSequence", splitToSequence)
}

// A sequence is no tensor, so its gradient is carried in the layout of
// the tensor SplitToSequence cut it from (torch.chunk, split and unbind
// in a dynamo export without its optimizer): each piece's gradient in
// the piece's place, zeros where no SequenceAt read one. Contributions
// of several SequenceAt then add up as tensors, and SplitToSequence
// hands the sum on to its input unchanged, as autograd's backward of
// split concatenates the pieces' gradients.

// sequenceAt pads the gradient of the piece it took to the shape of the
// tensor the sequence was cut from, at the piece's place.
func sequenceAt(c *call) error {
	if !c.wants(0) {
		return nil
	}
	b := c.b
	pi := b.ix.Producer(c.in(0))
	if pi < 0 {
		return c.errorf("the sequence %q is not made by a node", c.in(0))
	}
	sp := b.src.Node[pi]
	if sp.OpType != "SplitToSequence" || !onnx.IsDefaultDomain(sp.Domain) {
		return c.errorf("the sequence %q is made by %s; the backward follows sequences SplitToSequence makes", c.in(0), sp.OpType)
	}
	xs, err := c.shape(sp.Input[0])
	if err != nil {
		return err
	}
	var split []int64
	has, scalar := len(sp.Input) > 1 && sp.Input[1] != "", false
	if has {
		t, err := b.constant(sp.Input[1])
		if err != nil {
			return err
		}
		if split, err = int64s(t); err != nil {
			return err
		}
		scalar = len(t.Shape) == 0
	}
	p, ok := onnx.SplitPieces(sp, xs, split, has, scalar)
	if !ok {
		return c.errorf("SplitToSequence %s: split %v does not cut shape %v", sp.Name, split, xs)
	}
	pos, err := b.constInts(c.in(1))
	if err != nil {
		return err
	}
	k, ok := p.Index(pos[0])
	if len(pos) != 1 || !ok {
		return c.errorf("position %v is not one of the %d pieces", pos, len(p.Sizes))
	}
	g := c.g()
	if p.Squeeze {
		g = b.op("Unsqueeze", []string{g, b.ints(int64(p.Axis))})
	}
	pads := make([]int64, 2*len(xs))
	pads[p.Axis] = p.Offset(k)
	pads[len(xs)+p.Axis] = xs[p.Axis] - p.Offset(k) - p.Sizes[k]
	if slices.ContainsFunc(pads, func(v int64) bool { return v != 0 }) {
		g = b.op("Pad", []string{g, b.ints(pads...)})
	}
	c.set(0, g)
	return nil
}

// splitToSequence hands the sequence's gradient, already in its input's
// layout, to its input.
func splitToSequence(c *call) error {
	c.set(0, c.g())
	return nil
}
