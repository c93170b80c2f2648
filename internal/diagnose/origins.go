package diagnose

import (
	"sort"

	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
)

// origin is a node where non-finite values start in one pass: one of its
// outputs holds NaN/Inf while all of its inputs are finite.
type origin struct {
	node int
	// affected are the nodes downstream of the origin whose outputs hold
	// NaN/Inf in the same pass, in topological order; outputs the graph
	// outputs among their values.
	affected []int
	outputs  []string
}

// findOrigins walks the graph in topological order and returns every origin
// of non-finite values in res. Values fp16audit did not observe (integer
// values, initializers) count as finite. Propagation is followed through
// consumers, so independent origins are all reported, each with the nodes it
// reached.
func findOrigins(g *onnx.GraphProto, order []int, res *observe.PassResult, consumers func(string) []int) []origin {
	nonFinite := func(name string) bool {
		s, ok := res.Stats[name]
		return ok && s.NonFinite() > 0
	}
	isGraphOutput := map[string]bool{}
	for _, o := range g.Output {
		isGraphOutput[o.Name] = true
	}
	pos := make(map[int]int, len(order))
	for p, ni := range order {
		pos[ni] = p
	}
	claimed := map[int]bool{}
	var origins []origin
	for _, ni := range order {
		n := g.Node[ni]
		if claimed[ni] {
			continue
		}
		bad := false
		for _, o := range n.Output {
			if nonFinite(o) {
				bad = true
				break
			}
		}
		if !bad {
			continue
		}
		clean := true
		for _, in := range n.Input {
			if in != "" && nonFinite(in) {
				clean = false
				break
			}
		}
		if !clean {
			continue
		}
		o := origin{node: ni}
		// Breadth-first over consumers whose outputs are non-finite.
		seen := map[int]bool{ni: true}
		queue := []int{ni}
		for len(queue) > 0 {
			cur := queue[0]
			queue = queue[1:]
			for _, out := range g.Node[cur].Output {
				if !nonFinite(out) {
					continue
				}
				if isGraphOutput[out] {
					o.outputs = append(o.outputs, out)
				}
				for _, c := range consumers(out) {
					if seen[c] {
						continue
					}
					seen[c] = true
					queue = append(queue, c)
					bad := false
					for _, co := range g.Node[c].Output {
						if nonFinite(co) {
							bad = true
						}
					}
					if bad {
						claimed[c] = true
						o.affected = append(o.affected, c)
					}
				}
			}
		}
		sortByPos(o.affected, pos)
		origins = append(origins, o)
	}
	return origins
}

func sortByPos(nodes []int, pos map[int]int) {
	sort.Slice(nodes, func(a, b int) bool { return pos[nodes[a]] < pos[nodes[b]] })
}
