package execute

import (
	"context"
	"fmt"
	"math"
	"slices"
	"unsafe"

	"fp16audit/internal/batch"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/ortcapi"
	"fp16audit/internal/statsop"
	"fp16audit/internal/tensor"
)

// Out of core. When the weights and one run of the passes do not fit in
// the budget together, the model runs as blocks of consecutive nodes of
// its topological order, one after another, each in a session of its own
// that holds only the weights its nodes read (ONNX Runtime maps them from
// the external data file when the session is created and unmaps them when
// it is closed). Every batch, or part of one, runs through a block before
// the next block's session is created; the values that cross a cut are
// copied out of ONNX Runtime and handed to the later block that reads them.
// Every pass runs in every block, side by side as in one session, and every
// value's statistics are taken in the block that makes it, so they equal
// the one-session run's bit for bit.
//
// The cuts go where few values cross: between the repeated blocks of a
// transformer only the residual stream and the masks do.

// profile is the memory of one run of the reference pass along the model's
// topological order, with everything a cut there needs.
type profile struct {
	order []int // the graph's topological order
	// live[j] is what the values hold while the node at position j runs
	// (its outputs and every value still to be read).
	live []int64
	// cross[j] and count[j] are the bytes and the number of values made
	// before position j and read at or after it: what a cut before
	// position j hands on (j = len(order): the graph's outputs).
	cross []int64
	count []int
	// inits[j] are the initializers the node at position j reads, with
	// their sizes in bytes.
	inits [][]string
	bytes map[string]int64
	// constant[j] is whether the node at position j computes a constant
	// (see onnx.Index.ConstantNodes).
	constant []bool
	// unknown is the number of values of unknown size (counted as 0).
	unknown int
	// held[j] is the number of sequences and optionals among what a cut
	// before position j would hand on: ONNX Runtime hands a later block
	// tensors only, so no cut goes where one is (see cuttable).
	held []int
}

// cuttable reports whether a cut before position j hands on tensors
// only.
func (p *profile) cuttable(j int) bool { return j >= len(p.held) || p.held[j] == 0 }

// newProfile measures g's values of shapes sh along idx's order; weight
// gives the memory a session holds for an initializer.
func newProfile(g *onnx.GraphProto, idx *onnx.Index, sh map[string][]int64, weight func(*onnx.TensorProto) int64) *profile {
	order := idx.Order()
	n := len(order)
	p := &profile{order: order, live: make([]int64, n), cross: make([]int64, n+1), count: make([]int, n+1),
		inits: make([][]string, n), bytes: map[string]int64{}, constant: make([]bool, n), held: make([]int, n+1)}
	tensorSize := func(name string) (int64, bool) {
		s, ok := sh[name]
		if !ok {
			return 0, false
		}
		es := int64(tensor.DType(idx.ElemType(name)).Size())
		if es == 0 {
			es = 4
		}
		return tensor.NumElements(s) * es, true
	}
	// A sequence holds copies of the tensors put into it (ONNX Runtime's
	// SplitToSequence copies its pieces out).
	contents := idx.Contents()
	size := func(name string) (int64, bool) {
		if idx.Tensor(name) {
			return tensorSize(name)
		}
		held, ok := contents[name]
		if !ok || len(held) == 0 {
			return 0, false
		}
		var total int64
		for _, v := range held {
			b, ok := tensorSize(v)
			if !ok {
				return 0, false
			}
			total += b
		}
		return total, true
	}
	// Constants (a weight's Identity, a Constant, shapes of weights) are
	// computed again in every block that reads them: they neither cross a
	// cut nor stay live, and their weights count where they are read.
	constant := idx.ConstantNodes(nil)
	fromInits := map[string][]string{}
	readers := make(map[string]int, len(g.Node))
	lastRead := make(map[string]int, len(g.Node))
	readsAt := make([][]string, len(order))
	for j, ni := range order {
		readsAt[j] = reads(g, idx, ni)
		for _, v := range readsAt[j] {
			readers[v]++
			lastRead[v] = j
		}
	}
	for _, vi := range g.Output {
		lastRead[vi.Name] = n
	}
	var live int64
	for j, ni := range order {
		node := g.Node[ni]
		var inits []string
		for _, in := range readsAt[j] {
			if t := idx.Initializer(in); t != nil {
				if _, ok := p.bytes[in]; !ok {
					p.bytes[in] = weight(t)
				}
				inits = append(inits, in)
			}
			for _, w := range fromInits[in] {
				if !slices.Contains(inits, w) {
					inits = append(inits, w)
				}
			}
		}
		if constant[ni] {
			p.constant[j] = true
			for _, o := range node.Output {
				fromInits[o] = inits
			}
			if j > 0 {
				p.live[j] = p.live[j-1]
			}
			continue
		}
		p.inits[j] = inits
		for _, o := range node.Output {
			if o == "" {
				continue
			}
			b, ok := size(o)
			if !ok {
				p.unknown++
			}
			live += b
			if last, ok := lastRead[o]; ok && last > j {
				// It crosses every cut after it up to its last reader.
				p.cross[j+1] += b
				p.count[j+1]++
				if last < n {
					p.cross[last+1] -= b
					p.count[last+1]--
				}
				if !idx.Tensor(o) {
					p.held[j+1]++
					if last < n {
						p.held[last+1]--
					}
				}
			}
		}
		p.live[j] = live
		for _, in := range readsAt[j] {
			if pr := idx.Producer(in); pr < 0 || constant[pr] {
				continue
			}
			if readers[in]--; readers[in] == 0 {
				b, _ := size(in)
				live -= b
			}
		}
	}
	for j := 1; j <= n; j++ {
		p.cross[j] += p.cross[j-1]
		p.count[j] += p.count[j-1]
		p.held[j] += p.held[j-1]
	}
	return p
}

