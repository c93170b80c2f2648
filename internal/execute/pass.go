package execute

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"unsafe"

	"fp16audit/internal/batch"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/rewrite"
	"fp16audit/internal/tensor"
)

// Progress is told about every finished pass of every batch; nil discards.
type Progress func(pass string, batch, batches int)

// passRun is one pass: its instrumented graph and where its results go. A
// run with a ref is compared element by element with that run's outputs
// for the same batch.
type passRun struct {
	name  string
	graph *passGraph
	res   *observe.PassResult
	ref   *passRun
}

func newPassRun(name string, graph *passGraph, ref *passRun) *passRun {
	obs := graph.obs
	names := make([]string, len(obs))
	for i, o := range obs {
		names[i] = o.Name
	}
	res := observe.NewPassResult(name, names, ref != nil)
	return &passRun{name: name, graph: graph, res: res, ref: ref}
}

// execution is how runPasses runs: the segment plan, the shapes that size
// the output buffers, the session options and where buffers come from.
type execution struct {
	inputs []string // the graph inputs, in batch order
	opts   onnxrt.SessionOptions
	plan   *segPlan
	// shapes[pass][batch] holds the value shapes known before running.
	shapes   [][]map[string][]int64
	pool     *bufferPool
	progress Progress
	// workers is the number of goroutines that compute statistics;
	// overlap says whether they run while ONNX Runtime computes the next
	// run (on cores ONNX Runtime leaves free) or after each run.
	workers int
	overlap bool
}

// held is an output of one run: its tensor and whether its buffer came
// from the pool (and goes back there when the tensor dies).
type held struct {
	t      *tensor.Tensor
	pooled bool
}

func (e *execution) release(hs []held) {
	for _, h := range hs {
		if h.pooled {
			e.pool.put(onnxrt.Float32View(h.t))
		}
	}
}

// observer computes statistics on its own goroutine, in the order the
// runs finish, while ONNX Runtime computes the next run: a run's outputs
// stay alive until its job is done.
type observer struct {
	jobs chan func()
	done chan struct{}
}

func newObserver() *observer {
	o := &observer{jobs: make(chan func()), done: make(chan struct{})}
	go func() {
		defer close(o.done)
		for f := range o.jobs {
			f()
		}
	}()
	return o
}

// wait returns once every job handed over so far is done.
func (o *observer) wait() {
	ch := make(chan struct{})
	o.jobs <- func() { close(ch) }
	<-ch
}

func (o *observer) close() {
	close(o.jobs)
	<-o.done
}

