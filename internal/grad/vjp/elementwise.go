package vjp

import (
	"math"

	"fp16audit/internal/onnx"
)

// Elementwise rules. Where PyTorch's derivative formula (tools/autograd's
// derivatives.yaml) picks a particular arrangement of the same math, the
// rule follows it, so that the fp32 results agree to rounding and the
// kinks (x = 0 for Relu, |x| = 3 for HardSwish) fall on the same side.

func init() {
	family("arith", arith)
	family("unary", unary)
	family("identity", identity)
	family("clip", clip)
	family("where", where)
	family("sum", sum)
	family("extremum", extremum)
	family("cast", cast)
	family("dropout", dropout)
}

// arith handles the broadcasting arithmetic ops: each input's gradient is
// computed at the broadcast shape, then summed back to the input's shape.
func arith(c *call) error {
	a, bn, y := c.in(0), c.in(1), c.out(0)
	sh, err := c.shapes(a, bn, y)
	if err != nil {
		return err
	}
	b, g := c.b, c.g()
	var da, db string
	switch c.n.OpType {
	case "Add":
		da, db = g, g
	case "Sub":
		da = g
		if c.wants(1) {
			db = b.neg(g)
		}
	case "Mul":
		if c.wants(0) {
			da = b.mul(g, bn)
		}
		if c.wants(1) {
			db = b.mul(g, a)
		}
	case "Div":
		if c.wants(0) {
			da = b.div(g, bn)
		}
		if c.wants(1) {
			// -g * ((a / b) / b), torch's div_tensor_other_backward
			db = b.neg(b.mul(g, b.div(y, bn)))
		}
	case "Pow":
		zero := b.scalar(0)
		if c.wants(0) {
			// g * p * a^(p-1), 0 where p == 0 (torch's pow_backward_self)
			pm1 := b.sub(bn, b.scalar(1))
			d := b.mul(g, b.mul(bn, b.op("Pow", []string{a, pm1})))
			da = b.op("Where", []string{b.op("Equal", []string{bn, zero}), zero, d})
		}
		if c.wants(1) {
			// g * y * log(a), 0 where a == 0 and p >= 0
			cond := b.op("And", []string{b.op("Equal", []string{a, zero}), b.op("GreaterOrEqual", []string{bn, zero})})
			d := b.mul(y, b.op("Log", []string{a}))
			db = b.mul(g, b.op("Where", []string{cond, zero, d}))
		}
	}
	if c.wants(0) {
		c.set(0, b.unbroadcast(da, sh[2], sh[0]))
	}
	if c.wants(1) {
		c.set(1, b.unbroadcast(db, sh[2], sh[1]))
	}
	return nil
}

