package rewrite

import (
	"fmt"

	"fp16audit/internal/onnx"
)

// AddEpsilon returns a copy of m in which every Sqrt reading one of the
// values in eps takes the square root of that value plus eps[value]: the
// epsilon a hand-written normalization adds inside its root
// (sqrt(var + 1e-12)) put back where the graph has none. The Add runs in
// fp32, before the Sqrt; m is unchanged. A value no Sqrt reads is an
// error.
func AddEpsilon(m *onnx.ModelProto, eps map[string]float32) (*onnx.ModelProto, error) {
	out := onnx.ShallowCopy(m)
	g := out.Graph
	done := map[string]bool{}
	nodes := make([]*onnx.NodeProto, 0, len(g.Node)+len(eps))
	for _, n := range g.Node {
		if n.OpType != "Sqrt" || !onnx.IsDefaultDomain(n.Domain) || len(n.Input) != 1 {
			nodes = append(nodes, n)
			continue
		}
		v := n.Input[0]
		e, ok := eps[v]
		if !ok {
			nodes = append(nodes, n)
			continue
		}
		c, sum := v+"::epsilon", v+"::plus_epsilon"
		if !done[v] {
			// A Constant node, as an exporter writes a Python number:
			// it belongs to the root's module (kept with it in fp32 by
			// the keep-fp32 fix) and is no parameter the policy holds.
			k := onnx.Node("Constant", c, nil, []string{c}, onnx.AttrTensor("value", onnx.FloatTensor("", nil, []float32{e})))
			add := onnx.Node("Add", sum, []string{v, c}, []string{sum})
			k.MetadataProps, add.MetadataProps = onnx.ScopeMetadata(n), onnx.ScopeMetadata(n) // reported in the root's module
			nodes = append(nodes, k, add)
			done[v] = true
		}
		s := onnx.CloneNode(n)
		s.Input = []string{sum}
		nodes = append(nodes, s)
	}
	for v := range eps {
		if !done[v] {
			return nil, fmt.Errorf("add epsilon: no Sqrt reads %q", v)
		}
	}
	g.Node = nodes
	return out, nil
}
