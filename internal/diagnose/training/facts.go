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
	"fp16audit/internal/diagnose/words"
	"math"
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
	// Trainer names the trainer whose words the fix texts use
	// (words.Names; "" is words.Default) and AutocastDevice the device
	// its autocast runs on ("" is cuda).
	Trainer, AutocastDevice string

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
	// Saved is its run at scale 1 with the forward values held in 16
	// bits as the policy holds them and every gradient unrounded: the
	// backward exactly at the values the fp16 forward saved, which the
	// emulated runs' parameter gradients lose their mass against, so
	// that the forward's own precision (no loss scale changes it) is not
	// counted as mass lost. nil where the forward holds nothing in 16
	// bits; where it is NaN/Inf the fp32 run is the reference.
	Saved *grad.Run
	// Runs are its emulated runs (rounding on) by exponent.
	Runs map[int]*grad.Run
	// InitExp is the initial scale's exponent; MinExp and MaxExp bound
	// the exponents judged.
	InitExp, MinExp, MaxExp int
	// Tolerance: a scale is clean when no parameter gradient loses more
	// than this share of its L2 norm.
	Tolerance float64
	// VerifyFixes verifies the one-step fixes whenever the initial scale
	// overflows or loses mass, not only bf16 when no fp16 scale is clean
	// (a replay of a captured step asks what would have held there): bf16,
	// and the modules whose gradients fail kept in fp32.
	VerifyFixes bool
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
// loss scaling) at scale 1; KeepFP32 with the nodes keep computing in
// fp32 (autocast disabled around their modules), forward and backward,
// at scale 2^exp. Each also returns the fix's own reference, the
// backward at the values its forward saved with the gradients unrounded
// (see Backward.Saved; nil: the fp32 run is the reference). ctx ending
// stops the run.
type Runner interface {
	BF16(ctx context.Context) (run, ref *grad.Run, err error)
	KeepFP32(ctx context.Context, keep map[int]bool, exp int) (run, ref *grad.Run, err error)
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
	if p.module != "" && exportersConstant(p.value) {
		return fmt.Sprintf("%s.weight, exported as %s", p.module, p.value)
	}
	return p.value
}

// exportersConstant reports whether name is one the exporters give a
// weight they rewrote: the TorchScript exporter's onnx::MatMul_12, the
// dynamo exporter's val_12 (a Linear's weight transposed for MatMul and
// folded into a constant of its own).
func exportersConstant(name string) bool {
	if strings.HasPrefix(name, "onnx::") {
		return true
	}
	digits, ok := strings.CutPrefix(name, "val_")
	return ok && digits != "" && strings.Trim(digits, "0123456789") == ""
}

// label names a parameter's module, or the parameter.
func (p *param) label() string {
	if p.module != "" {
		return p.module
	}
	return p.value
}

// words are the phrases of the trainer the fix texts follow.
func (f *Facts) words() *words.Trainer {
	return words.For(f.Trainer)
}

// bf16 is how the user's trainer trains in bf16.
func (f *Facts) bf16() string {
	return f.words().BF16For(f.AutocastDevice)
}
