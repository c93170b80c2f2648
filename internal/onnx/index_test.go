package onnx

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"fp16audit/internal/tensor"
)

// diamond is x -> a -> (b, c) -> d -> e, with an independent f reading x.
func diamond() []*NodeProto {
	return []*NodeProto{
		Node("Relu", "a", []string{"x"}, []string{"va"}),
		Node("Neg", "b", []string{"va"}, []string{"vb"}),
		Node("Abs", "c", []string{"va"}, []string{"vc"}),
		Node("Add", "d", []string{"vb", "vc"}, []string{"vd"}),
		Node("Exp", "e", []string{"vd"}, []string{"ve"}),
		Node("Sigmoid", "f", []string{"x"}, []string{"vf"}),
	}
}

func names(g *GraphProto, order []int) []string {
	out := make([]string, len(order))
	for i, n := range order {
		out[i] = g.Node[n].GetName()
	}
	return out
}

func checkTopological(t *testing.T, ix *Index) {
	t.Helper()
	order := ix.Order()
	if len(order) != len(ix.Graph().GetNode()) {
		t.Fatalf("order has %d nodes, graph %d", len(order), len(ix.Graph().GetNode()))
	}
	pos := map[int]int{}
	for p, n := range order {
		pos[n] = p
	}
	for i, n := range ix.Graph().GetNode() {
		for _, in := range append(slices.Clone(n.GetInput()), ix.ImplicitInputs(i)...) {
			if p := ix.Producer(in); p >= 0 && pos[p] >= pos[i] {
				t.Errorf("node %s runs before its producer %s", ix.NodeLabel(i), ix.NodeLabel(p))
			}
		}
	}
}

func TestOrder(t *testing.T) {
	tests := []struct {
		name  string
		perm  []int // file position -> diamond node
		order []string
	}{
		{"sorted keeps file order", []int{0, 1, 2, 3, 4, 5}, []string{"a", "b", "c", "d", "e", "f"}},
		{"reversed", []int{5, 4, 3, 2, 1, 0}, []string{"f", "a", "c", "b", "d", "e"}},
		{"shuffled", []int{3, 5, 1, 0, 4, 2}, []string{"f", "a", "b", "c", "d", "e"}},
		{"consumer first", []int{4, 3, 2, 1, 0, 5}, []string{"a", "c", "b", "d", "e", "f"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := diamond()
			g := &GraphProto{Name: "g"}
			for _, p := range tc.perm {
				g.Node = append(g.Node, d[p])
			}
			ix, err := NewIndex(g)
			if err != nil {
				t.Fatal(err)
			}
			checkTopological(t, ix)
			if got := names(g, ix.Order()); !slices.Equal(got, tc.order) {
				t.Errorf("order %v, want %v", got, tc.order)
			}
		})
	}
}

func TestOrderRandomShuffles(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	// A layered graph: each node reads two earlier values.
	var nodes []*NodeProto
	vals := []string{"in"}
	for i := range 200 {
		out := "v" + string(rune('A'+i%26)) + strings.Repeat("x", i/26)
		nodes = append(nodes, Node("Add", out+"_node", []string{vals[rng.IntN(len(vals))], vals[rng.IntN(len(vals))]}, []string{out}))
		vals = append(vals, out)
	}
	for range 20 {
		g := &GraphProto{Name: "g", Node: slices.Clone(nodes)}
		rng.Shuffle(len(g.Node), func(i, j int) { g.Node[i], g.Node[j] = g.Node[j], g.Node[i] })
		ix, err := NewIndex(g)
		if err != nil {
			t.Fatal(err)
		}
		checkTopological(t, ix)
	}
}