// reads lists the values node i of g reads, each once: its inputs and the
// outer values its subgraphs read.
func reads(g *onnx.GraphProto, idx *onnx.Index, i int) []string {
	out := make([]string, 0, len(g.Node[i].Input))
	for _, list := range [][]string{g.Node[i].Input, idx.ImplicitInputs(i)} {
		for _, in := range list {
			if in != "" && !slices.Contains(out, in) {
				out = append(out, in)
			}
		}
	}
	return out
}

// peak is the most the values hold at once.
func (p *profile) peak() int64 {
	if len(p.live) == 0 {
		return 0
	}
	return slices.Max(p.live)
}

// roundedWeights returns, per model node (index < nodes), the bytes of the
// rounded copies of weights the passes make for it: an emulated pass
// rounds a weight an fp16 op reads right before the op, and the copy lives
// until the op has run (the fp32 reference rounds nothing).
func roundedWeights(passes []Pass, nodes int) (map[int]int64, error) {
	out := map[int]int64{}
	for _, p := range passes {
		g := p.Model.Graph
		idx, err := onnx.NewIndex(g)
		if err != nil {
			return nil, err
		}
		for _, n := range g.Node {
			if n.OpType != "Cast" || !onnx.IsDefaultDomain(n.Domain) || len(n.Input) != 1 || len(n.Output) != 1 {
				continue
			}
			t := idx.Initializer(n.Input[0])
			if t == nil || !onnx.IsHalfType(int32(onnx.IntAttr(n, "to", 0))) {
				continue
			}
			// The weight rounded to half (Cast) and back to float, as
			// the combined graph's Round computes it: 4 bytes an element.
			size := onnx.TensorBytes(t) / int64(max(tensor.DType(t.DataType).Size(), 1)) * 4
			var consumers []int
			for _, back := range idx.Consumers(n.Output[0]) {
				consumers = append(consumers, idx.Consumers(g.Node[back].Output[0])...)
			}
			for _, c := range consumers {
				if c < nodes {
					out[c] += size
				}
			}
		}
	}
	return out, nil
}

// blockPlan cuts the model's order into blocks.
type blockPlan struct {
	prof *profile
	// starts[b] is the position in prof.order where block b starts; the
	// last block ends with the order.
	starts []int
	// cost[b] is block b's estimate: its weights, its values and what is
	// handed on around it.
	cost []int64
	// ran is the number of blocks that ran: those with more than
	// constants to compute.
	ran int
	// bySize says the blocks were cut for the size of the sessions
	// alone (MaxSessionNodes), not for the budget: the run is in core,
	// and the pages of a block's weights stay mapped for the next pass.
	bySize bool
}