// unary handles the one-input activations and math functions.
func unary(c *call) error {
	if !c.wants(0) {
		return nil
	}
	b, g, x, y, n := c.b, c.g(), c.in(0), c.out(0), c.n
	one := b.scalar(1)
	var d string
	switch n.OpType {
	case "Neg":
		d = b.neg(g)
	case "Exp":
		d = b.mul(g, y)
	case "Log":
		d = b.div(g, x)
	case "Sqrt":
		// g / (2 * y)
		d = b.div(g, b.mul(y, b.scalar(2)))
	case "Reciprocal":
		// -g * (y * y)
		d = b.neg(b.mul(g, b.mul(y, y)))
	case "Abs":
		d = b.mul(g, b.op("Sign", []string{x}))
	case "Relu":
		// torch's threshold_backward on the result: zero where y <= 0
		d = b.op("Where", []string{b.op("Greater", []string{y, b.scalar(0)}), g, b.scalar(0)})
	case "LeakyRelu":
		alpha := attrFloat(n, "alpha", 0.01)
		d = b.op("Where", []string{b.op("Greater", []string{x, b.scalar(0)}), g, b.scale(g, float64(alpha))})
	case "Elu":
		// x > 0: g; else g * (y + alpha)
		alpha := attrFloat(n, "alpha", 1)
		neg := b.mul(g, b.add(y, b.scalar(alpha)))
		d = b.op("Where", []string{b.op("Greater", []string{x, b.scalar(0)}), g, neg})
	case "Sigmoid":
		// g * (1 - y) * y
		d = b.mul(b.mul(g, b.sub(one, y)), y)
	case "Sin":
		d = b.mul(g, b.op("Cos", []string{x}))
	case "Cos":
		// g * -sin(x)
		d = b.mul(g, b.neg(b.op("Sin", []string{x})))
	case "Tanh":
		// g * (1 - y²)
		d = b.mul(g, b.sub(one, b.mul(y, y)))
	case "Erf":
		// g * 2/sqrt(pi) * exp(-x²)
		e := b.op("Exp", []string{b.neg(b.mul(x, x))})
		d = b.mul(g, b.scale(e, 2/math.Sqrt(math.Pi)))
	case "Softplus":
		d = b.mul(g, b.op("Sigmoid", []string{x}))
	case "Softsign":
		// g / (1 + |x|)²
		den := b.add(one, b.op("Abs", []string{x}))
		d = b.div(g, b.mul(den, den))
	case "HardSigmoid":
		// alpha inside the linear segment 0 < alpha*x + beta < 1
		alpha, beta := attrFloat(n, "alpha", 0.2), attrFloat(n, "beta", 0.5)
		lin := b.add(b.scale(x, float64(alpha)), b.scalar(beta))
		in := b.op("And", []string{b.op("Greater", []string{lin, b.scalar(0)}), b.op("Less", []string{lin, one})})
		d = b.op("Where", []string{in, b.scale(g, float64(alpha)), b.scalar(0)})
	case "HardSwish":
		// torch's hardswish_backward: 0 for x < -3, g*(x/3 + 1/2) for
		// x <= 3, g above
		mid := b.mul(g, b.add(b.div(x, b.scalar(3)), b.scalar(0.5)))
		upper := b.op("Where", []string{b.op("LessOrEqual", []string{x, b.scalar(3)}), mid, g})
		d = b.op("Where", []string{b.op("Less", []string{x, b.scalar(-3)}), b.scalar(0), upper})
	case "Gelu":
		d = b.mul(g, geluDerivative(b, x, attrString(n, "approximate", "none")))
	}
	c.set(0, d)
	return nil
}

// geluDerivative returns dGELU/dx: Φ(x) + x·φ(x) exactly, or the derivative
// of the tanh approximation 0.5x(1 + tanh(k(x + 0.044715x³))).
func geluDerivative(b *Builder, x, approx string) string {
	half, one := b.scalar(0.5), b.scalar(1)
	if approx == "tanh" {
		k := math.Sqrt(2 / math.Pi)
		x2 := b.mul(x, x)
		inner := b.scale(b.add(x, b.scale(b.mul(x2, x), 0.044715)), k)
		t := b.op("Tanh", []string{inner})
		dinner := b.scale(b.add(one, b.scale(x2, 3*0.044715)), k)
		left := b.mul(half, b.add(one, t))
		right := b.mul(b.mul(half, x), b.mul(b.sub(one, b.mul(t, t)), dinner))
		return b.add(left, right)
	}
	cdf := b.mul(half, b.add(one, b.op("Erf", []string{b.scale(x, 1/math.Sqrt2)})))
	pdf := b.scale(b.op("Exp", []string{b.scale(b.mul(x, x), -0.5)}), 1/math.Sqrt(2*math.Pi))
	return b.add(cdf, b.mul(x, pdf))
}

// identity passes the gradient through.
func identity(c *call) error {
	c.set(0, c.g())
	return nil
}