func TestCycle(t *testing.T) {
	tests := []struct {
		name  string
		nodes []*NodeProto
		want  []string
	}{
		{"three", []*NodeProto{
			Node("Relu", "entry", []string{"x"}, []string{"v0"}),
			Node("Add", "a", []string{"v0", "vc"}, []string{"va"}),
			Node("Relu", "b", []string{"va"}, []string{"vb"}),
			Node("Relu", "c", []string{"vb"}, []string{"vc"}),
			Node("Relu", "downstream", []string{"vc"}, []string{"vd"}),
		}, []string{`"a"`, `"b"`, `"c"`}},
		{"self loop unnamed", []*NodeProto{
			Node("Relu", "ok", []string{"x"}, []string{"v0"}),
			Node("Add", "", []string{"v0", "v1"}, []string{"v1"}),
		}, []string{"Add#1"}},
		{"through subgraph", []*NodeProto{
			Node("If", "if", []string{"cond"}, []string{"vi"}, AttrGraph("then_branch", &GraphProto{
				Node: []*NodeProto{Node("Identity", "", []string{"vr"}, []string{"t"})}, Output: []*ValueInfoProto{{Name: "t"}}})),
			Node("Relu", "r", []string{"vi"}, []string{"vr"}),
		}, []string{`"if"`, `"r"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewIndex(&GraphProto{Name: "cyc", Node: tc.nodes})
			var ce *CycleError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v, want *CycleError", err)
			}
			if !slices.Equal(ce.Nodes, tc.want) {
				t.Errorf("cycle nodes %v, want %v", ce.Nodes, tc.want)
			}
			if want := `graph "cyc" has a cycle through nodes ` + strings.Join(tc.want, ", "); !strings.Contains(err.Error(), want) {
				t.Errorf("error %q, want it to contain %q", err, want)
			}
		})
	}
}

func TestDuplicateProducer(t *testing.T) {
	_, err := NewIndex(&GraphProto{Name: "g", Node: []*NodeProto{
		Node("Relu", "a", []string{"x"}, []string{"v"}),
		Node("Relu", "", []string{"x"}, []string{"v"}),
	}})
	if err == nil || !strings.Contains(err.Error(), `value "v" is produced by both node "a" and node Relu#1`) {
		t.Errorf("error = %v", err)
	}
}

// subgraphModel has an If whose branches read outer values produced after
// it in the file, one of them only inside a Loop nested in the branch.
func subgraphGraph() *GraphProto {
	inner := &GraphProto{
		Name:  "inner_body",
		Input: []*ValueInfoProto{{Name: "i"}, {Name: "c"}},
		Node: []*NodeProto{
			Node("Add", "deep_add", []string{"i", "deep"}, []string{"s"}),
			Node("Identity", "", []string{"c"}, []string{"c2"}),
		},
		Output: []*ValueInfoProto{{Name: "c2"}, {Name: "s"}},
	}
	thenG := &GraphProto{
		Name:        "then",
		Initializer: []*TensorProto{FloatTensor("local", []int64{1}, []float32{1})},
		Node: []*NodeProto{
			Node("Mul", "m", []string{"w", "local"}, []string{"t1"}),
			Node("Loop", "inner", []string{"", "cond"}, []string{"t2"}, AttrGraph("body", inner)),
		},
		Output: []*ValueInfoProto{{Name: "t1"}},
	}
	elseG := &GraphProto{Name: "else", Output: []*ValueInfoProto{{Name: "x"}}}
	return &GraphProto{
		Name: "outer",
		Node: []*NodeProto{
			Node("If", "if", []string{"cond"}, []string{"y"}, AttrGraph("then_branch", thenG), AttrGraph("else_branch", elseG)),
			Node("Relu", "make_w", []string{"x"}, []string{"w"}),
			Node("Neg", "make_deep", []string{"x"}, []string{"deep"}),
			Node("Greater", "make_cond", []string{"x", "zero"}, []string{"cond"}),
		},
		Input: []*ValueInfoProto{TensorValueInfo("x", TensorProto_FLOAT, 1)},
	}
}

func TestImplicitInputs(t *testing.T) {
	g := subgraphGraph()
	ix, err := NewIndex(g)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ix.ImplicitInputs(0), []string{"w", "cond", "deep", "x"}; !slices.Equal(got, want) {
		t.Errorf("implicit inputs %v, want %v", got, want)
	}
	if got := names(g, ix.Order()); !slices.Equal(got, []string{"make_w", "make_deep", "make_cond", "if"}) {
		t.Errorf("order %v", got)
	}
	if got := ix.Consumers("deep"); !slices.Equal(got, []int{0}) {
		t.Errorf("consumers of deep %v, want [0]", got)
	}
	if got := ix.Consumers("x"); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Errorf("consumers of x %v, want [0 1 2 3]", got)
	}
	checkTopological(t, ix)
}

func TestProducerConsumers(t *testing.T) {
	g := &GraphProto{Name: "g", Node: diamond(), Initializer: []*TensorProto{FloatTensor("x", []int64{1}, []float32{1})}}
	ix, err := NewIndex(g)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		producer  int
		consumers []int
	}{
		{"x", -1, []int{0, 5}},
		{"va", 0, []int{1, 2}},
		{"vd", 3, []int{4}},
		{"ve", 4, nil},
		{"absent", -1, nil},
	}
	for _, tc := range tests {
		if got := ix.Producer(tc.name); got != tc.producer {
			t.Errorf("Producer(%q) = %d, want %d", tc.name, got, tc.producer)
		}
		if got := ix.Consumers(tc.name); !slices.Equal(got, tc.consumers) {
			t.Errorf("Consumers(%q) = %v, want %v", tc.name, got, tc.consumers)
		}
	}
}

