// Package execute runs the passes of an audit through ONNX Runtime: the
// execution stage. The fp32 reference and the emulated passes run side by
// side in one graph that shares the model's weights, and a custom operator
// (package statsop) summarises every observed value of every pass inside
// the session, while the values are produced; only a record of a few
// numbers per value leaves ONNX Runtime. An Engine holds what the passes of
// one model share — the library, the graph inputs, session options, the
// model's topological order, the values to observe and the memory budget —
// and Run executes a set of passes over the batches, cutting a batch into
// sub-batches when one run of it would exceed the budget.
package execute

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"
	"unsafe"

	"fp16audit/internal/batch"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/ortcapi"
	"fp16audit/internal/statsop"
	"fp16audit/internal/tensor"
)

// Chunk is the chunk length of the statistics: a value is cut into chunks
// of about this many elements, summarised in parallel on ONNX Runtime's
// threads and merged in index order (see statsop). It fixes the rounding of
// the float64 sums (mean, rms, the relative error), so it is part of what
// makes two audits agree bit for bit.
const Chunk = 1 << 16

// Engine runs the passes of one model.
type Engine struct {
	// Library is the ONNX Runtime shared library (onnxrt.FindLibrary).
	Library string
	// Inputs are the model's graph inputs, in the order of a batch's
	// tensors.
	Inputs []string
	// Session holds the options every pass runs with: threads, the
	// optimization level, the folder of external data.
	Session onnxrt.SessionOptions
	// Order is the model's topological order; Nodes its number of nodes.
	// Every pass graph keeps the model's nodes at their indices and appends
	// its own after them.
	Order []int
	Nodes int
	// Observe names the values whose statistics each pass returns, and
	// ElemType gives their element types (0 when undeclared).
	Observe  []string
	ElemType func(string) int32
	// Contents names the containers among the model's values (sequences,
	// optionals: onnx.Index.Contents) and the tensors each holds: no
	// statistics node can read a container, so every result gives it
	// those tensors' statistics (observe.PassResult.Contain).
	Contents map[string][]string
	// MaxMemory bounds the process's memory while the passes run, in
	// bytes; 0 plans for DefaultMemoryFraction of the available memory.
	MaxMemory int64
	// ModelFile is the model's file, in Session.ExternalDataDir. When set,
	// the large weights the model stores inline are handed to ONNX
	// Runtime over the loaded model's memory (statsop.HandsOver), so that
	// the process holds them once.
	ModelFile string
	// Weights, set by Share, are the weights every session of the
	// engine shares (statsop.Weights): the passes of Run after Run, each
	// block and the backward's sessions take them from it instead of
	// loading them again. Close releases them.
	Weights *statsop.Weights
	// Progress is told about every finished pass of every batch; nil
	// discards.
	Progress Progress
	// Outputs says how each compared graph output is judged (its role)
	// and whether its last axis holds classes; an output it does not name
	// is a graph output whose last axis counts as classes.
	Outputs map[string]OutputKind

	notes []string
	// forceStep, when set (by tests only), runs every batch in parts of
	// this many samples whatever the budget; forceBlocks cuts the model
	// into this many blocks of about equal numbers of nodes.
	forceStep   int64
	forceBlocks int
	// probe holds the shapes measured during the current Run, once known;
	// resident is the process's memory when the Run started.
	probe    *shapeProbe
	resident int64
	// sessionNodes is the number of nodes of the current Run's combined
	// graph (see MaxSessionNodes).
	sessionNodes int
	// timings has one entry per Run; the last is the current one's.
	timings []RunTiming
	// refs keeps reference outputs from Run to Run (refs.go).
	refs refCache
	// noSizeCut runs the current graph whole, after its run in blocks cut
	// for their size failed.
	noSizeCut bool
}

// RunTiming is where one Run's time went.
type RunTiming struct {
	Passes []string
	// Total is the whole Run; Sessions the part spent creating its
	// Created sessions.
	Total, Sessions time.Duration
	Created         int
}

// Timings returns one entry per Run so far, in order.
func (e *Engine) Timings() []RunTiming { return e.timings }

