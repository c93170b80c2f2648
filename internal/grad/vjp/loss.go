package vjp

import (
	"errors"
	"fmt"
	"fp16audit/internal/tensor"
	"slices"

	"fp16audit/internal/onnx"
)

// Target describes the target input a loss added: its shape and ONNX
// element type. Name is "" for ModelOutput, which takes no target.
type Target struct {
	Name  string
	Shape []int64
	Type  int32
	// CrossEntropy is how the cross-entropy loss reads the logits and
	// this target; nil for the other losses.
	CrossEntropy *CrossEntropyLayout
}

// DefaultIgnoreIndex is PyTorch's ignore_index, the label Hugging Face's
// data collators put on padding.
const DefaultIgnoreIndex = -100

// CrossEntropyOptions say how the cross-entropy loss reads its logits and
// targets.
type CrossEntropyOptions struct {
	// ClassAxis is the logits' class axis: 1 for PyTorch's own convention
	// (F.cross_entropy: [N, C, d1, …] logits, [N, d1, …] targets), -1 for
	// the last axis ([…, C] logits, […] targets: a language model's
	// logits, fastai's CrossEntropyLossFlat), 0 to decide by the target's
	// shape (the last axis when no target shape is given).
	ClassAxis int
	// IgnoreIndex is the target value left out of the loss and its mean
	// (PyTorch's ignore_index); nil means DefaultIgnoreIndex.
	IgnoreIndex *int64
	// Shift scores the logits at position t of the target's last axis
	// against target t+1, as a causal language model's loss does
	// (logits[..., :-1, :] against labels[..., 1:]): the target holds the
	// unshifted token ids (Hugging Face's labels=input_ids), and the
	// logits of the last position get no gradient.
	Shift bool
}

// CrossEntropyLayout is how a cross-entropy loss read its logits and target.
type CrossEntropyLayout struct {
	// ClassAxis is the logits' class axis as the user counts it: 1, or
	// -1 for the last (rank-2 logits [N, C] count as 1).
	ClassAxis int
	// Classes is the size of the class axis.
	Classes int64
	// IgnoreIndex is the target value the loss leaves out.
	IgnoreIndex int64
	// Shift tells that position t is scored against target t+1 along the
	// target's last axis.
	Shift bool
	// Labels is the target's shape as the loss reads it: the logits'
	// shape without the class axis (before the shift).
	Labels []int64
}

// ErrTargetShape marks a target whose shape fits no reading of the
// loss's output.
var ErrTargetShape = errors.New("target shape")

// Loss adds the target and scale inputs, the loss output (LossOutput) and
// the seed gradient scale × dL/dpred (SeedOutput) for the loss kind
// applied to the forward value pred, and returns the target it added.
// targetShape is the shape the caller's target has (nil: derived from
// pred's shape, see grad.Options); ce configures cross-entropy and is
// ignored by the other losses. The seed is written in closed form, as
// PyTorch's loss backward kernels compute it, rather than differentiated
// through the loss nodes: it is what autograd hands to the model's last
// op.
func (b *Builder) Loss(kind Loss, pred string, targetShape []int64, ce CrossEntropyOptions) (Target, error) {
	tg := Target{Name: TargetInput}
	ps, err := b.shape(pred)
	if err != nil {
		return tg, fmt.Errorf("grad: %w", err)
	}
	b.label = "loss"
	b.inputs = append(b.inputs, onnx.TensorValueInfo(ScaleInput, onnx.TensorProto_FLOAT))
	scale := ScaleInput
	n := tensor.NumElements(ps)

	var loss, seed string
	switch kind {
	case ModelOutput:
		tg = Target{}
		loss = b.sumAll(pred)
		seed = b.expandTo(scale, ps)
	case CrossEntropy:
		if loss, seed, err = b.crossEntropy(pred, ps, targetShape, ce, &tg); err != nil {
			return tg, err
		}
	case BCE, MSE, L1:
		if err := b.target(kind, pred, targetShape, &tg, ps, elemFloat, ""); err != nil {
			return tg, err
		}
		t := tg.Name
		if !slices.Equal(tg.Shape, ps) {
			t = b.reshape(t, ps)
		}
		m := float64(n)
		switch kind {
		case BCE:
			// max(x,0) − x·t + log(1 + exp(−|x|)), stable for any x
			soft := b.op("Log", []string{b.add(b.scalar(1), b.op("Exp", []string{b.neg(b.op("Abs", []string{pred}))}))})
			l := b.add(b.sub(b.op("Relu", []string{pred}), b.mul(pred, t)), soft)
			loss = b.scale(b.sumAll(l), 1/m)
			seed = b.mul(b.sub(b.op("Sigmoid", []string{pred}), t), b.scale(scale, 1/m))
		case MSE:
			d := b.sub(pred, t)
			loss = b.scale(b.sumAll(b.mul(d, d)), 1/m)
			seed = b.mul(d, b.scale(scale, 2/m))
		case L1:
			d := b.sub(pred, t)
			loss = b.scale(b.sumAll(b.op("Abs", []string{d})), 1/m)
			seed = b.mul(b.op("Sign", []string{d}), b.scale(scale, 1/m))
		}
	}
	b.rename(loss, LossOutput)
	b.output(LossOutput, []int64{})
	b.rename(seed, SeedOutput)
	b.output(SeedOutput, ps)
	return tg, nil
}