func typesGraph() *GraphProto {
	return &GraphProto{
		Name: "types",
		Node: []*NodeProto{
			Node("Constant", "k", nil, []string{"k"}, AttrTensor("value", &TensorProto{Dims: []int64{2}, DataType: int32(TensorProto_FLOAT16), Int32Data: []int32{0x3c00, 0x4000}})),
			Node("Constant", "kf", nil, []string{"kf"}, AttrFloat("value_float", 2.5)),
			Node("Constant", "kfs", nil, []string{"kfs"}, &AttributeProto{Name: "value_floats", Type: AttributeProto_FLOATS, Floats: []float32{1, 2, 3}}),
			Node("Constant", "ki", nil, []string{"ki"}, AttrInt("value_int", -4)),
			Node("Constant", "kis", nil, []string{"kis"}, AttrInts("value_ints", 1, 2)),
			Node("Cast", "half", []string{"x"}, []string{"xh"}, AttrInt("to", int64(TensorProto_FLOAT16))),
			Node("Mul", "mul", []string{"xh", "k"}, []string{"m"}),
			Node("Reshape", "rs", []string{"m", "kis"}, []string{"r"}),
			Node("Shape", "shape", []string{"r"}, []string{"s"}),
			Node("Greater", "gt", []string{"r", "k"}, []string{"b"}),
			Node("Where", "where", []string{"b", "w", "r"}, []string{"wh"}),
			Node("MaxPool", "pool", []string{"wh"}, []string{"p", "pi"}),
			Node("Split", "split", []string{"p"}, []string{"p1", "p2"}),
			Node("Custom", "custom", []string{"p1"}, []string{"u"}),
			Node("Relu", "declared", []string{"u"}, []string{"dv"}),
		},
		Initializer: []*TensorProto{
			FloatTensor("w", []int64{2, 3}, []float32{1, 2, 3, 4, 5, 6}),
			{Name: "wi", Dims: []int64{3}, DataType: int32(TensorProto_INT32), Int32Data: []int32{1, 2, 3}},
		},
		Input: []*ValueInfoProto{
			TensorValueInfo("x", TensorProto_FLOAT, "batch", 3, "seq"),
			TensorValueInfo("w", TensorProto_FLOAT, 2, 3),
			TensorValueInfo("wi", TensorProto_INT32, 3),
		},
		ValueInfo: []*ValueInfoProto{TensorValueInfo("dv", TensorProto_DOUBLE)},
		Output:    []*ValueInfoProto{TensorValueInfo("wh", TensorProto_BFLOAT16, "batch", -1)},
	}
}