// blockOf returns the block of every node index of the profiled graph.
func (bp *blockPlan) blockOf() map[int]int {
	out := map[int]int{}
	b := 0
	for j, ni := range bp.prof.order {
		for b+1 < len(bp.starts) && bp.starts[b+1] <= j {
			b++
		}
		out[ni] = b
	}
	return out
}

// blockError says which block did not fit, naming both sizes.
type blockError struct {
	node   string
	need   int64
	budget int64
}

func (e *blockError) Error() string {
	return fmt.Sprintf("the block at node %s alone needs an estimated %s, above the %s the budget leaves", e.node, FormatSize(e.need), FormatSize(e.budget))
}

// blockCost is the estimate of a block of positions [s, e) of the order
// for runs of step samples: the weights its nodes read, the rounded copies
// of one node's weights, its values (with the arena's margin) and what the
// other runs hand on around it (values crossing its two cuts, in every
// pass, held between the blocks' runs).
func (m *MemoryPlan) blockCost(s, e int, step int64, weights map[string]bool) int64 {
	p := m.prof
	var w, r, live int64
	for name := range weights {
		w += p.bytes[name]
	}
	for j := s; j < e; j++ {
		r = max(r, m.roundedBy[p.order[j]])
		live = max(live, p.live[j])
	}
	scale := float64(step) / float64(max(m.samples, 1))
	// The current run's values crossing in are among its live values;
	// the other runs' wait, on either side of the block.
	held := float64(p.cross[s]+p.cross[e]) * float64(len(m.passes)) * float64(m.all-step) / float64(max(m.samples, 1))
	return int64(blockMargin*float64(w+r) + partMargin*m.factor*float64(live)*scale + held)
}

// blockMargin is what a block's session holds beyond its weights and the
// rounded copies, as a factor of them: ONNX Runtime's arena rounds the
// rounded copies up, and the copies of the nodes run close together may
// overlap (measured on the 600 M decoder of BenchmarkLLM: up to 1.07).
const blockMargin = 1.1

// cut chooses the blocks for runs of step samples: each block as long as
// the budget allows, ended at the cut within it where the fewest values
// cross (the latest of equals), so that a transformer is cut between its
// layers, and never where a sequence or an optional crosses. It fails
// when a single node does not fit.
func (m *MemoryPlan) cut(step int64) (*blockPlan, *blockError) {
	p := m.prof
	n := len(p.order)
	room := m.budget - m.resident
	if m.bySize {
		room = math.MaxInt64
	}
	bp := &blockPlan{prof: p}
	for s := 0; s < n; {
		weights := map[string]bool{}
		e := s
		var cost int64
		for e < n {
			for _, w := range p.inits[e] {
				weights[w] = true
			}
			c := m.blockCost(s, e+1, step, weights)
			if c > room || (m.maxBlock > 0 && e-s >= m.maxBlock) {
				break
			}
			e, cost = e+1, c
		}
		if e == s {
			return nil, &blockError{node: nodeLabel(m, p.order[s]), need: m.blockCost(s, s+1, step, weights), budget: room}
		}
		if e < n {
			// The latest of the cuts where the fewest values (then the
			// fewest bytes) cross, in the block's second half, so that
			// blocks stay long (a cut among the first nodes, where
			// little is live yet, would make a block of a few nodes),
			// and after at least one node that is not a constant (a
			// block of constants only would do nothing).
			fewer := func(a, b int) bool {
				return p.count[a] < p.count[b] || p.count[a] == p.count[b] && p.cross[a] < p.cross[b]
			}
			first := s + (e-s)/2
			for first < e && p.constant[first] {
				first++
			}
			best := -1
			for c := e; c > first; c-- {
				if p.cuttable(c) && (best < 0 || fewer(c, best)) {
					best = c
				}
			}
			// where a sequence crosses every cut of the second half, the
			// latest cut before it, else the first after it (over the
			// budget: a sequence lives across a few nodes only)
			for c := first; best < 0 && c > s; c-- {
				if p.cuttable(c) {
					best = c
				}
			}
			for c := e + 1; best < 0; c++ {
				if c >= n || p.cuttable(c) {
					best = c
				}
			}
			if best != e {
				weights = map[string]bool{}
				for j := s; j < best; j++ {
					for _, w := range p.inits[j] {
						weights[w] = true
					}
				}
				cost = m.blockCost(s, best, step, weights)
			}
			e = best
		}
		bp.starts = append(bp.starts, s)
		bp.cost = append(bp.cost, cost)
		s = e
	}
	return bp, nil
}

