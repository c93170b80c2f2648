package rewrite

import (
	"fp16audit/internal/onnx"
)

// fp16Max is float16's largest finite value, torch.finfo(torch.float16).max.
const fp16Max = 65504

// HalfGuards returns the nodes of g that clamp a value to float16's range
// only because the value is float16: Hugging Face's T5 (and models written
// after it) runs, after each sublayer,
//
//	if hidden_states.dtype == torch.float16:
//	    clamp_value = torch.where(torch.isinf(hidden_states).any(), finfo.max - 1000, finfo.max)
//	    hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)
//
// A model traced in float16 (exported after model.half()) holds the branch
// as Clip(x, -w, w) with w = Where(…IsInf(x)…, 64504, 65504); one traced in
// float32 does not hold it at all. So the branch belongs to the passes
// that hold x in 16 bits: the fp32 reference and the autocast passes, where
// PyTorch holds x in float32, must not clamp (Upcast makes such a Clip an
// Identity), and a pass holding x in fp16 clamps as PyTorch does (Emulate
// puts the Clip back).
func HalfGuards(g *onnx.GraphProto) map[int]bool {
	ix, err := onnx.NewIndex(g)
	if err != nil {
		return nil
	}
	out := map[int]bool{}
	for i, n := range g.Node {
		if !onnx.IsDefaultDomain(n.Domain) || n.OpType != "Clip" || len(n.Input) < 3 || n.Input[0] == "" || n.Input[2] == "" {
			continue
		}
		w := ix.Producer(through(ix, n.Input[2]))
		if w < 0 || g.Node[w].OpType != "Where" || len(g.Node[w].Input) != 3 {
			continue
		}
		where := g.Node[w]
		if !fp16Bounds(ix, where.Input[1], where.Input[2]) {
			continue
		}
		if reachesIsInf(ix, where.Input[0], through(ix, n.Input[0])) {
			out[i] = true
		}
	}
	return out
}

// through follows Cast and Identity nodes up from value v.
func through(ix *onnx.Index, v string) string {
	for range 8 {
		p := ix.Producer(v)
		if p < 0 {
			return v
		}
		n := ix.Graph().Node[p]
		if !onnx.IsDefaultDomain(n.Domain) || (n.OpType != "Cast" && n.OpType != "Identity") || len(n.Input) == 0 {
			return v
		}
		v = n.Input[0]
	}
	return v
}

// fp16Bounds reports whether a and b are scalar constants the larger of
// which is float16's largest value (T5 picks it, or 1000 below it).
func fp16Bounds(ix *onnx.Index, a, b string) bool {
	hi := 0.0
	for _, v := range []string{a, b} {
		t, err := ConstantThroughIdentity(ix, through(ix, v))
		if err != nil || t.Elements() != 1 {
			return false
		}
		f, err := t.Float32s()
		if err != nil {
			return false
		}
		hi = max(hi, float64(f[0]))
	}
	return hi == fp16Max
}

// reachesIsInf reports whether cond is computed, within a few nodes, from
// IsInf of x (through casts).
func reachesIsInf(ix *onnx.Index, cond, x string) bool {
	seen := map[string]bool{}
	frontier := []string{cond}
	for depth := 0; depth < 8 && len(frontier) > 0; depth++ {
		var next []string
		for _, v := range frontier {
			p := ix.Producer(v)
			if p < 0 || seen[v] {
				continue
			}
			seen[v] = true
			n := ix.Graph().Node[p]
			if n.OpType == "IsInf" && len(n.Input) > 0 && through(ix, n.Input[0]) == x {
				return true
			}
			next = append(next, n.Input...)
		}
		frontier = next
	}
	return false
}
