// Package training diagnoses the training side of an audit: how the
// forward passes' mode (eval or train) changed BatchNormalization and
// Dropout, whether an eval-mode audit reflects training at all, and what
// the backward pass does in fp16 at each loss scale — which gradient
// overflows first, which module's gradients flush to zero, and which
// init_scale a GradScaler should start from. Its checks (FP6xxx) are
// analyzers over one Facts value, like the forward audit's; it computes
// on results and never runs a model: the audit hands it the scans of the
// backward graph and a Runner for the one fix it verifies (bf16).
package training

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"

	"fp16audit/internal/grad"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
)

// Facts is what the training analyzers know about one audit.
type Facts struct {
	// Model is the model as audited (after the mode rewrite), Policy and
	// Assign its precision plan.
	Model  *onnx.Model
	Policy *precision.Policy
	Assign *precision.Assignment
	// Mode is rewrite.ModeEval or rewrite.ModeTrain; Changes what the
	// mode rewrite did and Seed the Dropout seed of train mode.
	Mode    string
	Changes rewrite.ModeChanges
	Seed    int64
	// FP32 is the forward fp32 pass (nil when it did not run).
	FP32 *observe.PassResult
	// Backward is the backward audit (nil without a loss).
	Backward *Backward

	once  sync.Once
	table *table
}

// Backward is what the backward runs produced.
type Backward struct {
	// Loss, Output and Target describe the loss (Target: the file).
	Loss   grad.Loss
	Output string
	Target string
	// Batch is the index of the batch the backward ran on.
	Batch int
	// Scored counts the targets the loss averages over (grad's
	// Result.ScoredTargets), of Targets in all.
	Scored, Targets int64
	// Res is the backward graph with autocast's rounding.
	Res *grad.Result
	// FP32 is its run with the rounding off at scale 1: the reference,
	// whose mass by exponent judges every scale.
	FP32 *grad.Run
	// Runs are its emulated runs (rounding on) by exponent.
	Runs map[int]*grad.Run
	// InitExp is the initial scale's exponent; MinExp and MaxExp bound
	// the exponents judged.
	InitExp, MinExp, MaxExp int
	// Tolerance: a scale is clean when no parameter gradient loses more
	// than this share of its L2 norm.
	Tolerance float64
	// Count counts the backward runs; Elapsed their time with the graph
	// generation, in seconds.
	Count   int
	Elapsed float64

	// memo holds what is read off the runs' parameter gradients (millions
	// of elements on a ResNet), once per run for every Facts over this
	// Backward: the audit asks NextRuns and then diagnoses, each with a
	// Facts of its own.
	memo runMemo
}

// runMemo caches, by run (and the fp32 run it is compared with), the
// parameter losses of an emulated run, whether a run's parameter
// gradients hold NaN/Inf, whether the fp32 backward does, and the fp32
// parameter gradients' norms.
type runMemo struct {
	lost   map[runPair][]float64
	over   map[*grad.Run]bool
	broken map[*grad.Run]bool
	norms  map[*grad.Run][]float64
}

type runPair struct{ run, fp32 *grad.Run }

// Runner verifies a fix by running the backward again: BF16 runs it with
// the rounding of the bf16 policy (learn.to_bf16(), which trains without
// loss scaling) at scale 1; ctx ending stops the run.
type Runner interface {
	BF16(ctx context.Context) (*grad.Run, error)
}

// entry is one gradient the policy holds in reduced precision: the
// gradient of a node output, or a Site (a parameter's gradient an autocast
// op computes in half).
type entry struct {
	key    string // Grad.Value or Site.Rounded
	site   bool
	value  string
	node   int // producing node; for a site the op computing it; -1 none
	pos    int // position of node in the topological order (-1: source)
	kind   string
	prec   string
	format grad.Format
	module string
	op     string
	// partial: the gradient misses the share of an op without a rule.
	partial bool
}

