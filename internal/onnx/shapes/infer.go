// Package shapes infers the concrete shape of every value of an ONNX graph
// for one batch: the sizes the memory plan is made from.
package shapes

import (
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"slices"

	"fp16audit/internal/tensor"
)

// Shape inference for the memory estimate. It covers
// the ops that carry the bulk of a network's activations (convolutions,
// matrix products, pooling, elementwise ops, the common shape ops with
// constant arguments) and leaves a value out when it cannot be sure; the
// caller then asks ONNX Runtime (probeShapes). Shapes are concrete: symbolic
// dimensions are bound by the batch's actual input shapes.

// shapeInference holds what is known while walking one graph.
type shapeInference struct {
	idx    *onnx.Index
	shapes map[string][]int64
	ints   map[string][]int64 // values of small integer tensors computed here (Shape and the arithmetic on it)
}

// maxInts is the most elements of an integer value whose contents the
// inference follows: shapes and the indices computed from them.
const maxInts = 64

// Infer returns the concrete shape of every value of g it can derive
// from inputs (graph input name → actual shape), the initializers and the
// Constant nodes. Declared shapes whose dimensions are all known (after
// binding the inputs' symbolic dimensions), then known (shapes measured
// otherwise; may be nil), fill in what the rules miss.
func Infer(g *onnx.GraphProto, idx *onnx.Index, inputs, known map[string][]int64) map[string][]int64 {
	si := &shapeInference{idx: idx, shapes: map[string][]int64{}, ints: map[string][]int64{}}
	params := map[string]int64{}
	for name, shape := range inputs {
		si.shapes[name] = shape
		if decl, ok := idx.Shape(name); ok && decl.Rank() == len(shape) {
			for i, p := range decl.Params {
				if p != "" {
					params[p] = shape[i]
				}
			}
		}
	}
	for _, t := range g.GetInitializer() {
		si.shapes[t.GetName()] = nonNilDims(t.GetDims())
	}
	for _, ni := range idx.Order() {
		n := g.GetNode()[ni]
		outs := si.node(n)
		if len(n.GetOutput()) == 1 && n.GetOutput()[0] != "" {
			si.fold(n, outs)
		}
		for k, o := range n.GetOutput() {
			if o == "" {
				continue
			}
			if k < len(outs) && outs[k] != nil {
				si.shapes[o] = outs[k]
			} else if s, ok := declaredShape(idx, o, params); ok {
				si.shapes[o] = s
			} else if s, ok := known[o]; ok {
				si.shapes[o] = s
			}
		}
	}
	return si.shapes
}

func nonNilDims(d []int64) []int64 {
	if d == nil {
		return []int64{}
	}
	return slices.Clone(d)
}

// declaredShape returns the declared shape of name with its symbolic
// dimensions bound, when every dimension is then known.
func declaredShape(idx *onnx.Index, name string, params map[string]int64) ([]int64, bool) {
	decl, ok := idx.Shape(name)
	if !ok {
		return nil, false
	}
	out := make([]int64, decl.Rank())
	for i, d := range decl.Dims {
		switch v, bound := params[decl.Params[i]]; {
		case d >= 0:
			out[i] = d
		case decl.Params[i] != "" && bound:
			out[i] = v
		default:
			return nil, false
		}
	}
	return out, true
}

// in returns the shape of input k of n, or nil when unknown or absent.
func (si *shapeInference) in(n *onnx.NodeProto, k int) []int64 {
	if k >= len(n.GetInput()) || n.GetInput()[k] == "" {
		return nil
	}
	return si.shapes[n.GetInput()[k]]
}

// constInts returns the int64 contents of input k: an initializer, a
// Constant, or a small value computed by the shape ops.
func (si *shapeInference) constInts(n *onnx.NodeProto, k int) ([]int64, bool) {
	if k >= len(n.GetInput()) || n.GetInput()[k] == "" {
		return nil, false
	}
	name := n.GetInput()[k]
	if v, ok := si.ints[name]; ok {
		return v, true
	}
	// Only small tensors are decoded: a weight (possibly external data)
	// is never a shape.
	if s, ok := si.shapes[name]; !ok || tensor.NumElements(s) > maxInts {
		return nil, false
	}
	t, err := si.idx.ConstantValue(name)
	if err != nil || t.DType != tensor.Int64 || len(t.Data) > 8*maxInts {
		return nil, false
	}
	v, err := t.Int64s()
	return v, err == nil
}

