// Package vjp emits the nodes of a backward graph: the Builder that
// appends nodes, constants and outputs to a forward graph, the loss and its
// seed gradient, and one rule (the
// vector–Jacobian product) per op type. It is part of the rewrite stage:
// a function from a model to a model, which never runs one. Package grad
// drives it over a whole graph; this file is the surface that driver uses.
package vjp

import (
	"fmt"

	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/tensor"
)

// Facts are what Build needs to know about one batch that the model file
// does not say: the shape of every value, and the contents of the small
// values that shape arithmetic computes (the starts and ends of a Slice
// after torch.chunk, a Pad's pads, a Dropout's training flag).
type Facts struct {
	// Shapes maps every value to its shape.
	Shapes map[string][]int64
	// Values maps the non-constant inputs that rules read as parameters
	// to their contents.
	Values map[string]*tensor.Tensor
}

// ParamInputs returns the input slots of an op type that the rules read as
// fixed parameters rather than as data (its entry's ParamInputs in
// internal/onnx/ops): a probe records their contents when they are
// computed at run time.
func ParamInputs(opType string) []int {
	if o := ops.Lookup(ops.Default, opType); o != nil {
		return o.ParamInputs
	}
	return nil
}

// Internal ends every intermediate name the backward graph (and a probe)
// invents; a model's own names never do (CheckNames).
const Internal = internal

const internal = "::fp16audit"

// ErrNoRule marks an op without a vector–Jacobian product.
var ErrNoRule = errNoRule

// Apply runs the rule of forward node i: gy holds the gradients of its
// outputs ("" for none) and need says which inputs want one. It returns
// each input's contribution ("" for none). When the op has no rule (an
// error wrapping ErrNoRule) or a rule's precondition fails, nothing the
// rule emitted stays in the graph.
func (b *Builder) Apply(i int, gy []string, need []bool) ([]string, error) {
	n := b.src.Node[i]
	c := &call{b: b, n: n, i: i, gy: gy, need: need, dx: make([]string, len(n.Input))}
	b.label = NodeLabel(n, i)
	c.mark()
	r, ok := ruleOf(n.OpType)
	if !onnx.IsDefaultDomain(n.Domain) {
		ok = false
	}
	if !ok {
		return nil, errNoRule
	}
	if err := r(c); err != nil {
		c.rollback()
		return nil, err
	}
	b.ruled[i] = [2]int{c.nodes, len(b.nodes)}
	return c.dx, nil
}

// Saved makes fwd the forward of the backward graph: the forward as a
// policy runs it (rewrite.Emulate of Graph()), whose node i is node i of
// Graph() reading its inputs as the op saw them — a copy rounded to the
// 16 bits it casts an input to, a source held in 16 bits — and whose
// values held in 16 bits keep their names for the rounded value. The
// nodes node i's rule appended read node i's inputs as fwd's node i reads
// them and its outputs as fwd holds them: the backward differentiates at
// the values autograd saved for it, not at the fp32 forward's. Call it
// once every rule has run; Model then assembles fwd with the backward.
func (b *Builder) Saved(fwd *onnx.GraphProto) {
	for i, n := range b.src.Node {
		r, ok := b.ruled[i]
		if !ok || i >= len(fwd.Node) {
			continue
		}
		e := fwd.Node[i]
		for j, in := range n.Input {
			if in == "" || j >= len(e.Input) || e.Input[j] == in {
				continue
			}
			for _, bn := range b.nodes[r[0]:r[1]] {
				for k, x := range bn.Input {
					if x == in {
						bn.Input[k] = e.Input[j]
					}
				}
			}
		}
	}
	b.src = fwd
}

// Graph returns the forward graph as the rules left it: the caller's
// nodes, with clones where a rule added an output to a forward op.
func (b *Builder) Graph() *onnx.GraphProto { return b.src }

// Opset returns the default-domain opset of the backward graph.
func (b *Builder) Opset() int64 { return b.opset }

// SetLabel prefixes the names of the values emitted next, so a reader of
// the graph sees what each came from.
func (b *Builder) SetLabel(label string) { b.label = label }

// Rename gives value from the name to (see rename).
func (b *Builder) Rename(from, to string) { b.rename(from, to) }

// Sum writes the sum of values to out.
func (b *Builder) Sum(values []string, out string) { b.emitTo("Sum", values, out) }

// Round writes src rounded through the 16-bit type et to dst.
func (b *Builder) Round(src, dst string, et int32) { b.round(src, dst, et) }

// Output declares name a FLOAT graph output of the given shape (unknown
// when nil).
func (b *Builder) Output(name string, shape []int64) { b.output(name, shape) }

// Shape returns the static shape of a forward value, nil when unknown.
func (b *Builder) Shape(v string) []int64 { return b.mustShape(v) }

// IsFloat reports whether a forward value is FLOAT.
func (b *Builder) IsFloat(v string) bool { return b.isFloat(v) }

// NodeLabel names forward node i in the names the backward graph invents:
// its name, or op type and index when it has none.
func NodeLabel(n *onnx.NodeProto, i int) string {
	if n.Name != "" {
		return n.Name
	}
	return fmt.Sprintf("%s#%d", n.OpType, i)
}

// Int64s returns an integer tensor's elements as int64.
func Int64s(t *tensor.Tensor) ([]int64, error) { return int64s(t) }