// newSession creates a session of plan and counts its time in the
// current Run's timing.
func (e *Engine) newSession(rt *ortcapi.Runtime, plan *statsop.Plan, inputs []string, opts ortcapi.Options) (*statsop.Session, error) {
	t0 := time.Now()
	s, err := statsop.NewSession(rt, plan, inputs, opts)
	if n := len(e.timings); n > 0 {
		e.timings[n-1].Sessions += time.Since(t0)
		e.timings[n-1].Created++
	}
	return s, err
}

// Share makes every later session of the engine share the weights of the
// graphs gs (the audit's upcast and forward graphs, whose initializers
// every pass's graph keeps): they are mapped or wrapped once, here, and
// handed to each session (statsop.Weights). Close releases them.
func (e *Engine) Share(gs ...*onnx.GraphProto) error {
	rt, err := ortcapi.Open(e.Library)
	if err != nil {
		return err
	}
	declared := ""
	if e.handsOver() {
		declared = filepath.Base(e.ModelFile)
	}
	e.Close()
	e.Weights = statsop.NewWeights(rt, e.Session.ExternalDataDir, declared, gs...)
	return nil
}

// Close releases the shared weights and the kept reference outputs; the
// engine's sessions are closed already (each Run closes its own).
func (e *Engine) Close() {
	e.Weights.Close()
	e.Weights = nil
	e.refs = refCache{}
}

// Progress is told about every finished pass of every batch.
type Progress func(pass string, batch, batches int)

// OutputKind is how a graph output's comparison with fp32's is judged.
type OutputKind struct {
	Role    observe.Role
	Classes bool
	// Batched says that the output's first axis is the batch's (the same
	// symbolic dimension as an input's first axis): a chosen output's items
	// are then matched sample by sample, along its second axis.
	Batched bool
}

// Pass is a pass to run: its name, its graph (the model's values under the
// model's names, as the rewrites make it), and the name of the pass it is
// compared with ("" for none; that pass must come earlier in the same Run).
type Pass struct {
	Name  string
	Model *onnx.ModelProto
	Ref   string
	// OutputRef names the pass whose graph outputs this pass's are
	// compared with, when that is not Ref (a rerun compares only its
	// outputs with fp32's); it must come earlier in the same Run.
	OutputRef string
	// OutputsOnly runs the pass for its graph outputs alone: its values
	// are not observed (the fp32 outputs a rerun is compared with).
	OutputsOnly bool
	// keptRef, set by withKeptRef, is the graph of the pass whose kept
	// outputs this pass's are compared with (see refs.go).
	keptRef *onnx.ModelProto
}

// outputRef is the pass whose graph outputs p's are compared with.
func (p Pass) outputRef() string {
	if p.OutputRef != "" {
		return p.OutputRef
	}
	return p.Ref
}

// Notes returns facts about how the passes ran that a report must carry
// (values dropped from observation, batches run in parts).
func (e *Engine) Notes() []string { return e.notes }

func (e *Engine) note(format string, args ...any) {
	n := fmt.Sprintf(format, args...)
	if !slices.Contains(e.notes, n) {
		e.notes = append(e.notes, n)
	}
}

// BudgetError is an audit refused before it starts because its memory
// estimate exceeds what the machine has or what --max-memory allows even
// for one sample at a time: the user must audit less at once or pass a
// budget.
type BudgetError struct {
	Err error
}

func (e *BudgetError) Error() string { return e.Err.Error() }

func (e *BudgetError) Unwrap() error { return e.Err }

// Run runs passes over batches and returns one result per pass, in order,
// with the memory plan it followed. Values whose type the graph does not
// declare are observed as FLOAT; when ONNX Runtime refuses that, they are
// dropped (Notes says so) and the passes start again.
func (e *Engine) Run(ctx context.Context, passes []Pass, batches []batch.Batch) ([]*observe.PassResult, *MemoryPlan, error) {
	res, mp, err := e.run(ctx, passes, batches)
	if err == nil && len(e.Contents) > 0 {
		for _, r := range res {
			r.Contain(e.Contents)
		}
	}
	return res, mp, err
}