func axis(a int64, rank int) int {
	if a < 0 {
		a += int64(rank)
	}
	return int(a)
}

// node returns the shapes of n's outputs (nil entries where unknown), by
// the shape rule its entry in internal/onnx/ops names (rules.go): a
// contrib op's too (QuickGelu is unary).
func (si *shapeInference) node(n *onnx.NodeProto) [][]int64 {
	o := ops.Lookup(n.GetDomain(), n.GetOpType())
	if o == nil {
		return nil
	}
	r, ok := rules[o.Shape]
	if !ok {
		return nil
	}
	return r(si, n, si.in(n, 0))
}

// broadcast returns the numpy broadcast of a and b.
func broadcast(a, b []int64) ([]int64, bool) {
	if len(a) < len(b) {
		a, b = b, a
	}
	out := slices.Clone(a)
	off := len(a) - len(b)
	for i, d := range b {
		switch o := out[off+i]; {
		case o == d || d == 1:
		case o == 1:
			out[off+i] = d
		default:
			return nil, false
		}
	}
	return out, true
}

func matmulShape(a, b []int64) []int64 {
	if len(a) == 0 || len(b) == 0 {
		return nil
	}
	a1, b1 := len(a) == 1, len(b) == 1
	if a1 {
		a = []int64{1, a[0]}
	}
	if b1 {
		b = []int64{b[0], 1}
	}
	if a[len(a)-1] != b[len(b)-2] {
		return nil
	}
	batch, ok := broadcast(a[:len(a)-2], b[:len(b)-2])
	if !ok {
		return nil
	}
	out := append(batch, a[len(a)-2], b[len(b)-1])
	if b1 {
		out = append(out[:len(out)-2], out[len(out)-2])
	}
	if a1 {
		out = append(out[:len(out)-2], out[len(out)-1])
	}
	return out
}

func reshape(x, shape []int64, allowZero bool) []int64 {
	out := slices.Clone(shape)
	infer := -1
	known := int64(1)
	for i, d := range out {
		switch {
		case d == 0 && !allowZero:
			if i >= len(x) {
				return nil
			}
			out[i] = x[i]
			known *= x[i]
		case d == -1:
			if infer >= 0 {
				return nil
			}
			infer = i
		case d < 0:
			return nil
		default:
			known *= d
		}
	}
	if infer >= 0 {
		if known == 0 {
			return nil
		}
		out[infer] = tensor.NumElements(x) / known
	}
	if tensor.NumElements(out) != tensor.NumElements(x) {
		return nil
	}
	return out
}

func unsqueeze(x, axes []int64) []int64 {
	r := len(x) + len(axes)
	ins := make([]bool, r)
	for _, a := range axes {
		i := axis(a, r)
		if i < 0 || i >= r || ins[i] {
			return nil
		}
		ins[i] = true
	}
	out := make([]int64, 0, r)
	k := 0
	for i := range r {
		if ins[i] {
			out = append(out, 1)
		} else {
			out = append(out, x[k])
			k++
		}
	}
	return out
}

func squeeze(x, axes []int64) []int64 {
	drop := make([]bool, len(x))
	if len(axes) == 0 {
		for i, d := range x {
			drop[i] = d == 1
		}
	}
	for _, a := range axes {
		i := axis(a, len(x))
		if i < 0 || i >= len(x) || x[i] != 1 {
			return nil
		}
		drop[i] = true
	}
	out := []int64{}
	for i, d := range x {
		if !drop[i] {
			out = append(out, d)
		}
	}
	return out
}

