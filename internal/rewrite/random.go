package rewrite

import (
	"math"
	"slices"

	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
)

// The hash the fixed draws come from: each element's flat index, shifted
// by the node, through a multiplicative step and two squarings modulo
// primes below 2^31 (every product stays below 2^62, so int64 arithmetic
// is exact). Its values pass as uniform on [0, hashPrime1): the fraction
// below a threshold, the correlation between neighbours and between rows
// and columns of a matrix are those of independent draws (measured on
// 10^6 elements; TestFixedRandomDraws).
const (
	hashPrime1 = 2147483647 // 2^31 - 1
	hashPrime2 = 2147483629
	hashMul    = 48271
	hashAdd1   = 12345
	hashAdd2   = 54321
	// hashNodeStride separates the indices of two random nodes.
	hashNodeStride = 1000003
)

// FixedRandom returns a copy of m in which the nodes that draw random
// numbers draw them from a hash of each element's index, the node's place
// in the graph and its seed: the same numbers at every run of a session.
// ONNX Runtime's Dropout and random ops draw new numbers at every run,
// seed or not, so the runs of one backward session (the fp32 reference,
// the rounded runs at each scale, the bf16 run) would each drop or add
// different elements, and their gradients would differ by the draws
// rather than by the precision: a Dropout or a stochastic depth (which
// the exporters write as RandomUniformLike) made a healthy backward read
// as one that loses all of a gradient.
//
// Rewritten: a Dropout in training mode (a constant true training_mode, a
// constant ratio strictly between 0 and 1, a FLOAT input) computes
// x·mask/(1−ratio) with the mask output, where it has one, the mask;
// RandomUniform(Like), RandomNormal(Like) (Box–Muller) and Bernoulli with
// their attributes. The numbers are neither ONNX Runtime's nor PyTorch's.
// m is not modified; the count of rewritten nodes is returned.
func FixedRandom(m *onnx.ModelProto) (*onnx.ModelProto, int, error) {
	draws := func(n *onnx.NodeProto) bool {
		return onnx.IsDefaultDomain(n.Domain) && (n.OpType == "Dropout" || ops.Random(n.Domain, n.OpType))
	}
	if !slices.ContainsFunc(m.Graph.Node, draws) {
		// most graphs: no index to build
		return m, 0, nil
	}
	ix, err := onnx.NewIndex(m.Graph)
	if err != nil {
		return nil, 0, err
	}
	f := &fixer{shared: map[string]bool{}}
	for k, n := range m.Graph.Node {
		if !f.fix(ix, k, n) {
			f.nodes = append(f.nodes, n)
		}
	}
	if f.fixed == 0 {
		return m, 0, nil
	}
	out := onnx.ShallowCopy(m)
	out.Graph.Node = f.nodes
	out.Graph.Initializer = append(slices.Clone(out.Graph.Initializer), f.inits...)
	return out, f.fixed, nil
}

// fixer collects FixedRandom's nodes and initializers.
type fixer struct {
	nodes  []*onnx.NodeProto
	inits  []*onnx.TensorProto
	shared map[string]bool
	fixed  int
}

func (f *fixer) node(op, out string, in []string, attrs ...*onnx.AttributeProto) string {
	f.nodes = append(f.nodes, onnx.Node(op, out, in, []string{out}, attrs...))
	return out
}

func (f *fixer) int64s(name string, dims []int64, v ...int64) string {
	f.inits = append(f.inits, onnx.Int64Tensor(name, dims, v))
	return name
}

func (f *fixer) float(name string, v float64) string {
	f.inits = append(f.inits, onnx.FloatTensor(name, nil, []float32{float32(v)}))
	return name
}

// constant is an int64 scalar shared by every rewritten node.
func (f *fixer) constant(tag string, v int64) string {
	name := onnx.InternalName("fixed-random", tag)
	if !f.shared[name] {
		f.shared[name] = true
		f.int64s(name, nil, v)
	}
	return name
}

