package grad_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"fp16audit/internal/execute/backward"
	"fp16audit/internal/grad"
	"fp16audit/internal/grad/vjp"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/tensor"
)

// Every rule is checked against central differences on a tiny graph: the
// op (or a few) with random float inputs, reduced to L = Σ y ⊙ R for a
// fixed random R, so dL/dy = R exercises every output element with a
// different weight. The graph inputs are differentiated (InputGrads), and
// each element of each input is perturbed by ±h in fp32.

type tinyInput struct {
	name   string
	shape  []int64
	lo, hi float64
	// away keeps values at least this far from each of these points
	// (kinks of the op) so the finite difference does not straddle one.
	away []float64
	// distinct makes the values pairwise different by at least 1e-2
	// (max pooling and max reductions need a unique winner).
	distinct bool
}

type tiny struct {
	name   string
	opset  int64
	inputs []tinyInput
	inits  []*onnx.TensorProto
	nodes  []*onnx.NodeProto
	// tol bounds |numeric − analytic| / (1 + |analytic|); h is the step.
	tol, h float64
}

func nd(op string, ins []string, out string, attrs ...*onnx.AttributeProto) *onnx.NodeProto {
	return onnx.Node(op, out, ins, []string{out}, attrs...)
}

func in(name string, shape ...int64) tinyInput {
	return tinyInput{name: name, shape: shape, lo: -2, hi: 2}
}

func (ti tinyInput) rng(lo, hi float64) tinyInput { ti.lo, ti.hi = lo, hi; return ti }
func (ti tinyInput) avoid(p ...float64) tinyInput { ti.away = p; return ti }
func (ti tinyInput) unique() tinyInput            { ti.distinct = true; return ti }

func ints(name string, v ...int64) *onnx.TensorProto {
	return onnx.Int64Tensor(name, []int64{int64(len(v))}, v)
}

func scalarInt(name string, v int64) *onnx.TensorProto {
	return onnx.Int64Tensor(name, []int64{}, []int64{v})
}

// rope returns RotaryEmbedding's caches for positions 0–2 and half a
// rotated width of half (any numbers: the rule is the op's transpose, not
// a property of true sines), and the positions of two sequences of three.
func rope(half int64) []*onnx.TensorProto {
	cos, sin := make([]float32, 3*half), make([]float32, 3*half)
	for i := range cos {
		cos[i], sin[i] = float32(math.Cos(0.7*float64(i))), float32(math.Sin(0.7*float64(i)))
	}
	return []*onnx.TensorProto{fconst("cos", []int64{3, half}, cos...), fconst("sin", []int64{3, half}, sin...),
		onnx.Int64Tensor("pos", []int64{2, 3}, []int64{0, 1, 2, 2, 0, 1})}
}

func fconst(name string, dims []int64, v ...float32) *onnx.TensorProto {
	return onnx.FloatTensor(name, dims, v)
}