func (e *Engine) run(ctx context.Context, passes []Pass, batches []batch.Batch) ([]*observe.PassResult, *MemoryPlan, error) {
	start := time.Now()
	var names []string
	for _, p := range passes {
		if !p.OutputsOnly {
			names = append(names, p.Name)
		}
	}
	e.timings = append(e.timings, RunTiming{Passes: names})
	defer func() { e.timings[len(e.timings)-1].Total = time.Since(start) }()
	if kept, skip := e.withKeptRef(passes, batches); skip >= 0 {
		res, mp, err := e.runOnce(ctx, kept, batches)
		var sc *sizeCutError
		if !errors.Is(err, errKeptInParts) && !errors.As(err, &sc) {
			if err != nil {
				return nil, nil, err
			}
			// The pass dropped returns no results of its own.
			res = slices.Insert(res, skip, observe.NewPassResult(passes[skip].Name, nil, false))
			return res, mp, nil
		}
	}
	for attempt := 0; ; attempt++ {
		res, mp, err := e.runOnce(ctx, passes, batches)
		var sc *sizeCutError
		if errors.As(err, &sc) {
			e.noSizeCut = true
			res, mp, err = e.runOnce(ctx, passes, batches)
			e.noSizeCut = false
		}
		if err == nil || attempt > 0 || !isCreateError(err) || !e.dropUntyped() {
			return res, mp, err
		}
	}
}

// sizeCutError is a run in blocks cut for the sessions' size alone that
// failed (a value the cut hands on that cannot cross, say): Run runs the
// graph whole instead.
type sizeCutError struct{ err error }

func (c *sizeCutError) Error() string { return c.err.Error() }
func (c *sizeCutError) Unwrap() error { return c.err }

// createError is ONNX Runtime refusing a graph.
type createError struct{ err error }

func (c *createError) Error() string { return c.err.Error() }
func (c *createError) Unwrap() error { return c.err }

func isCreateError(err error) bool {
	var c *createError
	return errors.As(err, &c)
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
	e.note("%d value(s) of undeclared type are not observed (run ONNX shape inference on the model to include them)", len(e.Observe)-len(kept))
	e.Observe = kept
	return true
}