// crossEntropy emits F.cross_entropy(pred, target, ignore_index) with mean
// reduction over the scored positions, and its seed, and declares the
// target. With Shift the logits lose their last position and the target
// its first along the target's last axis, and the seed is padded back
// with zeros.
func (b *Builder) crossEntropy(pred string, ps, given []int64, o CrossEntropyOptions, tg *Target) (loss, seed string, err error) {
	r := len(ps)
	if r < 2 {
		return "", "", fmt.Errorf("grad: cross-entropy needs logits with a class axis ([N, C], [N, C, d…] or […, C]); output %q has shape %v", pred, ps)
	}
	axis, err := classAxis(pred, ps, given, o)
	if err != nil {
		return "", "", err
	}
	labels := slices.Delete(slices.Clone(ps), axis, axis+1)
	where := "the classes on axis 1"
	if axis == r-1 && r > 2 {
		where = "the classes on the last axis"
	}
	if err := b.target(CrossEntropy, pred, given, tg, labels, elemInt64, where); err != nil {
		return "", "", err
	}
	ignore := int64(DefaultIgnoreIndex)
	if o.IgnoreIndex != nil {
		ignore = *o.IgnoreIndex
	}
	classes := ps[axis]
	user := 1
	if r > 2 && axis == r-1 {
		user = -1
	}
	tg.CrossEntropy = &CrossEntropyLayout{ClassAxis: user, Classes: classes, IgnoreIndex: ignore, Shift: o.Shift, Labels: labels}

	t := tg.Name
	if !slices.Equal(tg.Shape, labels) {
		t = b.reshape(t, labels)
	}
	logits := pred
	// the target's last axis, and where it lies among the logits' axes
	seqT := int64(len(labels) - 1)
	seqL := seqT
	if seqT >= int64(axis) {
		seqL++
	}
	if o.Shift {
		if labels[seqT] < 2 {
			return "", "", fmt.Errorf("grad: %w %v: shifting the targets by one needs at least 2 positions along the last axis", ErrTargetShape, tg.Shape)
		}
		logits = b.slice(pred, seqL, 0, ps[seqL]-1)
		t = b.slice(t, seqT, 1, labels[seqT])
	}
	ax := int64(axis)
	valid := b.op("Not", []string{b.op("Equal", []string{t, b.int0(ignore)})})
	// ignored positions read class 0, then count for nothing
	safe := b.op("Where", []string{valid, t, b.int0(0)})
	validAt := b.op("Unsqueeze", []string{valid, b.ints(ax)})
	weight := b.op("Cast", []string{validAt}, onnx.AttrInt("to", int64(elemFloat)))
	count := b.sumAll(weight)

	logp := b.op("LogSoftmax", []string{logits}, onnx.AttrInt("axis", ax))
	picked := b.op("GatherElements", []string{logp, b.op("Unsqueeze", []string{safe, b.ints(ax)})}, onnx.AttrInt("axis", ax))
	// torch's nll_loss never reads an ignored position: Where, not a
	// product, so a −Inf there stays out; 0/0 = NaN when all are ignored,
	// as in torch
	loss = b.div(b.neg(b.sumAll(b.op("Where", []string{validAt, picked, b.scalar(0)}))), count)
	onehot := b.op("OneHot", []string{safe, b.ints(classes), b.floats([]int64{2}, []float32{0, 1})}, onnx.AttrInt("axis", ax))
	// torch: log_softmax_backward(nll_loss_backward(scale)) =
	// (exp(logp) − onehot) · weight · scale/W, 0 when W = 0
	per := b.div(ScaleInput, b.op("Max", []string{count, b.scalar(1)}))
	seed = b.mul(b.mul(b.sub(b.op("Exp", []string{logp}), onehot), weight), per)
	if o.Shift {
		pads := make([]int64, 2*r)
		pads[r+int(seqL)] = 1
		seed = b.op("Pad", []string{seed, b.ints(pads...)})
	}
	return loss, seed, nil
}