// cutEvery cuts the order into k blocks of about equal numbers of nodes
// (tests use it to run small models in blocks), each cut moved on past
// the sequences and optionals that cross it.
func (m *MemoryPlan) cutEvery(k int) *blockPlan {
	n := len(m.prof.order)
	k = max(1, min(k, n))
	bp := &blockPlan{prof: m.prof}
	for b := range k {
		j := b * n / k
		for j < n && !m.prof.cuttable(j) {
			j++
		}
		if j >= n || (b > 0 && j <= bp.starts[len(bp.starts)-1]) {
			continue
		}
		bp.starts = append(bp.starts, j)
		bp.cost = append(bp.cost, 0)
	}
	return bp
}

func nodeLabel(m *MemoryPlan, i int) string {
	if m.nodeName != nil {
		return m.nodeName(i)
	}
	return fmt.Sprint(i)
}

// job is one run through the blocks: a batch or a part of one (or a
// probe run of its first samples), with the values earlier blocks handed
// on for it.
type job struct {
	batch  int
	lo, n  int64
	inputs []*tensor.Tensor
	held   map[string]*tensor.Tensor
	// probe is 1 or 2 for the shape probe's runs of one and two samples,
	// whose records give shapes only.
	probe int
}

// runBlocks runs the passes of plan over the batches block by block:
// every batch (or part of one) through a block, then the next block.
func (e *Engine) runBlocks(ctx context.Context, rt *ortcapi.Runtime, plan *statsop.Plan, mp *MemoryPlan, batches []batch.Batch, results []*observe.PassResult, cmp []comparison) error {
	bo := mp.blocks.blockOf()
	pin := make([]int, len(plan.Origin))
	for i, o := range plan.Origin {
		pin[i] = -1
		if o >= 0 && o < e.Nodes {
			pin[i] = bo[o]
		}
	}
	blocks, err := statsop.Split(plan, pin)
	if err != nil {
		return err
	}
	mp.blocks.ran = len(blocks)
	// The last block that reads each handed value: it is dropped after.
	lastUse := map[string]int{}
	for b, blk := range blocks {
		for _, in := range blk.Inputs {
			if blk.Handed[in] {
				lastUse[in] = b
			}
		}
	}
	jobs, err := e.jobs(mp, batches)
	if err != nil {
		return err
	}
	opts, err := e.options()
	if err != nil {
		return err
	}
	r := &blockRun{e: e, rt: rt, mp: mp, batches: batches, results: results, lastUse: lastUse, probe: newShapeProbe(), graph: plan.Model.Graph,
		probed: map[string][2][]int64{}, fetch: plan.Fetch, cmp: cmp}
	for b, blk := range blocks {
		if err := ctx.Err(); err != nil {
			return err
		}
		typed := blk.Typed(func(name string) int32 {
			if t := jobs[0].held[name]; t != nil {
				return int32(t.DType)
			}
			return 0 // not returned: ONNX Runtime refuses the block and says which
		})
		sess, err := e.newSession(rt, typed, blk.Inputs, opts)
		if err != nil {
			return &createError{fmt.Errorf("block %d of %d: %w", b+1, len(blocks), err)}
		}
		// An interrupt stops the run in flight, not only the next one.
		detach := sess.StopOn(ctx)
		err = r.block(ctx, sess, b, blk, jobs)
		detach()
		sess.Close()
		// Out of core, the process holds one block's weights at a time.
		if !mp.blocks.bySize {
			e.Weights.Drop(typed.Model.Graph.Initializer)
		}
		if err != nil {
			return fmt.Errorf("block %d of %d: %w", b+1, len(blocks), err)
		}
	}
	if e.Progress != nil {
		for bi := range batches {
			for _, p := range results {
				e.Progress(p.Name, bi+1, len(batches))
			}
		}
	}
	if mp.step > 0 {
		e.note("batches larger than %d samples ran in parts of %d samples to stay within the memory budget (%s); their maxima and counts merge exactly, their sums round per part", mp.step, mp.step, FormatSize(mp.budget))
	}
	return nil
}

