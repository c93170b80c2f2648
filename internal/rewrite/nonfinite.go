package rewrite

import (
	"encoding/binary"
	"math"
	"strconv"

	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
)

// TorchNonFinite rewrites m so that every op whose ONNX Runtime kernel
// treats NaN or ±Inf otherwise than the PyTorch op it was exported from
// (its registry entry's NonFinite) makes them where PyTorch's does: the
// op's output gets an internal name, and nodes appended to the graph make
// the value of the old name from it and from the op's inputs. Node
// indices, graph inputs and outputs are kept, so the origins, the
// statistics and the passes built on the model read the value PyTorch
// would hold under the value's own name. Where the outputs agree with
// PyTorch's the appended nodes change nothing: a pass costs a few
// elementwise ops per such node, and an LSTM or GRU one more matrix
// product of its input (the gates' input projection).
//
// The rules, by the entry's NonFinite:
//   - NonFiniteSkipsNaN (ReduceMax, ReduceMin, MaxPool, GlobalMaxPool):
//     NaN wherever the same reduction or window over IsNaN(x) holds one.
//   - NonFiniteGates (LSTM, GRU): NaN at a step's hidden units whose gate
//     pre-activations W·x_t are NaN, and at every unit from the next step
//     on (in the direction's own order): the recurrence spreads a NaN of
//     h to every gate. An initial state whose recurrent product is NaN
//     makes the whole sequence NaN.
//   - NonFiniteOpenBound (Clip without one of its bounds): x where it is
//     the infinity on the open side.
//   - NonFiniteSignNaN (Sign): 0 where x is NaN.
//
// Values whose element type is known to be neither FLOAT nor DOUBLE are
// left as ONNX Runtime makes them, and so is a model whose default opset
// is below 11 (CumSum, IsInf's directions, Where on floats).
// m is not modified.
func TorchNonFinite(m *onnx.ModelProto) *onnx.ModelProto {
	opset := defaultOpset(m)
	if opset < 11 {
		return m
	}
	ix, err := onnx.NewIndex(m.Graph)
	if err != nil {
		return m
	}
	var out *onnx.ModelProto
	b := &nfBuilder{opset: opset}
	for i, n := range m.Graph.Node {
		if !onnx.IsDefaultDomain(n.Domain) || len(n.Output) == 0 || n.Output[0] == "" {
			continue
		}
		o := ops.Lookup(n.Domain, n.OpType)
		if o == nil {
			continue
		}
		elem := ix.ElemType(n.Output[0])
		if elem == 0 {
			elem = elemFloat // not inferred (LSTM's outputs): as Instrument reads it
		}
		if elem != elemFloat && elem != elemDouble {
			continue
		}
		b.node, b.elem = n, elem
		var rewired []string
		switch o.NonFinite {
		case ops.NonFiniteSkipsNaN:
			rewired = b.skipsNaN()
		case ops.NonFiniteGates:
			rewired = b.gates()
		case ops.NonFiniteOpenBound:
			rewired = b.openBound()
		case ops.NonFiniteSignNaN:
			rewired = b.signNaN()
		}
		if rewired == nil {
			continue
		}
		if out == nil {
			out = onnx.ShallowCopy(m)
		}
		c := onnx.CloneNode(n)
		for k, raw := range rewired {
			if raw != "" {
				c.Output[k] = raw
			}
		}
		out.Graph.Node[i] = c
	}
	if out == nil {
		return m
	}
	out.Graph.Node = append(out.Graph.Node, b.nodes...)
	return out
}

// nfBuilder appends the nodes of TorchNonFinite's rules for one node at a
// time.
type nfBuilder struct {
	opset int64
	node  *onnx.NodeProto
	elem  int32 // the node's output element type
	nodes []*onnx.NodeProto
	n     int // names made so far
}

// name returns a fresh internal name derived from the node's first output.
func (b *nfBuilder) name(tag string) string {
	b.n++
	return onnx.InternalName(b.node.Output[0], "torch-"+tag+"-"+strconv.Itoa(b.n))
}

