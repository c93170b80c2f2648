package vjp

import (
	"fp16audit/internal/tensor"
	"slices"

	"fp16audit/internal/onnx"
)

func init() {
	family("softmax", softmax)
	family("reduce", reduce)
	family("batchNorm", batchNorm)
	family("layerNorm", layerNorm)
	family("rmsNorm", rmsNorm)
}

// softmax (opset 13 on: one axis).
//
//	Softmax:    dx = y ⊙ (g − Σ g⊙y)
//	LogSoftmax: dx = g − exp(y) ⊙ Σ g
func softmax(c *call) error {
	if !c.wants(0) {
		return nil
	}
	ys, err := c.shape(c.out(0))
	if err != nil {
		return err
	}
	b, g, y := c.b, c.g(), c.out(0)
	axis := normAxis(attrInt(c.n, "axis", -1), len(ys))
	if c.n.OpType == "Softmax" {
		s := b.reduceSum(b.mul(g, y), []int64{axis}, true)
		c.set(0, b.mul(y, b.sub(g, s)))
		return nil
	}
	s := b.reduceSum(g, []int64{axis}, true)
	c.set(0, b.sub(g, b.mul(b.op("Exp", []string{y}), s)))
	return nil
}

// reduceAxes returns the axes a Reduce node reduces over (normalized,
// sorted) and whether it reduces at all. ReduceSum takes axes as an input
// from opset 13, the other reductions from opset 18; before that they are
// an attribute.
func reduceAxes(c *call, rank int) ([]int64, bool, error) {
	var axes []int64
	if c.n.OpType == "ReduceSum" || c.b.opset >= 18 {
		if a := c.in(1); a != "" {
			v, err := c.b.constInts(a)
			if err != nil {
				return nil, false, err
			}
			axes = v
		}
	} else {
		axes = attrInts(c.n, "axes")
	}
	if len(axes) == 0 {
		if attrInt(c.n, "noop_with_empty_axes", 0) != 0 {
			return nil, false, nil
		}
		return iota64(0, rank), true, nil
	}
	out := make([]int64, len(axes))
	for i, a := range axes {
		out[i] = normAxis(a, rank)
	}
	slices.Sort(out)
	return out, true, nil
}

// reduce spreads the gradient back over the reduced axes: evenly for
// ReduceSum (×1/n for ReduceMean), ×2x for ReduceSumSquare, ×x/y for
// ReduceL2, and shared among the elements equal to the result for
// ReduceMax/ReduceMin (as torch's amax/amin backward does).
func reduce(c *call) error {
	if !c.wants(0) {
		return nil
	}
	x := c.in(0)
	sh, err := c.shapes(x, c.out(0))
	if err != nil {
		return err
	}
	xs := sh[0]
	axes, reduces, err := reduceAxes(c, len(xs))
	if err != nil {
		return err
	}
	b, g := c.b, c.g()
	if !reduces {
		c.set(0, g)
		return nil
	}
	ks := keepdimsShape(xs, axes)
	gk, yk := g, c.out(0)
	if attrInt(c.n, "keepdims", 1) == 0 {
		gk = b.reshape(g, ks)
		yk = b.reshape(yk, ks)
	}
	count := int64(1)
	for _, a := range axes {
		count *= xs[a]
	}
	var d string
	switch c.n.OpType {
	case "ReduceSum":
		d = b.expandTo(gk, xs)
	case "ReduceMean":
		d = b.expandTo(b.scale(gk, 1/float64(count)), xs)
	case "ReduceSumSquare":
		d = b.mul(b.expandTo(gk, xs), b.scale(x, 2))
	case "ReduceL2":
		d = b.mul(b.expandTo(gk, xs), b.div(x, yk))
		d = b.op("Where", []string{b.op("Equal", []string{yk, b.scalar(0)}), b.scalar(0), d})
	case "ReduceMax", "ReduceMin":
		mask := b.op("Cast", []string{b.op("Equal", []string{x, yk})}, onnx.AttrInt("to", int64(elemFloat)))
		n := b.reduceSum(mask, axes, true)
		d = b.mul(mask, b.div(gk, n))
	}
	c.set(0, d)
	return nil
}

// channelShape is [1, C, 1, ...] for broadcasting per-channel vectors over
// an NC... tensor of rank r.
func channelShape(c int64, r int) []int64 {
	s := make([]int64, r)
	for i := range s {
		s[i] = 1
	}
	s[1] = c
	return s
}

