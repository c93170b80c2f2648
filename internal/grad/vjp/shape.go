package vjp

import (
	"fp16audit/internal/tensor"
	"math"
	"slices"

	"fp16audit/internal/onnx"
)

func init() {
	family("reshapeBack", reshapeBack)
	family("transposeBack", transposeBack)
	family("concat", concat)
	family("split", split)
	family("sliceBack", sliceBack)
	family("gather", gather)
	family("gatherElements", gatherElements)
	family("expand", expand)
	family("gatherND", gatherND)
	family("tile", tile)
	family("pad", pad)
	family("trilu", trilu)
}

// reshapeBack: ops that only relabel the elements take the gradient back to
// the input's shape.
func reshapeBack(c *call) error {
	if !c.wants(0) {
		return nil
	}
	xs, err := c.shape(c.in(0))
	if err != nil {
		return err
	}
	c.set(0, c.b.reshape(c.g(), xs))
	return nil
}

func transposeBack(c *call) error {
	if !c.wants(0) {
		return nil
	}
	perm := attrInts(c.n, "perm")
	if perm == nil {
		xs, err := c.shape(c.in(0))
		if err != nil {
			return err
		}
		perm = iota64(0, len(xs))
		slices.Reverse(perm)
	}
	c.set(0, c.b.transpose(c.g(), inversePerm(perm)))
	return nil
}

// concat cuts the gradient into the inputs' pieces.
func concat(c *call) error {
	ys, err := c.shape(c.out(0))
	if err != nil {
		return err
	}
	axis := normAxis(attrInt(c.n, "axis", 0), len(ys))
	off := int64(0)
	for k, in := range c.n.Input {
		xs, err := c.shape(in)
		if err != nil {
			return err
		}
		if c.wants(k) {
			c.set(k, c.b.slice(c.g(), axis, off, off+xs[axis]))
		}
		off += xs[axis]
	}
	return nil
}

// split joins the outputs' gradients, with zeros for outputs that have
// none.
func split(c *call) error {
	if !c.wants(0) {
		return nil
	}
	xs, err := c.shape(c.in(0))
	if err != nil {
		return err
	}
	axis := normAxis(attrInt(c.n, "axis", 0), len(xs))
	parts := make([]string, len(c.n.Output))
	for k, o := range c.n.Output {
		if c.gy[k] != "" {
			parts[k] = c.gy[k]
			continue
		}
		os, err := c.shape(o)
		if err != nil {
			return err
		}
		parts[k] = c.b.zeros(os)
	}
	c.set(0, c.b.op("Concat", parts, onnx.AttrInt("axis", axis)))
	return nil
}

// sliceBack puts the gradient back where Slice took its elements from:
// negative steps are undone by reversing, steps above one by interleaving
// zeros, and the offsets by zero padding. The starts, ends, axes and steps
// must be fixed for the probed batch.
func sliceBack(c *call) error {
	if !c.wants(0) {
		return nil
	}
	x, y := c.in(0), c.out(0)
	sh, err := c.shapes(x, y)
	if err != nil {
		return err
	}
	xs, ys := sh[0], sh[1]
	r := len(xs)
	starts, err := c.b.constInts(c.in(1))
	if err != nil {
		return err
	}
	if _, err := c.b.constInts(c.in(2)); err != nil {
		return err
	}
	axes := iota64(0, len(starts))
	if a := c.in(3); a != "" {
		if axes, err = c.b.constInts(a); err != nil {
			return err
		}
	}
	steps := make([]int64, len(starts))
	for i := range steps {
		steps[i] = 1
	}
	if s := c.in(4); s != "" {
		if steps, err = c.b.constInts(s); err != nil {
			return err
		}
	}
	b := c.b
	if tensor.NumElements(ys) == 0 {
		c.set(0, b.zeros(xs))
		return nil
	}
	cur, cs := c.g(), slices.Clone(ys)
	before, after := make([]int64, r), make([]int64, r)
	for i := range r {
		after[i] = xs[i] - ys[i] // axes not sliced keep before 0, after 0
	}
	for k, a := range axes {
		a = normAxis(a, r)
		dim, st, n := xs[a], steps[k], ys[a]
		start := starts[k]
		if start < 0 {
			start += dim
		}
		if st > 0 {
			start = min(max(start, 0), dim)
		} else {
			start = min(max(start, 0), dim-1)
		}
		lowest, stride := start, st
		if st < 0 {
			cur = b.op("Slice", []string{cur, b.ints(-1), b.ints(math.MinInt64), b.ints(a), b.ints(-1)})
			lowest, stride = start+(n-1)*st, -st
		}
		if stride > 1 {
			// [.., n, ..] → [.., n, 1, ..] → pad to [.., n, stride, ..] →
			// [.., n·stride, ..] → first (n-1)·stride+1
			u := b.op("Unsqueeze", []string{cur, b.ints(a + 1)})
			us := slices.Insert(slices.Clone(cs), int(a+1), 1)
			pads := make([]int64, 2*len(us))
			pads[len(us)+int(a)+1] = stride - 1
			p := b.op("Pad", []string{u, b.ints(pads...)})
			cs[a] = n * stride
			cur = b.slice(b.reshape(p, cs), a, 0, (n-1)*stride+1)
			cs[a] = (n-1)*stride + 1
		}
		before[a] = lowest
		after[a] = dim - (lowest + cs[a])
	}
	pads := append(before, after...)
	if slices.ContainsFunc(pads, func(p int64) bool { return p != 0 }) {
		cur = b.op("Pad", []string{cur, b.ints(pads...)})
	}
	c.set(0, cur)
	return nil
}