// runPasses runs every batch through every pass, in the order given (a
// reference before the passes compared with it), segment by segment. Each
// segment opens one session per pass, runs all batches through it and
// closes it; the values that cross into later segments are kept per pass
// and batch and dropped after their last reader. Statistics of a run's
// outputs are computed on all cores while the next run computes.
func runPasses(ctx context.Context, runs []*passRun, batches []batch.Batch, e *execution) (err error) {
	plan := e.plan
	store := make([][]map[string]held, len(runs))
	for pi := range runs {
		store[pi] = make([]map[string]held, len(batches))
		for bi := range batches {
			store[pi][bi] = map[string]held{}
		}
	}
	obs := newObserver()
	defer func() {
		obs.close()
		for pi := range store {
			for bi := range store[pi] {
				for _, h := range store[pi][bi] {
					e.release([]held{h})
				}
			}
		}
	}()
	refOf := map[*passRun]int{}
	for pi, r := range runs {
		refOf[r] = pi
	}
	segs := plan.segments()
	for s := range segs {
		sgs := make([]*segGraph, len(runs))
		sessions := make([]*onnxrt.Session, len(runs))
		closeAll := func() {
			for _, sess := range sessions {
				if sess != nil {
					sess.Close()
				}
			}
		}
		for pi, r := range runs {
			if err := ctx.Err(); err != nil {
				closeAll()
				return err
			}
			sg := r.graph.segment(s, plan.segOf, plan.boundary[pi], plan.rank0)
			if len(sg.outputs) == 0 && segs == 1 {
				// Nothing to observe (a model without float values): the
				// pass still runs the model's own outputs, so that a model
				// ONNX Runtime cannot run is reported rather than passed.
				for _, vi := range r.graph.model.Graph.Output {
					sg.outputs = append(sg.outputs, vi.GetName())
					sg.model.Graph.Output = append(sg.model.Graph.Output, vi)
				}
			}
			if len(sg.outputs) == 0 {
				continue
			}
			if len(sg.inputs) == 0 {
				// ONNX Runtime wants an input; the first graph input will do.
				sg.inputs = []string{e.inputs[0]}
				sg.model.Graph.Input = append(sg.model.Graph.Input, declarations(r.graph.model.Graph)[e.inputs[0]])
			}
			data, err := onnx.Marshal(sg.model)
			if err != nil {
				closeAll()
				return err
			}
			sess, err := onnxrt.NewSession(data, sg.inputs, sg.outputs, e.opts)
			if err != nil {
				closeAll()
				if segs > 1 {
					return fmt.Errorf("%s pass, segment %d of %d: %w", r.name, s+1, segs, err)
				}
				return fmt.Errorf("%s pass: %w", r.name, err)
			}
			sgs[pi], sessions[pi] = sg, sess
		}
		if e.opts.LowMemory {
			// The marshalled segments are garbage now, as large as the
			// segment's weights; return them to the system before the
			// segment's values take the room.
			debug.FreeOSMemory()
		}
		for bi, b := range batches {
			refOuts := make([]map[string]*tensor.Tensor, len(runs))
			var deferred [][]held
			for pi, r := range runs {
				sg := sgs[pi]
				if sg == nil {
					continue
				}
				if err := ctx.Err(); err != nil {
					obs.wait()
					closeAll()
					return err
				}
				outs, hs, err := e.runSegment(sessions[pi], sg, b, store[pi][bi], e.shapes[pi][bi])
				if err != nil {
					obs.wait()
					closeAll()
					if segs > 1 {
						return fmt.Errorf("%s pass, segment %d of %d, batch %s: %w", r.name, s+1, segs, b.Source, err)
					}
					return fmt.Errorf("%s pass, batch %s: %w", r.name, b.Source, err)
				}
				// Boundary values stay in the store; the rest die after
				// observation (a reference's after the passes compared
				// with it).
				var dying []held
				for i, name := range sg.outputs {
					if last, ok := plan.boundary[pi][name]; ok && last > s {
						store[pi][bi][name] = hs[i]
					} else {
						dying = append(dying, hs[i])
					}
				}
				var ref map[string]*tensor.Tensor
				if r.ref != nil {
					ref = refOuts[refOf[r.ref]]
				}
				if isRefOf(runs, r) {
					m := make(map[string]*tensor.Tensor, len(sg.obs))
					for i, o := range sg.obs {
						m[o.Name] = outs[i]
					}
					refOuts[pi] = m
					deferred = append(deferred, dying)
					dying = nil
				}
				obsOuts := outs[:len(sg.obs)]
				r, bi, sg, dying := r, bi, sg, dying
				job := func() {
					r.summarize(sg.obs, obsOuts, ref, bi, e.workers)
					e.release(dying)
				}
				if e.overlap {
					obs.jobs <- job
				} else {
					job()
				}
			}
			if e.progress != nil && s == segs-1 {
				for _, r := range runs {
					e.progress(r.name, bi+1, len(batches))
				}
			}
			if len(deferred) > 0 {
				obs.jobs <- func() {
					for _, d := range deferred {
						e.release(d)
					}
				}
			}
		}
		obs.wait()
		closeAll()
		for pi := range runs {
			for bi := range batches {
				for name, h := range store[pi][bi] {
					if plan.boundary[pi][name] <= s {
						e.release([]held{h})
						delete(store[pi][bi], name)
					}
				}
			}
		}
	}
	return nil
}

func isRefOf(runs []*passRun, r *passRun) bool {
	for _, x := range runs {
		if x.ref == r {
			return true
		}
	}
	return false
}