func (si *shapeInference) reduce(n *onnx.NodeProto, x []int64) [][]int64 {
	if x == nil {
		return nil
	}
	axes, ok := onnx.IntsAttr(n, "axes")
	if !ok && len(n.GetInput()) > 1 && n.GetInput()[1] != "" {
		if axes, ok = si.constInts(n, 1); !ok {
			return nil
		}
	}
	keep := onnx.IntAttr(n, "keepdims", 1) != 0
	red := make([]bool, len(x))
	if len(axes) == 0 {
		if onnx.IntAttr(n, "noop_with_empty_axes", 0) != 0 {
			return [][]int64{x}
		}
		for i := range red {
			red[i] = true
		}
	}
	for _, a := range axes {
		i := axis(a, len(x))
		if i < 0 || i >= len(x) {
			return nil
		}
		red[i] = true
	}
	out := []int64{}
	for i, d := range x {
		switch {
		case !red[i]:
			out = append(out, d)
		case keep:
			out = append(out, 1)
		}
	}
	return [][]int64{out}
}

// window infers Conv and the pooling ops: [N, C, spatial...].
func (si *shapeInference) window(n *onnx.NodeProto, x []int64) [][]int64 {
	if len(x) < 3 {
		return nil
	}
	sp := len(x) - 2
	out := slices.Clone(x)
	kernel, ok := onnx.IntsAttr(n, "kernel_shape")
	if n.GetOpType() == "Conv" {
		w := si.in(n, 1)
		if len(w) != len(x) {
			return nil
		}
		out[1] = w[0]
		if !ok {
			kernel = w[2:]
		}
	} else if !ok {
		return nil
	}
	if len(kernel) != sp {
		return nil
	}
	strides := ones(sp, "strides", n)
	dil := ones(sp, "dilations", n)
	pads, ok := onnx.IntsAttr(n, "pads")
	if !ok {
		pads = make([]int64, 2*sp)
	}
	if len(pads) != 2*sp || len(strides) != sp || len(dil) != sp {
		return nil
	}
	ceil := onnx.IntAttr(n, "ceil_mode", 0) != 0
	autoPad := onnx.StringAttr(n, "auto_pad")
	for i := range sp {
		in, k := x[2+i], (kernel[i]-1)*dil[i]+1
		switch autoPad {
		case "SAME_UPPER", "SAME_LOWER":
			out[2+i] = (in + strides[i] - 1) / strides[i]
		case "VALID":
			out[2+i] = (in-k)/strides[i] + 1
		default:
			num := in + pads[i] + pads[sp+i] - k
			if num < 0 {
				return nil
			}
			o := num/strides[i] + 1
			if ceil && num%strides[i] != 0 {
				o++
				// The last window must start inside the input or the
				// beginning padding (ONNX's ceil_mode rule).
				if (o-1)*strides[i] >= in+pads[i] {
					o--
				}
			}
			out[2+i] = o
		}
	}
	if n.GetOpType() == "MaxPool" && len(n.GetOutput()) > 1 {
		return [][]int64{out, out}
	}
	return [][]int64{out}
}

func (si *shapeInference) convTranspose(n *onnx.NodeProto, x []int64) [][]int64 {
	w := si.in(n, 1)
	if len(x) < 3 || len(w) != len(x) {
		return nil
	}
	sp := len(x) - 2
	if _, ok := onnx.IntsAttr(n, "output_shape"); ok || onnx.StringAttr(n, "auto_pad") != "" && onnx.StringAttr(n, "auto_pad") != "NOTSET" {
		return nil
	}
	out := slices.Clone(x)
	out[1] = w[1] * onnx.IntAttr(n, "group", 1)
	kernel, ok := onnx.IntsAttr(n, "kernel_shape")
	if !ok {
		kernel = w[2:]
	}
	strides, dil := ones(sp, "strides", n), ones(sp, "dilations", n)
	pads, ok := onnx.IntsAttr(n, "pads")
	if !ok {
		pads = make([]int64, 2*sp)
	}
	opad, ok := onnx.IntsAttr(n, "output_padding")
	if !ok {
		opad = make([]int64, sp)
	}
	if len(kernel) != sp || len(strides) != sp || len(dil) != sp || len(pads) != 2*sp || len(opad) != sp {
		return nil
	}
	for i := range sp {
		out[2+i] = strides[i]*(x[2+i]-1) + opad[i] + (kernel[i]-1)*dil[i] + 1 - pads[i] - pads[sp+i]
	}
	return [][]int64{out}
}