// param is one parameter gradient and the reduced-precision gradients it
// is computed from: its own sites and the gradients of the outputs of the
// ops that read it (indexes into table.entries).
type param struct {
	value  string
	module string
	node   int // the first node that reads it (-1: none)
	pos    int
	feeds  []int
	// noise: the fp32 gradient is zero up to rounding (see noiseRatio).
	noise bool
}

// table is the gradients of one backward graph, computed once.
type table struct {
	entries []*entry
	params  []*param
}

// mass returns entry e's Mass in run r (nil when the run has none).
func (e *entry) mass(r *grad.Run) *grad.Mass {
	if r == nil {
		return nil
	}
	if e.site {
		return r.Sites[e.key]
	}
	return r.Grads[e.key]
}

// gradients computes the table once.
func (f *Facts) gradients() *table {
	f.once.Do(func() { f.table = f.buildTable() })
	return f.table
}

func (f *Facts) buildTable() *table {
	b := f.Backward
	t := &table{}
	if b == nil {
		return t
	}
	g := f.Model.Proto.Graph
	ix := f.Model.Index
	pos := map[int]int{}
	for k, i := range ix.Order() {
		pos[i] = k
	}
	for _, gr := range b.Res.Grads {
		if gr.Raw == "" {
			continue // held in fp32: nothing to overflow or flush in 16 bits
		}
		p := f.Assign.Value[gr.Value]
		e := &entry{key: gr.Value, value: gr.Value, node: gr.Node, pos: -1, kind: "activation",
			prec: precOf(p), format: grad.FormatOf(p.ElemType()), partial: gr.Partial}
		if gr.Node >= 0 {
			n := g.Node[gr.Node]
			e.pos, e.module, e.op = pos[gr.Node], onnx.ModulePath(n), n.OpType
		}
		t.entries = append(t.entries, e)
	}
	for _, s := range b.Res.Sites {
		n := g.Node[s.Node]
		e := &entry{key: s.Rounded, site: true, value: s.Value, node: s.Node, pos: pos[s.Node],
			kind: siteKind(ix, n, s.Input), prec: precOf(precision.PrecisionOf(s.ElemType)),
			format: grad.FormatOf(s.ElemType), module: onnx.ModulePath(n), op: n.OpType}
		t.entries = append(t.entries, e)
	}
	// Forward order; at one node its output's gradient comes after its
	// sites, so that backward order (the reverse) meets the output first.
	sort.SliceStable(t.entries, func(i, j int) bool {
		a, c := t.entries[i], t.entries[j]
		if a.pos != c.pos {
			return a.pos < c.pos
		}
		return a.site && !c.site
	})
	byValue := map[string][]int{}
	for k, e := range t.entries {
		if !e.site {
			byValue[e.value] = append(byValue[e.value], k)
		}
	}
	params := b.Res.Params()
	norms := f.paramNorms(params)
	for k, gr := range params {
		p := &param{value: gr.Value, pos: -1, node: gr.Node}
		if gr.Node >= 0 {
			p.module, p.pos = onnx.ModulePath(g.Node[gr.Node]), pos[gr.Node]
		}
		for k, e := range t.entries {
			if e.site && e.value == gr.Value {
				p.feeds = append(p.feeds, k)
			}
		}
		for _, c := range ix.Consumers(gr.Value) {
			n := g.Node[c]
			if p.module == "" {
				p.module = onnx.ModulePath(n)
			}
			if p.pos < 0 || pos[c] < p.pos {
				p.pos, p.node = pos[c], c
			}
			for _, o := range n.Output {
				p.feeds = append(p.feeds, byValue[o]...)
			}
		}
		if b.FP32 != nil {
			for _, i := range p.feeds {
				if m := t.entries[i].mass(b.FP32); m != nil && norms[k] < noiseRatio*m.Norm() {
					p.noise = true
				}
			}
		}
		t.params = append(t.params, p)
	}
	sort.SliceStable(t.params, func(i, j int) bool { return t.params[i].pos < t.params[j].pos })
	return t
}