func TestElemType(t *testing.T) {
	ix, err := NewIndex(typesGraph())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		want TensorProto_DataType
	}{
		{"x", TensorProto_FLOAT},
		{"w", TensorProto_FLOAT},
		{"wi", TensorProto_INT32},
		{"k", TensorProto_FLOAT16},
		{"kf", TensorProto_FLOAT},
		{"kfs", TensorProto_FLOAT},
		{"ki", TensorProto_INT64},
		{"kis", TensorProto_INT64},
		{"xh", TensorProto_FLOAT16},
		{"m", TensorProto_FLOAT16},
		{"r", TensorProto_FLOAT16},
		{"s", TensorProto_INT64},
		{"b", TensorProto_BOOL},
		{"wh", TensorProto_BFLOAT16}, // declared output type wins over inference
		{"p", TensorProto_BFLOAT16},
		{"pi", TensorProto_INT64},
		{"p1", TensorProto_BFLOAT16},
		{"p2", TensorProto_BFLOAT16},
		{"u", TensorProto_UNDEFINED},
		{"dv", TensorProto_DOUBLE},
		{"absent", TensorProto_UNDEFINED},
	}
	for _, tc := range tests {
		if got := ix.ElemType(tc.name); got != int32(tc.want) {
			t.Errorf("ElemType(%q) = %s, want %s", tc.name, DataTypeName(got), tc.want)
		}
	}
}

func TestShape(t *testing.T) {
	ix, err := NewIndex(typesGraph())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		want string
		ok   bool
	}{
		{"x", "[batch,3,seq]", true},
		{"w", "[2,3]", true},
		{"k", "[2]", true},
		{"kf", "[]", true},
		{"kfs", "[3]", true},
		{"wh", "[batch,?]", true},
		{"dv", "[]", true},
		{"m", "", false},
	}
	for _, tc := range tests {
		s, ok := ix.Shape(tc.name)
		if ok != tc.ok || ok && s.String() != tc.want {
			t.Errorf("Shape(%q) = %v %v, want %v %v", tc.name, s, ok, tc.want, tc.ok)
		}
	}
	s, _ := ix.Shape("x")
	if !slices.Equal(s.Dims, []int64{-1, 3, -1}) || !slices.Equal(s.Params, []string{"batch", "", "seq"}) {
		t.Errorf("x shape %+v", s)
	}
}

func TestGraphInputs(t *testing.T) {
	ix, err := NewIndex(typesGraph())
	if err != nil {
		t.Fatal(err)
	}
	in := ix.GraphInputs()
	if len(in) != 1 || in[0].GetName() != "x" {
		t.Errorf("GraphInputs = %v, want only x", in)
	}
	if !ix.IsInitializer("w") || ix.IsInitializer("x") || ix.Initializer("w") == nil || ix.Initializer("k") != nil {
		t.Error("initializer lookup wrong")
	}
}

func TestConstantValue(t *testing.T) {
	ix, err := NewIndex(typesGraph())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		dtype tensor.DType
		shape []int64
		data  []byte
	}{
		{"w", tensor.Float32, []int64{2, 3}, le32(math.Float32bits(1), math.Float32bits(2), math.Float32bits(3), math.Float32bits(4), math.Float32bits(5), math.Float32bits(6))},
		{"wi", tensor.Int32, []int64{3}, le32(1, 2, 3)},
		{"k", tensor.Float16, []int64{2}, le16(0x3c00, 0x4000)},
		{"kf", tensor.Float32, []int64{}, le32(math.Float32bits(2.5))},
		{"kfs", tensor.Float32, []int64{3}, le32(math.Float32bits(1), math.Float32bits(2), math.Float32bits(3))},
		{"ki", tensor.Int64, []int64{}, le64(math.MaxUint64 - 3)},
		{"kis", tensor.Int64, []int64{2}, le64(1, 2)},
	}
	for _, tc := range tests {
		got, err := ix.ConstantValue(tc.name)
		if err != nil {
			t.Errorf("ConstantValue(%q): %v", tc.name, err)
			continue
		}
		if got.DType != tc.dtype || !slices.Equal(got.Shape, tc.shape) || !bytes.Equal(got.Data, tc.data) {
			t.Errorf("ConstantValue(%q) = %s %v % x, want %s %v % x", tc.name, got.DType, got.Shape, got.Data, tc.dtype, tc.shape, tc.data)
		}
	}
	if _, err := ix.ConstantValue("m"); !errors.Is(err, ErrNotConstant) {
		t.Errorf("ConstantValue(m) error = %v, want ErrNotConstant", err)
	}
}
