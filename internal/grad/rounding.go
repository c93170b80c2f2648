package grad

import (
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
)

// Rounding names the gradients the backward graph rounds to a 16-bit type,
// emulating a backward pass that holds them in half precision.
type Rounding struct {
	// Values maps a forward value to the 16-bit ONNX type (FLOAT16 or
	// BFLOAT16) its gradient is held in. The gradient, summed over all the
	// value's consumers, is rounded once; the unrounded sum stays visible
	// as Grad.Raw.
	Values map[string]int32
	// Inputs maps a node input slot to the 16-bit type the op computes
	// that input's gradient in: the contribution is rounded before it is
	// added to the input's other contributions, and is reported as a Site.
	Inputs map[Slot]int32
}

// Slot is a forward node's input slot.
type Slot struct{ Node, Input int }

func (r *Rounding) value(v string) int32 {
	if r == nil {
		return 0
	}
	return r.Values[v]
}

func (r *Rounding) input(node, slot int) int32 {
	if r == nil {
		return 0
	}
	return r.Inputs[Slot{node, slot}]
}

// AutocastRounding returns the Rounding of autocast's backward for the
// assignment a (computed on g under an fp16 or bf16 policy): in autograd a
// tensor's gradient has the tensor's dtype, so every value a holds in half
// precision has a half gradient; and an op that casts an input to its
// lower precision (a Conv or Linear weight and bias, an fp32 activation
// entering a Linear) computes that input's gradient in half before the
// cast's backward converts it to fp32, so those contributions are rounded
// too.
func AutocastRounding(g *onnx.GraphProto, a *precision.Assignment) *Rounding {
	r := &Rounding{Values: map[string]int32{}, Inputs: map[Slot]int32{}}
	half := func(p precision.Precision) bool { return p == precision.FP16 || p == precision.BF16 }
	for name, p := range a.Value {
		if half(p) {
			r.Values[name] = p.ElemType()
		}
	}
	for i := range g.Node {
		if i >= len(a.Node) || !half(a.Node[i]) || i >= len(a.CastInputs) {
			continue
		}
		for j, cast := range a.CastInputs[i] {
			if cast && !half(a.Value[g.Node[i].Input[j]]) {
				r.Inputs[Slot{i, j}] = a.Node[i].ElemType()
			}
		}
	}
	return r
}