// classAxis resolves the class axis of logits of shape ps for a target of
// shape given (nil: not known).
func classAxis(pred string, ps, given []int64, o CrossEntropyOptions) (int, error) {
	r := len(ps)
	last := r - 1
	switch o.ClassAxis {
	case 1:
		return 1, nil
	case -1:
		return last, nil
	case 0:
	default:
		return 0, fmt.Errorf("grad: class axis %d: want 1, -1 (the last) or 0 (decided by the target's shape)", o.ClassAxis)
	}
	if r == 2 || given == nil {
		return last, nil
	}
	byAxis1 := slices.Delete(slices.Clone(ps), 1, 2)
	byLast := ps[:last]
	e1, eL := slices.Equal(given, byAxis1), slices.Equal(given, byLast)
	if e1 != eL {
		if e1 {
			return 1, nil
		}
		return last, nil
	}
	n1, nL := tensor.NumElements(given) == tensor.NumElements(byAxis1), tensor.NumElements(given) == tensor.NumElements(byLast)
	if !e1 && n1 != nL {
		if n1 {
			return 1, nil
		}
		return last, nil
	}
	if e1 || n1 {
		return 0, fmt.Errorf("grad: %w %v fits cross-entropy on output %q %v both with the classes on axis 1 (targets %v) and on the last axis (targets %v): say which axis holds the classes",
			ErrTargetShape, given, pred, ps, byAxis1, byLast)
	}
	return 0, fmt.Errorf("grad: %w %v (%d elements) fits cross-entropy on output %q %v neither with the classes on the last axis (targets %v, %d elements) nor on axis 1 (targets %v, %d elements)",
		ErrTargetShape, given, tensor.NumElements(given), pred, ps, byLast, tensor.NumElements(byLast), byAxis1, tensor.NumElements(byAxis1))
}

// target declares the target input: of shape given when not nil (it must
// hold as many elements as want), else of shape want. how says how the
// loss reads the output, for the error.
func (b *Builder) target(kind Loss, pred string, given []int64, tg *Target, want []int64, et int32, how string) error {
	ts := want
	if given != nil {
		if tensor.NumElements(given) != tensor.NumElements(want) {
			if how != "" {
				how = ", " + how
			}
			return fmt.Errorf("grad: %w %v has %d elements, the %s loss on output %q %v wants %d (shape %v%s)",
				ErrTargetShape, given, tensor.NumElements(given), kind, pred, b.mustShape(pred), tensor.NumElements(want), want, how)
		}
		ts = slices.Clone(given)
	}
	dims := make([]any, len(ts))
	for i, d := range ts {
		dims[i] = d
	}
	b.inputs = append(b.inputs, onnx.TensorValueInfo(TargetInput, onnx.TensorProto_DataType(et), dims...))
	tg.Shape, tg.Type = ts, et
	return nil
}