// hash returns an int64 value uniform on [0, hashPrime1), shaped as the
// int64 vector shape holds, with count elements (a scalar), for the node
// at index k with seed; add is added to every value (1 keeps them above
// zero).
func (f *fixer) hash(tag func(string) string, k int, seed, add int64, count, shape string) string {
	start := add + (int64(k)*hashNodeStride+(seed%hashNodeStride+hashNodeStride)%hashNodeStride)%(1<<30)
	h := f.node("Range", tag("index"), []string{f.constant("zero", 0), count, f.constant("one", 1)})
	h = f.node("Add", tag("h0"), []string{h, f.int64s(tag("start"), nil, start)})
	h = f.node("Mul", tag("h1"), []string{h, f.constant("mul", hashMul)})
	h = f.node("Mod", tag("h2"), []string{h, f.constant("p1", hashPrime1)})
	h = f.node("Mul", tag("h3"), []string{h, h})
	h = f.node("Add", tag("h4"), []string{h, f.constant("add1", hashAdd1)})
	h = f.node("Mod", tag("h5"), []string{h, f.constant("p2", hashPrime2)})
	h = f.node("Mul", tag("h6"), []string{h, h})
	h = f.node("Add", tag("h7"), []string{h, f.constant("add2", hashAdd2)})
	h = f.node("Mod", tag("h8"), []string{h, f.constant("p1", hashPrime1)})
	return f.node("Reshape", tag("hash"), []string{h, shape})
}

// uniform returns a FLOAT value uniform on (0, 1] (off 1) or [0, 1) (off
// 0) from a hash.
func (f *fixer) uniform(tag func(string) string, h string, off int64) string {
	if off != 0 {
		h = f.node("Add", tag("u-off"), []string{h, f.constant("one", 1)})
	}
	u := f.node("Cast", tag("u-float"), []string{h}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT)))
	return f.node("Mul", tag("u"), []string{u, f.float(tag("u-scale"), 1.0/hashPrime1)})
}