// jobs lists the runs every block makes: each batch whole or in the
// plan's parts, after the shape probe's two runs when parts need shapes
// the inference could not give.
func (e *Engine) jobs(mp *MemoryPlan, batches []batch.Batch) ([]*job, error) {
	var jobs []*job
	needProbe := false
	for bi, b := range batches {
		size := b.Size()
		step := mp.subBatch(size)
		for lo := int64(0); lo < size; lo += step {
			n := min(step, size-lo)
			part := b.Inputs
			if n < size {
				var err error
				if part, err = batch.Cut(b.Inputs, lo, n); err != nil {
					return nil, err
				}
				needProbe = needProbe || !mp.knows(bi, e.Observe)
			}
			jobs = append(jobs, &job{batch: bi, lo: lo, n: n, inputs: part, held: map[string]*tensor.Tensor{}})
		}
	}
	if !needProbe {
		return jobs, nil
	}
	// The probe's runs go first: the first sample, then the first two, of
	// a batch that has two.
	bi := slices.IndexFunc(batches, func(b batch.Batch) bool { return b.Size() >= 2 })
	var probe []*job
	for n := int64(1); n <= 2; n++ {
		part, err := batch.Cut(batches[bi].Inputs, 0, n)
		if err != nil {
			return nil, err
		}
		probe = append(probe, &job{batch: bi, n: n, inputs: part, held: map[string]*tensor.Tensor{}, probe: int(n)})
	}
	return append(probe, jobs...), nil
}

// knows reports whether the shape inference sized every value of names
// for batch bi.
func (m *MemoryPlan) knows(bi int, names []string) bool {
	for _, v := range names {
		if _, ok := m.inferred[bi][v]; !ok {
			return false
		}
	}
	return true
}

// blockRun is the state of runBlocks across blocks.
type blockRun struct {
	e       *Engine
	rt      *ortcapi.Runtime
	mp      *MemoryPlan
	batches []batch.Batch
	results []*observe.PassResult
	// graph is the whole plan's, whose nodes a failure names.
	graph   *onnx.GraphProto
	lastUse map[string]int
	// probed holds the probe runs' shapes of each value (one sample, two
	// samples), probe what they tell.
	probed map[string][2][]int64
	probe  *shapeProbe
	// fetch are the whole plan's graph outputs, which the last block
	// returns among the values it hands on, and cmp the comparisons of
	// those outputs (see compareHeld).
	fetch []statsop.Fetch
	cmp   []comparison
}

