package vjp

import (
	"fp16audit/internal/tensor"
	"math"
	"slices"

	"fp16audit/internal/onnx"
)

func init() {
	family("gemm", gemm)
	family("matmul", matmul)
	family("conv", conv)
}

// gemm: Y = alpha·A'·B' + beta·C with A' = transA ? Aᵀ : A and B' likewise.
// Each product gradient is one Gemm with the transposes folded into its
// flags.
func gemm(c *call) error {
	n, b, g := c.n, c.b, c.g()
	alpha := attrFloat(n, "alpha", 1)
	beta := attrFloat(n, "beta", 1)
	ta, tb := attrInt(n, "transA", 0) != 0, attrInt(n, "transB", 0) != 0
	a, bn := c.in(0), c.in(1)
	flag := func(v bool) int64 {
		if v {
			return 1
		}
		return 0
	}
	gm := func(x, y string, tx, ty bool) string {
		attrs := []*onnx.AttributeProto{onnx.AttrInt("transA", flag(tx)), onnx.AttrInt("transB", flag(ty))}
		if alpha != 1 {
			attrs = append(attrs, onnx.AttrFloat("alpha", alpha))
		}
		return b.op("Gemm", []string{x, y}, attrs...)
	}
	if c.wants(0) {
		if !ta {
			c.set(0, gm(g, bn, false, !tb)) // alpha·g·B'ᵀ
		} else {
			c.set(0, gm(bn, g, tb, true)) // (alpha·g·B'ᵀ)ᵀ = alpha·B'·gᵀ
		}
	}
	if c.wants(1) {
		if !tb {
			c.set(1, gm(a, g, !ta, false)) // alpha·A'ᵀ·g
		} else {
			c.set(1, gm(g, a, true, ta)) // alpha·gᵀ·A'
		}
	}
	if cn := c.in(2); cn != "" && c.wants(2) {
		sh, err := c.shapes(cn, c.out(0))
		if err != nil {
			return err
		}
		d := g
		if beta != 1 {
			d = b.scale(g, float64(beta))
		}
		c.set(2, b.unbroadcast(d, sh[1], sh[0]))
	}
	return nil
}

// matmul: numpy matmul with batch broadcasting and 1-D promotion. A 2-D
// weight B under a batched A (a Linear on a sequence) gets its gradient
// from one Gemm over the flattened batch instead of a batched product and a
// sum.
func matmul(c *call) error {
	a, bn, y := c.in(0), c.in(1), c.out(0)
	sh, err := c.shapes(a, bn, y)
	if err != nil {
		return err
	}
	b, g := c.b, c.g()
	as, bs, ys := sh[0], sh[1], sh[2]
	// Promote 1-D operands as matmul does: A [k] → [1,k], B [k] → [k,1].
	a2, b2, as2, bs2 := a, bn, as, bs
	g2, ys2 := g, ys
	if len(as) == 1 {
		as2 = []int64{1, as[0]}
		a2 = b.reshape(a, as2)
	}
	if len(bs) == 1 {
		bs2 = []int64{bs[0], 1}
		b2 = b.reshape(bn, bs2)
	}
	if len(as) == 1 || len(bs) == 1 {
		if len(as) == 1 && len(bs) == 1 {
			ys2 = []int64{1, 1}
		} else {
			batch := broadcastShape(as2[:len(as2)-2], bs2[:len(bs2)-2])
			ys2 = append(batch, as2[len(as2)-2], bs2[len(bs2)-1])
		}
		g2 = b.reshape(g, ys2)
	}
	swap := func(r int) []int64 {
		p := iota64(0, r)
		p[r-1], p[r-2] = p[r-2], p[r-1]
		return p
	}
	if c.wants(0) {
		// dA = g · Bᵀ, summed over broadcast batch dimensions
		d := b.op("MatMul", []string{g2, b.transpose(b2, swap(len(bs2)))})
		ds := append(broadcastShape(ys2[:len(ys2)-2], bs2[:len(bs2)-2]), ys2[len(ys2)-2], bs2[len(bs2)-2])
		d = b.unbroadcast(d, ds, as2)
		if len(as) == 1 {
			d = b.reshape(d, as)
		}
		c.set(0, d)
	}
	if c.wants(1) {
		var d string
		if len(bs2) == 2 && len(as2) >= 2 {
			k, m := bs2[0], bs2[1]
			af := b.reshape(a2, []int64{-1, k})
			gf := b.reshape(g2, []int64{-1, m})
			d = b.op("Gemm", []string{af, gf}, onnx.AttrInt("transA", 1))
		} else {
			// dB = Aᵀ · g, summed over broadcast batch dimensions
			d = b.op("MatMul", []string{b.transpose(a2, swap(len(as2))), g2})
			ds := append(broadcastShape(as2[:len(as2)-2], ys2[:len(ys2)-2]), as2[len(as2)-1], ys2[len(ys2)-1])
			d = b.unbroadcast(d, ds, bs2)
		}
		if len(bs) == 1 {
			d = b.reshape(d, bs)
		}
		c.set(1, d)
	}
	return nil
}