// batchNorm: y = (x − μ)/√(σ²+ε) · scale + B per channel. In inference
// mode μ and σ² are the running statistics (inputs, no gradient); in
// training mode (training_mode=1) they are the batch's mean and biased
// variance over all axes but 1, which couples the elements:
//
//	dx = scale·invstd · (g − mean(g) − x̂·mean(g⊙x̂))
func batchNorm(c *call) error {
	if len(c.gy) > 1 && slices.ContainsFunc(c.gy[1:], func(s string) bool { return s != "" }) {
		return c.errorf("gradient through the running statistics outputs")
	}
	x, scale := c.in(0), c.in(1)
	xs, err := c.shape(x)
	if err != nil {
		return err
	}
	b, g := c.b, c.g()
	r := len(xs)
	eps := float64(attrFloat(c.n, "epsilon", 1e-5))
	cs := channelShape(xs[1], r)
	axes := slices.DeleteFunc(iota64(0, r), func(a int64) bool { return a == 1 })
	m := tensor.NumElements(xs) / xs[1]
	var xhat, invstd string
	training := attrInt(c.n, "training_mode", 0) != 0
	if training {
		mean := b.scale(b.reduceSum(x, axes, true), 1/float64(m))
		xc := b.sub(x, mean)
		v := b.scale(b.reduceSum(b.mul(xc, xc), axes, true), 1/float64(m))
		invstd = b.op("Reciprocal", []string{b.op("Sqrt", []string{b.add(v, b.scalar(float32(eps)))})})
		xhat = b.mul(xc, invstd)
	} else {
		mean := b.reshape(c.in(3), cs)
		v := b.reshape(c.in(4), cs)
		invstd = b.op("Reciprocal", []string{b.op("Sqrt", []string{b.add(v, b.scalar(float32(eps)))})})
		xhat = b.mul(b.sub(x, mean), invstd)
	}
	var dscale, dbias string
	if c.wants(1) || (training && c.wants(0)) {
		dscale = b.reduceSum(b.mul(g, xhat), axes, true)
	}
	if c.wants(2) || (training && c.wants(0)) {
		dbias = b.reduceSum(g, axes, true)
	}
	if c.wants(0) {
		k := b.mul(b.reshape(scale, cs), invstd)
		if training {
			inner := b.sub(b.sub(g, b.scale(dbias, 1/float64(m))), b.mul(xhat, b.scale(dscale, 1/float64(m))))
			c.set(0, b.mul(k, inner))
		} else {
			c.set(0, b.mul(g, k))
		}
	}
	if c.wants(1) {
		c.set(1, b.reshape(dscale, []int64{xs[1]}))
	}
	if c.wants(2) {
		c.set(2, b.reshape(dbias, []int64{xs[1]}))
	}
	return nil
}

// layerNorm (opset 17): normalizes over axes [axis, rank) with the mean and
// variance recomputed here (the optional Mean and InvStdDev outputs are
// rarely exported):
//
//	dx = invstd · (ĝ − mean(ĝ) − x̂·mean(ĝ⊙x̂)),  ĝ = g ⊙ scale
func layerNorm(c *call) error {
	if len(c.gy) > 1 && slices.ContainsFunc(c.gy[1:], func(s string) bool { return s != "" }) {
		return c.errorf("gradient through the Mean or InvStdDev outputs")
	}
	x, scale, bias := c.in(0), c.in(1), c.in(2)
	xs, axes, lead, nrm, eps, err := normGeometry(c, x)
	if err != nil {
		return err
	}
	b, g := c.b, c.g()

	mean := b.scale(b.reduceSum(x, axes, true), 1/nrm)
	xc := b.sub(x, mean)
	v := b.scale(b.reduceSum(b.mul(xc, xc), axes, true), 1/nrm)
	invstd := b.op("Reciprocal", []string{b.op("Sqrt", []string{b.add(v, b.scalar(eps))})})
	xhat := b.mul(xc, invstd)
	if c.wants(0) {
		gh := b.mul(g, scale)
		m1 := b.scale(b.reduceSum(gh, axes, true), 1/nrm)
		m2 := b.scale(b.reduceSum(b.mul(gh, xhat), axes, true), 1/nrm)
		c.set(0, b.mul(invstd, b.sub(b.sub(gh, m1), b.mul(xhat, m2))))
	}
	if c.wants(1) {
		ss, err := c.shape(scale)
		if err != nil {
			return err
		}
		c.set(1, sumTo(b, b.mul(g, xhat), xs, lead, ss))
	}
	if bias != "" && c.wants(2) {
		bs, err := c.shape(bias)
		if err != nil {
			return err
		}
		c.set(2, sumTo(b, g, xs, lead, bs))
	}
	return nil
}

// rmsNorm is RMSNormalization (opset 23, torch 2.9's export of rms_norm at
// that opset): y = x / sqrt(mean(x², axes) + eps) · scale over the axes
// from axis on, with x̂ = x / rms:
// dx = (g·scale − x̂ · mean(g·scale·x̂)) / rms, dscale = Σ g·x̂ over the
// leading axes (torch's rms_norm backward).
func rmsNorm(c *call) error {
	x, scale := c.in(0), c.in(1)
	xs, axes, lead, nrm, eps, err := normGeometry(c, x)
	if err != nil {
		return err
	}
	b, g := c.b, c.g()

	ms := b.scale(b.reduceSum(b.mul(x, x), axes, true), 1/nrm)
	inv := b.op("Reciprocal", []string{b.op("Sqrt", []string{b.add(ms, b.scalar(eps))})})
	xhat := b.mul(x, inv)
	if c.wants(0) {
		gh := b.mul(g, scale)
		m := b.scale(b.reduceSum(b.mul(gh, xhat), axes, true), 1/nrm)
		c.set(0, b.mul(inv, b.sub(gh, b.mul(xhat, m))))
	}
	if c.wants(1) {
		ss, err := c.shape(scale)
		if err != nil {
			return err
		}
		c.set(1, sumTo(b, b.mul(g, xhat), xs, lead, ss))
	}
	return nil
}

// normGeometry is what LayerNormalization and RMSNormalization read of
// their node: x's shape, the normalized axes (from the axis attribute on)
// and the leading ones, the number of elements normalized together and
// epsilon.
func normGeometry(c *call, x string) (xs, axes, lead []int64, nrm float64, eps float32, err error) {
	if xs, err = c.shape(x); err != nil {
		return nil, nil, nil, 0, 0, err
	}
	r := len(xs)
	axis := normAxis(attrInt(c.n, "axis", -1), r)
	return xs, iota64(int(axis), r), iota64(0, int(axis)), float64(tensor.NumElements(xs[axis:])), attrFloat(c.n, "epsilon", 1e-5), nil
}

// sumTo sums v (shape xs) over the leading axes and then back to the
// broadcast shape ts of a parameter.
func sumTo(b *Builder, v string, xs, lead, ts []int64) string {
	rest := xs[len(lead):]
	if len(lead) > 0 {
		v = b.reduceSum(v, lead, false)
	}
	return b.unbroadcast(v, rest, ts)
}