// op appends one node and returns its single output.
func (b *nfBuilder) op(opType string, inputs []string, attrs ...*onnx.AttributeProto) string {
	out := b.name(opType)
	b.nodes = append(b.nodes, onnx.Node(opType, out, inputs, []string{out}, attrs...))
	return out
}

// constant appends a Constant node holding t (named by the node). The
// rules' constants are nodes, not initializers: the passes share the
// model's initializers, and a pass's own would be copied into each.
func (b *nfBuilder) constant(t *onnx.TensorProto) string {
	name := b.name("const")
	t.Name = name
	b.nodes = append(b.nodes, onnx.Node("Constant", name, nil, []string{name}, onnx.AttrTensor("value", t)))
	return name
}

// scalarInt appends an INT64 scalar constant.
func (b *nfBuilder) scalarInt(v int64) string {
	return b.constant(onnx.Int64Tensor("", nil, []int64{v}))
}

// axesOp applies Squeeze, Unsqueeze or ReduceMax over axes, with the axes
// as an attribute or, from the opset that moved them there (13 for the
// first two, 18 for ReduceMax), as an input.
func (b *nfBuilder) axesOp(opType, x string, keepdims bool, axes ...int64) string {
	var attrs []*onnx.AttributeProto
	if opType == "ReduceMax" {
		k := int64(0)
		if keepdims {
			k = 1
		}
		attrs = append(attrs, onnx.AttrInt("keepdims", k))
	}
	if since := map[string]int64{"Squeeze": 13, "Unsqueeze": 13, "ReduceMax": 18}[opType]; b.opset >= since {
		return b.op(opType, []string{x, b.ints(axes...)}, attrs...)
	}
	return b.op(opType, []string{x}, append(attrs, onnx.AttrInts("axes", axes...))...)
}

// ints appends a 1-D INT64 constant.
func (b *nfBuilder) ints(values ...int64) string {
	return b.constant(onnx.Int64Tensor("", []int64{int64(len(values))}, values))
}

// scalar appends a scalar constant of the node's output type.
func (b *nfBuilder) scalar(v float64) string {
	if b.elem == elemDouble {
		t := &onnx.TensorProto{DataType: elemDouble, RawData: make([]byte, 8)}
		binary.LittleEndian.PutUint64(t.RawData, math.Float64bits(v))
		return b.constant(t)
	}
	return b.constant(onnx.FloatTensor("", nil, []float32{float32(v)}))
}

// nanWhere makes out = Where(mask, NaN, raw) for a FLOAT mask of 0 and 1.
func (b *nfBuilder) nanWhere(mask, raw, out string) {
	cond := b.op("Cast", []string{mask}, onnx.AttrInt("to", int64(onnx.TensorProto_BOOL)))
	b.nodes = append(b.nodes, onnx.Node("Where", b.name("where"), []string{cond, b.scalar(math.NaN()), raw}, []string{out}))
}

// isNaN returns IsNaN(x) as FLOAT 0 and 1.
func (b *nfBuilder) isNaN(x string) string {
	return b.op("Cast", []string{b.op("IsNaN", []string{x})}, onnx.AttrInt("to", int64(elemFloat)))
}

// raw returns the internal name the node's output k is renamed to.
func (b *nfBuilder) raw(k int) string { return onnx.InternalName(b.node.Output[k], "onnxruntime") }

// skipsNaN: the same reduction or window over IsNaN(x) says where a NaN
// was compared; ReduceMin's mask is a ReduceMax with its attributes (the
// two share them).
func (b *nfBuilder) skipsNaN() []string {
	n := b.node
	if len(n.Input) == 0 || n.Input[0] == "" {
		return nil
	}
	opType := n.OpType
	if opType == "ReduceMin" {
		opType = "ReduceMax"
	}
	in := append([]string{b.isNaN(n.Input[0])}, n.Input[1:]...)
	mask := b.name("mask")
	b.nodes = append(b.nodes, onnx.Node(opType, mask, in, []string{mask}, n.Attribute...))
	raws := make([]string, len(n.Output))
	raws[0] = b.raw(0)
	b.nanWhere(mask, raws[0], n.Output[0])
	return raws
}

