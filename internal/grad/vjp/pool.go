package vjp

import (
	"fp16audit/internal/tensor"
	"slices"

	"fp16audit/internal/onnx"
)

func init() {
	family("maxPool", maxPool)
	family("avgPool", avgPool)
	family("globalPool", globalPool)
}

// maxPool routes each output's gradient to the input element it took. The
// rule reads the positions from MaxPool's optional Indices output (flat
// indices into the whole input, batch and channel included, whatever the
// pads, dilations and ceil_mode), adding that output when the node lacks
// it, and scatters with reduction="add" so that elements picked by several
// overlapping windows receive every share, as torch's
// max_pool2d_with_indices_backward does.
func maxPool(c *call) error {
	if !c.wants(0) {
		return nil
	}
	if attrInt(c.n, "storage_order", 0) != 0 {
		return c.errorf("MaxPool with storage_order=1 (column-major indices)")
	}
	x := c.in(0)
	xs, err := c.shape(x)
	if err != nil {
		return err
	}
	b := c.b
	idx := c.out(1)
	if idx == "" {
		n := b.fwd(c.i)
		idx = n.Output[0] + "::indices" + internal
		n.Output = append(n.Output[:1], idx)
	}
	flat := b.zeros([]int64{tensor.NumElements(xs)})
	d := b.op("ScatterElements", []string{flat, b.reshape(idx, []int64{-1}), b.reshape(c.g(), []int64{-1})},
		onnx.AttrInt("axis", 0), onnx.AttrString("reduction", "add"))
	c.set(0, b.reshape(d, xs))
	return nil
}

// avgPool spreads each output's gradient evenly over its window: divide by
// the window's divisor, then a depthwise transposed convolution with a
// kernel of ones scatters it back. The divisors are constants computed
// here from the static shapes: the window's size clipped to the input
// (count_include_pad=0) or to the padded input (count_include_pad=1, as
// torch counts padding but not the overhang of a ceil_mode window).
func avgPool(c *call) error {
	if !c.wants(0) {
		return nil
	}
	x, y := c.in(0), c.out(0)
	sh, err := c.shapes(x, y)
	if err != nil {
		return err
	}
	xs, ys := sh[0], sh[1]
	r := len(xs) - 2
	kernel := attrInts(c.n, "kernel_shape")
	if len(kernel) != r {
		return c.errorf("AveragePool kernel_shape %v for rank %d input", kernel, len(xs))
	}
	geo := geometry(c.n, kernel, xs[2:], ys[2:])
	includePad := attrInt(c.n, "count_include_pad", 0) != 0
	b, g := c.b, c.g()

	// Per-dimension divisors, then their outer product over the output.
	per := make([][]float32, r)
	extra := make([]int64, r)
	for i := range r {
		in, k, s, dl, pb, pe := xs[2+i], kernel[i], geo.strides[i], geo.dilations[i], geo.padBegin[i], geo.padEnd[i]
		lo, hi := int64(0), in
		if includePad {
			lo, hi = -pb, in+pe
		}
		per[i] = make([]float32, ys[2+i])
		for o := range ys[2+i] {
			n := int64(0)
			for j := range k {
				p := o*s - pb + j*dl
				if p >= lo && p < hi {
					n++
				}
			}
			per[i][o] = float32(n)
		}
		extra[i] = max(0, (ys[2+i]-1)*s+(k-1)*dl+1-(in+pb+pe))
	}
	outShape := append([]int64{1, 1}, ys[2:]...)
	div := make([]float32, tensor.NumElements(ys[2:]))
	for flat := range div {
		v, rem := float32(1), flat
		for i := r - 1; i >= 0; i-- {
			o := rem % int(ys[2+i])
			rem /= int(ys[2+i])
			v *= per[i][o]
		}
		div[flat] = v
	}
	gs := b.div(g, b.floats(outShape, div))
	ch := xs[1]
	ones := make([]float32, ch*tensor.NumElements(kernel))
	for i := range ones {
		ones[i] = 1
	}
	w := b.floats(append([]int64{ch, 1}, kernel...), ones)
	padEnd := make([]int64, r)
	outPad := make([]int64, r)
	for i := range r {
		padEnd[i] = geo.padEnd[i] + extra[i]
		full := geo.strides[i]*(ys[2+i]-1) + (kernel[i]-1)*geo.dilations[i] + 1 - geo.padBegin[i] - padEnd[i]
		outPad[i] = xs[2+i] - full
	}
	pads := append(slices.Clone(geo.padBegin), padEnd...)
	d := b.op("ConvTranspose", []string{gs, w},
		onnx.AttrInts("kernel_shape", kernel...), onnx.AttrInts("strides", geo.strides...),
		onnx.AttrInts("dilations", geo.dilations...), onnx.AttrInts("pads", pads...),
		onnx.AttrInt("group", ch), onnx.AttrInts("output_padding", outPad...))
	c.set(0, d)
	return nil
}

// globalPool: GlobalAveragePool spreads g/(spatial size) over the input;
// GlobalMaxPool shares g among the elements equal to the maximum.
func globalPool(c *call) error {
	if !c.wants(0) {
		return nil
	}
	x := c.in(0)
	xs, err := c.shape(x)
	if err != nil {
		return err
	}
	b, g := c.b, c.g()
	if c.n.OpType == "GlobalAveragePool" {
		c.set(0, b.expandTo(b.scale(g, 1/float64(tensor.NumElements(xs[2:]))), xs))
		return nil
	}
	mask := b.op("Cast", []string{b.op("Equal", []string{x, c.out(0)})}, onnx.AttrInt("to", int64(elemFloat)))
	n := b.reduceSum(mask, iota64(2, len(xs)), true)
	c.set(0, b.mul(mask, b.div(g, n)))
	return nil
}
