package execute

import (
	"fmt"
	"slices"

	"fp16audit/internal/onnx"
	"fp16audit/internal/rewrite"
)

// Segmented execution. Marking every value as an output keeps all of a
// batch's activations alive at once; to audit in bounded memory the
// topological order of the model's nodes is cut into contiguous segments,
// each run as its own ONNX Runtime session whose inputs are the values that
// cross into it (boundary values) and whose outputs are its observed values
// plus the values later segments need.
//
// Every pass graph (the upcast fp32 graph, the emulated graphs, the fix
// reruns) keeps the model's nodes at their indices and appends its own
// nodes (Upcast's boundary casts, Emulate's rounding casts, Instrument's
// casts) after them. A cut is a position in the model's order, so every
// pass cuts at the same places. An appended node lives in the segment of
// the latest producer of its inputs (as early as it can run): a rounded
// value is made where the value is made and crosses a boundary already
// rounded, exactly as the unsegmented graph's consumers see it. Appended
// nodes that read only graph inputs and initializers, and Constant nodes,
// float: a copy goes into every segment that uses them, as they are
// neither observed nor worth holding.

// passGraph is one pass's instrumented model, analysed for cutting.
type passGraph struct {
	name  string
	model *onnx.ModelProto
	idx   *onnx.Index
	obs   []rewrite.Observed
	// pos holds, per node, the position in the model's order of the
	// segment it belongs to, or -1 for a floating node.
	pos   []int
	inits map[string]bool // initializer names
	input map[string]bool // graph inputs that are not initializers
}

// newPassGraph analyses inst, the instrumented graph of a pass. nCore is
// the number of nodes of the model; order its topological order.
func newPassGraph(name string, inst *onnx.ModelProto, obs []rewrite.Observed, order []int, nCore int) (*passGraph, error) {
	idx, err := onnx.NewIndex(inst.Graph)
	if err != nil {
		return nil, err
	}
	g := inst.Graph
	pg := &passGraph{name: name, model: inst, idx: idx, obs: obs, pos: make([]int, len(g.Node)),
		inits: map[string]bool{}, input: map[string]bool{}}
	for _, t := range g.Initializer {
		pg.inits[t.Name] = true
	}
	for _, s := range g.SparseInitializer {
		pg.inits[s.GetValues().GetName()] = true
	}
	for _, vi := range g.Input {
		if !pg.inits[vi.Name] {
			pg.input[vi.Name] = true
		}
	}
	corePos := make([]int, nCore)
	for p, ni := range order {
		corePos[ni] = p
	}
	for _, ni := range idx.Order() {
		n := g.Node[ni]
		inPos := -1
		for _, in := range append(slices.Clone(n.Input), idx.ImplicitInputs(ni)...) {
			if p := idx.Producer(in); in != "" && p >= 0 {
				inPos = max(inPos, pg.pos[p])
			}
		}
		switch {
		case ni >= nCore:
			pg.pos[ni] = inPos
		case n.OpType == "Constant" && onnx.IsDefaultDomain(n.Domain):
			pg.pos[ni] = -1
		default:
			pg.pos[ni] = corePos[ni]
			if inPos > corePos[ni] {
				return nil, fmt.Errorf("%s pass: node %s reads a value made after it in the model's order", name, idx.NodeLabel(ni))
			}
		}
	}
	return pg, nil
}

// span is where one value that a node makes lives: made at position def,
// last read at position use (def when only its own segment reads it).
type span struct {
	name     string
	def, use int
}

// spans lists the values made by non-floating nodes with where they are
// read.
func (pg *passGraph) spans() []span {
	var out []span
	for ni, n := range pg.model.Graph.Node {
		if pg.pos[ni] < 0 {
			continue
		}
		for _, o := range n.Output {
			if o == "" {
				continue
			}
			use := pg.pos[ni]
			for _, c := range pg.idx.Consumers(o) {
				use = max(use, pg.pos[c])
			}
			out = append(out, span{name: o, def: pg.pos[ni], use: use})
		}
	}
	return out
}

// segGraph is one segment of one pass, ready to become a session.
type segGraph struct {
	model   *onnx.ModelProto
	inputs  []string // session inputs: graph inputs and boundary values
	outputs []string // session outputs: observed values, then boundary values
	// obs are the observed values this segment returns, in the pass's
	// observed order; obs[i] is session output i.
	obs []rewrite.Observed
}