// openBound: Clip's absent bound is float32's largest value in ONNX
// Runtime and no bound in PyTorch, so an infinity on that side keeps its
// value.
func (b *nfBuilder) openBound() []string {
	n := b.node
	x := n.Input[0]
	noMin, noMax := len(n.Input) < 2 || n.Input[1] == "", len(n.Input) < 3 || n.Input[2] == ""
	if !noMin && !noMax {
		return nil
	}
	var attrs []*onnx.AttributeProto
	switch {
	case noMin && !noMax:
		attrs = append(attrs, onnx.AttrInt("detect_positive", 0))
	case noMax && !noMin:
		attrs = append(attrs, onnx.AttrInt("detect_negative", 0))
	}
	inf := b.op("IsInf", []string{x}, attrs...)
	raw := b.raw(0)
	b.nodes = append(b.nodes, onnx.Node("Where", b.name("where"), []string{inf, x, raw}, []string{n.Output[0]}))
	return []string{raw}
}

// signNaN: torch.sign(NaN) is 0.
func (b *nfBuilder) signNaN() []string {
	n := b.node
	nan := b.op("IsNaN", []string{n.Input[0]})
	raw := b.raw(0)
	b.nodes = append(b.nodes, onnx.Node("Where", b.name("where"), []string{nan, b.scalar(0), raw}, []string{n.Output[0]}))
	return []string{raw}
}