// paramNorms returns the L2 norm of each parameter's fp32 gradient (nil
// without the fp32 run), spread over the cores.
func (f *Facts) paramNorms(params []grad.Grad) []float64 {
	b := f.Backward
	if b.FP32 == nil {
		return nil
	}
	if norms, ok := b.memo.norms[b.FP32]; ok && len(norms) == len(params) {
		return norms
	}
	norms := make([]float64, len(params))
	parallel(len(params), func(i int) {
		var ss float64
		for _, v := range b.FP32.Params[params[i].Value] {
			ss += float64(v) * float64(v)
		}
		norms[i] = math.Sqrt(ss)
	})
	if b.memo.norms == nil {
		b.memo.norms = map[*grad.Run][]float64{}
	}
	b.memo.norms[b.FP32] = norms
	return norms
}

// siteKind says what a Site's input slot is: the weight or bias of a Conv
// or Linear (a parameter, or an Identity of one), or another input.
func siteKind(ix *onnx.Index, n *onnx.NodeProto, slot int) string {
	v := n.Input[slot]
	param := ix.IsInitializer(v)
	if p := ix.Producer(v); p >= 0 {
		pn := ix.Graph().Node[p]
		param = pn.OpType == "Identity" && len(pn.Input) == 1 && ix.IsInitializer(pn.Input[0])
	}
	switch {
	case !param:
		return "input"
	case slot == biasInput(n), n.OpType == "Add" || n.OpType == "Sub": // a layer's bias, or the exporter's split Linear bias
		return "bias"
	}
	return "weight"
}

// biasInput is the input slot of n's bias when it is a layer with one
// (ops.Op.BiasInput: Conv's, Gemm's C), -1 otherwise.
func biasInput(n *onnx.NodeProto) int {
	if o := ops.Lookup(ops.Default, n.OpType); o != nil && o.BiasInput > 0 {
		return o.BiasInput
	}
	return -1
}

func precOf(p precision.Precision) string { return p.String() }

// label names an entry for a reader: its module, or its value when the
// node has no module path.
func (e *entry) label() string {
	if e.module != "" {
		return e.module
	}
	return e.value
}

// name names a parameter for a reader: its initializer's name or, where
// the exporter invented that name (a Linear's weight transposed for
// MatMul is "onnx::MatMul_604"), the weight of the module that reads it.
func (p *param) name() string {
	if strings.HasPrefix(p.value, "onnx::") && p.module != "" {
		return fmt.Sprintf("%s.weight, exported as %s", p.module, p.value)
	}
	return p.value
}

// label names a parameter's module, or the parameter.
func (p *param) label() string {
	if p.module != "" {
		return p.module
	}
	return p.value
}

// fp32Broken reports whether the fp32 backward holds NaN/Inf: in the
// loss, a parameter gradient or a gradient held in 16 bits.
func (b *Backward) fp32Broken() bool {
	r := b.FP32
	if r == nil {
		return false
	}
	if isNaNOrInf(r.Loss) || !paramsFinite(r) {
		return true
	}
	for _, m := range r.Grads {
		if m.NonFinite > 0 {
			return true
		}
	}
	for _, m := range r.Sites {
		if m.NonFinite > 0 {
			return true
		}
	}
	return false
}

// ready reports whether the backward can say anything about 16-bit
// gradients: it ran, it is finite in fp32, and something is held in 16
// bits.
func (f *Facts) ready() bool {
	b := f.Backward
	if b == nil || b.FP32 == nil {
		return false
	}
	return !f.fp32Broken() && len(f.gradients().entries) > 0
}

// fp32Broken is Backward.fp32Broken, read once per fp32 run.
func (f *Facts) fp32Broken() bool {
	b := f.Backward
	m := &b.memo
	if v, ok := m.broken[b.FP32]; ok {
		return v
	}
	if m.broken == nil {
		m.broken = map[*grad.Run]bool{}
	}
	m.broken[b.FP32] = b.fp32Broken()
	return m.broken[b.FP32]
}