// segment cuts segment s out of the pass graph: its nodes, the floating
// nodes they read, and the initializers they use. segOf maps a position in
// the model's order to its segment; boundary maps each value that crosses
// a cut to the last segment that reads it. rank0 lists the values known to be
// scalars, which are declared so (ONNX Runtime's scalar outputs cannot be
// read back otherwise).
func (pg *passGraph) segment(s int, segOf func(int) int, boundary map[string]int, rank0 map[string]bool) *segGraph {
	g := pg.model.Graph
	idx := pg.idx
	in := func(ni int) bool { return pg.pos[ni] >= 0 && segOf(pg.pos[ni]) == s }
	// Floating nodes that the segment's nodes read, transitively.
	take := map[int]bool{}
	var pull func(name string)
	pull = func(name string) {
		p := idx.Producer(name)
		if name == "" || p < 0 || pg.pos[p] >= 0 || take[p] {
			return
		}
		take[p] = true
		for _, x := range append(slices.Clone(g.Node[p].Input), idx.ImplicitInputs(p)...) {
			pull(x)
		}
	}
	for ni, n := range g.Node {
		if in(ni) {
			take[ni] = true
			for _, x := range append(slices.Clone(n.Input), idx.ImplicitInputs(ni)...) {
				pull(x)
			}
		}
	}
	sg := &segGraph{}
	ng := &onnx.GraphProto{Name: g.Name}
	made := map[string]bool{}
	for _, ni := range idx.Order() {
		if take[ni] {
			ng.Node = append(ng.Node, g.Node[ni])
			for _, o := range g.Node[ni].Output {
				made[o] = true
			}
		}
	}
	seen := map[string]bool{}
	decl := declarations(g)
	for _, ni := range idx.Order() {
		if !take[ni] {
			continue
		}
		for _, x := range append(slices.Clone(g.Node[ni].Input), idx.ImplicitInputs(ni)...) {
			if x == "" || made[x] || seen[x] {
				continue
			}
			seen[x] = true
			switch {
			case pg.inits[x]:
				if t := idx.Initializer(x); t != nil {
					ng.Initializer = append(ng.Initializer, t)
				} else {
					for _, sp := range g.SparseInitializer {
						if sp.GetValues().GetName() == x {
							ng.SparseInitializer = append(ng.SparseInitializer, sp)
						}
					}
				}
			case pg.input[x]:
				ng.Input = append(ng.Input, decl[x])
				sg.inputs = append(sg.inputs, x)
			default:
				ng.Input = append(ng.Input, boundaryInfo(x, idx.ElemType(x), rank0[x]))
				sg.inputs = append(sg.inputs, x)
			}
		}
	}
	outSeen := map[string]bool{}
	for _, o := range pg.obs {
		p := idx.Producer(o.Output)
		if p >= 0 && in(p) {
			sg.obs = append(sg.obs, o)
			sg.outputs = append(sg.outputs, o.Output)
			ng.Output = append(ng.Output, onnx.TypedValue(o.Output, int32(onnx.TensorProto_FLOAT)))
			outSeen[o.Output] = true
		}
	}
	var bnames []string
	for name, last := range boundary {
		if p := idx.Producer(name); p >= 0 && in(p) && last > s && !outSeen[name] {
			bnames = append(bnames, name)
		}
	}
	slices.Sort(bnames)
	for _, name := range bnames {
		sg.outputs = append(sg.outputs, name)
		ng.Output = append(ng.Output, boundaryInfo(name, idx.ElemType(name), rank0[name]))
	}
	for _, vi := range g.ValueInfo {
		if made[vi.Name] && !outSeen[vi.Name] && !slices.Contains(bnames, vi.Name) {
			ng.ValueInfo = append(ng.ValueInfo, vi)
		}
	}
	m := onnx.ShallowCopy(pg.model)
	m.Graph = ng
	sg.model = m
	return sg
}

// declarations maps every declared value of g to its ValueInfo.
func declarations(g *onnx.GraphProto) map[string]*onnx.ValueInfoProto {
	out := map[string]*onnx.ValueInfoProto{}
	for _, list := range [][]*onnx.ValueInfoProto{g.ValueInfo, g.Output, g.Input} {
		for _, vi := range list {
			out[vi.Name] = vi
		}
	}
	return out
}

// boundaryInfo declares a boundary value: its element type and, for a
// scalar, its (empty) shape; other shapes are left open, as they change
// with the batch.
func boundaryInfo(name string, elem int32, scalar bool) *onnx.ValueInfoProto {
	if scalar {
		return onnx.ScalarValue(name, elem)
	}
	return onnx.TypedValue(name, elem)
}

// segPlan is where the passes are cut and what that costs.
type segPlan struct {
	cuts []int // segment s is positions [cuts[s], cuts[s+1])
	// boundary maps, per pass, each value that crosses a cut to the last
	// segment that reads it.
	boundary []map[string]int
	rank0    map[string]bool
	// peak is the planned memory of the costliest segment; perPass the
	// observed bytes of one batch in each pass, unsegmented.
	peak    int64
	perPass []int64
	// maxSet is the most observed bytes one pass holds in one segment.
	maxSet  int64
	weights int64 // initializers of the model, once
	// unknown counts values whose size is not known (not in the estimate).
	unknown int
}