func ones(n int, name string, node *onnx.NodeProto) []int64 {
	if v, ok := onnx.IntsAttr(node, name); ok {
		return v
	}
	out := make([]int64, n)
	for i := range out {
		out[i] = 1
	}
	return out
}

// sliceLen is the length of dim[start:end:step] as ONNX Slice clamps it.
func sliceLen(dim, start, end, step int64) int64 {
	clamp := func(v, lo, hi int64) int64 { return max(lo, min(v, hi)) }
	if start < 0 {
		start += dim
	}
	if end < 0 {
		end += dim
	}
	if step > 0 {
		start, end = clamp(start, 0, dim), clamp(end, 0, dim)
		if end <= start {
			return 0
		}
		return (end - start + step - 1) / step
	}
	start, end = clamp(start, -1, dim-1), clamp(end, -1, dim-1)
	if start <= end {
		return 0
	}
	return (start - end - step - 1) / -step
}

// rangeLen is the number of elements of Range(start, limit, delta).
func rangeLen(start, limit, delta int64) int64 {
	d := limit - start
	if delta < 0 {
		d, delta = -d, -delta
	}
	return max((d+delta-1)/delta, 0)
}

// fold computes the contents of n's one output when it is a small integer
// tensor made from others whose contents are known: the arithmetic PyTorch
// exports write around Shape (`x.shape[-1] // 2`, the masks' Range and
// ConstantOfShape, expand's Where(Equal(shape, -1), ...)) so that the
// Reshape, Expand and Slice reading it get their shapes. outs are the
// output shapes node inferred.
func (si *shapeInference) fold(n *onnx.NodeProto, outs [][]int64) {
	if !onnx.IsDefaultDomain(n.GetDomain()) || len(outs) != 1 || outs[0] == nil || tensor.NumElements(outs[0]) > maxInts {
		return
	}
	out := n.GetOutput()[0]
	if _, ok := si.ints[out]; ok {
		return
	}
	size := int(tensor.NumElements(outs[0]))
	args := make([][]int64, len(n.GetInput()))
	for k := range args {
		v, ok := si.constInts(n, k)
		if !ok && n.GetInput()[k] != "" {
			return
		}
		args[k] = v
	}
	var v []int64
	switch op := n.GetOpType(); op {
	case "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten":
		v = args[0]
	case "Cast":
		switch tensor.DType(onnx.IntAttr(n, "to", 0)) {
		case tensor.Int64, tensor.Int32, tensor.Int16, tensor.Int8, tensor.Uint8, tensor.Uint16, tensor.Uint32, tensor.Uint64:
			v = args[0]
		case tensor.Bool:
			v = apply(size, [][]int64{args[0]}, func(a []int64) int64 { return b2i(a[0] != 0) })
		}
	case "Neg":
		v = apply(size, args, func(a []int64) int64 { return -a[0] })
	case "Abs":
		v = apply(size, args, func(a []int64) int64 { return max(a[0], -a[0]) })
	case "Not":
		v = apply(size, args, func(a []int64) int64 { return b2i(a[0] == 0) })
	case "Add":
		v = apply(size, args, func(a []int64) int64 { return a[0] + a[1] })
	case "Sub":
		v = apply(size, args, func(a []int64) int64 { return a[0] - a[1] })
	case "Mul":
		v = apply(size, args, func(a []int64) int64 { return a[0] * a[1] })
	case "Div", "Mod":
		for _, d := range args[min(1, len(args)-1)] {
			if d == 0 {
				return
			}
		}
		if op == "Div" {
			// Integer Div truncates toward zero, as C does.
			v = apply(size, args, func(a []int64) int64 { return a[0] / a[1] })
		} else if onnx.IntAttr(n, "fmod", 0) == 0 {
			v = apply(size, args, func(a []int64) int64 { r := a[0] % a[1]; return r + a[1]*b2i(r != 0 && (r < 0) != (a[1] < 0)) })
		}
	case "Max":
		v = apply(size, args, func(a []int64) int64 { return slices.Max(a) })
	case "Min":
		v = apply(size, args, func(a []int64) int64 { return slices.Min(a) })
	case "Equal":
		v = apply(size, args, func(a []int64) int64 { return b2i(a[0] == a[1]) })
	case "Less":
		v = apply(size, args, func(a []int64) int64 { return b2i(a[0] < a[1]) })
	case "Greater":
		v = apply(size, args, func(a []int64) int64 { return b2i(a[0] > a[1]) })
	case "Where":
		v = apply(size, args, func(a []int64) int64 {
			if a[0] != 0 {
				return a[1]
			}
			return a[2]
		})
	case "Range":
		if len(args) == 3 && len(args[0]) == 1 && len(args[2]) == 1 {
			for i := range size {
				v = append(v, args[0][0]+int64(i)*args[2][0])
			}
		}
	case "ConstantOfShape":
		if t := tensorAttr(n, "value"); t == nil {
			v = make([]int64, size)
		} else if c, err := onnx.DecodeTensor(t, ""); err == nil && c.DType == tensor.Int64 && len(c.Data) == 8 {
			iv, _ := c.Int64s()
			v = make([]int64, size)
			for i := range v {
				v[i] = iv[0]
			}
		}
	case "Slice":
		if len(args[0]) == size && len(outs[0]) == 1 && len(args) >= 3 && len(args[1]) == 1 && len(args[2]) == 1 {
			step := int64(1)
			if len(args) > 4 && len(args[4]) == 1 {
				step = args[4][0]
			}
			if step == 1 {
				dim := int64(len(si.ints[n.GetInput()[0]]))
				st := args[1][0]
				if st < 0 {
					st += dim
				}
				st = max(0, min(st, dim))
				if st+int64(size) <= dim {
					v = args[0][st : st+int64(size)]
				}
			}
		}
	}
	if v != nil && len(v) == size {
		si.ints[out] = slices.Clone(v)
	}
}