// normIndices maps negative indices into [0, dim) as Gather reads them,
// so the scatter sees what the gather took.
func normIndices(b *Builder, idx string, dim int64) string {
	cast := b.op("Cast", []string{idx}, onnx.AttrInt("to", int64(elemInt64)))
	// 0-d constants, so that a scalar index stays a scalar
	neg := b.op("Less", []string{cast, b.int0(0)})
	return b.op("Where", []string{neg, b.op("Add", []string{cast, b.int0(dim)}), cast})
}

// gather: data[..., idx, ...] along axis. The gradient is a scatter-add
// of g into zeros of the data's shape (repeated indices, as in an
// Embedding, sum), done with ScatterND over the gathered axis moved to the
// front.
func gather(c *call) error {
	if !c.wants(0) {
		return nil
	}
	data, idx := c.in(0), c.in(1)
	sh, err := c.shapes(data, idx)
	if err != nil {
		return err
	}
	xs, is := sh[0], sh[1]
	r, q := len(xs), len(is)
	a := normAxis(attrInt(c.n, "axis", 0), r)
	b, g := c.b, c.g()
	// g: pre + idx + post → idx + pre + post
	gt := g
	if a > 0 && q > 0 {
		perm := append(iota64(int(a), int(a)+q), iota64(0, int(a))...)
		perm = append(perm, iota64(int(a)+q, r-1+q)...)
		gt = b.transpose(g, perm)
	}
	front := append([]int64{xs[a]}, xs[:a]...)
	front = append(front, xs[a+1:]...)
	ni := b.op("Unsqueeze", []string{normIndices(b, idx, xs[a]), b.ints(-1)})
	d := b.op("ScatterND", []string{b.zeros(front), ni, gt}, onnx.AttrString("reduction", "add"))
	if a > 0 {
		perm := append(iota64(1, int(a)+1), 0)
		perm = append(perm, iota64(int(a)+1, r)...)
		d = b.transpose(d, perm)
	}
	c.set(0, d)
	return nil
}

// gatherElements: the gradient is ScatterElements(add) of g at the same
// indices.
func gatherElements(c *call) error {
	if !c.wants(0) {
		return nil
	}
	xs, err := c.shape(c.in(0))
	if err != nil {
		return err
	}
	b := c.b
	a := normAxis(attrInt(c.n, "axis", 0), len(xs))
	d := b.op("ScatterElements", []string{b.zeros(xs), normIndices(b, c.in(1), xs[a]), c.g()},
		onnx.AttrInt("axis", a), onnx.AttrString("reduction", "add"))
	c.set(0, d)
	return nil
}

