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
	"math"
	"sort"
	"sync"

	"fp16audit/internal/grad"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
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
	// Res is the backward graph with autocast's rounding and summaries;
	// Scans are its runs by exponent.
	Res   *grad.Result
	Scans map[int]*grad.Scan
	// FP32 is one run at scale 1 of the same backward without rounding,
	// whose readings are keyed like Scans'.
	FP32 *grad.Scan
	// InitExp is the initial scale's exponent; MinExp and MaxExp bound
	// the sweep.
	InitExp, MinExp, MaxExp int
	// UnderflowFraction: a gradient flushing more than this fraction
	// underflows.
	UnderflowFraction float64
	// Runs counts the backward runs; Elapsed their time with the graph
	// generation, in seconds.
	Runs    int
	Elapsed float64
}

// Runner verifies a fix by running the backward again: BF16 runs it with
// the rounding of the bf16 policy (learn.to_bf16(), which trains without
// loss scaling) at scale 1, returning the graph and its scan; ctx ending
// stops the run.
type Runner interface {
	BF16(ctx context.Context) (*grad.Result, *grad.Scan, error)
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
	module string
	op     string
	// partial: the gradient misses the share of an op without a rule.
	partial bool
	// ref counts the gradient's nonzero elements in the fp32 backward
	// (0 for a site, which the fp32 graph does not have).
	ref float64
}

// table is the gradients and what the scans say about each, computed
// once.
type table struct {
	entries []*entry
	exps    []int // scanned exponents, ascending
	// maxClean and flushFree per entry (nil: none), see the report.
	maxClean  []*int
	flushFree []*int
}

// reading returns entry e's reading in scan s.
func (e *entry) reading(s *grad.Scan) (grad.Reading, bool) {
	if e.site {
		r, ok := s.Sites[e.key]
		return r, ok
	}
	r, ok := s.Grads[e.key]
	return r, ok
}

// overflowed reports whether a reading overflowed.
func overflowed(r grad.Reading) bool { return r.NonFinite || isNaNOrInf(r.MaxAbs) }

// lostFraction is the fraction of a gradient fp16 loses to underflow.
// With ref, the count of its nonzero elements in the fp32 backward, it is
// the share of those that are zero here — flushed here, or zero already
// because a gradient upstream flushed, which is why a gradient can look
// clean at a small scale where nothing reaches it. Without ref (a site,
// which the fp32 graph does not have) it is the share the rounding here
// flushes. An overflowed reading loses nothing to underflow.
func lostFraction(r grad.Reading, ref float64) float64 {
	switch {
	case overflowed(r):
		return 0
	case ref > 0:
		return max(0, 1-(r.NonZero-r.Flushed)/ref)
	}
	return r.FlushedFraction()
}

// lost is lostFraction for entry e.
func (e *entry) lost(r grad.Reading) float64 { return lostFraction(r, e.ref) }

// flushes reports whether entry e loses more than the fraction thr.
func (e *entry) flushes(r grad.Reading, thr float64) bool { return e.lost(r) > thr }

// Flags are the per-key flags a sweep tracks: bit 0 overflow, bit 1 more
// than thr of the gradient lost to underflow, measured against fp32, the
// fp32 backward's scan. Overflow switches on once as the scale grows and
// the loss off, so backward.Sweep can bisect on them.
func Flags(thr float64, fp32 *grad.Scan) func(*grad.Scan) map[string]uint8 {
	return func(s *grad.Scan) map[string]uint8 {
		out := make(map[string]uint8, len(s.Grads)+len(s.Sites))
		add := func(prefix string, m map[string]grad.Reading, refs map[string]grad.Reading) {
			for k, r := range m {
				var f uint8
				if overflowed(r) {
					f |= 1
				}
				if lostFraction(r, refs[k].NonZero) > thr {
					f |= 2
				}
				out[prefix+k] = f
			}
		}
		var refs map[string]grad.Reading
		if fp32 != nil {
			refs = fp32.Grads
		}
		add("g:", s.Grads, refs)
		add("s:", s.Sites, nil)
		return out
	}
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
		e := &entry{key: gr.Value, value: gr.Value, node: gr.Node, pos: -1, kind: "activation",
			prec: precOf(f.Assign.Value[gr.Value]), partial: gr.Partial}
		if b.FP32 != nil {
			e.ref = b.FP32.Grads[gr.Value].NonZero
		}
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
			module: onnx.ModulePath(n), op: n.OpType}
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
	for e := range b.Scans {
		t.exps = append(t.exps, e)
	}
	sort.Ints(t.exps)
	thr := b.UnderflowFraction
	for _, e := range t.entries {
		var clean, free *int
		for _, x := range t.exps {
			r, ok := e.reading(b.Scans[x])
			if !ok {
				continue
			}
			if overflowed(r) {
				break
			}
			clean = ptr(x)
		}
		if clean != nil {
			// The smallest exponent from which every scale up to clean
			// loses at most thr: searched from the top, so that a scale
			// where nothing reaches the gradient yet cannot pass for one
			// where it is kept.
			for k := len(t.exps) - 1; k >= 0; k-- {
				x := t.exps[k]
				if x > *clean {
					continue
				}
				r, _ := e.reading(b.Scans[x])
				if e.flushes(r, thr) {
					break
				}
				free = ptr(x)
			}
		}
		t.maxClean = append(t.maxClean, clean)
		t.flushFree = append(t.flushFree, free)
	}
	return t
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
	case slot == 2 && (n.OpType == "Conv" || n.OpType == "Gemm" || n.OpType == "ConvTranspose"),
		n.OpType == "Add" || n.OpType == "Sub": // the exporter's split Linear bias
		return "bias"
	}
	return "weight"
}

func precOf(p precision.Precision) string { return p.String() }

// window returns the global largest clean exponent (nil: none), the
// smallest flush-free one (nil: none at or below it), and the modules
// underflowing at every clean scale.
func (t *table) window() (maxClean, flushFree *int, under []string) {
	for i := range t.entries {
		c := t.maxClean[i]
		if c == nil {
			return nil, nil, nil
		}
		if maxClean == nil || *c < *maxClean {
			maxClean = ptr(*c)
		}
	}
	if maxClean == nil {
		return nil, nil, nil // nothing held in half
	}
	seen := map[string]bool{}
	for i, e := range t.entries {
		ff := t.flushFree[i]
		if ff == nil || *ff > *maxClean {
			if m := e.label(); !seen[m] {
				seen[m] = true
				under = append(under, m)
			}
			continue
		}
		if flushFree == nil || *ff > *flushFree {
			flushFree = ptr(*ff)
		}
	}
	if len(under) > 0 {
		return maxClean, nil, under
	}
	return maxClean, flushFree, nil
}

// label names an entry for a reader: its module, or its value when the
// node has no module path.
func (e *entry) label() string {
	if e.module != "" {
		return e.module
	}
	return e.value
}

// firstOverflow returns the entry that overflows first in backward order
// at exponent x, or -1.
func (t *table) firstOverflow(s *grad.Scan) int {
	for i := len(t.entries) - 1; i >= 0; i-- {
		if r, ok := t.entries[i].reading(s); ok && overflowed(r) {
			return i
		}
	}
	return -1
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