// overflow says whether the backward at exponent x overflows: measured
// when an emulated run at x (or, the scale only growing it, at a smaller
// exponent that overflowed or a larger one that did not) says so, else
// from the fp32 backward's maxima. first is the entry that overflows
// first in backward order by the fp32 maxima (-1: none there).
func (f *Facts) overflow(x int) (over bool, first int) {
	t, b := f.gradients(), f.Backward
	first = -1
	for i := len(t.entries) - 1; i >= 0; i-- {
		e := t.entries[i]
		if m := e.mass(b.FP32); m != nil && m.Overflows(x, e.format) {
			first = i
			break
		}
	}
	if r, ok := b.Runs[x]; ok {
		return f.runOverflows(r), first
	}
	for y, r := range b.Runs {
		if y < x && f.runOverflows(r) {
			return true, first
		}
	}
	for y, r := range b.Runs {
		if y > x && !f.runOverflows(r) {
			return false, first
		}
	}
	return first >= 0, first
}

// runOverflows: an emulated run overflows when a parameter gradient holds
// NaN or Inf, which is what makes a GradScaler skip the step. Each run is
// read once.
func (f *Facts) runOverflows(r *grad.Run) bool {
	m := &f.Backward.memo
	if v, ok := m.over[r]; ok {
		return v
	}
	v := !paramsFinite(r)
	if m.over == nil {
		m.over = map[*grad.Run]bool{}
	}
	m.over[r] = v
	return v
}

// paramsFinite reports whether every parameter gradient of r is finite,
// read on every core.
func paramsFinite(r *grad.Run) bool {
	gs := make([][]float32, 0, len(r.Params))
	for _, g := range r.Params {
		gs = append(gs, g)
	}
	bad := make([]bool, len(gs))
	parallel(len(gs), func(i int) { bad[i] = !allFinite(gs[i]) })
	return !slices.Contains(bad, true)
}

// allFinite reads the exponent bits alone: a ResNet's parameter
// gradients are millions of elements, read for the fp32 backward and
// every emulated run.
func allFinite(g []float32) bool {
	const exp = 0x7f800000 // all ones: Inf or NaN
	for _, x := range g {
		if math.Float32bits(x)&exp == exp {
			return false
		}
	}
	return true
}