// runSegment runs one batch through one segment session. Outputs whose
// shape is known beforehand are written into pool buffers.
func (e *execution) runSegment(sess *onnxrt.Session, sg *segGraph, b batch.Batch, store map[string]held, shapes map[string][]int64) ([]*tensor.Tensor, []held, error) {
	inputs := make([]*tensor.Tensor, len(sg.inputs))
	for i, name := range sg.inputs {
		if h, ok := store[name]; ok {
			inputs[i] = h.t
			continue
		}
		for k, in := range e.inputs {
			if in == name {
				inputs[i] = b.Inputs[k]
			}
		}
		if inputs[i] == nil {
			return nil, nil, fmt.Errorf("segment input %q is neither a graph input nor a value of an earlier segment", name)
		}
	}
	into := make([]*tensor.Tensor, len(sg.outputs))
	for i, name := range sg.outputs {
		shape, ok := shapes[name]
		if !ok || len(shape) == 0 || (i >= len(sg.obs) && sg.outputType(name) != int32(onnx.TensorProto_FLOAT)) {
			continue
		}
		n := tensor.NumElements(shape)
		if n == 0 {
			continue
		}
		buf := e.pool.get(int(n))
		into[i] = &tensor.Tensor{Name: name, DType: tensor.Float32, Shape: shape,
			Data: unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), 4*len(buf))}
	}
	outs, err := sess.RunWith(inputs, into)
	if err != nil {
		for _, t := range into {
			if t != nil {
				e.pool.put(onnxrt.Float32View(t))
			}
		}
		return nil, nil, err
	}
	hs := make([]held, len(outs))
	for i, t := range outs {
		hs[i] = held{t: t}
		if into[i] == nil {
			continue
		}
		if t == into[i] {
			hs[i].pooled = true
		} else {
			e.pool.put(onnxrt.Float32View(into[i])) // refused: a shape the inference got wrong
		}
	}
	return outs, hs, nil
}

// outputType is the declared element type of a segment output.
func (sg *segGraph) outputType(name string) int32 {
	for _, o := range sg.model.Graph.Output {
		if o.Name == name {
			return o.GetType().GetTensorType().GetElemType()
		}
	}
	return 0
}

// observe folds one batch's outputs of one segment, one per observed value
// in obs order, into the statistics, and compares them with the reference
// outputs (by value name) when ref is not nil.
func (r *passRun) summarize(obs []rewrite.Observed, outs []*tensor.Tensor, ref map[string]*tensor.Tensor, batchIndex, workers int) {
	for i, o := range obs {
		if _, ok := r.res.Shapes[o.Name]; !ok {
			r.res.Shapes[o.Name] = outs[i].Shape
		}
	}
	// Large values are split into chunks so that every core has work even
	// when one value dominates; the chunks of a value merge in index order.
	type chunk struct {
		value, part, lo, hi int
	}
	const chunkElems = 1 << 20
	var chunks []chunk
	parts := make([][]observe.Stats, len(obs))
	diffs := make([][]observe.Diff, len(obs))
	for i, t := range outs {
		if t.DType != tensor.Float32 {
			continue
		}
		n := int(t.Elements())
		k := max(1, (n+chunkElems-1)/chunkElems)
		parts[i] = make([]observe.Stats, k)
		diffs[i] = make([]observe.Diff, k)
		for c := range k {
			chunks = append(chunks, chunk{i, c, c * n / k, (c + 1) * n / k})
		}
	}
	next := make(chan chunk, len(chunks))
	for _, c := range chunks {
		next <- c
	}
	close(next)
	var wg sync.WaitGroup
	for range max(1, min(workers, len(chunks))) {
		wg.Go(func() {
			for c := range next {
				y := onnxrt.Float32View(outs[c.value])
				parts[c.value][c.part] = observeChunk(y[c.lo:c.hi], int64(c.lo), batchIndex)
				if ref == nil {
					continue
				}
				if rt, ok := ref[obs[c.value].Name]; ok && rt.DType == tensor.Float32 {
					x := onnxrt.Float32View(rt)
					lo, hi := min(c.lo, len(x)), min(c.hi, len(x))
					diffs[c.value][c.part].Observe(y[lo:hi], x[lo:hi])
				}
			}
		})
	}
	wg.Wait()
	for i, o := range obs {
		if parts[i] == nil {
			continue
		}
		st := observe.NewStats()
		for _, p := range parts[i] {
			st.Merge(p)
		}
		r.res.Stats[o.Name].Merge(st)
		if ref != nil {
			if _, ok := ref[o.Name]; ok {
				d := r.res.Diffs[o.Name]
				for _, p := range diffs[i] {
					d.Merge(p)
				}
			}
		}
	}
}