// broadcastShape is the numpy broadcast of two shapes.
func broadcastShape(x, y []int64) []int64 {
	r := max(len(x), len(y))
	out := make([]int64, r)
	for i := range r {
		dx, dy := int64(1), int64(1)
		if j := i - (r - len(x)); j >= 0 {
			dx = x[j]
		}
		if j := i - (r - len(y)); j >= 0 {
			dy = y[j]
		}
		out[i] = max(dx, dy)
		if dx == 0 || dy == 0 {
			out[i] = 0
		}
	}
	return out
}

// convGeometry is a Conv's (or pool's) spatial parameters with explicit
// pads, whatever auto_pad said.
type convGeometry struct {
	kernel, strides, dilations, padBegin, padEnd []int64
}

// geometry reads kernel, strides, dilations and pads for a node over an
// input of spatial shape in with output spatial shape out, resolving
// auto_pad from the static shapes.
func geometry(n *onnx.NodeProto, kernel, in, out []int64) convGeometry {
	r := len(in)
	g := convGeometry{kernel: kernel, strides: ones(r), dilations: ones(r), padBegin: make([]int64, r), padEnd: make([]int64, r)}
	if s := attrInts(n, "strides"); len(s) == r {
		g.strides = s
	}
	if d := attrInts(n, "dilations"); len(d) == r {
		g.dilations = d
	}
	switch attrString(n, "auto_pad", "NOTSET") {
	case "SAME_UPPER", "SAME_LOWER":
		for i := range r {
			ext := (kernel[i]-1)*g.dilations[i] + 1
			total := max(0, (out[i]-1)*g.strides[i]+ext-in[i])
			if attrString(n, "auto_pad", "") == "SAME_UPPER" {
				g.padBegin[i] = total / 2
			} else {
				g.padBegin[i] = (total + 1) / 2
			}
			g.padEnd[i] = total - g.padBegin[i]
		}
	case "VALID":
	default:
		if p := attrInts(n, "pads"); len(p) == 2*r {
			copy(g.padBegin, p[:r])
			copy(g.padEnd, p[r:])
		}
	}
	return g
}

func ones(r int) []int64 {
	out := make([]int64, r)
	for i := range out {
		out[i] = 1
	}
	return out
}

