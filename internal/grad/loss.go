package grad

import (
	"fmt"
	"slices"

	"fp16audit/internal/onnx"
)

// loss adds the target and scale inputs, the loss output and the seed
// gradient scale × dL/dpred, and returns the seed's name. The seed is
// written in closed form, as PyTorch's loss backward kernels compute it,
// rather than differentiated through the loss nodes: it is what autograd
// hands to the model's last op.
func (b *builder) loss(opt Options, res *Result) (string, error) {
	pred := res.Output
	ps, err := b.shape(pred)
	if err != nil {
		return "", fmt.Errorf("grad: %w", err)
	}
	b.label = "loss"
	b.inputs = append(b.inputs, onnx.TensorValueInfo(ScaleInput, onnx.TensorProto_FLOAT))
	scale := ScaleInput
	n := numel(ps)

	var loss, seed string
	switch opt.Loss {
	case ModelOutput:
		res.TargetShape, res.TargetType, res.Target = nil, 0, ""
		loss = b.sumAll(pred)
		seed = b.expandTo(scale, ps)
	case CrossEntropy:
		if len(ps) < 2 {
			return "", fmt.Errorf("grad: cross-entropy needs logits [N, C, ...], output %q has shape %v", pred, ps)
		}
		classes := ps[1]
		ts := append([]int64{ps[0]}, ps[2:]...)
		if err := b.target(opt, res, ts, elemInt64); err != nil {
			return "", err
		}
		t := res.Target
		if !equalShape(res.TargetShape, ts) {
			t = b.reshape(t, ts)
		}
		m := float64(n / classes)
		logp := b.op("LogSoftmax", []string{pred}, onnx.AttrInt("axis", 1))
		picked := b.op("GatherElements", []string{logp, b.op("Unsqueeze", []string{t, b.ints(1)})}, onnx.AttrInt("axis", 1))
		loss = b.scale(b.neg(b.sumAll(picked)), 1/m)
		onehot := b.op("OneHot", []string{t, b.ints(classes), b.floats([]int64{2}, []float32{0, 1})}, onnx.AttrInt("axis", 1))
		// torch: log_softmax_backward(nll_loss_backward(scale)) =
		// (exp(logp) − onehot) · scale/M
		seed = b.mul(b.sub(b.op("Exp", []string{logp}), onehot), b.scale(scale, 1/m))
	case BCE, MSE, L1:
		if err := b.target(opt, res, ps, elemFloat); err != nil {
			return "", err
		}
		t := res.Target
		if !equalShape(res.TargetShape, ps) {
			t = b.reshape(t, ps)
		}
		m := float64(n)
		switch opt.Loss {
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
	return SeedOutput, nil
}

// target declares the target input: of opt.TargetShape when given (it must
// hold as many elements as want), else of shape want.
func (b *builder) target(opt Options, res *Result, want []int64, et int32) error {
	ts := want
	if opt.TargetShape != nil {
		if numel(opt.TargetShape) != numel(want) {
			return fmt.Errorf("grad: target shape %v has %d elements, the %s loss on output %q wants %d (shape %v)",
				opt.TargetShape, numel(opt.TargetShape), opt.Loss, res.Output, numel(want), want)
		}
		ts = slices.Clone(opt.TargetShape)
	}
	dims := make([]any, len(ts))
	for i, d := range ts {
		dims[i] = d
	}
	b.inputs = append(b.inputs, onnx.TensorValueInfo(TargetInput, onnx.TensorProto_DataType(et), dims...))
	res.TargetShape, res.TargetType = ts, et
	return nil
}