// observeChunk summarises elements [off, off+len(x)) of one tensor.
func observeChunk(x []float32, off int64, batchIndex int) observe.Stats {
	s := observe.Of(x, batchIndex)
	if s.ArgMax >= 0 {
		s.ArgMax += off
	}
	return s
}

// isCreateError reports whether err is ONNX Runtime refusing a graph.
func isCreateError(err error) bool {
	var re *onnxrt.RuntimeError
	return errors.As(err, &re) && re.Stage == onnxrt.StageCreate
}

// overlap decides whether statistics are computed while ONNX Runtime
// runs, and on how many goroutines. ONNX Runtime's default uses every
// core, and then overlapping only makes the two fight over the cores (and
// holds more outputs alive), which measured slower; with --threads below
// the number of cores the statistics take the cores left over.
func (e *Engine) overlap() (bool, int) {
	cores := runtime.GOMAXPROCS(0)
	if t := e.Session.Threads; t > 0 && t < cores {
		return true, cores - t
	}
	return false, cores
}

// Pass is a pass to run: its name, its graph before instrumentation, and
// the name of the pass it is compared with ("" for none; that pass must come
// earlier in the same Run).
type Pass struct {
	Name  string
	Model *onnx.ModelProto
	Ref   string
}

// Run runs passes over batches, segmented when the memory budget asks for
// it, and returns one result per pass, in order, with the memory plan it
// followed. Values whose type the graph does not declare are observed as
// FLOAT; when ONNX Runtime refuses that, they are dropped (Notes says so)
// and the passes start again. An estimate above the available memory is a
// *BudgetError.
func (e *Engine) Run(ctx context.Context, passes []Pass, batches []batch.Batch) ([]*observe.PassResult, *MemoryPlan, error) {
	for attempt := 0; ; attempt++ {
		res, mp, err := e.runOnce(ctx, passes, batches)
		if err == nil || attempt > 0 || !isCreateError(err) || !e.dropUntyped() {
			return res, mp, err
		}
	}
}

func (e *Engine) runOnce(ctx context.Context, passes []Pass, batches []batch.Batch) ([]*observe.PassResult, *MemoryPlan, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	graphs := make([]*passGraph, len(passes))
	for i, p := range passes {
		inst, obs := rewrite.Instrument(p.Model, e.Observe, e.ElemType)
		pg, err := newPassGraph(p.Name, inst, obs, e.Order, e.Nodes)
		if err != nil {
			return nil, nil, err
		}
		graphs[i] = pg
	}
	mp, err := e.memoryPlan(ctx, graphs, batches)
	if err != nil {
		return nil, nil, err
	}
	opts := e.Session
	opts.LowMemory = mp.plan.segments() > 1
	overlap, workers := e.overlap()
	opts.NoSpinning = overlap
	pool := newBufferPool(mp.poolLimit())
	defer pool.close()
	runs := make([]*passRun, len(passes))
	byName := map[string]*passRun{}
	for i, p := range passes {
		runs[i] = newPassRun(p.Name, graphs[i], byName[p.Ref])
		byName[p.Name] = runs[i]
	}
	x := &execution{inputs: e.Inputs, opts: opts, plan: mp.plan, shapes: mp.shapes, pool: pool,
		progress: e.Progress, workers: workers, overlap: overlap}
	if err := runPasses(ctx, runs, batches, x); err != nil {
		return nil, nil, err
	}
	out := make([]*observe.PassResult, len(runs))
	for i, r := range runs {
		out[i] = r.res
	}
	return out, mp, nil
}

// dropUntyped removes the values without a known element type from the
// observed list; it reports whether there were any.
func (e *Engine) dropUntyped() bool {
	kept := e.Observe[:0:0]
	for _, n := range e.Observe {
		if e.ElemType(n) != 0 {
			kept = append(kept, n)
		}
	}
	if len(kept) == len(e.Observe) {
		return false
	}
	e.notes = append(e.notes, fmt.Sprintf("%d value(s) of undeclared type are not observed (run ONNX shape inference on the model to include them)", len(e.Observe)-len(kept)))
	e.Observe = kept
	return true
}
