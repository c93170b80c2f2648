package onnx

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// fuzzModelPath names a model in a folder that does not exist, so that no
// external data location a fuzzed model names can ever be read.
const fuzzModelPath = "/nonexistent-fp16audit-fuzz/model.onnx"

// FuzzLoadBytes feeds arbitrary bytes to the loader: it must return a model
// or a *LoadError, never panic, and a model it returns must have a valid
// topological order.
func FuzzLoadBytes(f *testing.F) {
	for _, name := range []string{"mlp.onnx", "attention.onnx", "explicit_half_cast.onnx", "cnn_external.onnx"} {
		data, err := os.ReadFile(filepath.Join("..", "..", "fixtures", "models", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
		f.Add(data[:len(data)/2])
	}
	f.Add([]byte{})
	f.Add([]byte("\x08\x08\x12\x00"))
	for _, seed := range [][]byte{{3, 1, 2, 0, 1, 0, 2}, {8, 4, 1, 7, 3, 3, 9, 2, 5, 5, 1}} {
		data, err := Marshal(NewModel(fuzzGraph(seed), 17))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := LoadBytes(data, fuzzModelPath)
		if err != nil {
			var le *LoadError
			if !errors.As(err, &le) || le.Path != fuzzModelPath {
				t.Fatalf("error %T %v is not a *LoadError naming the file", err, err)
			}
			return
		}
		checkOrder(t, m.Proto.Graph, m.Index)
		if _, err := Marshal(m.Proto); err != nil {
			t.Fatalf("a loaded model does not serialize: %v", err)
		}
	})
}

// FuzzNewIndex builds graphs from bytes — nodes wired to values produced
// earlier or later (so cycles happen), duplicate producers, nested If
// subgraphs reading outer values — and checks the index against a
// reference: NewIndex must fail exactly when the graph has a duplicate
// producer or a cycle, and its order must be topological otherwise.
func FuzzNewIndex(f *testing.F) {
	f.Add([]byte{3, 1, 2, 0, 1, 0, 2})
	f.Add([]byte{8, 4, 1, 7, 3, 3, 9, 2, 5, 5, 1})
	f.Add([]byte{2, 0x81, 1, 1, 0x80, 0})
	f.Add([]byte{12, 0xff, 0xfe, 0x40, 3, 2, 1, 0, 9, 9, 9, 9, 0x7f})
	f.Fuzz(func(t *testing.T, data []byte) {
		g := fuzzGraph(data)
		ix, err := NewIndex(g)
		dup, cyclic := refCheck(g)
		switch {
		case dup:
			if err == nil {
				t.Fatal("duplicate producer not reported")
			}
		case cyclic:
			var ce *CycleError
			if !errors.As(err, &ce) || len(ce.Nodes) == 0 {
				t.Fatalf("cycle not reported: %v", err)
			}
		case err != nil:
			t.Fatalf("valid graph refused: %v", err)
		default:
			checkOrder(t, g, ix)
		}
	})
}

// fuzzGraph decodes a graph: data[0] gives the node count; each node then
// reads one byte whose low bits pick its inputs among the values v0..vN
// (vK is node K's output, so a node may read a later node's output) and
// whose high bits ask for a duplicate output or a nested If.
func fuzzGraph(data []byte) *GraphProto {
	next := func() int {
		if len(data) == 0 {
			return 0
		}
		b := int(data[0])
		data = data[1:]
		return b
	}
	n := next()%24 + 1
	g := &GraphProto{Name: "fuzz", Input: []*ValueInfoProto{TensorValueInfo("x", TensorProto_FLOAT, 2)}}
	val := func(k int) string {
		if k%(n+1) == n {
			return "x"
		}
		return fmt.Sprintf("v%d", k%(n+1))
	}
	for i := range n {
		b := next()
		in := []string{val(b & 0x1f), val(next())}
		out := fmt.Sprintf("v%d", i)
		if b&0x40 != 0 && i > 0 {
			out = fmt.Sprintf("v%d", next()%i) // a second producer
		}
		node := Node("Add", fmt.Sprintf("n%d", i), in, []string{out})
		if b&0x80 != 0 {
			node = Node("If", fmt.Sprintf("if%d", i), []string{"x"}, []string{out},
				AttrGraph("then_branch", nestedGraph(val(next()), next()%6)),
				AttrGraph("else_branch", nestedGraph(val(next()), 0)))
		}
		g.Node = append(g.Node, node)
	}
	g.Output = []*ValueInfoProto{TensorValueInfo(val(next()), TensorProto_FLOAT, 2)}
	return g
}

// nestedGraph returns a branch, depth levels of If deep, whose innermost
// node reads outer from the enclosing scope.
func nestedGraph(outer string, depth int) *GraphProto {
	g := &GraphProto{Name: fmt.Sprintf("b%d", depth),
		Node:   []*NodeProto{Node("Identity", "", []string{outer}, []string{fmt.Sprintf("o%d", depth)})},
		Output: []*ValueInfoProto{TensorValueInfo(fmt.Sprintf("o%d", depth), TensorProto_FLOAT, 2)}}
	if depth > 0 {
		g.Node = []*NodeProto{Node("If", "", []string{"x"}, []string{fmt.Sprintf("o%d", depth)},
			AttrGraph("then_branch", nestedGraph(outer, depth-1)), AttrGraph("else_branch", nestedGraph(outer, 0)))}
	}
	return g
}

// refCheck reports, by brute force, whether g has a value with two
// producers and whether its dependencies (subgraph reads included) cycle.
func refCheck(g *GraphProto) (dup, cyclic bool) {
	producer := map[string]int{}
	for i, n := range g.Node {
		for _, o := range n.Output {
			if _, ok := producer[o]; ok {
				dup = true
			}
			producer[o] = i
		}
	}
	if dup {
		return true, false
	}
	deps := make([][]int, len(g.Node))
	for i, n := range g.Node {
		for _, in := range append(append([]string(nil), n.Input...), implicitInputs(n)...) {
			if p, ok := producer[in]; ok {
				deps[i] = append(deps[i], p)
			}
		}
	}
	state := make([]int, len(g.Node)) // 0 new, 1 on path, 2 done
	var visit func(int) bool
	visit = func(i int) bool {
		if state[i] == 1 {
			return true
		}
		if state[i] == 2 {
			return false
		}
		state[i] = 1
		for _, d := range deps[i] {
			if visit(d) {
				return true
			}
		}
		state[i] = 2
		return false
	}
	for i := range g.Node {
		if visit(i) {
			return false, true
		}
	}
	return false, false
}

// checkOrder fails unless ix.Order() is a permutation of g's nodes in which
// every node comes after the producers of its inputs, subgraph reads
// included.
func checkOrder(t *testing.T, g *GraphProto, ix *Index) {
	t.Helper()
	order := ix.Order()
	if len(order) != len(g.Node) {
		t.Fatalf("order has %d nodes, graph %d", len(order), len(g.Node))
	}
	pos := make([]int, len(g.Node))
	for i := range pos {
		pos[i] = -1
	}
	for k, i := range order {
		if i < 0 || i >= len(g.Node) || pos[i] >= 0 {
			t.Fatalf("order %v is not a permutation", order)
		}
		pos[i] = k
	}
	for i, n := range g.Node {
		for _, in := range append(append([]string(nil), n.Input...), ix.ImplicitInputs(i)...) {
			if p := ix.Producer(in); p >= 0 && pos[p] > pos[i] {
				t.Fatalf("node %d reads %q before node %d produces it", i, in, p)
			}
		}
	}
}
