package vjp

import (
	"math"

	"fp16audit/internal/onnx"
)

func init() {
	family("attention", attention)
}

// attention is Attention (opset 23, torch 2.9's export of
// scaled_dot_product_attention at that opset) with 4-D inputs Q [B, Hq,
// Sq, D], K and V [B, Hkv, Skv, D] (Hq a multiple of Hkv: grouped-query
// attention), an optional boolean (True attends) or additive mask and
// is_causal. The backward recomputes P = softmax(scale·Q·Kᵀ + mask) and,
// with dO the output's gradient:
// dV = Pᵀ·dO, dS = P ⊙ (dO·Vᵀ − Σ dO·Vᵀ ⊙ P), dQ = scale·dS·K,
// dK = scale·dSᵀ·Q (each summed over the query heads that share a key
// head), and an additive mask's gradient is dS (torch's
// scaled_dot_product_attention backward, math path). The cache inputs
// (past_key, past_value), 3-D inputs, softcap and the extra outputs are
// refused by name.
func attention(c *call) error {
	for k := 1; k < len(c.gy); k++ {
		if c.gy[k] != "" {
			return c.errorf("gradient through Attention's present_key, present_value or qk_matmul_output")
		}
	}
	if len(c.n.Input) > 4 && (c.n.Input[4] != "" || (len(c.n.Input) > 5 && c.n.Input[5] != "")) {
		return c.errorf("Attention with past_key/past_value (a decoding cache): export without the cache")
	}
	if attrFloat(c.n, "softcap", 0) != 0 {
		return c.errorf("Attention with softcap")
	}
	q, k, v := c.in(0), c.in(1), c.in(2)
	qs, err := c.shape(q)
	if err != nil {
		return err
	}
	ks, err := c.shape(k)
	if err != nil {
		return err
	}
	if len(qs) != 4 || len(ks) != 4 {
		return c.errorf("Attention on %d-D inputs (the gradient rule takes [batch, heads, sequence, head size])", len(qs))
	}
	bsz, hq, sq, d := qs[0], qs[1], qs[2], qs[3]
	hkv, skv := ks[1], ks[2]
	if hkv == 0 || hq%hkv != 0 {
		return c.errorf("Attention with %d query heads over %d key heads", hq, hkv)
	}
	groups := hq / hkv
	scale := float64(attrFloat(c.n, "scale", float32(1/math.Sqrt(float64(d)))))
	b, g := c.b, c.g()
	last2 := []int64{0, 1, 3, 2}

	// K and V repeated to the query heads, as grouped-query attention
	// reads them.
	repeat := func(x string, sh []int64) string {
		if groups == 1 {
			return x
		}
		x = b.reshape(x, []int64{sh[0], sh[1], 1, sh[2], sh[3]})
		x = b.expandTo(x, []int64{sh[0], sh[1], groups, sh[2], sh[3]})
		return b.reshape(x, []int64{sh[0], sh[1] * groups, sh[2], sh[3]})
	}
	// a gradient at the query heads summed back to the key heads
	fold := func(x string, sh []int64) string {
		if groups == 1 {
			return x
		}
		x = b.reshape(x, []int64{sh[0], sh[1], groups, sh[2], sh[3]})
		return b.reduceSum(x, []int64{2}, false)
	}
	vs, err := c.shape(v)
	if err != nil {
		return err
	}
	kr, vr := repeat(k, ks), repeat(v, vs)

	s := b.scale(b.op("MatMul", []string{q, b.transpose(kr, last2)}), scale)
	var maskShape []int64
	float := false
	if len(c.n.Input) > 3 && c.n.Input[3] != "" {
		mask := c.n.Input[3]
		if maskShape, err = c.shape(mask); err != nil {
			return err
		}
		if b.isFloat(mask) {
			float = true
			s = b.add(s, mask)
		} else {
			s = b.op("Where", []string{mask, s, b.scalar(float32(math.Inf(-1)))})
		}
	}
	if attrInt(c.n, "is_causal", 0) != 0 {
		if sq != skv {
			return c.errorf("causal Attention of %d queries over %d keys", sq, skv)
		}
		lower := b.op("Trilu", []string{b.add(b.zeros([]int64{sq, skv}), b.scalar(1))}, onnx.AttrInt("upper", 0))
		keep := b.op("Cast", []string{lower}, onnx.AttrInt("to", int64(onnx.TensorProto_BOOL)))
		s = b.op("Where", []string{keep, s, b.scalar(float32(math.Inf(-1)))})
	}
	p := b.op("Softmax", []string{s}, onnx.AttrInt("axis", -1))
	// dS = P ⊙ (dP − Σ dP ⊙ P), dP = dO·Vᵀ
	dp := b.op("MatMul", []string{g, b.transpose(vr, last2)})
	ds := b.mul(p, b.sub(dp, b.reduceSum(b.mul(dp, p), []int64{3}, true)))
	if c.wants(0) {
		c.set(0, b.scale(b.op("MatMul", []string{ds, kr}), scale))
	}
	if c.wants(1) {
		dk := b.scale(b.op("MatMul", []string{b.transpose(ds, last2), q}), scale)
		c.set(1, fold(dk, ks))
	}
	if c.wants(2) {
		dv := b.op("MatMul", []string{b.transpose(p, last2), g})
		c.set(2, fold(dv, vs))
	}
	if float && c.wants(3) {
		c.set(3, b.unbroadcast(ds, []int64{bsz, hq, sq, skv}, maskShape))
	}
	return nil
}