func (p *segPlan) segments() int { return len(p.cuts) - 1 }

func (p *segPlan) segOf(pos int) int {
	s, _ := slices.BinarySearch(p.cuts, pos+1)
	return s - 1
}

// planInput is what the planner needs about each pass.
type planInput struct {
	graphs  []*passGraph
	sizes   []map[string]int64 // per pass: bytes of each value (max over batches)
	rank0   map[string]bool
	nodes   int // positions in the model's order
	batches int
	// sets is how many passes' observed values are alive at once.
	sets int
}

// planSegments cuts the order into segments whose planned memory fits
// budget (0: one segment). A segment's memory is the observed values of
// sets passes, the boundary values it reads and writes for every pass and
// batch, and its initializers in every pass's session. A single position
// that alone exceeds the budget becomes a segment of its own.
func planSegments(in planInput, budget int64) *segPlan {
	n := in.nodes
	np := len(in.graphs)
	plan := &segPlan{rank0: in.rank0, perPass: make([]int64, np)}
	obs := make([][]int64, np) // prefix sums of observed bytes by position
	live := make([]int64, n+2) // bytes crossing cut c (all passes, one batch), as a difference array
	bad := make([]int, n+2)    // values that cannot cross cut c
	initsAt := make([][]string, n)
	initBytes := map[string]int64{}
	spans := make([][]span, np)
	for pi, pg := range in.graphs {
		obs[pi] = make([]int64, n+1)
		at := make([]int64, n)
		for _, o := range pg.obs {
			if p := pg.idx.Producer(o.Output); p >= 0 && pg.pos[p] >= 0 {
				b, ok := in.sizes[pi][o.Output]
				if !ok {
					plan.unknown++
				}
				at[pg.pos[p]] += b
			}
		}
		for p := range n {
			obs[pi][p+1] = obs[pi][p] + at[p]
		}
		plan.perPass[pi] = obs[pi][n]
		spans[pi] = pg.spans()
		for _, sp := range spans[pi] {
			if sp.use <= sp.def {
				continue
			}
			b, known := in.sizes[pi][sp.name]
			live[sp.def+1] += b
			live[sp.use+1] -= b
			if t := pg.idx.ElemType(sp.name); !known || t == 0 || onnx.IsHalfType(t) {
				bad[sp.def+1]++
				bad[sp.use+1]--
			}
		}
		if pi == 0 {
			g := pg.model.Graph
			for ni, nd := range g.Node {
				if pg.pos[ni] < 0 {
					continue
				}
				for _, x := range nd.Input {
					if t := pg.idx.Initializer(x); t != nil {
						initsAt[pg.pos[ni]] = append(initsAt[pg.pos[ni]], x)
						initBytes[x] = onnx.TensorBytes(t)
					}
				}
			}
			for _, t := range g.Initializer {
				plan.weights += onnx.TensorBytes(t)
			}
		}
	}
	for c := 1; c <= n+1; c++ {
		live[c] += live[c-1]
		bad[c] += bad[c-1]
	}
	cost := func(a, b int, w int64) int64 {
		var most int64
		for pi := range np {
			most = max(most, obs[pi][b]-obs[pi][a])
		}
		c := int64(in.sets)*most + int64(np)*w
		if a > 0 {
			c += int64(in.batches) * live[a]
		}
		if b < n {
			c += int64(in.batches) * live[b]
		}
		return c
	}
	plan.cuts = []int{0}
	for a := 0; a < n; {
		best, bestCost := -1, int64(0)
		held := map[string]bool{}
		var w int64
		for b := a + 1; b <= n; b++ {
			for _, x := range initsAt[b-1] {
				if !held[x] {
					held[x] = true
					w += initBytes[x]
				}
			}
			if b < n && (bad[b] > 0 || budget == 0) {
				continue
			}
			c := cost(a, b, w)
			if best < 0 || c <= budget {
				best, bestCost = b, c
				continue
			}
			if c-int64(in.batches)*(live[a]+live[b]) > budget {
				break // the part that only grows is already over
			}
		}
		if best < 0 {
			best = n
			bestCost = cost(a, n, w)
		}
		plan.peak = max(plan.peak, bestCost)
		for pi := range np {
			plan.maxSet = max(plan.maxSet, obs[pi][best]-obs[pi][a])
		}
		plan.cuts = append(plan.cuts, best)
		a = best
	}
	plan.boundary = make([]map[string]int, np)
	for pi := range in.graphs {
		plan.boundary[pi] = map[string]int{}
		for _, sp := range spans[pi] {
			if d, u := plan.segOf(sp.def), plan.segOf(sp.use); u > d {
				plan.boundary[pi][sp.name] = u
			}
		}
	}
	return plan
}