// gates: an LSTM's or GRU's hidden unit is NaN in PyTorch from the step
// where one of its gate pre-activations is NaN, and every unit is from the
// step after (the recurrent product of a NaN unit is NaN in every gate).
// Inputs: X, W, R, B, sequence_lens, initial_h (LSTM: initial_c, P);
// outputs Y [T, D, B, H] (layout 1: [B, T, D, H]), Y_h [D, B, H] (layout
// 1: [B, D, H]), LSTM's Y_c like Y_h.
func (b *nfBuilder) gates() []string {
	n := b.node
	input := func(k int) string {
		if k < len(n.Input) {
			return n.Input[k]
		}
		return ""
	}
	x, w, r := input(0), input(1), input(2)
	if x == "" || w == "" || r == "" {
		return nil
	}
	lstm := n.OpType == "LSTM"
	gates := int64(3)
	if lstm {
		gates = 4
	}
	hidden := onnx.IntAttr(n, "hidden_size", 0)
	if hidden <= 0 {
		return nil
	}
	layout := onnx.IntAttr(n, "layout", 0)
	dirs := []string{onnx.StringAttr(n, "direction")}
	switch dirs[0] {
	case "", "forward":
		dirs[0] = "forward"
	case "bidirectional":
		dirs = []string{"forward", "reverse"}
	}
	if layout == 1 {
		x = b.op("Transpose", []string{x}, onnx.AttrInts("perm", 1, 0, 2))
	}
	// valid[t, b, 1]: step t of sample b is computed (sequence_lens).
	valid := ""
	if lens := input(4); lens != "" {
		steps := b.op("Gather", []string{b.op("Shape", []string{x}), b.scalarInt(0)}, onnx.AttrInt("axis", 0))
		t := b.op("Range", []string{b.scalarInt(0), steps, b.scalarInt(1)})
		less := b.op("Less", []string{b.axesOp("Unsqueeze", t, false, 1), b.op("Cast", []string{lens}, onnx.AttrInt("to", int64(onnx.TensorProto_INT64)))})
		valid = b.axesOp("Unsqueeze", b.op("Cast", []string{less}, onnx.AttrInt("to", int64(elemFloat))), false, 2)
	}
	states := []string{input(5)}
	if lstm {
		states = append(states, input(6))
	}
	transposed := func(m, d string) string { // m's direction d, [G·H, K] → [K, G·H]
		return b.op("Transpose", []string{b.op("Gather", []string{m, d}, onnx.AttrInt("axis", 0))}, onnx.AttrInts("perm", 1, 0))
	}
	var ys, hs, cs []string
	for d, dir := range dirs {
		idx := b.scalarInt(int64(d))
		// P = X · W_dᵀ: the gates' input pre-activations [T, B, G·H].
		p := b.op("MatMul", []string{x, transposed(w, idx)})
		perGate := b.op("Reshape", []string{b.isNaN(p), b.ints(0, 0, gates, hidden)})
		unit := b.axesOp("ReduceMax", perGate, false, 2)
		cell := unit
		if lstm {
			// c_t = f·c + i·g: not the output gate (ONNX order i, o, f, c).
			cell = b.axesOp("ReduceMax", b.op("Gather", []string{perGate, b.ints(0, 2, 3)}, onnx.AttrInt("axis", 2)), false, 2)
		}
		if valid != "" {
			unit = b.op("Mul", []string{unit, valid})
			cell = b.op("Mul", []string{cell, valid})
		}
		// before[t, b, 1]: a step before t, in the direction's order, had
		// a NaN unit.
		some := b.axesOp("ReduceMax", unit, true, 2)
		rev := int64(0)
		if dir == "reverse" {
			rev = 1
		}
		before := b.op("CumSum", []string{some, b.scalarInt(0)}, onnx.AttrInt("exclusive", 1), onnx.AttrInt("reverse", rev))
		// An initial state whose recurrent product R_d · h0 is NaN (or a
		// NaN initial cell) poisons every step of its sample.
		for k, st := range states {
			if st == "" {
				continue
			}
			sd := b.op("Gather", []string{st, idx}, onnx.AttrInt("axis", 0)) // [B, H]
			if k == 0 {
				sd = b.op("MatMul", []string{sd, transposed(r, idx)})
			}
			before = b.op("Add", []string{before, b.axesOp("ReduceMax", b.isNaN(sd), true, 1)})
		}
		after := b.op("Cast", []string{b.op("Cast", []string{before}, onnx.AttrInt("to", int64(onnx.TensorProto_BOOL)))}, onnx.AttrInt("to", int64(elemFloat)))
		y := b.op("Max", []string{unit, after})
		c := b.op("Max", []string{cell, after})
		if valid != "" {
			y = b.op("Mul", []string{y, valid})
			c = b.op("Mul", []string{c, valid})
		}
		// The final state is the last step computed, T-1 forward (a
		// sample's last valid step), 0 reverse; once a unit is NaN it
		// stays NaN, so it is the maximum over the steps.
		ys = append(ys, b.axesOp("Unsqueeze", y, false, 1)) // [T, 1, B, H]
		hs = append(hs, b.axesOp("ReduceMax", y, true, 0))  // [1, B, H]
		cs = append(cs, b.axesOp("ReduceMax", c, true, 0))
	}
	cat := func(parts []string, axis int64) string {
		if len(parts) == 1 {
			return parts[0]
		}
		return b.op("Concat", parts, onnx.AttrInt("axis", axis))
	}
	masks := []string{cat(ys, 1), cat(hs, 0), cat(cs, 0)}
	if layout == 1 {
		masks[0] = b.op("Transpose", []string{masks[0]}, onnx.AttrInts("perm", 2, 0, 1, 3))
		masks[1] = b.op("Transpose", []string{masks[1]}, onnx.AttrInts("perm", 1, 0, 2))
		masks[2] = b.op("Transpose", []string{masks[2]}, onnx.AttrInts("perm", 1, 0, 2))
	}
	raws := make([]string, len(n.Output))
	for k, o := range n.Output {
		if o == "" || k > 2 {
			continue
		}
		raws[k] = b.raw(k)
		b.nanWhere(masks[k], raws[k], o)
	}
	return raws
}
