package rewrite

import (
	"math"

	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/internal/tensor"
)

// FinfoFill is a place where an emulated pass reads a number that
// torch.finfo(dtype) wrote as the limit of the precision it is read in.
// Code that asks the dtype — scores.masked_fill(~mask,
// torch.finfo(scores.dtype).min), a mask (1 - m) * torch.finfo(dtype).min
// — exports from an fp32 trace as the number ±3.4028235e38, while at run
// time it writes -65504 into an fp16 tensor and finfo(bfloat16).min into a
// bf16 one. Written as exported, the number would be ±Inf in the 16-bit
// value, and a fully masked softmax row NaN where PyTorch's is uniform.
//
// Only 0-dim float constants count: they are Python numbers in the eager
// model, which is what finfo(dtype).min is, and a number takes the dtype of
// the op that reads it. Tensors of that value (a mask buffer, a folded
// mask) are parameters or buffers that model.half() converts with a plain
// cast, giving ±Inf as the emulation does; an autocast op's cast of its
// input and the model's own Cast to half of an fp32 number are plain casts
// too. A hard-coded torch.finfo(torch.float32).min exports the same number,
// so it is taken for the dtype-aware idiom; where the dynamo exporter
// recorded the reader's line of Python and it asks the dtype, that is
// known (Asked).
type FinfoFill struct {
	// Node reads Constant (an initializer or Constant output holding
	// Value) in input slot Slot.
	Node, Slot int
	Constant   string
	Value      float64
	// Precision is the precision the number is read in: the node's, which
	// holds a 0-dim operand at its compute precision. Source is set when
	// the assignment holds the number itself in reduced precision (the half
	// policy holds the model's numbers in fp16): every reader then counts,
	// one computing in fp32 reading fp32's limit, the number as exported.
	Precision precision.Precision
	Source    bool
	// Asked is set when the reader's line of Python, as the dynamo
	// exporter recorded it, calls torch.finfo on a tensor's dtype
	// (onnx.SourceAsksDtype): the idiom, told rather than taken.
	Asked bool
}

// Limit is the number the emulated pass reads: the largest finite value
// of Precision with Value's sign (Value itself for fp32).
func (f FinfoFill) Limit() float64 {
	switch f.Precision {
	case precision.FP16:
		return math.Copysign(tensor.FP16Max, f.Value)
	case precision.BF16:
		return math.Copysign(tensor.BF16Max, f.Value)
	}
	return f.Value
}

// Reduced reports whether the number is read in fp16 or bf16, where the
// limit differs from the exported number.
func (f FinfoFill) Reduced() bool { return isHalf(f.Precision) }

func isHalf(p precision.Precision) bool { return p == precision.FP16 || p == precision.BF16 }

// FinfoFills lists, in node order and then input order, where a graph
// under assignment a reads a 0-dim float constant of exactly ±float32's
// largest value in a precision that is not the number's own: a node
// computing in fp16 or bf16 that holds the number at its precision (not a
// Cast or CastLike, not a parameter slot), and every reader of a number
// the assignment itself holds in reduced precision.
func FinfoFills(g *onnx.GraphProto, a *precision.Assignment) []FinfoFill {
	ix, err := onnx.NewIndex(g)
	if err != nil {
		return nil
	}
	values := map[string]float64{}
	var out []FinfoFill
	for i, n := range g.Node {
		np := precision.NotFloat
		if i < len(a.Node) {
			np = a.Node[i]
		}
		for j, in := range n.Input {
			v, ok := values[in]
			if !ok {
				v = dtypeAwareScalar(ix, in)
				values[in] = v
			}
			if v == 0 {
				continue
			}
			f := FinfoFill{Node: i, Slot: j, Constant: in, Value: v, Precision: np, Source: isHalf(a.Value[in]), Asked: onnx.SourceAsksDtype(n)}
			switch {
			case f.Source:
				if !isHalf(np) {
					f.Precision = precision.FP32
				}
			case !isHalf(np) || !precision.DataSlot(n.OpType, j) ||
				onnx.IsDefaultDomain(n.Domain) && (n.OpType == "Cast" || n.OpType == "CastLike"):
				continue
			}
			out = append(out, f)
		}
	}
	return out
}

// dtypeAwareScalar returns ±float32's largest value when name is a 0-dim
// FLOAT initializer or Constant output holding it, else 0.
func dtypeAwareScalar(ix *onnx.Index, name string) float64 {
	if name == "" || ix.ElemType(name) != elemFloat {
		return 0
	}
	if s, ok := ix.Shape(name); !ok || s.Rank() != 0 {
		return 0
	}
	t, err := ix.ConstantValue(name)
	if err != nil {
		return 0 // a computed scalar, not a constant
	}
	xs, err := t.Float32s()
	if err != nil || len(xs) != 1 || math.Abs(float64(xs[0])) != math.MaxFloat32 {
		return 0
	}
	return float64(xs[0])
}