func (e *Engine) runOnce(ctx context.Context, passes []Pass, batches []batch.Batch) ([]*observe.PassResult, *MemoryPlan, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if e.Session.Device != "" && e.Session.Device != "cpu" {
		return nil, nil, fmt.Errorf("device %q: the statistics run inside ONNX Runtime's CPU provider, and this build audits on the CPU only; drop --device", e.Session.Device)
	}
	rt, err := ortcapi.Open(e.Library)
	if err != nil {
		return nil, nil, err
	}
	results := make([]*observe.PassResult, len(passes))
	for i, p := range passes {
		observed := e.Observe
		if p.OutputsOnly {
			observed = nil
		}
		results[i] = observe.NewPassResult(p.Name, observed, p.Ref != "")
	}
	if len(e.Observe) == 0 {
		// Nothing to observe (a model without float values): the model
		// still runs, so that a model ONNX Runtime cannot run is reported
		// rather than passed.
		return results, &MemoryPlan{parts: 1}, e.runPlain(ctx, rt, passes[0], batches)
	}
	ps := make([]statsop.Pass, len(passes))
	index := map[string]int{}
	outRef := make([]int, len(passes))
	for i, p := range passes {
		ps[i] = statsop.Pass{Name: p.Name, Model: p.Model, Ref: -1, OutputsOnly: p.OutputsOnly}
		outRef[i] = -1
		for k, name := range []string{p.Ref, p.outputRef()} {
			if name == "" {
				continue
			}
			r, ok := index[name]
			if !ok {
				return nil, nil, fmt.Errorf("pass %s compares with %s, which does not come before it", p.Name, name)
			}
			if k == 0 {
				ps[i].Ref = r
			} else {
				outRef[i] = r
			}
		}
		if p.keptRef != nil {
			outRef[i] = keptOutputs
		}
		index[p.Name] = i
	}
	plan, err := statsop.Combine(ps, e.Observe, e.ElemType, Chunk)
	if err != nil {
		return nil, nil, err
	}
	cmp := comparisons(plan, passes, outRef, results, e.Outputs)
	if e.handsOver() {
		plan.Declared = filepath.Base(e.ModelFile)
	}
	plan.Weights = e.Weights
	e.sessionNodes = len(plan.Model.Graph.Node)
	// What the process holds before the session (the library, the model,
	// the batches) counts against the budget; the plan made again after a
	// probe must not count the session's own memory twice.
	e.probe = nil
	e.resident, _ = memResident()
	// The shared weights an earlier Run mapped are among the resident
	// pages, and the plan counts them with the weights.
	e.resident = max(0, e.resident-e.Weights.Mapped())
	mp, err := e.memoryPlan(passes, batches, nil)
	if err != nil {
		return nil, nil, err
	}
	if err := keptWhole(passes, batches, mp); err != nil {
		return nil, nil, err
	}
	if mp.blocks != nil {
		if err := e.runBlocks(ctx, rt, plan, mp, batches, results, cmp); err != nil {
			if mp.blocks.bySize && ctx.Err() == nil && !errors.Is(err, errKeptInParts) {
				// Cut for the sessions' size alone, the graph still runs
				// whole: slower to create, never refused for the cut.
				return nil, nil, &sizeCutError{err}
			}
			return nil, nil, err
		}
		return results, mp, nil
	}
	opts, err := e.options()
	if err != nil {
		return nil, nil, err
	}
	sess, err := e.newSession(rt, plan, e.Inputs, opts)
	if err != nil {
		return nil, nil, &createError{fmt.Errorf("passes %s: %w", passNames(passes), err)}
	}
	defer sess.Close()
	// An interrupt stops the run in flight, not only the next batch.
	defer sess.StopOn(ctx)()
	if probe := mp.probeBatch(batches); probe != nil {
		// The shape inference could not size some values (shapes computed
		// from the data, as exporters write reshapes): two runs of one and
		// two samples measure them, and the plan is made again.
		if e.probe, err = probeShapes(rt, sess, plan, probe.Inputs); err != nil {
			return nil, nil, err
		}
		if mp, err = e.memoryPlan(passes, batches, e.probe); err != nil {
			return nil, nil, err
		}
		if err := keptWhole(passes, batches, mp); err != nil {
			return nil, nil, err
		}
	}
	for bi, b := range batches {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		if err := e.runBatch(rt, sess, plan, mp, bi, b, results, cmp); err != nil {
			return nil, nil, runFailure(err, resultNames(results), plan.Model.Graph, b)
		}
		if e.Progress != nil {
			for _, p := range passes {
				e.Progress(p.Name, bi+1, len(batches))
			}
		}
	}
	return results, mp, nil
}

// runPlain runs a pass's graph as it is over the batches, its own outputs
// returned and dropped.
func (e *Engine) runPlain(ctx context.Context, rt *ortcapi.Runtime, p Pass, batches []batch.Batch) error {
	data, err := onnx.Marshal(p.Model)
	if err != nil {
		return err
	}
	var outs []string
	for _, o := range p.Model.Graph.Output {
		outs = append(outs, o.Name)
	}
	opts, err := e.options()
	if err != nil {
		return err
	}
	s, err := rt.NewSession(data, e.Inputs, outs, opts)
	if err != nil {
		return &createError{fmt.Errorf("%s pass: %w", p.Name, err)}
	}
	defer s.Close()
	defer s.StopOn(ctx)()
	for _, b := range batches {
		if err := ctx.Err(); err != nil {
			return err
		}
		vals, err := values(rt, b.Inputs)
		if err != nil {
			return err
		}
		res := make([]*ortcapi.Value, len(outs))
		err = s.Run(vals, res)
		for _, v := range append(vals, res...) {
			if v != nil {
				v.Release()
			}
		}
		if err != nil {
			return runFailure(err, []string{p.Name}, p.Model.Graph, b)
		}
	}
	return nil
}

// handsOver reports whether sessions hand the model's inline weights to
// ONNX Runtime over the loaded model's memory: the model's file must be in
// the external-data folder the sessions are told.
func (e *Engine) handsOver() bool {
	if e.ModelFile == "" || e.Session.ExternalDataDir == "" {
		return false
	}
	a, err1 := filepath.Abs(filepath.Dir(e.ModelFile))
	b, err2 := filepath.Abs(e.Session.ExternalDataDir)
	return err1 == nil && err2 == nil && a == b
}