// lost returns the share of parameter k's gradient norm lost at exponent
// x: measured by the emulated run at x, or estimated from the fp32 mass
// by exponent of the gradients it is computed from (each one's own
// rounding, compounded as independent losses).
func (f *Facts) lost(k, x int) (lost float64, measured bool) {
	t, b := f.gradients(), f.Backward
	if r, ok := b.Runs[x]; ok {
		m := &b.memo
		key := runPair{r, b.FP32}
		ls, ok := m.lost[key]
		if !ok {
			// Each run's losses once: a parameter gradient is long.
			names := make([]string, len(t.params))
			for i, q := range t.params {
				names[i] = q.value
			}
			var finite []bool
			ls, finite = lostMasses(r, b.FP32, names, x)
			if m.lost == nil {
				m.lost = map[runPair][]float64{}
			}
			m.lost[key] = ls
			if _, ok := m.over[r]; !ok && len(names) == len(r.Params) {
				// The same read said whether every gradient is finite.
				if m.over == nil {
					m.over = map[*grad.Run]bool{}
				}
				m.over[r] = slices.Contains(finite, false)
			}
		}
		return ls[k], true
	}
	est := f.estimate(k, x)
	// Calibrate by the nearest measured run that does not overflow: how
	// far the parameter's measured loss exceeds the estimate there.
	near, ok := 0, false
	for y, r := range b.Runs {
		if f.runOverflows(r) {
			continue
		}
		if !ok || abs(y-x) < abs(near-x) || (abs(y-x) == abs(near-x) && y > near) {
			near, ok = y, true
		}
	}
	if ok {
		m, _ := f.lost(k, near)
		if e := f.estimate(k, near); e > 0 && m > e {
			est *= m / e
		}
	}
	return min(1, est), false
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// estimate is the share of parameter k's gradient norm lost at exponent x
// by the fp32 mass by exponent of the gradients it is computed from, each
// one's own rounding compounded as independent losses.
func (f *Facts) estimate(k, x int) float64 {
	t, b := f.gradients(), f.Backward
	kept := 1.0
	for _, i := range t.params[k].feeds {
		e := t.entries[i]
		if m := e.mass(b.FP32); m != nil {
			kept *= 1 - m.Lost(x, e.format)
		}
	}
	return 1 - kept
}

// noiseRatio: a parameter gradient whose fp32 norm is below this share of
// the norm of a gradient it is computed from is zero up to rounding (a
// sum that cancels, such as an attention key's bias gradient, which
// softmax's shift invariance makes zero): its relative loss measures
// rounding noise, and it is not judged.
const noiseRatio = 1.0 / (1 << 16)

// noise reports whether parameter k's fp32 gradient is zero up to
// rounding (see noiseRatio).
func (f *Facts) noise(k int) bool { return f.gradients().params[k].noise }

// worst returns the largest share a judged parameter gradient loses at x
// and the parameter's index (-1: no parameter).
func (f *Facts) worst(x int) (lost float64, k int) {
	k = -1
	for i := range f.gradients().params {
		if f.noise(i) {
			continue
		}
		if l, _ := f.lost(i, x); k < 0 || l > lost {
			lost, k = l, i
		}
	}
	return lost, k
}

// estimateMargin: an exponent without an emulated run counts as clean
// only when this many times its estimated loss is within the tolerance.
// The estimate misses how the backward amplifies a gradient's rounding
// into a parameter's (a Conv's weight gradient summed over BatchNorm's
// centred gradient): on the training fixtures the measured loss came out
// up to 4.6 times the calibrated estimate (cnn_bn_train's conv1 weight at
// 2^1, estimated 0.41%, measured 1.9%), and with the margin no scale the
// clean window counts on its estimate loses more than the tolerance when
// run (TestEstimateAgainstRuns): a scale judged by its estimate errs
// towards loss, by up to two exponents of the window's start.
const estimateMargin = 4

// clean reports whether exponent x neither overflows nor loses more than
// the tolerance of any parameter gradient: measured, or estimated with
// estimateMargin.
func (f *Facts) clean(x int) bool {
	if over, _ := f.overflow(x); over {
		return false
	}
	l, _ := f.worst(x)
	if _, measured := f.Backward.Runs[x]; !measured {
		l *= estimateMargin
	}
	return l <= f.Backward.Tolerance
}

// mayBeClean reports whether exponent x, without a run, would be clean by
// its estimate alone (without estimateMargin).
func (f *Facts) mayBeClean(x int) bool {
	if _, measured := f.Backward.Runs[x]; measured {
		return false
	}
	if over, _ := f.overflow(x); over {
		return false
	}
	l, _ := f.worst(x)
	return l <= f.Backward.Tolerance
}

// scales are what the facts say about the loss scales: the largest
// without overflow, where a GradScaler from the initial scale settles,
// and the smallest from which every scale up to the largest clean one is
// clean. nil: none.
type scales struct {
	maxClean, settled, cleanFrom *int
}

func (f *Facts) scales() scales {
	var s scales
	b := f.Backward
	if !f.ready() {
		return s
	}
	for x := b.MaxExp; x >= b.MinExp; x-- {
		if over, _ := f.overflow(x); !over {
			s.maxClean = ptr(x)
			break
		}
	}
	if s.maxClean == nil {
		return s
	}
	s.settled = ptr(min(b.InitExp, *s.maxClean))
	for x := *s.maxClean; x >= b.MinExp && f.clean(x); x-- {
		s.cleanFrom = ptr(x)
	}
	return s
}

// maxRuns bounds the emulated runs NextRuns asks for.
const maxRuns = 8

// overflowMargin: an emulated run's gradients differ from the fp32 ones by
// the rounding upstream of them, a small share of their size. A scale at
// which a gradient comes within this share of overflowing is confirmed by
// a run; one farther below overflow is clean as far as the fp32 maxima
// say.
const overflowMargin = 1.0 / 8

// nearOverflow reports whether a 16-bit gradient scaled to 2^x comes
// within overflowMargin of overflowing.
func (f *Facts) nearOverflow(x int) bool {
	for _, e := range f.gradients().entries {
		if m := e.mass(f.Backward.FP32); m != nil && math.Ldexp(m.Max, x)*(1+overflowMargin) >= e.format.Overflow {
			return true
		}
	}
	return false
}

// NextRuns returns the exponents at which an emulated backward should run
// next to confirm what the fp32 backward's mass by exponent says, where
// not yet run: the settled scale, which decides the verdict; the largest
// clean one where a gradient there comes near overflow (farther from it,
// it keeps what the settled scale keeps, and more); and, when the settled
// scale is not clean, the smallest of the clean window, the scale to start
// from, and the one below it while its estimate alone would call it
// clean. Under a clean settled scale the window's start is only reported,
// estimated with estimateMargin (so on the safe side). The
// audit runs them, adds them to Runs and asks again until nothing is
// left: a run that overflows, or loses more than the estimate, moves the
// edges (and recalibrates the estimates near it), and the next call asks
// for the new ones.
func (f *Facts) NextRuns() []int {
	b := f.Backward
	if !f.ready() || len(b.Runs) >= maxRuns {
		return nil
	}
	s := f.scales()
	want := []*int{s.settled}
	if s.maxClean != nil && f.nearOverflow(*s.maxClean) {
		want = append(want, s.maxClean)
	}
	if s.settled != nil && !f.clean(*s.settled) && s.cleanFrom != nil {
		// The window's start is the advice: measured, and the scale
		// below it too where only the margin keeps it out.
		want = append(want, s.cleanFrom)
		if below := *s.cleanFrom - 1; below >= b.MinExp && f.mayBeClean(below) {
			if _, ok := b.Runs[*s.cleanFrom]; ok {
				want = append(want, ptr(below))
			}
		}
	}
	var out []int
	for _, x := range want {
		if x == nil {
			continue
		}
		if _, ok := b.Runs[*x]; !ok && !slices.Contains(out, *x) {
			out = append(out, *x)
		}
	}
	sort.Ints(out)
	return out
}

func ptr[T any](v T) *T { return &v }

func isNaNOrInf(x float64) bool { return math.IsNaN(x) || math.IsInf(x, 0) }

// finite returns a pointer to x, or nil when x is not finite (JSON null).
func finite(x float64) *float64 {
	if isNaNOrInf(x) {
		return nil
	}
	return &x
}

// lostMasses returns grad.LostMass of each named parameter gradient of r
// (× 2^exp) against fp32's, and whether r's is finite, spread over the
// cores: a ResNet-18's gradients are 11 M elements, read once per run.
func lostMasses(r, fp32 *grad.Run, names []string, exp int) (lost []float64, finite []bool) {
	lost, finite = make([]float64, len(names)), make([]bool, len(names))
	parallel(len(names), func(i int) {
		lost[i], finite[i] = grad.LostMass(r.Params[names[i]], fp32.Params[names[i]], exp)
	})
	return lost, finite
}

// parallel calls do(0) … do(n-1) on every core, each index once.
func parallel(n int, do func(i int)) {
	work := make(chan int, n)
	for i := range n {
		work <- i
	}
	close(work)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), n) {
		wg.Go(func() {
			for i := range work {
				do(i)
			}
		})
	}
	wg.Wait()
}