// block runs every job through one block's session and folds the records
// of the values the block makes.
func (r *blockRun) block(ctx context.Context, sess *statsop.Session, b int, blk *statsop.Block, jobs []*job) error {
	plan := sess.Plan()
	var m *statsop.Merger
	for _, j := range jobs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.run(sess, b, blk, j); err != nil {
			return err
		}
		size := r.batches[j.batch].Size()
		switch {
		case j.probe > 0:
			for i, o := range plan.Outputs {
				sh, ok := sess.Record(i, 0).Shape()
				if !ok {
					return fmt.Errorf("value %q: its rank is too large to merge parts of a batch", o.Value)
				}
				got := r.probed[o.Value]
				got[j.probe-1] = sh
				r.probed[o.Value] = got
				if j.probe == 2 {
					r.probe.add(o.Value, got[0], got[1])
				}
			}
		case j.n == size:
			foldRun(sess, plan, r.results, j.batch)
		default:
			if j.lo == 0 {
				m = statsop.NewMerger(plan, j.batch, size, r.full(j.batch, size))
			}
			if err := m.Add(sess, j.n); err != nil {
				return fmt.Errorf("batch %s, samples %d to %d: %w", r.batches[j.batch].Source, j.lo, j.lo+j.n-1, err)
			}
			if j.lo+j.n == size {
				if err := mergeInto(plan, m, r.results); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// full is the shape of every observed value for batch bi of size samples:
// inferred, or measured by the probe where the inference could not.
func (r *blockRun) full(bi int, size int64) map[string][]int64 {
	out := r.probe.full(size)
	for v, sh := range r.mp.inferred[bi] {
		if _, ok := out[v]; !ok {
			out[v] = sh
		}
	}
	return out
}

// run runs one job through a block and keeps what the block hands on.
func (r *blockRun) run(sess *statsop.Session, b int, blk *statsop.Block, j *job) error {
	ins := make([]*tensor.Tensor, len(blk.Inputs))
	for k, name := range blk.Inputs {
		if blk.Handed[name] {
			ins[k] = j.held[name]
		} else {
			ins[k] = j.inputs[slices.Index(r.e.Inputs, name)]
		}
	}
	vals, err := values(r.rt, ins)
	if err != nil {
		return err
	}
	outs, err := sess.RunHand(vals)
	for _, v := range vals {
		v.Release()
	}
	if err != nil {
		return runFailure(err, resultNames(r.results), r.graph, r.batches[j.batch])
	}
	defer func() {
		for _, o := range outs {
			o.Release()
		}
	}()
	for k, name := range sess.Plan().Hand {
		t, err := copyOut(name, outs[k])
		if err != nil {
			return err
		}
		j.held[name] = t
	}
	for _, name := range blk.Inputs {
		if blk.Handed[name] && r.lastUse[name] == b {
			delete(j.held, name)
		}
	}
	return r.compareHeld(j)
}

// compareHeld folds the graph outputs a job's run returned into their
// comparisons, once a pass's output and its reference's are both there,
// and drops them: no later block reads them.
func (r *blockRun) compareHeld(j *job) error {
	if j.probe == 0 {
		b := r.batches[j.batch]
		whole := j.lo == 0 && j.n == b.Size()
		for _, c := range r.cmp {
			yt := j.held[r.fetch[c.fetch].Name]
			var rt *tensor.Tensor
			if c.ref < 0 {
				if rt = r.e.refs.get(c.kept, c.value, b); yt != nil && (rt == nil || !whole) {
					return fmt.Errorf("output %q: no kept reference for batch %s", c.value, b.Source)
				}
			} else {
				rt = j.held[r.fetch[c.ref].Name]
				if rt != nil && whole {
					// The tensor is a copy no later block reads: kept as it is.
					r.e.refs.keep(c.refModel, c.value, b, nil, nil, rt)
				}
			}
			if yt == nil || rt == nil {
				continue
			}
			y, err := yt.Float32s()
			if err != nil {
				return err
			}
			ref, err := rt.Float32s()
			if err != nil {
				return err
			}
			c.diff.Observe(j.batch, j.lo, yt.Shape, rt.Shape, y, ref)
		}
	}
	for _, f := range r.fetch {
		delete(j.held, f.Name)
	}
	return nil
}

// copyOut copies a value ONNX Runtime returned into Go memory, so that the
// session (and its arena) can go before a later block reads it.
func copyOut(name string, v *ortcapi.Value) (*tensor.Tensor, error) {
	et, shape, err := v.Info()
	if err != nil {
		return nil, fmt.Errorf("value %q: %w", name, err)
	}
	dt := tensor.DType(et)
	size := tensor.NumElements(shape) * int64(dt.Size())
	if dt.Size() == 0 {
		return nil, fmt.Errorf("value %q of element type %d cannot be handed from one block to the next", name, et)
	}
	t := &tensor.Tensor{Name: name, DType: dt, Shape: shape, Data: make([]byte, size)}
	if size > 0 {
		p, err := v.Data()
		if err != nil {
			return nil, fmt.Errorf("value %q: %w", name, err)
		}
		copy(t.Data, unsafe.Slice((*byte)(p), size))
	}
	return t, nil
}