// options are the session options of a combined graph.
// Every run keeps ONNX Runtime's memory arena: a run in parts reuses the
// arena its first part grew, where allocating every value afresh would
// fault its pages in again (measured: twice the time, mostly system time);
// the plan leaves partMargin for the arena's rounding up.
func (e *Engine) options() (ortcapi.Options, error) {
	level, err := ortcapi.ParseLevel(e.Session.Optimization)
	if err != nil {
		return ortcapi.Options{}, err
	}
	// Prepacking is off: a MatMul of the fp32 pass would keep a repacked
	// copy of its weight while the emulated passes round the original, so
	// the process would hold the weights twice. Unpacked, every pass reads
	// the one copy ONNX Runtime maps from the model's external data (MLAS
	// packs per call, as it does for the emulated passes' rounded weights
	// anyway).
	o := ortcapi.Options{Threads: e.Session.Threads, Level: level,
		Config: map[string]string{"session.intra_op.allow_spinning": "0", "session.disable_prepacking": "1"}}
	if e.Session.ExternalDataDir != "" {
		o.Config["session.model_external_initializers_file_folder_path"] = e.Session.ExternalDataDir
	}
	return o, nil
}

// resultNames are the names of the passes whose results these are, in
// their order.
func resultNames(results []*observe.PassResult) []string {
	names := make([]string, len(results))
	for i, r := range results {
		names[i] = r.Name
	}
	return names
}

func passNames(passes []Pass) string {
	names := make([]string, len(passes))
	for i, p := range passes {
		names[i] = p.Name
	}
	return fmt.Sprint(names)
}

// runBatch runs one batch, whole or in the plan's sub-batches, and folds
// its records into the results.
func (e *Engine) runBatch(rt *ortcapi.Runtime, sess *statsop.Session, plan *statsop.Plan, mp *MemoryPlan, bi int, b batch.Batch, results []*observe.PassResult, cmp []comparison) error {
	size := b.Size()
	step := mp.subBatch(size)
	if step >= size {
		if err := run(rt, sess, b.Inputs); err != nil {
			return err
		}
		if err := e.compareOutputs(sess, cmp, b, bi, 0, true); err != nil {
			return err
		}
		foldRun(sess, plan, results, bi)
		return nil
	}
	var m *statsop.Merger
	for lo := int64(0); lo < size; lo += step {
		n := min(step, size-lo)
		part, err := batch.Cut(b.Inputs, lo, n)
		if err != nil {
			return err
		}
		if err := run(rt, sess, part); err != nil {
			return err
		}
		if m == nil {
			pr := e.probe
			if pr == nil {
				if pr, err = probeShapes(rt, sess, plan, b.Inputs); err != nil {
					return err
				}
				e.probe = pr
			}
			// The probe runs overwrote the part's records: run it again.
			if err := run(rt, sess, part); err != nil {
				return err
			}
			m = statsop.NewMerger(plan, bi, size, pr.full(size))
		}
		if err := e.compareOutputs(sess, cmp, b, bi, lo, false); err != nil {
			return err
		}
		if err := m.Add(sess, n); err != nil {
			return fmt.Errorf("samples %d to %d: %w", lo, lo+n-1, err)
		}
	}
	if err := mergeInto(plan, m, results); err != nil {
		return err
	}
	e.note("batches larger than %d samples ran in parts of %d samples to stay within the memory budget (%s); their maxima and counts merge exactly, their sums round per part", step, step, FormatSize(mp.budget))
	return nil
}

// mergeInto folds a batch's merged records of plan's values into the
// results.
func mergeInto(plan *statsop.Plan, m *statsop.Merger, results []*observe.PassResult) error {
	for i, o := range plan.Outputs {
		for row, p := range o.Passes {
			l, err := m.Result(i, row)
			if err != nil {
				return err
			}
			res := results[p]
			if _, ok := res.Shapes[o.Value]; !ok {
				res.Shapes[o.Value] = l.Shape
			}
			res.Stats[o.Value].Merge(l.Stats)
			if l.Diff != nil && res.Diffs != nil {
				res.Diffs[o.Value].Merge(*l.Diff)
			}
		}
	}
	return nil
}

