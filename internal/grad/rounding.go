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
	// Forward, when set, holds the forward values as the policy does too,
	// so that the backward differentiates at the values autograd saved:
	// see Forward. nil: the forward runs in fp32 and every rule reads its
	// fp32 values.
	Forward *Forward
}

// Forward is how a policy holds the forward values a backward reads: the
// assignment Values and Inputs were made from and the model's own graph
// (whose explicit half casts the assignment honours), as rewrite.Emulate
// takes them. Build then runs the forward as the policy's forward pass
// does — every value the assignment holds in 16 bits rounded under its
// own name, every input an op casts to its lower precision read through a
// rounded copy — and every rule reads its op's inputs and outputs as the
// op saw and made them. That is what autograd saves under autocast: an
// op records for backward the tensors it was called with, after
// autocast's cast (mm and convolution the fp16 copies of their inputs and
// weights), or its result, in the dtype it computed in (relu, sigmoid,
// tanh, exp, sqrt, softmax their fp16 result where they ran in fp16;
// layer_norm under autocast, an fp32-list op, its fp32 input, which holds
// the fp16 values exactly). The rounding runs switchably with the
// gradients' (backward.MassSession): the fp32 reference stays fp32.
type Forward struct {
	Orig   *onnx.GraphProto
	Assign *precision.Assignment
}

// Held is one forward value the backward reads rounded to 16 bits (a
// rounding rewrite.EmulateHeld made): the Cast pair from Raw to Rounded.
type Held struct {
	// Raw is the value as computed in fp32, Rounded the name the rounded
	// value goes by: the value's own name for a value the policy holds in
	// 16 bits, an internal one for a copy.
	Raw, Rounded string
	// Value is the model's value held, and Slots the op input slots that
	// read a copy of it (nil for the value itself); Cast tells a copy an
	// op casts to its lower precision from a source held in 16 bits.
	Value string
	Slots []Slot
	Cast  bool
	// ElemType is the 16-bit ONNX type.
	ElemType int32
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

func (r *Rounding) forward() *Forward {
	if r == nil {
		return nil
	}
	return r.Forward
}

// HeldType returns the 16-bit type r holds the forward value h in (h
// from another rounding of the same model: RunAlt's), 0 when r does not
// hold it: a copy an op casts takes the op's lower precision under r, a
// value r's own.
func (r *Rounding) HeldType(h Held) int32 {
	f := r.forward()
	if f == nil {
		return 0
	}
	a := f.Assign
	half := func(p precision.Precision) bool { return p == precision.FP16 || p == precision.BF16 }
	for _, s := range h.Slots {
		if h.Cast && s.Node < len(a.Node) && s.Node < len(a.CastInputs) && s.Input < len(a.CastInputs[s.Node]) &&
			a.CastInputs[s.Node][s.Input] && half(a.Node[s.Node]) {
			return a.Node[s.Node].ElemType()
		}
	}
	if p := a.Value[h.Value]; half(p) {
		return p.ElemType()
	}
	return 0
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

// HeldBy reports whether the rounding o holds in 16 bits every forward
// value r's graph holds (o a rounding of the same model at the same
// points, another policy's): then a session of r runs o too.
func (r *Result) HeldBy(o *Rounding) bool {
	for _, h := range r.Held {
		if o.HeldType(h) == 0 {
			return false
		}
	}
	return true
}