func seedOf(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

func (ti tinyInput) values(r *rand.Rand) []float32 {
	n := int(tensor.NumElements(ti.shape))
	out := make([]float32, n)
	for i := range out {
		for {
			v := ti.lo + (ti.hi-ti.lo)*r.Float64()
			ok := true
			for _, p := range ti.away {
				ok = ok && math.Abs(v-p) > 0.15
			}
			if ti.distinct {
				for _, w := range out[:i] {
					ok = ok && math.Abs(v-float64(w)) > 1e-2
				}
			}
			if ok {
				out[i] = float32(v)
				break
			}
		}
	}
	return out
}

// tinyModel builds the graph with L = Σ y ⊙ R; R's shape is y's, found by
// running the op once.
func tinyModel(t *testing.T, c tiny, feeds []*tensor.Tensor, r *rand.Rand) *onnx.ModelProto {
	t.Helper()
	g := &onnx.GraphProto{Name: c.name, Node: slices.Clone(c.nodes), Initializer: slices.Clone(c.inits)}
	for _, ti := range c.inputs {
		dims := make([]any, len(ti.shape))
		for i, d := range ti.shape {
			dims[i] = d
		}
		g.Input = append(g.Input, onnx.TensorValueInfo(ti.name, onnx.TensorProto_FLOAT, dims...))
	}
	opset := c.opset
	if opset == 0 {
		opset = 17
	}
	// first run: the shape of y
	g.Output = []*onnx.ValueInfoProto{{Name: "y", Type: &onnx.TypeProto{Value: &onnx.TypeProto_TensorType{
		TensorType: &onnx.TypeProto_Tensor{ElemType: elemFloat}}}}}
	m := onnx.NewModel(g, opset)
	y := runModel(t, m, feeds, []string{"y"})[0]
	rv := make([]float32, y.Elements())
	for i := range rv {
		rv[i] = float32(2*r.Float64() - 1)
	}
	g.Initializer = append(g.Initializer, onnx.FloatTensor("R", y.Shape, rv))
	g.Node = append(g.Node, nd("Mul", []string{"y", "R"}, "yR"), nd("ReduceSum", []string{"yR"}, "L", onnx.AttrInt("keepdims", 0)))
	g.Output = []*onnx.ValueInfoProto{onnx.TensorValueInfo("L", onnx.TensorProto_FLOAT)}
	return m
}

func runModel(t *testing.T, m *onnx.ModelProto, feeds []*tensor.Tensor, outs []string) []*tensor.Tensor {
	t.Helper()
	s := session(t, m, outs)
	defer s.Close()
	res, err := s.Run(feeds)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func session(t *testing.T, m *onnx.ModelProto, outs []string) *onnxrt.Session {
	t.Helper()
	data, err := onnx.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, vi := range m.Graph.Input {
		names = append(names, vi.Name)
	}
	s, err := onnxrt.NewSession(data, names, outs, sessionOptions)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func checkNumeric(t *testing.T, c tiny) {
	t.Helper()
	requireORT(t)
	r := rand.New(rand.NewPCG(seedOf(c.name), 1))
	var feeds []*tensor.Tensor
	for _, ti := range c.inputs {
		feeds = append(feeds, tensor.FromFloat32s(ti.name, ti.shape, ti.values(r)))
	}
	m := tinyModel(t, c, feeds, r)
	facts, err := backward.Probe(context.Background(), ortLib, m, "", feeds, sessionOptions)
	if err != nil {
		t.Fatal(err)
	}
	res, err := grad.Build(m, facts, grad.Options{Loss: grad.ModelOutput, Output: "L", InputGrads: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Unsupported) > 0 {
		t.Fatalf("unsupported: %+v", res.Unsupported)
	}
	s, err := backward.NewSession(res, sessionOptions, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	outs, err := s.Run(feeds, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	fwd := session(t, m, []string{"L"})
	defer fwd.Close()
	loss := func() float64 {
		o, err := fwd.Run(feeds)
		if err != nil {
			t.Fatal(err)
		}
		return float64(floats(t, o[0])[0])
	}
	tol, h := c.tol, c.h
	if tol == 0 {
		tol = 3e-3
	}
	if h == 0 {
		h = 1e-2
	}
	for k, ti := range c.inputs {
		gr, ok := res.GradOf(ti.name)
		if !ok {
			t.Errorf("input %s: no gradient", ti.name)
			continue
		}
		if !slices.Equal(gr.Shape, ti.shape) {
			t.Errorf("input %s: gradient shape %v, want %v", ti.name, gr.Shape, ti.shape)
		}
		got := floats(t, outs[gr.Name])
		if len(got) != int(tensor.NumElements(ti.shape)) {
			t.Fatalf("input %s: %d gradient elements, want %d", ti.name, len(got), tensor.NumElements(ti.shape))
		}
		x := floats(t, feeds[k])
		worst := 0.0
		for i := range x {
			orig := x[i]
			set := func(v float32) {
				x[i] = v
				copy(feeds[k].Data, tensor.FromFloat32s("", ti.shape, x).Data)
			}
			set(orig + float32(h))
			up := loss()
			set(orig - float32(h))
			down := loss()
			set(orig)
			num := (up - down) / (2 * h)
			e := math.Abs(num-float64(got[i])) / (1 + math.Abs(float64(got[i])))
			worst = math.Max(worst, e)
			if e > tol {
				t.Errorf("input %s[%d]: analytic %.6g, numeric %.6g", ti.name, i, got[i], num)
			}
		}
		t.Logf("input %s %v: worst error %.2g", ti.name, ti.shape, worst)
	}
}

func TestElementwise(t *testing.T) {
	cases := []tiny{
		{name: "Add broadcast", inputs: []tinyInput{in("a", 2, 3, 4), in("b", 3, 1)}, nodes: []*onnx.NodeProto{nd("Add", []string{"a", "b"}, "y")}},
		{name: "Sub broadcast", inputs: []tinyInput{in("a", 4), in("b", 2, 3, 4)}, nodes: []*onnx.NodeProto{nd("Sub", []string{"a", "b"}, "y")}},
		{name: "Mul broadcast", inputs: []tinyInput{in("a", 2, 1, 4), in("b", 3, 1)}, nodes: []*onnx.NodeProto{nd("Mul", []string{"a", "b"}, "y")}},
		{name: "Div broadcast", inputs: []tinyInput{in("a", 2, 3), in("b", 3).rng(0.5, 2)}, nodes: []*onnx.NodeProto{nd("Div", []string{"a", "b"}, "y")}},
		{name: "Mul same input", inputs: []tinyInput{in("a", 2, 3)}, nodes: []*onnx.NodeProto{nd("Mul", []string{"a", "a"}, "y")}},
		{name: "Pow", inputs: []tinyInput{in("a", 2, 3).rng(0.3, 2), in("p", 3).rng(-1.5, 2.5)}, nodes: []*onnx.NodeProto{nd("Pow", []string{"a", "p"}, "y")}},
		{name: "Sum", inputs: []tinyInput{in("a", 2, 3), in("b", 3), in("c", 1, 1)}, nodes: []*onnx.NodeProto{nd("Sum", []string{"a", "b", "c"}, "y")}},
		{name: "Max broadcast", inputs: []tinyInput{in("a", 2, 3), in("b", 3)}, nodes: []*onnx.NodeProto{nd("Max", []string{"a", "b"}, "y")}},
		{name: "Min of three", inputs: []tinyInput{in("a", 2, 3), in("b", 2, 3), in("c", 1, 3)}, nodes: []*onnx.NodeProto{nd("Min", []string{"a", "b", "c"}, "y")}},
		// a tie everywhere: each copy gets half, together the whole gradient
		{name: "Max same input", inputs: []tinyInput{in("a", 2, 3)}, nodes: []*onnx.NodeProto{nd("Max", []string{"a", "a"}, "y")}},
		{name: "Max of one", inputs: []tinyInput{in("a", 2, 3)}, nodes: []*onnx.NodeProto{nd("Max", []string{"a"}, "y")}},
	}
	unary := []struct {
		op    string
		input tinyInput
		attrs []*onnx.AttributeProto
		opset int64
	}{
		{"Neg", in("x", 2, 3), nil, 0},
		{"Exp", in("x", 2, 3), nil, 0},
		{"Log", in("x", 2, 3).rng(0.2, 3), nil, 0},
		{"Sqrt", in("x", 2, 3).rng(0.2, 3), nil, 0},
		{"Reciprocal", in("x", 2, 3).rng(0.5, 2), nil, 0},
		{"Abs", in("x", 2, 3).avoid(0), nil, 0},
		{"Relu", in("x", 2, 3).avoid(0), nil, 0},
		{"LeakyRelu", in("x", 2, 3).avoid(0), []*onnx.AttributeProto{onnx.AttrFloat("alpha", 0.1)}, 0},
		{"Elu", in("x", 2, 3).avoid(0), []*onnx.AttributeProto{onnx.AttrFloat("alpha", 0.7)}, 0},
		{"Sigmoid", in("x", 2, 3), nil, 0},
		{"Tanh", in("x", 2, 3), nil, 0},
		{"Erf", in("x", 2, 3), nil, 0},
		{"Softplus", in("x", 2, 3), nil, 0},
		{"Softsign", in("x", 2, 3), nil, 0},
		{"Sin", in("x", 2, 3).rng(-3, 3), nil, 0},
		{"Cos", in("x", 2, 3).rng(-3, 3), nil, 0},
		{"HardSigmoid", in("x", 3, 4).rng(-5, 5).avoid(-2.5, 2.5), []*onnx.AttributeProto{onnx.AttrFloat("alpha", 0.2)}, 0},
		{"HardSwish", in("x", 3, 4).rng(-5, 5).avoid(-3, 3), nil, 0},
		{"Gelu", in("x", 2, 3).rng(-3, 3), nil, 20},
		{"Gelu", in("x", 2, 3).rng(-3, 3), []*onnx.AttributeProto{onnx.AttrString("approximate", "tanh")}, 20},
		{"Identity", in("x", 2, 3), nil, 0},
	}
	for _, u := range unary {
		name := u.op
		if len(u.attrs) > 0 {
			name += " " + u.attrs[0].Name
		}
		cases = append(cases, tiny{name: name, opset: u.opset, inputs: []tinyInput{u.input},
			nodes: []*onnx.NodeProto{nd(u.op, []string{"x"}, "y", u.attrs...)}})
	}
	cases = append(cases,
		tiny{name: "Clip", inputs: []tinyInput{in("x", 3, 4).avoid(-0.5, 1)},
			inits: []*onnx.TensorProto{fconst("lo", nil, -0.5), fconst("hi", nil, 1)},
			nodes: []*onnx.NodeProto{nd("Clip", []string{"x", "lo", "hi"}, "y")}},
		tiny{name: "Where", inputs: []tinyInput{in("a", 2, 3), in("b", 3)},
			inits: []*onnx.TensorProto{fconst("zero", nil, 0), fconst("c", []int64{2, 3}, 1, -1, 2, -2, 0.5, -0.5)},
			nodes: []*onnx.NodeProto{nd("Greater", []string{"c", "zero"}, "m"), nd("Where", []string{"m", "a", "b"}, "y")}},
		tiny{name: "Cast", inputs: []tinyInput{in("x", 2, 3)},
			nodes: []*onnx.NodeProto{nd("Cast", []string{"x"}, "y", onnx.AttrInt("to", 1))}},
		tiny{name: "CastLike", inputs: []tinyInput{in("x", 2, 3)}, inits: []*onnx.TensorProto{fconst("like", nil, 0)},
			nodes: []*onnx.NodeProto{nd("CastLike", []string{"x", "like"}, "y")}},
		tiny{name: "Dropout eval", inputs: []tinyInput{in("x", 2, 3)},
			inits: []*onnx.TensorProto{fconst("ratio", nil, 0.3)},
			nodes: []*onnx.NodeProto{nd("Dropout", []string{"x", "ratio"}, "y")}},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { checkNumeric(t, c) })
	}
}

func TestWhereConditionGetsNoGradient(t *testing.T) {
	// c feeds only Greater, whose output carries no gradient.
	requireORT(t)
	c := tiny{name: "Where cond", inputs: []tinyInput{in("c", 2, 3), in("a", 2, 3)},
		inits: []*onnx.TensorProto{fconst("zero", nil, 0)},
		nodes: []*onnx.NodeProto{nd("Greater", []string{"c", "zero"}, "m"), nd("Where", []string{"m", "a", "zero"}, "y")}}
	r := rand.New(rand.NewPCG(1, 1))
	var feeds []*tensor.Tensor
	for _, ti := range c.inputs {
		feeds = append(feeds, tensor.FromFloat32s(ti.name, ti.shape, ti.values(r)))
	}
	m := tinyModel(t, c, feeds, r)
	facts, err := backward.Probe(context.Background(), ortLib, m, "", feeds, sessionOptions)
	if err != nil {
		t.Fatal(err)
	}
	res, err := grad.Build(m, facts, grad.Options{Loss: grad.ModelOutput, Output: "L", InputGrads: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := res.GradOf("c"); ok {
		t.Error("the Where condition's source got a gradient")
	}
	if _, ok := res.GradOf("a"); !ok {
		t.Error("the Where branch got no gradient")
	}
}

func TestLinear(t *testing.T) {
	var cases []tiny
	for _, ta := range []int64{0, 1} {
		for _, tb := range []int64{0, 1} {
			as, bs := []int64{3, 4}, []int64{4, 5}
			if ta == 1 {
				as = []int64{4, 3}
			}
			if tb == 1 {
				bs = []int64{5, 4}
			}
			for _, cs := range [][]int64{{5}, {3, 5}, {1, 1}} {
				cases = append(cases, tiny{name: "Gemm transA=" + string('0'+rune(ta)) + " transB=" + string('0'+rune(tb)) + " C" + shapeString(cs),
					inputs: []tinyInput{in("a", as...), in("b", bs...), in("c", cs...)},
					nodes: []*onnx.NodeProto{nd("Gemm", []string{"a", "b", "c"}, "y", onnx.AttrInt("transA", ta), onnx.AttrInt("transB", tb),
						onnx.AttrFloat("alpha", 0.7), onnx.AttrFloat("beta", 1.3))}})
			}
		}
	}
	cases = append(cases, tiny{name: "Gemm no C", inputs: []tinyInput{in("a", 3, 4), in("b", 5, 4)},
		nodes: []*onnx.NodeProto{nd("Gemm", []string{"a", "b"}, "y", onnx.AttrInt("transB", 1))}})
	for _, mm := range [][2][]int64{
		{{3, 4}, {4, 5}},
		{{2, 3, 4}, {4, 5}},
		{{3, 4}, {2, 4, 5}},
		{{2, 1, 3, 4}, {3, 4, 2}},
		{{4}, {4, 5}},
		{{2, 3, 4}, {4}},
		{{4}, {4}},
		{{4}, {2, 4, 3}},
	} {
		cases = append(cases, tiny{name: "MatMul " + shapeString(mm[0]) + "x" + shapeString(mm[1]),
			inputs: []tinyInput{in("a", mm[0]...), in("b", mm[1]...)},
			nodes:  []*onnx.NodeProto{nd("MatMul", []string{"a", "b"}, "y")}})
	}
	convs := []struct {
		name   string
		x, w   []int64
		bias   bool
		attrs  []*onnx.AttributeProto
		nobias bool
	}{
		{"Conv 3x3 pad 1", []int64{2, 3, 5, 5}, []int64{4, 3, 3, 3}, true, []*onnx.AttributeProto{onnx.AttrInts("pads", 1, 1, 1, 1)}, false},
		{"Conv stride 2 odd size", []int64{1, 2, 6, 7}, []int64{3, 2, 3, 3}, false, []*onnx.AttributeProto{onnx.AttrInts("strides", 2, 2), onnx.AttrInts("pads", 1, 0, 0, 1)}, false},
		{"Conv dilation 2", []int64{1, 2, 7, 7}, []int64{2, 2, 3, 3}, true, []*onnx.AttributeProto{onnx.AttrInts("dilations", 2, 2), onnx.AttrInts("pads", 2, 2, 2, 2)}, false},
		{"Conv groups 2 stride 2 dilation 2", []int64{2, 4, 9, 8}, []int64{6, 2, 3, 2}, true, []*onnx.AttributeProto{onnx.AttrInt("group", 2), onnx.AttrInts("strides", 2, 3), onnx.AttrInts("dilations", 2, 1), onnx.AttrInts("pads", 1, 0, 2, 1)}, false},
		{"Conv depthwise", []int64{1, 3, 5, 5}, []int64{3, 1, 3, 3}, true, []*onnx.AttributeProto{onnx.AttrInt("group", 3), onnx.AttrInts("pads", 1, 1, 1, 1)}, false},
		{"Conv SAME_UPPER stride 2", []int64{1, 2, 5, 6}, []int64{2, 2, 3, 3}, false, []*onnx.AttributeProto{onnx.AttrString("auto_pad", "SAME_UPPER"), onnx.AttrInts("strides", 2, 2)}, false},
		{"Conv im2col (N·P ≤ M)", []int64{1, 2, 3, 3}, []int64{12, 2, 3, 3}, true, []*onnx.AttributeProto{onnx.AttrInts("pads", 1, 1, 1, 1)}, false},
		{"Conv im2col groups 2 stride 2", []int64{1, 4, 4, 3}, []int64{8, 2, 3, 2}, false, []*onnx.AttributeProto{onnx.AttrInt("group", 2), onnx.AttrInts("strides", 2, 1), onnx.AttrInts("pads", 1, 0, 1, 1)}, false},
		{"Conv 1d", []int64{2, 2, 9}, []int64{3, 2, 4}, true, []*onnx.AttributeProto{onnx.AttrInts("strides", 2), onnx.AttrInts("pads", 1, 1)}, false},
		{"Conv 3d", []int64{1, 2, 4, 4, 3}, []int64{2, 2, 2, 3, 2}, true, []*onnx.AttributeProto{onnx.AttrInts("pads", 0, 1, 0, 1, 1, 1)}, false},
	}
	for _, cv := range convs {
		ins := []tinyInput{in("x", cv.x...), in("w", cv.w...)}
		names := []string{"x", "w"}
		if cv.bias {
			ins = append(ins, in("b", cv.w[0]))
			names = append(names, "b")
		}
		cases = append(cases, tiny{name: cv.name, inputs: ins, nodes: []*onnx.NodeProto{nd("Conv", names, "y", cv.attrs...)}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { checkNumeric(t, c) })
	}
}

func TestNormalization(t *testing.T) {
	cases := []tiny{
		{name: "Softmax axis 1", inputs: []tinyInput{in("x", 2, 3, 4)}, nodes: []*onnx.NodeProto{nd("Softmax", []string{"x"}, "y", onnx.AttrInt("axis", 1))}},
		{name: "LogSoftmax", inputs: []tinyInput{in("x", 2, 5)}, nodes: []*onnx.NodeProto{nd("LogSoftmax", []string{"x"}, "y")}},
		{name: "ReduceSum keepdims 0", inputs: []tinyInput{in("x", 2, 3, 4)}, inits: []*onnx.TensorProto{ints("axes", 0, -1)},
			nodes: []*onnx.NodeProto{nd("ReduceSum", []string{"x", "axes"}, "y", onnx.AttrInt("keepdims", 0))}},
		{name: "ReduceSum all", inputs: []tinyInput{in("x", 2, 3)}, nodes: []*onnx.NodeProto{nd("ReduceSum", []string{"x"}, "y")}},
		{name: "ReduceMean opset 13 attribute", opset: 13, inputs: []tinyInput{in("x", 2, 3, 4)},
			nodes: []*onnx.NodeProto{nd("ReduceMean", []string{"x"}, "y", onnx.AttrInts("axes", -1), onnx.AttrInt("keepdims", 1))}},
		{name: "ReduceMean opset 18 input", opset: 18, inputs: []tinyInput{in("x", 2, 3, 4)}, inits: []*onnx.TensorProto{ints("axes", 1)},
			nodes: []*onnx.NodeProto{nd("ReduceMean", []string{"x", "axes"}, "y", onnx.AttrInt("keepdims", 0))}},
		{name: "ReduceSumSquare", inputs: []tinyInput{in("x", 2, 3)}, nodes: []*onnx.NodeProto{nd("ReduceSumSquare", []string{"x"}, "y", onnx.AttrInts("axes", 1))}},
		{name: "ReduceL2", inputs: []tinyInput{in("x", 2, 3)}, nodes: []*onnx.NodeProto{nd("ReduceL2", []string{"x"}, "y", onnx.AttrInts("axes", 1), onnx.AttrInt("keepdims", 0))}},
		{name: "ReduceMax", inputs: []tinyInput{in("x", 2, 3).unique()}, nodes: []*onnx.NodeProto{nd("ReduceMax", []string{"x"}, "y", onnx.AttrInts("axes", 1), onnx.AttrInt("keepdims", 0))}},
		{name: "ReduceMin", inputs: []tinyInput{in("x", 2, 3).unique()}, nodes: []*onnx.NodeProto{nd("ReduceMin", []string{"x"}, "y", onnx.AttrInts("axes", 0))}},
		{name: "BatchNormalization inference", inputs: []tinyInput{in("x", 2, 3, 2, 2), in("s", 3), in("b", 3)},
			inits: []*onnx.TensorProto{fconst("mean", []int64{3}, 0.1, -0.2, 0.3), fconst("var", []int64{3}, 0.5, 1.5, 2)},
			nodes: []*onnx.NodeProto{nd("BatchNormalization", []string{"x", "s", "b", "mean", "var"}, "y", onnx.AttrFloat("epsilon", 1e-3))}},
		{name: "BatchNormalization training", opset: 15, inputs: []tinyInput{in("x", 3, 2, 2, 2), in("s", 2), in("b", 2)},
			inits: []*onnx.TensorProto{fconst("mean", []int64{2}, 0, 0), fconst("var", []int64{2}, 1, 1)},
			nodes: []*onnx.NodeProto{onnx.Node("BatchNormalization", "bn", []string{"x", "s", "b", "mean", "var"}, []string{"y", "rm", "rv"}, onnx.AttrInt("training_mode", 1))}, tol: 5e-3},
		{name: "BatchNormalization training 1d", opset: 15, inputs: []tinyInput{in("x", 5, 3), in("s", 3), in("b", 3)},
			inits: []*onnx.TensorProto{fconst("mean", []int64{3}, 0, 0, 0), fconst("var", []int64{3}, 1, 1, 1)},
			nodes: []*onnx.NodeProto{onnx.Node("BatchNormalization", "bn", []string{"x", "s", "b", "mean", "var"}, []string{"y", "rm", "rv"}, onnx.AttrInt("training_mode", 1))}, tol: 5e-3},
		{name: "LayerNormalization last axis", inputs: []tinyInput{in("x", 2, 3, 4), in("s", 4), in("b", 4)},
			nodes: []*onnx.NodeProto{nd("LayerNormalization", []string{"x", "s", "b"}, "y")}, tol: 5e-3},
		{name: "LayerNormalization axis 1", inputs: []tinyInput{in("x", 2, 3, 4), in("s", 3, 4)},
			nodes: []*onnx.NodeProto{nd("LayerNormalization", []string{"x", "s"}, "y", onnx.AttrInt("axis", 1), onnx.AttrFloat("epsilon", 1e-3))}, tol: 5e-3},
		// opset 23, as torch 2.9 exports rms_norm there
		{name: "RMSNormalization last axis", opset: 23, inputs: []tinyInput{in("x", 2, 3, 4), in("s", 4)},
			nodes: []*onnx.NodeProto{nd("RMSNormalization", []string{"x", "s"}, "y")}, tol: 5e-3},
		{name: "RMSNormalization axis 1", opset: 23, inputs: []tinyInput{in("x", 2, 3, 4), in("s", 3, 4)},
			nodes: []*onnx.NodeProto{nd("RMSNormalization", []string{"x", "s"}, "y", onnx.AttrInt("axis", 1), onnx.AttrFloat("epsilon", 1e-3))}, tol: 5e-3},
		// RoPE at opset 23: [batch, heads, sequence, head size] with the
		// caches indexed by positions, the halves rotated (and the pairs,
		// interleaved), and a partial rotation leaving channels as they are
		{name: "RotaryEmbedding", opset: 23, inputs: []tinyInput{in("x", 2, 2, 3, 4)}, inits: rope(2),
			nodes: []*onnx.NodeProto{nd("RotaryEmbedding", []string{"x", "cos", "sin", "pos"}, "y")}},
		{name: "RotaryEmbedding interleaved", opset: 23, inputs: []tinyInput{in("x", 2, 2, 3, 4)}, inits: rope(2),
			nodes: []*onnx.NodeProto{nd("RotaryEmbedding", []string{"x", "cos", "sin", "pos"}, "y", onnx.AttrInt("interleaved", 1))}},
		{name: "RotaryEmbedding partial", opset: 23, inputs: []tinyInput{in("x", 2, 2, 3, 6)}, inits: rope(2),
			nodes: []*onnx.NodeProto{nd("RotaryEmbedding", []string{"x", "cos", "sin", "pos"}, "y", onnx.AttrInt("rotary_embedding_dim", 4))}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { checkNumeric(t, c) })
	}
}

// TestAttention: opset 23's Attention on [batch, heads, sequence, head
// size] inputs: plain, grouped-query (4 query heads over 2 key heads,
// 5 keys), a boolean mask, an additive mask (whose gradient is taken too),
// causal with its own scale.
func TestAttention(t *testing.T) {
	mask := &onnx.TensorProto{Name: "m", DataType: int32(onnx.TensorProto_BOOL), Dims: []int64{1, 1, 3, 3},
		RawData: []byte{1, 0, 1, 1, 1, 0, 0, 1, 1}}
	qkv := []string{"q", "k", "v"}
	cases := []tiny{
		{name: "plain", opset: 23, inputs: []tinyInput{in("q", 1, 2, 3, 4), in("k", 1, 2, 3, 4), in("v", 1, 2, 3, 4)},
			nodes: []*onnx.NodeProto{nd("Attention", qkv, "y")}, tol: 5e-3},
		{name: "grouped-query", opset: 23, inputs: []tinyInput{in("q", 1, 4, 3, 4), in("k", 1, 2, 5, 4), in("v", 1, 2, 5, 4)},
			nodes: []*onnx.NodeProto{nd("Attention", qkv, "y")}, tol: 5e-3},
		{name: "boolean mask", opset: 23, inputs: []tinyInput{in("q", 2, 2, 3, 4), in("k", 2, 2, 3, 4), in("v", 2, 2, 3, 4)},
			inits: []*onnx.TensorProto{mask}, nodes: []*onnx.NodeProto{nd("Attention", append(qkv, "m"), "y")}, tol: 5e-3},
		{name: "additive mask", opset: 23, inputs: []tinyInput{in("q", 1, 2, 3, 4), in("k", 1, 2, 3, 4), in("v", 1, 2, 3, 4), in("m", 1, 1, 3, 3)},
			nodes: []*onnx.NodeProto{nd("Attention", append(qkv, "m"), "y")}, tol: 5e-3},
		{name: "causal", opset: 23, inputs: []tinyInput{in("q", 1, 2, 4, 4), in("k", 1, 2, 4, 4), in("v", 1, 2, 4, 4)},
			nodes: []*onnx.NodeProto{nd("Attention", qkv, "y", onnx.AttrInt("is_causal", 1), onnx.AttrFloat("scale", 0.3))}, tol: 5e-3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { checkNumeric(t, c) })
	}
}

func TestPooling(t *testing.T) {
	cases := []tiny{
		{name: "MaxPool 3x3 stride 2 pad 1 (overlapping)", inputs: []tinyInput{in("x", 2, 2, 5, 5).unique()},
			nodes: []*onnx.NodeProto{nd("MaxPool", []string{"x"}, "y", onnx.AttrInts("kernel_shape", 3, 3), onnx.AttrInts("strides", 2, 2), onnx.AttrInts("pads", 1, 1, 1, 1))}},
		{name: "MaxPool 2x2 ceil_mode", inputs: []tinyInput{in("x", 1, 2, 5, 5).unique()},
			nodes: []*onnx.NodeProto{nd("MaxPool", []string{"x"}, "y", onnx.AttrInts("kernel_shape", 2, 2), onnx.AttrInts("strides", 2, 2), onnx.AttrInt("ceil_mode", 1))}},
		{name: "MaxPool with indices output", inputs: []tinyInput{in("x", 1, 2, 4, 4).unique()},
			nodes: []*onnx.NodeProto{onnx.Node("MaxPool", "mp", []string{"x"}, []string{"y", "idx"}, onnx.AttrInts("kernel_shape", 2, 2), onnx.AttrInts("strides", 2, 2))}},
		{name: "AveragePool 3x3 stride 2 pad 1 exclude pad", inputs: []tinyInput{in("x", 2, 2, 5, 6)},
			nodes: []*onnx.NodeProto{nd("AveragePool", []string{"x"}, "y", onnx.AttrInts("kernel_shape", 3, 3), onnx.AttrInts("strides", 2, 2), onnx.AttrInts("pads", 1, 1, 1, 1))}},
		{name: "AveragePool include pad", inputs: []tinyInput{in("x", 1, 2, 5, 5)},
			nodes: []*onnx.NodeProto{nd("AveragePool", []string{"x"}, "y", onnx.AttrInts("kernel_shape", 3, 2), onnx.AttrInts("strides", 2, 1), onnx.AttrInts("pads", 1, 0, 1, 1), onnx.AttrInt("count_include_pad", 1))}},
		{name: "AveragePool 2x2 ceil_mode", inputs: []tinyInput{in("x", 1, 1, 5, 5)},
			nodes: []*onnx.NodeProto{nd("AveragePool", []string{"x"}, "y", onnx.AttrInts("kernel_shape", 2, 2), onnx.AttrInts("strides", 2, 2), onnx.AttrInt("ceil_mode", 1))}},
		{name: "AveragePool 1d", inputs: []tinyInput{in("x", 2, 3, 7)},
			nodes: []*onnx.NodeProto{nd("AveragePool", []string{"x"}, "y", onnx.AttrInts("kernel_shape", 3), onnx.AttrInts("strides", 2))}},
		{name: "GlobalAveragePool", inputs: []tinyInput{in("x", 2, 3, 3, 4)}, nodes: []*onnx.NodeProto{nd("GlobalAveragePool", []string{"x"}, "y")}},
		{name: "GlobalMaxPool", inputs: []tinyInput{in("x", 2, 3, 3, 2).unique()}, nodes: []*onnx.NodeProto{nd("GlobalMaxPool", []string{"x"}, "y")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { checkNumeric(t, c) })
	}
}

func TestShapeOps(t *testing.T) {
	cases := []tiny{
		{name: "Reshape", inputs: []tinyInput{in("x", 2, 3, 4)}, inits: []*onnx.TensorProto{ints("s", 4, -1)},
			nodes: []*onnx.NodeProto{nd("Reshape", []string{"x", "s"}, "y")}},
		{name: "Flatten", inputs: []tinyInput{in("x", 2, 3, 4)}, nodes: []*onnx.NodeProto{nd("Flatten", []string{"x"}, "y", onnx.AttrInt("axis", 2))}},
		{name: "Squeeze Unsqueeze", inputs: []tinyInput{in("x", 2, 1, 3)}, inits: []*onnx.TensorProto{ints("a", 1), ints("b", 0, 3)},
			nodes: []*onnx.NodeProto{nd("Squeeze", []string{"x", "a"}, "s"), nd("Unsqueeze", []string{"s", "b"}, "y")}},
		{name: "Transpose", inputs: []tinyInput{in("x", 2, 3, 4)}, nodes: []*onnx.NodeProto{nd("Transpose", []string{"x"}, "y", onnx.AttrInts("perm", 1, 2, 0))}},
		{name: "Transpose default", inputs: []tinyInput{in("x", 2, 3, 4)}, nodes: []*onnx.NodeProto{nd("Transpose", []string{"x"}, "y")}},
		{name: "Concat", inputs: []tinyInput{in("a", 2, 3), in("b", 2, 1), in("c", 2, 2)},
			nodes: []*onnx.NodeProto{nd("Concat", []string{"a", "b", "a", "c"}, "y", onnx.AttrInt("axis", -1))}},
		{name: "Split with unused output", inputs: []tinyInput{in("x", 2, 7)}, inits: []*onnx.TensorProto{ints("sp", 2, 3, 2)},
			nodes: []*onnx.NodeProto{onnx.Node("Split", "sp", []string{"x", "sp"}, []string{"p", "q", "r"}, onnx.AttrInt("axis", 1)),
				nd("Concat", []string{"r", "p"}, "y", onnx.AttrInt("axis", 1))}},
		// torch.chunk, split and unbind in a dynamo export made with
		// optimize=False: a sequence, read by SequenceAt (one piece never,
		// one twice, one from the end)
		{name: "SplitToSequence chunk", opset: 18, inputs: []tinyInput{in("x", 2, 7)}, inits: []*onnx.TensorProto{scalarInt("sz", 3), scalarInt("p0", 0), scalarInt("p2", -1)},
			nodes: []*onnx.NodeProto{onnx.Node("SplitToSequence", "sts", []string{"x", "sz"}, []string{"seq"}, onnx.AttrInt("axis", 1)),
				nd("SequenceAt", []string{"seq", "p0"}, "a"), nd("SequenceAt", []string{"seq", "p2"}, "b"), nd("SequenceAt", []string{"seq", "p0"}, "c"),
				nd("Mul", []string{"a", "c"}, "ac"), nd("Concat", []string{"ac", "b"}, "y", onnx.AttrInt("axis", 1))}},
		{name: "SplitToSequence sizes", opset: 18, inputs: []tinyInput{in("x", 5, 3)}, inits: []*onnx.TensorProto{ints("sz", 1, 3, 1), scalarInt("p1", 1)},
			nodes: []*onnx.NodeProto{onnx.Node("SplitToSequence", "sts", []string{"x", "sz"}, []string{"seq"}, onnx.AttrInt("axis", 0)),
				nd("SequenceAt", []string{"seq", "p1"}, "m"), nd("Tanh", []string{"m"}, "y")}},
		{name: "SplitToSequence unbind", opset: 18, inputs: []tinyInput{in("x", 2, 3, 4)}, inits: []*onnx.TensorProto{scalarInt("p1", 1), scalarInt("p2", 2)},
			nodes: []*onnx.NodeProto{onnx.Node("SplitToSequence", "sts", []string{"x"}, []string{"seq"}, onnx.AttrInt("axis", 1), onnx.AttrInt("keepdims", 0)),
				nd("SequenceAt", []string{"seq", "p1"}, "f"), nd("SequenceAt", []string{"seq", "p2"}, "g"), nd("Mul", []string{"f", "g"}, "y")}},
		{name: "Slice steps 2 and -1", inputs: []tinyInput{in("x", 3, 7, 5)},
			inits: []*onnx.TensorProto{ints("st", 1, -1, 4), ints("en", 100, 0, -6), ints("ax", 1, 2, 0), ints("sp", 2, -2, -1)},
			nodes: []*onnx.NodeProto{nd("Slice", []string{"x", "st", "en", "ax", "sp"}, "y")}},
		{name: "Slice offsets", inputs: []tinyInput{in("x", 4, 5)}, inits: []*onnx.TensorProto{ints("st", 1, -3), ints("en", 3, -1)},
			nodes: []*onnx.NodeProto{nd("Slice", []string{"x", "st", "en"}, "y")}},
		{name: "Slice computed end (torch.chunk)", inputs: []tinyInput{in("x", 2, 6)},
			inits: []*onnx.TensorProto{ints("i1", 1), ints("zero", 0), scalarInt("two", 2)},
			nodes: []*onnx.NodeProto{nd("Shape", []string{"x"}, "sh"), nd("Gather", []string{"sh", "i1"}, "d"),
				nd("Div", []string{"d", "two"}, "half"), nd("Slice", []string{"x", "half", "d", "i1"}, "y")}},
		{name: "Gather axis 1 repeated and negative", inputs: []tinyInput{in("x", 2, 4, 3)}, inits: []*onnx.TensorProto{onnx.Int64Tensor("i", []int64{2, 2}, []int64{0, 2, -1, 2})},
			nodes: []*onnx.NodeProto{nd("Gather", []string{"x", "i"}, "y", onnx.AttrInt("axis", 1))}},
		{name: "Gather scalar index", inputs: []tinyInput{in("x", 2, 4, 3)}, inits: []*onnx.TensorProto{scalarInt("i", 1)},
			nodes: []*onnx.NodeProto{nd("Gather", []string{"x", "i"}, "y", onnx.AttrInt("axis", 2))}},
		{name: "Gather embedding", inputs: []tinyInput{in("w", 5, 3)}, inits: []*onnx.TensorProto{onnx.Int64Tensor("tok", []int64{2, 3}, []int64{1, 4, 1, 0, 4, 4})},
			nodes: []*onnx.NodeProto{nd("Gather", []string{"w", "tok"}, "y")}},
		{name: "GatherElements", inputs: []tinyInput{in("x", 3, 4)}, inits: []*onnx.TensorProto{onnx.Int64Tensor("i", []int64{3, 2}, []int64{0, 3, 3, 3, -1, 1})},
			nodes: []*onnx.NodeProto{nd("GatherElements", []string{"x", "i"}, "y", onnx.AttrInt("axis", 1))}},
		// the dynamo exporter's advanced indexing: a tuple met twice, one
		// negative index, and a slice left of the tuples
		{name: "GatherND", opset: 18, inputs: []tinyInput{in("x", 3, 4, 2)}, inits: []*onnx.TensorProto{onnx.Int64Tensor("i", []int64{4, 2}, []int64{0, 1, 2, 3, 0, 1, -1, 0})},
			nodes: []*onnx.NodeProto{nd("GatherND", []string{"x", "i"}, "y")}},
		{name: "GatherND full tuples", opset: 18, inputs: []tinyInput{in("x", 3, 4)}, inits: []*onnx.TensorProto{onnx.Int64Tensor("i", []int64{2, 2, 2}, []int64{0, 1, 2, 3, 0, 1, 1, -2})},
			nodes: []*onnx.NodeProto{nd("GatherND", []string{"x", "i"}, "y")}},
		{name: "Expand", inputs: []tinyInput{in("x", 3, 1)}, inits: []*onnx.TensorProto{ints("s", 2, 3, 4)},
			nodes: []*onnx.NodeProto{nd("Expand", []string{"x", "s"}, "y")}},
		{name: "Tile", inputs: []tinyInput{in("x", 2, 3)}, inits: []*onnx.TensorProto{ints("r", 2, 3)},
			nodes: []*onnx.NodeProto{nd("Tile", []string{"x", "r"}, "y")}},
		{name: "Pad", inputs: []tinyInput{in("x", 2, 3)}, inits: []*onnx.TensorProto{ints("p", 1, 0, 2, 3)},
			nodes: []*onnx.NodeProto{nd("Pad", []string{"x", "p"}, "y")}},
		{name: "Trilu upper k=1", inputs: []tinyInput{in("x", 2, 4, 5)}, inits: []*onnx.TensorProto{scalarInt("k", 1)},
			nodes: []*onnx.NodeProto{nd("Trilu", []string{"x", "k"}, "y")}},
		{name: "Trilu lower k=-1", inputs: []tinyInput{in("x", 5, 3)}, inits: []*onnx.TensorProto{scalarInt("k", -1)},
			nodes: []*onnx.NodeProto{nd("Trilu", []string{"x", "k"}, "y", onnx.AttrInt("upper", 0))}},
		{name: "Trilu lower no k", inputs: []tinyInput{in("x", 4, 4)},
			nodes: []*onnx.NodeProto{nd("Trilu", []string{"x"}, "y", onnx.AttrInt("upper", 0))}},
		{name: "Pad axes opset 18", opset: 18, inputs: []tinyInput{in("x", 2, 3)}, inits: []*onnx.TensorProto{ints("p", 1, 2), ints("ax", -1)},
			nodes: []*onnx.NodeProto{nd("Pad", []string{"x", "p", "", "ax"}, "y")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { checkNumeric(t, c) })
	}
}

// TestTableGradients: every op whose entry in internal/onnx/ops names a
// gradient rule has a central-difference case in this file (a node of
// that op type, built with nd or onnx.Node), so an entry cannot claim a
// gradient that nothing checks against finite differences.
func TestTableGradients(t *testing.T) {
	fs := token.NewFileSet()
	f, err := parser.ParseFile(fs, "numeric_test.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	built := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			// TestElementwise's unary table: {"Neg", in("x", 2, 3), …},
			// each entry's op built with nd(u.op, …)
			if id, ok := n.Lhs[0].(*ast.Ident); ok && id.Name == "unary" && len(n.Rhs) == 1 {
				if cl, ok := n.Rhs[0].(*ast.CompositeLit); ok {
					for _, e := range cl.Elts {
						if row, ok := e.(*ast.CompositeLit); ok && len(row.Elts) > 0 {
							addString(built, row.Elts[0])
						}
					}
				}
			}
		case *ast.CallExpr:
			if isNodeBuilder(n.Fun) && len(n.Args) > 0 {
				addString(built, n.Args[0])
			}
		}
		return true
	})
	for _, op := range vjp.Ops() {
		if !built[op] {
			t.Errorf("%s has a gradient rule (its entry in internal/onnx/ops) but no central-difference case here", op)
		}
	}
}

// isNodeBuilder reports whether fn is nd or onnx.Node.
func isNodeBuilder(fn ast.Expr) bool {
	switch fn := fn.(type) {
	case *ast.Ident:
		return fn.Name == "nd"
	case *ast.SelectorExpr:
		x, ok := fn.X.(*ast.Ident)
		return ok && x.Name == "onnx" && fn.Sel.Name == "Node"
	}
	return false
}

// addString adds e to set when it is a string literal.
func addString(set map[string]bool, e ast.Expr) {
	if b, ok := e.(*ast.BasicLit); ok && b.Kind == token.STRING {
		if s, err := strconv.Unquote(b.Value); err == nil {
			set[s] = true
		}
	}
}