// shapeProbe is what two small runs tell about the shape of every observed
// value: its shape for one sample and its batch axis (-1 when the value
// does not depend on the number of samples).
type shapeProbe struct {
	one  map[string][]int64
	axis map[string]int
}

func newShapeProbe() *shapeProbe {
	return &shapeProbe{one: map[string][]int64{}, axis: map[string]int{}}
}

// add records value's shapes for one and for two samples: the axis that
// doubles is its batch axis.
func (p *shapeProbe) add(value string, one, two []int64) {
	p.one[value] = one
	p.axis[value] = -1
	for a := range one {
		if a < len(two) && two[a] == 2*one[a] && one[a] > 0 {
			p.axis[value] = a
			break
		}
	}
}

// probeShapes runs the first sample of inputs and then its first two: the
// axis that doubles is a value's batch axis (the first one for most
// values, the second for attention scores laid out [heads·batch, ...] or
// [seq, batch·heads, ...]); a value whose shape does not change does not
// depend on the batch. Shapes do not depend on the data, so this costs two
// runs of one and two samples.
func probeShapes(rt *ortcapi.Runtime, sess *statsop.Session, plan *statsop.Plan, inputs []*tensor.Tensor) (*shapeProbe, error) {
	shapesOf := func(n int64) ([][]int64, error) {
		// Shapes do not depend on the data: the first samples serve.
		part, err := batch.Cut(inputs, 0, n)
		if err != nil {
			return nil, err
		}
		if err := run(rt, sess, part); err != nil {
			return nil, err
		}
		out := make([][]int64, len(plan.Outputs))
		for i := range plan.Outputs {
			sh, ok := sess.Record(i, 0).Shape()
			if !ok {
				return nil, fmt.Errorf("value %q: its rank is too large to merge parts of a batch", plan.Outputs[i].Value)
			}
			out[i] = sh
		}
		return out, nil
	}
	one, err := shapesOf(1)
	if err != nil {
		return nil, err
	}
	two, err := shapesOf(2)
	if err != nil {
		return nil, err
	}
	p := newShapeProbe()
	for i, o := range plan.Outputs {
		p.add(o.Value, one[i], two[i])
	}
	return p, nil
}

// full returns the shape of every observed value for a batch of size
// samples.
func (p *shapeProbe) full(size int64) map[string][]int64 {
	out := map[string][]int64{}
	for v, one := range p.one {
		sh := slices.Clone(one)
		if a := p.axis[v]; a >= 0 {
			sh[a] *= size
		}
		out[v] = sh
	}
	return out
}

// keptOutputs in outRef marks a pass compared with kept outputs.
const keptOutputs = -2

// keptWhole refuses a plan in parts for passes compared with kept
// outputs, which are whole batches (errKeptInParts: Run runs them again
// with their reference).
func keptWhole(passes []Pass, batches []batch.Batch, mp *MemoryPlan) error {
	for _, p := range passes {
		if p.keptRef == nil {
			continue
		}
		for _, b := range batches {
			if mp.subBatch(b.Size()) < b.Size() {
				return errKeptInParts
			}
		}
	}
	return nil
}

// comparison is one graph output of a pass compared with the same output
// of its reference pass: the indices of both in the plan's Fetch list
// (ref -1: the reference's output kept from an earlier Run, of graph
// kept), and the reference pass's graph when its whole-batch outputs are
// kept for later Runs (nil: not kept).
type comparison struct {
	fetch, ref int
	value      string
	refModel   *onnx.ModelProto
	kept       *onnx.ModelProto
	diff       *observe.OutputDiff
}

