package onnx

import (
	"fmt"

	"fp16audit/internal/onnx/ops"
)

// checkDefined fails when a node of g, or a subgraph of it reading the
// enclosing scope, uses a value that no node produces and that is neither a
// graph input nor an initializer. ONNX Runtime refuses such a graph with a
// message that names neither the node nor the value.
func checkDefined(g *GraphProto, ix *Index) error {
	defined := sourceNames(g)
	for i, n := range g.GetNode() {
		uses := n.GetInput()
		if o := ops.Lookup(n.GetDomain(), n.GetOpType()); o != nil && o.Subgraphs {
			// The scoping of other ops' graph attributes is theirs to define.
			uses = append(append([]string(nil), uses...), ix.ImplicitInputs(i)...)
		}
		for _, in := range uses {
			if !defined[in] && ix.Producer(in) < 0 {
				return fmt.Errorf("graph %q: node %s reads value %q, which no node produces and which is neither a graph input nor an initializer; the model is corrupt or was edited by hand, export it again",
					g.GetName(), ix.NodeLabel(i), in)
			}
		}
	}
	for _, vi := range g.GetOutput() {
		if name := vi.GetName(); !defined[name] && ix.Producer(name) < 0 {
			return fmt.Errorf("graph %q: output %q is produced by no node and is neither a graph input nor an initializer; the model is corrupt, export it again", g.GetName(), name)
		}
	}
	return nil
}