// conv: Y = Conv(X, W) + B over N-D spatial dimensions with groups.
//
//   - dX is the transposed convolution of g with W (convDataGrad).
//   - dW correlates X with g, one kernel offset at a time (convWeightGrad).
//   - dB sums g over batch and space.
func conv(c *call) error {
	x, w, y := c.in(0), c.in(1), c.out(0)
	sh, err := c.shapes(x, w, y)
	if err != nil {
		return err
	}
	xs, ws, ys := sh[0], sh[1], sh[2]
	r := len(xs) - 2
	if r < 1 {
		return c.errorf("Conv input of rank %d", len(xs))
	}
	n, b, g := c.n, c.b, c.g()
	groups := attrInt(n, "group", 1)
	geo := geometry(n, ws[2:], xs[2:], ys[2:])

	if c.wants(0) {
		c.set(0, convDataGrad(b, g, w, xs, ws, ys, groups, geo))
	}
	if c.wants(1) {
		c.set(1, convWeightGrad(b, x, g, xs, ws, ys, groups, geo))
	}
	if bias := c.in(2); bias != "" && c.wants(2) {
		axes := append([]int64{0}, iota64(2, 2+r)...)
		c.set(2, b.reduceSum(g, axes, false))
	}
	return nil
}

// convWeightGrad returns dL/dW of a Conv as matrix products over the
// whole batch: with X_κ the (padded) input seen through kernel offset κ (a
// strided Slice of X held channels last) and P the output positions,
// dW[:, :, κ] = g[M, N·P] · X_κ[N·P, C]. Groups become a batch dimension of
// the products. A Conv of X with g as its kernel computes the same sums,
// but ONNX Runtime runs it as one small product per input channel, several
// times slower on the deep layers of a ResNet.
//
// The offsets must end up last, as in W. Where the batch has fewer output
// positions than W has output channels (deep layers), the slices are
// joined offset-last into one im2col matrix [N·P, C·k] and a single
// product lands in W's layout; otherwise (early layers, where the
// activations dwarf the weights) each offset gets its own product and one
// Transpose of the weight-sized result moves the offsets last.
func convWeightGrad(b *Builder, x, g string, xs, ws, ys []int64, groups int64, geo convGeometry) string {
	r := len(xs) - 2
	n, ch, m := xs[0], xs[1], ws[0]
	cg, mg := ch/groups, m/groups
	p := tensor.NumElements(ys[2:])
	xp := x
	if slices.ContainsFunc(append(slices.Clone(geo.padBegin), geo.padEnd...), func(v int64) bool { return v != 0 }) {
		pads := make([]int64, 2*(r+2))
		copy(pads[2:], geo.padBegin)
		copy(pads[r+4:], geo.padEnd)
		xp = b.op("Pad", []string{x, b.ints(pads...)})
	}
	// channels last: [N, S..., C]
	xl := b.transpose(xp, append(append([]int64{0}, iota64(2, 2+r)...), 1))
	// g as [G, Mg, N·P]
	gt := b.reshape(b.transpose(g, append([]int64{1, 0}, iota64(2, 2+r)...)), []int64{groups, mg, n * p})
	kernel := ws[2:]
	kk := tensor.NumElements(kernel)
	im2col := n*p <= m
	parts := make([]string, 0, kk)
	axes := iota64(1, 1+r)
	offset := make([]int64, r)
	for range kk {
		starts, ends := make([]int64, r), make([]int64, r)
		for d := range r {
			starts[d] = offset[d] * geo.dilations[d]
			ends[d] = starts[d] + (ys[2+d]-1)*geo.strides[d] + 1
		}
		xk := b.op("Slice", []string{xl, b.ints(starts...), b.ints(ends...), b.ints(axes...), b.ints(geo.strides...)})
		if im2col {
			parts = append(parts, b.reshape(xk, []int64{n * p, ch, 1}))
		} else {
			var xm string
			if groups == 1 {
				xm = b.reshape(xk, []int64{1, n * p, ch})
			} else {
				xm = b.transpose(b.reshape(xk, []int64{n * p, groups, cg}), []int64{1, 0, 2})
			}
			d := b.op("MatMul", []string{gt, xm}) // [G, Mg, Cg]
			parts = append(parts, b.reshape(d, []int64{1, m, cg}))
		}
		for d := r - 1; d >= 0; d-- {
			if offset[d]++; offset[d] < kernel[d] {
				break
			}
			offset[d] = 0
		}
	}
	if im2col {
		cols := parts[0]
		if kk > 1 {
			cols = b.op("Concat", parts, onnx.AttrInt("axis", 2)) // [N·P, C, k]
		}
		cols = b.reshape(cols, []int64{n * p, groups, cg * kk})
		if groups > 1 {
			cols = b.transpose(cols, []int64{1, 0, 2})
		} else {
			cols = b.reshape(cols, []int64{1, n * p, cg * kk})
		}
		return b.reshape(b.op("MatMul", []string{gt, cols}), ws)
	}
	dw := parts[0]
	if kk > 1 {
		dw = b.transpose(b.op("Concat", parts, onnx.AttrInt("axis", 0)), []int64{1, 2, 0})
	}
	return b.reshape(dw, ws)
}

