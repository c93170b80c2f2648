package vjp

func init() {
	family("rotary", rotary)
}

// rotary is RotaryEmbedding's (opset 23) gradient with respect to its
// input: each rotated pair (x1, x2) → (x1·cos − x2·sin, x1·sin + x2·cos) is
// a rotation by the position's angle, whose transpose is the rotation by
// minus that angle, so the input's gradient is the same op on the output's
// gradient with the sine negated (same attributes, caches and positions);
// the channels past rotary_embedding_dim pass through unchanged either
// way. The caches pass no gradient back, as in PyTorch, where every RoPE
// computes them from a buffer (inv_freq) of positions: an export that
// writes that buffer as a plain initializer (no torch.export marks) would
// otherwise train it.
func rotary(c *call) error {
	if !c.wants(0) {
		return nil
	}
	b := c.b
	ins := []string{c.g(), c.in(1), b.neg(c.in(2))}
	if p := c.in(3); p != "" {
		ins = append(ins, p)
	}
	c.set(0, b.op("RotaryEmbedding", ins, c.n.Attribute...))
	return nil
}