func expand(c *call) error {
	if !c.wants(0) {
		return nil
	}
	sh, err := c.shapes(c.in(0), c.out(0))
	if err != nil {
		return err
	}
	c.set(0, c.b.unbroadcast(c.g(), sh[1], sh[0]))
	return nil
}

// tile sums the copies: g [r0·d0, r1·d1, ...] viewed as [r0, d0, r1, d1,
// ...] and reduced over the repeat axes.
func tile(c *call) error {
	if !c.wants(0) {
		return nil
	}
	xs, err := c.shape(c.in(0))
	if err != nil {
		return err
	}
	reps, err := c.b.constInts(c.in(1))
	if err != nil {
		return err
	}
	view := make([]int64, 0, 2*len(xs))
	axes := make([]int64, 0, len(xs))
	for i, d := range xs {
		view = append(view, reps[i], d)
		axes = append(axes, int64(2*i))
	}
	b := c.b
	c.set(0, b.reduceSum(b.reshape(c.g(), view), axes, false))
	return nil
}

// pad (constant mode) cuts the padding off the gradient.
func pad(c *call) error {
	if !c.wants(0) {
		return nil
	}
	if mode := attrString(c.n, "mode", "constant"); mode != "constant" {
		return c.errorf("Pad mode %q (only constant padding has a rule)", mode)
	}
	xs, err := c.shape(c.in(0))
	if err != nil {
		return err
	}
	r := len(xs)
	pads, err := c.b.constInts(c.in(1))
	if err != nil {
		return err
	}
	axes := iota64(0, r)
	if a := c.in(3); a != "" {
		if axes, err = c.b.constInts(a); err != nil {
			return err
		}
	}
	k := len(axes)
	if len(pads) != 2*k {
		return c.errorf("Pad with %d pads for %d axes", len(pads), k)
	}
	starts, ends, sax := make([]int64, k), make([]int64, k), make([]int64, k)
	for i, a := range axes {
		a = normAxis(a, r)
		if pads[i] < 0 || pads[k+i] < 0 {
			return c.errorf("Pad with negative pads (cropping)")
		}
		starts[i], ends[i], sax[i] = pads[i], pads[i]+xs[a], a
	}
	b := c.b
	c.set(0, b.op("Slice", []string{c.g(), b.ints(starts...), b.ints(ends...), b.ints(sax...)}))
	return nil
}

// trilu keeps the same triangle of the gradient: the elements the forward
// zeroed get none (torch's tril/triu backward applies the same mask).
func trilu(c *call) error {
	if !c.wants(0) {
		return nil
	}
	ins := []string{c.g()}
	if k := c.in(1); k != "" {
		ins = append(ins, k)
	}
	c.set(0, c.b.op("Trilu", ins, onnx.AttrInt("upper", attrInt(c.n, "upper", 1))))
	return nil
}

// gatherND: data at the index tuples of indices' last axis (what the
// dynamo exporter writes for advanced indexing, x[rows, cols]). The
// gradient scatter-adds g into zeros of the data's shape at the same
// tuples (a tuple met twice sums, as autograd's index_put with
// accumulate does); negative indices count from each indexed dimension's
// end.
func gatherND(c *call) error {
	if !c.wants(0) {
		return nil
	}
	if bd := attrInt(c.n, "batch_dims", 0); bd != 0 {
		return c.errorf("GatherND with batch_dims %d", bd)
	}
	data, idx := c.in(0), c.in(1)
	sh, err := c.shapes(data, idx)
	if err != nil {
		return err
	}
	xs, is := sh[0], sh[1]
	if len(is) == 0 || is[len(is)-1] < 1 || is[len(is)-1] > int64(len(xs)) {
		return c.errorf("GatherND with indices of shape %v on data of shape %v", is, xs)
	}
	b := c.b
	k := is[len(is)-1]
	neg := b.op("Less", []string{idx, b.int0(0)})
	ni := b.op("Where", []string{neg, b.op("Add", []string{idx, b.ints(xs[:k]...)}), idx})
	c.set(0, b.op("ScatterND", []string{b.zeros(xs), ni, c.g()}, onnx.AttrString("reduction", "add")))
	return nil
}