// convDataGrad returns dL/dX of a Conv. With unit strides and a weight no
// larger than g it is a Conv of g with W flipped in space and its channel
// axes swapped per group, padded by (k−1)·d − p on each side: there ONNX
// Runtime's Conv kernels are several times faster than its ConvTranspose.
// Otherwise (or when a forward pad exceeds the kernel's extent) it is the
// ConvTranspose of g with W, whose output_padding restores the input size
// the forward's floor division lost.
func convDataGrad(b *Builder, g, w string, xs, ws, ys []int64, groups int64, geo convGeometry) string {
	r := len(xs) - 2
	kernel := ws[2:]
	unit := true
	pads := make([]int64, 2*r)
	for i := range r {
		ext := (kernel[i] - 1) * geo.dilations[i]
		pads[i], pads[r+i] = ext-geo.padBegin[i], ext-geo.padEnd[i]
		unit = unit && geo.strides[i] == 1 && pads[i] >= 0 && pads[r+i] >= 0
	}
	// The flipped, swapped W is a copy element by element (a Transpose
	// and a reversing Slice): where W outweighs g (the deep layers of a
	// ResNet, 512×512×3×3 against 8×512×2×2) it costs several times the
	// convolution, and ConvTranspose, which reads W as it is, is faster.
	unit = unit && tensor.NumElements(ws) <= tensor.NumElements(ys)
	if unit {
		m, cg := ws[0], ws[1]
		mg := m / groups
		// W [G·Mg, Cg, k...] → [G, Mg, Cg, k...] → [G, Cg, Mg, k...] →
		// [G·Cg, Mg, k...], then reversed along every spatial axis
		wt := b.reshape(w, append([]int64{groups, mg, cg}, kernel...))
		wt = b.transpose(wt, append([]int64{0, 2, 1}, iota64(3, 3+r)...))
		wt = b.reshape(wt, append([]int64{groups * cg, mg}, kernel...))
		rev := make([]int64, r)
		lo := make([]int64, r)
		for i := range r {
			rev[i], lo[i] = -1, math.MinInt64
		}
		wt = b.op("Slice", []string{wt, b.ints(rev...), b.ints(lo...), b.ints(iota64(2, 2+r)...), b.ints(rev...)})
		return b.op("Conv", []string{g, wt},
			onnx.AttrInts("kernel_shape", kernel...), onnx.AttrInts("dilations", geo.dilations...),
			onnx.AttrInts("pads", pads...), onnx.AttrInt("group", groups))
	}
	outPad := make([]int64, r)
	for i := range r {
		full := geo.strides[i]*(ys[2+i]-1) + (kernel[i]-1)*geo.dilations[i] + 1 - geo.padBegin[i] - geo.padEnd[i]
		outPad[i] = xs[2+i] - full
	}
	attrs := []*onnx.AttributeProto{
		onnx.AttrInts("kernel_shape", kernel...), onnx.AttrInts("strides", geo.strides...),
		onnx.AttrInts("dilations", geo.dilations...), onnx.AttrInts("pads", append(slices.Clone(geo.padBegin), geo.padEnd...)...),
		onnx.AttrInt("group", groups), onnx.AttrInts("output_padding", outPad...),
	}
	return b.op("ConvTranspose", []string{g, w}, attrs...)
}
