package statsop

import (
	"fmt"
	"slices"

	"fp16audit/internal/onnx"
)

// Splitting a plan into blocks. A model whose weights do not fit in memory
// at once runs as consecutive blocks of its nodes, each in a session of its
// own that loads only the weights its nodes read: the values that cross
// from one block to a later one are returned by the first and fed to the
// second. Every pass's copy of a model node belongs to the block of that
// model node, so all passes still run side by side, and every Observe node
// sits in the block that makes the values it reads; a block's records are
// therefore those of the values it makes, and equal, bit for bit, what the
// whole plan records for them.

// Block is one block of a split plan. Its Plan holds the block's nodes, the
// initializers they read, the Outputs whose Observe nodes it holds (under
// the whole plan's record slots) and, as Hand, the values it returns.
type Block struct {
	Plan *Plan
	// Inputs are the values its graph takes, in the order a session of it
	// takes them: the whole plan's graph inputs it reads, then the values
	// earlier blocks hand on.
	Inputs []string
	// Handed marks the inputs that earlier blocks return (the rest are
	// the plan's graph inputs).
	Handed map[string]bool
}

// Split cuts p into blocks. pin gives, for each node of p's graph, its
// block, or -1 for a node to be placed by its data (a value's rounding,
// cast or Observe node joins the latest block of the values it reads).
// Nodes that compute constants (a weight's Identity or rounding, a
// Constant) are copied into every block that reads them, so that no
// constant crosses a cut. It fails when a node reads a value made in a
// later block.
func Split(p *Plan, pin []int) ([]*Block, error) {
	g := p.Model.Graph
	if len(pin) != len(g.Node) {
		return nil, fmt.Errorf("split: %d block numbers for %d nodes", len(pin), len(g.Node))
	}
	ix, err := onnx.NewIndex(g)
	if err != nil {
		return nil, err
	}
	order := ix.Order()
	reads := func(i int) []string {
		return append(slices.Clone(g.Node[i].Input), ix.ImplicitInputs(i)...)
	}
	constant := ix.ConstantNodes(func(n *onnx.NodeProto) bool { return n.Domain == Domain && n.OpType == OpRound })
	block := make([]int, len(g.Node))
	blocks := 0
	for _, i := range order {
		if constant[i] {
			continue
		}
		b := 0
		for _, in := range reads(i) {
			if pr := ix.Producer(in); in != "" && pr >= 0 && !constant[pr] {
				b = max(b, block[pr])
			}
		}
		if pin[i] >= 0 {
			if pin[i] < b {
				return nil, fmt.Errorf("split: node %s in block %d reads a value made in the later block %d", ix.NodeLabel(i), pin[i], b)
			}
			b = pin[i]
		}
		block[i] = b
		blocks = max(blocks, b+1)
	}
	// Blocks left with constants only (or nothing) are dropped.
	rank := make([]int, blocks)
	for _, i := range order {
		if !constant[i] {
			rank[block[i]] = 1
		}
	}
	for b := 1; b < blocks; b++ {
		rank[b] += rank[b-1]
	}
	for i := range block {
		if !constant[i] {
			block[i] = rank[block[i]] - 1
		}
	}
	if blocks > 0 {
		blocks = rank[blocks-1]
	}
	// in[i] are the blocks a constant node i is copied into: those of its
	// readers.
	in := make([]map[int]bool, len(g.Node))
	for k := len(order) - 1; k >= 0; k-- {
		i := order[k]
		if !constant[i] {
			continue
		}
		in[i] = map[int]bool{}
		for _, o := range g.Node[i].Output {
			for _, c := range ix.Consumers(o) {
				if constant[c] {
					for b := range in[c] {
						in[i][b] = true
					}
				} else {
					in[i][block[c]] = true
				}
			}
		}
	}
	// last[v] is the last block that reads value v; a graph output is read
	// after every block.
	last := map[string]int{}
	for i := range g.Node {
		if constant[i] {
			continue
		}
		for _, in := range reads(i) {
			if in != "" {
				last[in] = max(last[in], block[i])
			}
		}
	}
	for _, vi := range g.Output {
		last[vi.Name] = blocks
	}
	graphInput := map[string]*onnx.ValueInfoProto{}
	for _, vi := range g.Input {
		graphInput[vi.Name] = vi
	}
	observed := map[string]int{} // Observe node output → index in p.Outputs
	for k, o := range p.Outputs {
		observed[o.Name] = k
	}
	out := make([]*Block, blocks)
	seen := make([]map[string]bool, blocks)
	handed := make([][]string, blocks)
	for b := range out {
		bg := &onnx.GraphProto{Name: fmt.Sprintf("%s::block%d", g.Name, b)}
		bp := &Plan{Records: p.Records, Declared: p.Declared, Weights: p.Weights, Model: &onnx.ModelProto{IrVersion: p.Model.IrVersion, ProducerName: p.Model.ProducerName,
			ProducerVersion: p.Model.ProducerVersion, OpsetImport: p.Model.OpsetImport, Functions: p.Model.Functions, Graph: bg}}
		out[b] = &Block{Plan: bp, Handed: map[string]bool{}}
		seen[b] = map[string]bool{}
	}
	add := func(b, i int) {
		n := g.Node[i]
		bg := out[b].Plan.Model.Graph
		bg.Node = append(bg.Node, n)
		out[b].Plan.Origin = append(out[b].Plan.Origin, p.Origin[i])
		for _, in := range reads(i) {
			if in == "" || seen[b][in] {
				continue
			}
			seen[b][in] = true
			switch pr := ix.Producer(in); {
			case pr >= 0 && (constant[pr] || block[pr] == b):
			case pr >= 0:
				handed[b] = append(handed[b], in)
				out[b].Handed[in] = true
			case graphInput[in] != nil:
				bg.Input = append(bg.Input, graphInput[in])
				out[b].Inputs = append(out[b].Inputs, in)
			case ix.Initializer(in) != nil:
				bg.Initializer = append(bg.Initializer, ix.Initializer(in))
			default:
				// A sparse initializer, or an outer value a subgraph reads.
				for _, s := range g.SparseInitializer {
					if s.GetValues().GetName() == in {
						bg.SparseInitializer = append(bg.SparseInitializer, s)
					}
				}
			}
		}
		if constant[i] {
			return
		}
		for _, o := range n.Output {
			if o != "" && last[o] > b {
				out[b].Plan.Hand = append(out[b].Plan.Hand, o)
				bg.Output = append(bg.Output, &onnx.ValueInfoProto{Name: o, Type: typeOf(ix, o)})
			}
		}
		if len(n.Output) == 1 && n.Domain == Domain && n.OpType == OpObserve {
			if k, ok := observed[n.Output[0]]; ok {
				out[b].Plan.Outputs = append(out[b].Plan.Outputs, p.Outputs[k])
			}
		}
	}
	for i := range g.Node {
		if !constant[i] {
			add(block[i], i)
			continue
		}
		for b := range blocks {
			if in[i][b] {
				add(b, i)
			}
		}
	}
	for b, blk := range out {
		blk.Inputs = append(blk.Inputs, handed[b]...)
		used := seen[b]
		for _, n := range blk.Plan.Model.Graph.Node {
			for _, o := range n.Output {
				used[o] = true
			}
		}
		for _, vi := range g.ValueInfo {
			if used[vi.Name] && !blk.Handed[vi.Name] {
				blk.Plan.Model.Graph.ValueInfo = append(blk.Plan.Model.Graph.ValueInfo, vi)
			}
		}
	}
	// A block that returns nothing has no effect.
	return slices.DeleteFunc(out, func(b *Block) bool { return len(b.Plan.Hand) == 0 }), nil
}

// typeOf is the declared or inferred tensor type of a value, nil when
// unknown (ONNX Runtime infers it).
func typeOf(ix *onnx.Index, name string) *onnx.TypeProto {
	t := ix.ElemType(name)
	if t == 0 {
		return nil
	}
	return onnx.TypedValue(name, t).Type
}

// Typed returns the block's plan with the inputs earlier blocks hand on
// declared as tensors of the element types elem gives: what those blocks
// returned, known once they ran.
func (b *Block) Typed(elem func(name string) int32) *Plan {
	c := *b.Plan
	c.Model = onnx.ShallowCopy(b.Plan.Model)
	for _, name := range b.Inputs {
		if b.Handed[name] {
			c.Model.Graph.Input = append(c.Model.Graph.Input, onnx.TypedValue(name, elem(name)))
		}
	}
	return &c
}