// fix writes n's fixed form and reports whether it did.
func (f *fixer) fix(ix *onnx.Index, k int, n *onnx.NodeProto) bool {
	if !onnx.IsDefaultDomain(n.Domain) || len(n.Output) == 0 || n.Output[0] == "" {
		return false
	}
	y := n.Output[0]
	tag := func(s string) string { return onnx.InternalName(y, "fixed-"+s) }
	seed := int64(onnx.FloatAttr(n, "seed", 0))
	// where the draw takes its element count and shape from
	var count, shape string
	switch n.OpType {
	case "Dropout", "RandomUniformLike", "RandomNormalLike", "Bernoulli":
		if len(n.Input) == 0 || n.Input[0] == "" {
			return false
		}
		count = tag("count")
		shape = tag("shape")
	case "RandomUniform", "RandomNormal":
		dims, ok := onnx.IntsAttr(n, "shape")
		if !ok {
			return false
		}
		total := int64(1)
		for _, d := range dims {
			total *= d
		}
		count = f.int64s(tag("count"), nil, total)
		shape = f.int64s(tag("shape"), []int64{int64(len(dims))}, dims...)
	default:
		return false
	}
	like := func() {
		f.node("Size", count, []string{n.Input[0]})
		f.node("Shape", shape, []string{n.Input[0]})
	}
	// the type the op writes: its dtype, or its input's
	outType := func() int64 {
		if n.OpType == "RandomUniform" || n.OpType == "RandomNormal" {
			return onnx.IntAttr(n, "dtype", int64(onnx.TensorProto_FLOAT))
		}
		if t := ix.ElemType(n.Input[0]); t != 0 {
			return onnx.IntAttr(n, "dtype", int64(t))
		}
		return onnx.IntAttr(n, "dtype", int64(onnx.TensorProto_FLOAT))
	}
	write := func(v string) {
		f.node("Cast", y, []string{v}, onnx.AttrInt("to", outType()))
		f.fixed++
	}
	switch n.OpType {
	case "Dropout":
		ratio, ok := trainingDropout(ix, n)
		if !ok {
			return false
		}
		// the node's seed is an int for Dropout
		seed = onnx.IntAttr(n, "seed", 0)
		like()
		h := f.hash(tag, k, seed, 1, count, shape)
		mask := tag("mask")
		if len(n.Output) > 1 && n.Output[1] != "" {
			mask = n.Output[1]
		}
		f.node("Less", mask, []string{h, f.int64s(tag("keep"), nil, int64(math.Round((1-ratio)*hashPrime1)))})
		keep := f.node("Cast", tag("keepf"), []string{mask}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT)))
		kept := f.node("Mul", tag("kept"), []string{n.Input[0], keep})
		f.nodes = append(f.nodes, onnx.Node("Mul", tag("out"), []string{kept, f.float(tag("scale"), 1/(1-ratio))}, []string{y}))
		f.fixed++
	case "RandomUniformLike", "RandomUniform":
		if n.OpType == "RandomUniformLike" {
			like()
		}
		lo, hi := float64(onnx.FloatAttr(n, "low", 0)), float64(onnx.FloatAttr(n, "high", 1))
		u := f.uniform(tag, f.hash(tag, k, seed, 1, count, shape), 0)
		v := f.node("Mul", tag("span"), []string{u, f.float(tag("width"), hi-lo)})
		write(f.node("Add", tag("value"), []string{v, f.float(tag("low"), lo)}))
	case "RandomNormalLike", "RandomNormal":
		if n.OpType == "RandomNormalLike" {
			like()
		}
		// Box–Muller: sqrt(-2 ln u1) cos(2π u2), u1 in (0, 1]
		u1 := f.uniform(func(s string) string { return tag("a-" + s) }, f.hash(func(s string) string { return tag("a-" + s) }, k, seed, 1, count, shape), 1)
		u2 := f.uniform(func(s string) string { return tag("b-" + s) }, f.hash(func(s string) string { return tag("b-" + s) }, k, seed, 1+hashNodeStride/2, count, shape), 0)
		r := f.node("Log", tag("log"), []string{u1})
		r = f.node("Mul", tag("m2log"), []string{r, f.float(tag("minus2"), -2)})
		r = f.node("Sqrt", tag("radius"), []string{r})
		c := f.node("Mul", tag("angle"), []string{u2, f.float(tag("2pi"), 2*math.Pi)})
		c = f.node("Cos", tag("cos"), []string{c})
		z := f.node("Mul", tag("z"), []string{r, c})
		z = f.node("Mul", tag("scaled"), []string{z, f.float(tag("scale"), float64(onnx.FloatAttr(n, "scale", 1)))})
		write(f.node("Add", tag("value"), []string{z, f.float(tag("mean"), float64(onnx.FloatAttr(n, "mean", 0)))}))
	case "Bernoulli":
		like()
		u := f.uniform(tag, f.hash(tag, k, seed, 1, count, shape), 0)
		p := f.node("Cast", tag("p"), []string{n.Input[0]}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT)))
		write(f.node("Less", tag("draw"), []string{u, p}))
	}
	return true
}

// trainingDropout reports whether n is a Dropout that drops (a constant
// true training_mode), with its constant ratio strictly between 0 and 1
// and a FLOAT (or undeclared) input; FixedRandom leaves any other as it
// is (a ratio of 0 keeps every element, whatever ONNX Runtime draws).
func trainingDropout(ix *onnx.Index, n *onnx.NodeProto) (float64, bool) {
	if len(n.Input) < 3 || n.Input[2] == "" {
		return 0, false
	}
	if t := ix.ElemType(n.Input[0]); t != 0 && t != int32(onnx.TensorProto_FLOAT) {
		return 0, false
	}
	tm, err := ConstantThroughIdentity(ix, n.Input[2])
	if err != nil || tm.Elements() != 1 || len(tm.Data) == 0 || tm.Data[0] == 0 {
		return 0, false
	}
	ratio := 0.5
	if len(n.Input) > 1 && n.Input[1] != "" {
		r, err := ConstantThroughIdentity(ix, n.Input[1])
		if err != nil || r.Elements() != 1 {
			return 0, false
		}
		v, err := r.Float32s()
		if err != nil {
			return 0, false
		}
		ratio = float64(v[0])
	}
	if !(ratio > 0 && ratio < 1) {
		return 0, false
	}
	return ratio, true
}
