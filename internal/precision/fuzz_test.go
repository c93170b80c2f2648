package precision

import (
	"fmt"
	"testing"

	"fp16audit/internal/onnx"
)

// fuzzOps are the op types fuzzed graphs are built from: every category of
// the policy, the special cases of Assign (Cast, CastLike, Constant,
// BatchNormalization, the rsqrt and Linear-bias patterns), ops without float
// outputs, subgraph ops, and an op of a custom domain.
var fuzzOps = []string{
	"MatMul", "Gemm", "Conv", "Add", "Sub", "Mul", "Div", "Sqrt", "Reciprocal",
	"Softmax", "Exp", "LayerNormalization", "Relu", "Cast", "CastLike", "Constant",
	"BatchNormalization", "Where", "Shape", "Equal", "ConstantOfShape", "If",
	"Dropout", "TopK", "Resize", "Concat", "custom.Op",
}

var fuzzTypes = []int32{0, 1, 10, 16, 11, 7, 9}

// FuzzAssign runs every policy over graphs decoded from bytes (arbitrary
// wiring, element types, cast targets, missing inputs, non-topological
// orders, values no node produces) and checks Assign's invariants: it never
// panics, sizes every per-node slice to the graph, gives every produced
// value a precision, and honours explicit casts.
func FuzzAssign(f *testing.F) {
	f.Add([]byte{5, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{12, 13, 2, 1, 14, 0, 3, 0x80, 21, 5, 5, 25, 7, 7})
	f.Add([]byte{3, 26, 0xff, 0xff, 1, 21, 0, 0})
	f.Add([]byte{20, 7, 1, 2, 8, 3, 4, 5, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26})
	f.Fuzz(func(t *testing.T, data []byte) {
		g, order, typ := assignGraph(data)
		elemType := func(name string) int32 { return typ[name] }
		for _, p := range Policies() {
			for _, et := range []func(string) int32{elemType, nil} {
				a := Assign(p, g, order, et)
				checkAssignment(t, p, g, order, a, nil)
			}
			keep := map[int]bool{}
			for i := range g.Node {
				if i%2 == 0 {
					keep[i] = true
				}
			}
			a := AssignKeepFP32(p, g, order, elemType, keep)
			checkAssignment(t, p, g, order, a, keep)
			for _, i := range order {
				n := g.Node[i]
				// A kept Cast to half stands for removing the cast: it
				// passes its input's precision on, 16-bit or not.
				removed := n.OpType == "Cast" && n.Domain == "" && len(n.Input) > 0 && onnx.IsHalfType(int32(onnx.FindAttr(n, "to").GetI()))
				if keep[i] && !removed && (a.Node[i] == FP16 || a.Node[i] == BF16) {
					t.Fatalf("%s: kept node %d computes in %s", p.Name, i, a.Node[i])
				}
			}
		}
	})
}

// checkAssignment checks a; a kept Cast to half stands for removing the
// cast, so keep exempts it.
func checkAssignment(t *testing.T, p *Policy, g *onnx.GraphProto, order []int, a *Assignment, keep map[int]bool) {
	t.Helper()
	if len(a.Node) != len(g.Node) || len(a.CastInputs) != len(g.Node) {
		t.Fatalf("%s: %d node precisions, %d cast lists for %d nodes", p.Name, len(a.Node), len(a.CastInputs), len(g.Node))
	}
	for i, n := range g.Node {
		if len(a.CastInputs[i]) != len(n.Input) {
			t.Fatalf("%s: node %d has %d inputs, %d cast flags", p.Name, i, len(n.Input), len(a.CastInputs[i]))
		}
	}
	for _, i := range order {
		n := g.Node[i]
		for _, o := range n.Output {
			if o == "" {
				continue
			}
			if _, ok := a.Value[o]; !ok {
				t.Fatalf("%s: output %q of node %d has no precision", p.Name, o, i)
			}
		}
		if n.OpType == "Cast" && n.Domain == "" && !keep[i] && len(n.Output) == 1 && n.Output[0] != "" {
			to := int32(onnx.FindAttr(n, "to").GetI())
			got, want := a.Value[n.Output[0]], PrecisionOf(to)
			// The exporter's promotion cast of a 16-bit operand (a Cast to
			// FLOAT before an op with an fp32 input) follows its input.
			promotion := to == int32(onnx.TensorProto_FLOAT) && len(n.Input) > 0 &&
				(got == FP16 || got == BF16) && got == a.Value[n.Input[0]]
			if got != want && !promotion && !lastProducer(g, order, i, n.Output[0]) {
				t.Fatalf("%s: Cast node %d outputs %s, want %s", p.Name, i, got, want)
			}
		}
	}
}

// lastProducer reports whether a node after position of i in order also
// produces name (fuzzed graphs may have two producers; the later wins).
func lastProducer(g *onnx.GraphProto, order []int, i int, name string) bool {
	seen := false
	for _, j := range order {
		if j == i {
			seen = true
			continue
		}
		if seen {
			for _, o := range g.Node[j].Output {
				if o == name {
					return true
				}
			}
		}
	}
	return false
}

// assignGraph decodes a graph, a node order (usually topological, sometimes
// shuffled or partial) and element types for some values.
func assignGraph(data []byte) (*onnx.GraphProto, []int, map[string]int32) {
	next := func() int {
		if len(data) == 0 {
			return 0
		}
		b := int(data[0])
		data = data[1:]
		return b
	}
	n := next()%32 + 1
	typ := map[string]int32{"x": 1, "w": 1, "h": 10, "i": 7}
	g := &onnx.GraphProto{
		Input: []*onnx.ValueInfoProto{
			onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 2, 4),
			onnx.TensorValueInfo("s", onnx.TensorProto_FLOAT),
			onnx.TensorValueInfo("i", onnx.TensorProto_INT64, 2),
		},
		Initializer: []*onnx.TensorProto{
			onnx.FloatTensor("w", []int64{4, 4}, make([]float32, 16)),
			{Name: "h", DataType: 10, Dims: []int64{1}, RawData: []byte{0, 0x3c}},
			onnx.FloatTensor("one", []int64{1}, []float32{1}),
		},
	}
	values := []string{"x", "w", "h", "i", "s", "one", "", "undefined"}
	for k := range n {
		b := next()
		op := fuzzOps[b%len(fuzzOps)]
		var in []string
		for range next() % 4 {
			in = append(in, values[next()%len(values)])
		}
		out := fmt.Sprintf("v%d", k)
		node := onnx.Node(op, fmt.Sprintf("n%d", k), in, []string{out})
		switch op {
		case "custom.Op":
			node.OpType, node.Domain = "Op", "custom"
		case "Cast":
			node.Attribute = append(node.Attribute, onnx.AttrInt("to", int64(fuzzTypes[next()%len(fuzzTypes)])))
		case "Constant":
			node.Input = nil
			if b&0x80 != 0 {
				node.Attribute = append(node.Attribute, onnx.AttrTensor("value", &onnx.TensorProto{DataType: fuzzTypes[next()%len(fuzzTypes)]}))
			} else {
				node.Attribute = append(node.Attribute, onnx.AttrFloat("value_float", 1))
			}
		case "ConstantOfShape":
			node.Attribute = append(node.Attribute, onnx.AttrTensor("value", &onnx.TensorProto{DataType: fuzzTypes[next()%len(fuzzTypes)], Dims: []int64{1}}))
		case "TopK", "Dropout":
			node.Output = append(node.Output, out+"_idx")
		case "If":
			node.Attribute = append(node.Attribute, onnx.AttrGraph("then_branch", &onnx.GraphProto{}))
		}
		if t := fuzzTypes[next()%len(fuzzTypes)]; t != 0 {
			typ[out] = t
		}
		if b&0x40 != 0 && k > 0 {
			node.Output = append(node.Output, "") // an omitted optional output
		}
		g.Node = append(g.Node, node)
		values = append(values, node.Output...)
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	switch next() % 4 {
	case 1:
		for i := range order {
			j := next() % n
			order[i], order[j] = order[j], order[i]
		}
	case 2:
		order = order[:n/2]
	case 3:
		order = nil
	}
	return g, order, typ
}