// clip passes the gradient where min <= x <= max (torch's clamp_backward).
func clip(c *call) error {
	if !c.wants(0) {
		return nil
	}
	b, x := c.b, c.in(0)
	mask := ""
	if lo := c.in(1); lo != "" {
		mask = b.op("GreaterOrEqual", []string{x, lo})
	}
	if hi := c.in(2); hi != "" {
		m := b.op("LessOrEqual", []string{x, hi})
		if mask == "" {
			mask = m
		} else {
			mask = b.op("And", []string{mask, m})
		}
	}
	if mask == "" {
		c.set(0, c.g())
		return nil
	}
	c.set(0, b.op("Where", []string{mask, c.g(), b.scalar(0)}))
	return nil
}

// where routes the gradient to the branch the condition picked.
func where(c *call) error {
	sh, err := c.shapes(c.in(1), c.in(2), c.out(0))
	if err != nil {
		return err
	}
	b, g, cond, zero := c.b, c.g(), c.in(0), c.b.scalar(0)
	if c.wants(1) {
		c.set(1, b.unbroadcast(b.op("Where", []string{cond, g, zero}), sh[2], sh[0]))
	}
	if c.wants(2) {
		c.set(2, b.unbroadcast(b.op("Where", []string{cond, zero, g}), sh[2], sh[1]))
	}
	return nil
}

// sum gives every input the output's gradient, summed back over
// broadcasting.
func sum(c *call) error {
	ys, err := c.shape(c.out(0))
	if err != nil {
		return err
	}
	for k, in := range c.n.Input {
		if !c.wants(k) {
			continue
		}
		xs, err := c.shape(in)
		if err != nil {
			return err
		}
		c.set(k, c.b.unbroadcast(c.g(), ys, xs))
	}
	return nil
}

// extremum: the elementwise Max or Min of several inputs passes the
// gradient to the input that holds the result, shared equally where
// several do (torch's maximum/minimum backward halves it at a tie of two).
func extremum(c *call) error {
	y := c.out(0)
	ys, err := c.shape(y)
	if err != nil {
		return err
	}
	b := c.b
	eq := make([]string, len(c.n.Input))
	for k, in := range c.n.Input {
		eq[k] = b.op("Cast", []string{b.op("Equal", []string{in, y})}, onnx.AttrInt("to", int64(elemFloat)))
	}
	count := eq[0]
	if len(eq) > 1 {
		count = b.op("Sum", eq)
	}
	for k, in := range c.n.Input {
		if !c.wants(k) {
			continue
		}
		xs, err := c.shape(in)
		if err != nil {
			return err
		}
		c.set(k, b.unbroadcast(b.div(b.mul(c.g(), eq[k]), count), ys, xs))
	}
	return nil
}

// cast converts the gradient back to the input's type; only float-to-float
// casts carry a gradient, and Build only differentiates FLOAT values.
func cast(c *call) error {
	c.set(0, c.g())
	return nil
}

// dropout is the identity in inference; in training it scales the kept
// elements by 1/(1-ratio) and zeroes the rest, as the mask output says. A
// node without a mask output gets one, so the backward sees the mask the
// forward drew.
func dropout(c *call) error {
	if !c.wants(0) {
		return nil
	}
	training := false
	if tm := c.in(2); tm != "" {
		v, err := c.b.constInts(tm)
		if err != nil {
			return err
		}
		training = len(v) == 1 && v[0] != 0
	}
	if !training {
		c.set(0, c.g())
		return nil
	}
	ratio := 0.5
	if r := c.in(1); r != "" {
		v, err := c.b.constFloat(r)
		if err != nil {
			return err
		}
		ratio = v
	}
	b := c.b
	mask := c.out(1)
	if mask == "" {
		n := b.fwd(c.i)
		mask = n.Output[0] + "::mask" + internal
		n.Output = append(n.Output[:1], mask)
	}
	m := b.op("Cast", []string{mask}, onnx.AttrInt("to", int64(elemFloat)))
	// torch: grad * mask * (1 / (1 - p))
	d := b.mul(c.g(), m)
	if ratio != 0 {
		d = b.scale(d, 1/(1-ratio))
	}
	c.set(0, d)
	return nil
}