// apply computes an elementwise op over args, each of size elements or
// one (broadcast); nil when their lengths do not fit.
func apply(size int, args [][]int64, f func([]int64) int64) []int64 {
	for _, a := range args {
		if len(a) != size && len(a) != 1 {
			return nil
		}
	}
	out := make([]int64, size)
	x := make([]int64, len(args))
	for i := range out {
		for k, a := range args {
			x[k] = a[min(i, len(a)-1)]
		}
		out[i] = f(x)
	}
	return out
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func tensorAttr(n *onnx.NodeProto, name string) *onnx.TensorProto {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name {
			return a.GetT()
		}
	}
	return nil
}

// split infers Split: sizes from the split input (opset 13) or attribute,
// else equal parts (the last smaller, as num_outputs asks since opset 18).
func (si *shapeInference) split(n *onnx.NodeProto, x []int64) [][]int64 {
	if x == nil {
		return nil
	}
	a := axis(onnx.IntAttr(n, "axis", 0), len(x))
	k := len(n.GetOutput())
	if a < 0 || a >= len(x) || k == 0 {
		return nil
	}
	sizes, ok := onnx.IntsAttr(n, "split")
	if !ok && len(n.GetInput()) > 1 && n.GetInput()[1] != "" {
		if sizes, ok = si.constInts(n, 1); !ok {
			return nil
		}
	}
	if !ok {
		part := (x[a] + int64(k) - 1) / int64(k)
		for i := range k {
			sizes = append(sizes, max(0, min(part, x[a]-int64(i)*part)))
		}
	}
	if len(sizes) != k {
		return nil
	}
	out := make([][]int64, k)
	for i, d := range sizes {
		out[i] = slices.Clone(x)
		out[i][a] = d
	}
	return out
}