// comparisons pairs every fetched output of a pass that has an output
// reference (outRef[pass] >= 0, or keptOutputs) with the reference's, and
// gives the pass's results their output comparisons.
func comparisons(plan *statsop.Plan, passes []Pass, outRef []int, results []*observe.PassResult, kinds map[string]OutputKind) []comparison {
	var out []comparison
	newDiff := func(f statsop.Fetch) *observe.OutputDiff {
		d := observe.NewOutputDiff(f.Value)
		if k, ok := kinds[f.Value]; ok {
			d.Role, d.Classes, d.Batched = k.Role, k.Classes, k.Batched
		}
		results[f.Pass].Outputs = append(results[f.Pass].Outputs, d)
		return d
	}
	for i, f := range plan.Fetch {
		r := outRef[f.Pass]
		if r == keptOutputs {
			out = append(out, comparison{fetch: i, ref: -1, value: f.Value, kept: passes[f.Pass].keptRef, diff: newDiff(f)})
			continue
		}
		if r < 0 {
			continue
		}
		for j, g := range plan.Fetch {
			if g.Pass == r && g.Value == f.Value {
				c := comparison{fetch: i, ref: j, value: f.Value, diff: newDiff(f)}
				if !passes[r].OutputsOnly {
					// A reference observed in full: its outputs are
					// kept for later Runs on the same batches.
					c.refModel = passes[r].Model
				}
				out = append(out, c)
				break
			}
		}
	}
	return out
}

// compareOutputs folds the outputs of the session's last run, batch b (the
// bi-th) from sample first on, into the comparisons; whole says the run
// was the whole batch, whose reference outputs are then kept.
func (e *Engine) compareOutputs(sess *statsop.Session, cmp []comparison, b batch.Batch, bi int, first int64, whole bool) error {
	for _, c := range cmp {
		y, shape, err := sess.Fetched(c.fetch)
		if err != nil {
			return err
		}
		var ref []float32
		var refShape []int64
		if c.ref < 0 {
			t := e.refs.get(c.kept, c.value, b)
			if t == nil || !whole {
				return fmt.Errorf("output %q: no kept reference for batch %s", c.value, b.Source)
			}
			if ref, err = t.Float32s(); err != nil {
				return err
			}
			refShape = t.Shape
		} else {
			if ref, refShape, err = sess.Fetched(c.ref); err != nil {
				return err
			}
			if whole {
				e.refs.keep(c.refModel, c.value, b, refShape, ref, nil)
			}
		}
		c.diff.Observe(bi, first, shape, refShape, y, ref)
	}
	return nil
}

// foldRun adds the records of a run of batch bi, whole, to every pass's
// results.
func foldRun(sess *statsop.Session, plan *statsop.Plan, results []*observe.PassResult, bi int) {
	for i, o := range plan.Outputs {
		for row, p := range o.Passes {
			r := sess.Record(i, row)
			shape, ok := r.Shape()
			if !ok {
				shape = nil
			}
			fold(results[p], o.Value, r.Stats(bi), r, shape)
		}
	}
}

// fold adds one batch's record of a value to a pass's results.
func fold(res *observe.PassResult, value string, st observe.Stats, r statsop.Record, shape []int64) {
	if _, ok := res.Shapes[value]; !ok && shape != nil {
		res.Shapes[value] = shape
	}
	res.Stats[value].Merge(st)
	if d, ok := r.Diff(); ok && res.Diffs != nil {
		res.Diffs[value].Merge(d)
	}
}

// run runs the session on tensors the caller owns.
func run(rt *ortcapi.Runtime, sess *statsop.Session, inputs []*tensor.Tensor) error {
	vals, err := values(rt, inputs)
	if err != nil {
		return err
	}
	defer func() {
		for _, v := range vals {
			v.Release()
		}
	}()
	return sess.Run(vals)
}

// values wraps tensors the caller owns as ONNX Runtime values, without a
// copy.
func values(rt *ortcapi.Runtime, inputs []*tensor.Tensor) ([]*ortcapi.Value, error) {
	vals := make([]*ortcapi.Value, 0, len(inputs))
	for _, x := range inputs {
		var p unsafe.Pointer
		if len(x.Data) > 0 {
			p = unsafe.Pointer(&x.Data[0])
		}
		v, err := rt.NewTensor(ortcapi.ElemType(x.DType), x.Shape, p, len(x.Data))
		if err != nil {
			for _, o := range vals {
				o.Release()
			}
			return nil, fmt.Errorf("input %q: %w", x.Name, err)
		}
		vals = append(vals, v)
	}
	return vals, nil
}
