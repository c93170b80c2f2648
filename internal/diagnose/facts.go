// Package diagnose turns what the passes observed into findings, origins,
// verified fixes and a verdict: the diagnosis stage of an audit. Every
// dynamic check is an Analyzer over one Facts value (the static facts of
// the model, the input analysis and the pass results), run by a driver
// like the static lint's; the verdict is computed from the findings the
// analyzers returned and from the fixes a rerun verified, never inside an
// analyzer.
package diagnose

import (
	"math"
	"sort"

	"fp16audit/internal/lint"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
	"fp16audit/internal/tensor"
	"fp16audit/report"
)

// Pass names, as the report has them.
const (
	PassFP32      = report.PassFP32
	PassFP16      = report.PassFP16
	PassBF16      = report.PassBF16
	PassAsWritten = report.PassAsWritten
)

// Thresholds are the diagnosis's tunable limits; DefaultThresholds documents
// the defaults, which the command line prints in --help.
type Thresholds struct {
	// HeadroomBits: a value held in fp16 whose fp32 headroom
	// log2(65504/max|x|) is below this gets FP2004.
	HeadroomBits float64
	// UnderflowFraction: a value held in fp16 losing more than this fraction
	// of its nonzero elements to zero gets FP3001.
	UnderflowFraction float64
	// ColumnScale: a tabular column with |mean| or std above this is "far
	// from standardized" (FP1004).
	ColumnScale float64
	// FixIterations bounds the keep-fp32 search: each iteration forces the
	// current origins to fp32 and re-runs.
	FixIterations int
	// OutputTolFP16 and OutputTolBF16: a pass whose graph outputs are
	// finite but whose worst sample differs from fp32 by more than this
	// relative L2 error fails (FP2006). bf16 keeps 8 significant bits to
	// fp16's 11, so its healthy error is several times fp16's; the
	// defaults are the largest errors measured on healthy models with a
	// margin (docs/reports.md, "Output agreement").
	OutputTolFP16, OutputTolBF16 float64
}

// DefaultThresholds are the documented defaults.
var DefaultThresholds = Thresholds{HeadroomBits: 3, UnderflowFraction: 0.10, ColumnScale: 10, FixIterations: 8,
	OutputTolFP16: 0.05, OutputTolBF16: 0.25}

// Facts is what the dynamic analyzers know about one audit. The caller
// fills the exported fields; Run derives the rest once (origins, the
// infinities the model writes on purpose, the values a mask fills) before
// any analyzer runs, and analyzers only read.
type Facts struct {
	// Static holds the model, the policy, the policy's precision
	// assignment and the topological order: the facts the static lint
	// works from.
	Static *lint.Facts
	// HalfCasts marks the model's own Cast-to-half nodes (node indices).
	HalfCasts map[int]bool
	// Inputs describes every graph input the batches fed, in input order.
	Inputs []*Input
	// Passes holds the results of the fp32 reference (PassFP32), the
	// policy's emulated pass (Main), under autocast-fp16 the bf16 pass,
	// and, when the model casts to half itself, the pass without mixed
	// precision that keeps those casts (PassAsWritten), when they ran
	// (the what-if passes run on demand).
	Passes map[string]*observe.PassResult
	// Main names the policy's emulated pass; "" under the fp32 policy.
	Main string
	// Ranked are the values a data-dependent selection ranks or gathers
	// from, which the passes compared with fp32's as graph outputs in
	// place of the outputs the selection chose: NaN/Inf reaching them
	// reach an output.
	Ranked []string
	// Values are the node outputs the passes observed, in topological
	// order.
	Values     []string
	Thresholds Thresholds
	// AutocastDevice is the device_type of the user's torch.autocast,
	// which the fix texts name ("cpu", "mps", ...); "" is "cuda".
	AutocastDevice string

	derived
}

// derived is what Run computes from the exported facts before the
// analyzers run.
type derived struct {
	prepared bool
	// consts marks the values fixed without running the model.
	consts map[string]bool
	// assign holds the precision assignment of every pass that ran.
	assign map[string]*precision.Assignment
	// origins, deliberate and fills are per pass: the origins of NaN/Inf,
	// the values whose only non-finite elements are infinities the model
	// writes on purpose, and where a mask constant beyond the pass's range
	// is written (see passOrigins).
	origins    map[string][]report.Origin
	deliberate map[string]map[string]bool
	fills      map[string][]fill
	// finfo lists where the policy's emulated pass reads a number
	// torch.finfo(dtype) wrote as its format's limit (rewrite.FinfoFills).
	finfo []rewrite.FinfoFill
	// masked marks the nodes whose values carry a mask (see prepare).
	masked map[int]bool
	// lowHeadroom lists the values of a clean emulated pass below the
	// headroom threshold, least headroom first.
	lowHeadroom []headroomValue
	// agreements holds the output agreement of every compared pass, by
	// pass name (recordAgreement): the fix reruns add theirs after the
	// analyzers ran.
	agreements map[string][]report.OutputAgreement
}

// headroomValue is a value held in reduced precision close to its
// format's limit.
type headroomValue struct {
	node  int
	value string
	bits  float64
}

// prepare computes the derived facts. Everything an analyzer reads beyond
// the exported fields is made here, once, so that analyzers run on the
// same facts in any order and never write.
func (f *Facts) prepare() {
	if f.prepared {
		return
	}
	f.prepared = true
	g := f.graph()
	f.consts = constantValues(g, f.Static.Order)
	f.assign = map[string]*precision.Assignment{PassFP32: f.Static.Assign}
	if f.Main != "" {
		f.assign[f.Main] = f.Static.Assign
	}
	elemType := f.Static.Model.Index.ElemType
	if _, ok := f.Passes[PassBF16]; ok && f.Main != PassBF16 {
		bp, _ := precision.PolicyByName("autocast-bf16")
		f.assign[PassBF16] = precision.Assign(bp, g, f.Static.Order, elemType)
	}
	if _, ok := f.Passes[PassAsWritten]; ok {
		f.assign[PassAsWritten] = AsWrittenAssignment(f.Static)
	}
	f.origins, f.deliberate, f.fills = map[string][]report.Origin{}, map[string]map[string]bool{}, map[string][]fill{}
	for _, p := range f.passNames() {
		if asg := f.assign[p]; asg != nil {
			f.origins[p], f.deliberate[p], f.fills[p] = f.passOrigins(p, f.Passes[p], asg)
		}
	}
	f.masked = map[int]bool{}
	if f.Main != "" {
		f.finfo = rewrite.FinfoFills(g, f.assign[f.Main])
		for ni := range f.finfoCarriers(f.finfo) {
			f.masked[ni] = true
		}
	}
	idx := f.Static.Model.Index
	for _, p := range []string{PassFP32, f.Main} {
		for v := range f.deliberate[p] {
			if ni := idx.Producer(v); ni >= 0 {
				f.masked[ni] = true
			}
		}
		for _, o := range f.origins[p] {
			if o.Cause != report.CauseConstant || o.Index < 0 {
				continue
			}
			f.masked[o.Index] = true
			for _, name := range o.Affected {
				for ni, n := range g.Node {
					if onnx.NodeName(g, ni) == name && len(n.Output) > 0 && idx.Producer(n.Output[0]) == ni {
						f.masked[ni] = true
					}
				}
			}
		}
	}
	if f.cleanMain() {
		for _, ni := range f.Static.Order {
			if f.masked[ni] {
				continue
			}
			for _, v := range g.Node[ni].Output {
				if h, ok := f.headroom(v); ok && h < f.Thresholds.HeadroomBits {
					f.lowHeadroom = append(f.lowHeadroom, headroomValue{ni, v, h})
				}
			}
		}
		sort.SliceStable(f.lowHeadroom, func(i, j int) bool { return f.lowHeadroom[i].bits < f.lowHeadroom[j].bits })
	}
}

// passNames lists the passes that ran, in a fixed order.
func (f *Facts) passNames() []string {
	names := make([]string, 0, len(f.Passes))
	for p := range f.Passes {
		names = append(names, p)
	}
	sort.Strings(names)
	return names
}

// AsWrittenAssignment is the precision of every value when the model runs
// without mixed precision: fp32, except where the model casts to half
// itself. The as-written pass emulates it.
func AsWrittenAssignment(st *lint.Facts) *precision.Assignment {
	p, _ := precision.PolicyByName("fp32")
	return precision.Assign(p, st.Model.Proto.GetGraph(), st.Order, st.Model.Index.ElemType)
}

func (f *Facts) graph() *onnx.GraphProto { return f.Static.Model.Proto.GetGraph() }

// nodeName names node i in findings and origins.
func (f *Facts) nodeName(i int) string { return onnx.NodeName(f.graph(), i) }

// poisoned reports whether a batch holds NaN/Inf in some input (other
// than unnormalized data saved in half precision).
func (f *Facts) poisoned() bool {
	for _, in := range f.Inputs {
		if in.Poisoned() {
			return true
		}
	}
	return false
}

// Origins returns every origin of non-finite values in the named pass,
// under that pass's assignment: those that reach a graph output and those
// whose NaN/Inf are absorbed on the way (see Reaches). Infinities the
// model writes on purpose (an -inf mask) are never origins.
func (f *Facts) Origins(pass string) []report.Origin { return f.origins[pass] }

// Reaches reports whether an origin decides the verdict: its NaN/Inf reach
// a graph output, or its effect leaves a graph output finite but wrong.
// NaN/Inf that softmax, max, where or relu absorb without changing an
// output decide nothing; a fill PyTorch refuses is an error finding of its
// own (Raises), not a verdict.
func (f *Facts) Reaches(o report.Origin) bool {
	return len(o.AffectedOutputs) > 0 || len(o.WrongOutputs) > 0
}

// Raises reports whether a constant origin is a fill PyTorch refuses
// (masked_fill of -1e9 into an fp16 tensor raises before anything else
// happens). A fill of exactly ±finfo(float32).max is excluded: that is what
// torch.finfo(x.dtype).min looks like in a graph traced in fp32, and such
// code writes the fp16 limit under autocast.
func (f *Facts) Raises(o report.Origin) bool {
	if o.Cause != report.CauseConstant || o.Index < 0 || dtypeAwareLimit(*o.ConstantValue) {
		return false
	}
	n := f.graph().Node[o.Index]
	for j, in := range n.Input {
		if in == o.Constant && lint.FillAt(n, j).Raises {
			return true
		}
	}
	return false
}

// dtypeAwareLimit reports whether v is ±float32's largest value, the trace
// of torch.finfo(x.dtype).min/max in an fp32 export.
func dtypeAwareLimit(v float64) bool { return math.Abs(v) == math.MaxFloat32 }

// deciding keeps the origins that reach an output or raise.
func (f *Facts) deciding(os []report.Origin) []report.Origin {
	out := []report.Origin{}
	for _, o := range os {
		if f.Reaches(o) {
			out = append(out, o)
		}
	}
	return out
}

// input returns the analysis of the graph input called name, or nil.
func (f *Facts) input(name string) *Input {
	for _, in := range f.Inputs {
		if in.Spec.Name == name {
			return in
		}
	}
	return nil
}

// mainOrigins returns the origins of the policy's emulated pass when they
// are the diagnosis's subject: the inputs are finite and nothing the fp32
// pass produces reaches an output (otherwise the emulated pass only
// repeats an earlier problem).
func (f *Facts) mainOrigins() []report.Origin {
	if f.Main == "" || f.poisoned() || len(f.deciding(f.Origins(PassFP32))) > 0 {
		return nil
	}
	return f.Origins(f.Main)
}

// originClass is what an origin of the emulated pass is, for its finding
// and the verdict.
type originClass int

const (
	classOverflow  originClass = iota // an op overflows (FP2001)
	classLogits                       // the final layer overflows (FP2003)
	classHalfCast                     // the model's own half cast makes it overflow (FP4001)
	classConstant                     // an out-of-range constant is written (FP4004)
	classInput                        // the batch holds NaN/Inf (FP1001)
	classPrecision                    // nothing overflows, rounding makes the outputs wrong (FP2006)
)

func (f *Facts) classify(o report.Origin) originClass {
	switch {
	case o.Cause == report.CauseInput:
		return classInput
	case o.Index < 0:
		return classOverflow
	case o.Cause == report.CauseConstant:
		return classConstant
	case o.Cause == report.CausePrecision:
		return classPrecision
	case o.ExplicitCast && f.overflowsAsWritten(o):
		return classHalfCast
	case f.isFinalLayer(o.Index) || f.isFinalBias(o.Index):
		return classLogits
	}
	return classOverflow
}

// overflowsAsWritten reports whether an emulated-pass origin overflows in
// the run without mixed precision too (the as-written pass: fp32 but for
// the model's own half casts): that run has an origin reaching an output
// at the same node or at one of the casts the origin's precision comes
// from. Only then is the model's cast to blame; an overflow that only
// autocast's lower precision causes stays an overflowing op, whatever
// casts lie upstream. Without the as-written pass (--passes none) the
// provenance alone decides.
func (f *Facts) overflowsAsWritten(o report.Origin) bool {
	if o.Index < 0 {
		return false
	}
	if f.Passes[PassAsWritten] == nil {
		return true
	}
	at := map[int]bool{o.Index: true}
	for _, c := range f.Static.Assign.Casts[o.Value] {
		at[c] = true
	}
	for _, a := range f.deciding(f.Origins(PassAsWritten)) {
		if a.Index >= 0 && at[a.Index] {
			return true
		}
	}
	return false
}

// isFinalBias reports whether node ni is the bias Add of the final layer
// (the exporter's split of a Linear on a 3-D input): the overflow then
// starts in the head as well.
func (f *Facts) isFinalBias(ni int) bool {
	n := f.graph().Node[ni]
	if n.OpType != "Add" || !onnx.IsDefaultDomain(n.Domain) {
		return false
	}
	idx := f.Static.Model.Index
	for _, in := range n.Input {
		if p := idx.Producer(in); p >= 0 && f.isFinalLayer(p) {
			return true
		}
	}
	return false
}

// isFinalLayer reports whether node ni is the last layer op (one autocast
// runs in its lower precision: Gemm, MatMul, Conv...) before a graph
// output: every path from its outputs reaches a graph output through ops
// that may follow a final layer (ops.Tail: shape ops, activations,
// softmax, casts, the Linear bias) only. It does not depend on the policy: the same head is the final
// layer under autocast and under half.
func (f *Facts) isFinalLayer(ni int) bool {
	g := f.graph()
	n := g.Node[ni]
	if !precision.IsLowerPrecisionOp(n.Domain, n.OpType) {
		return false
	}
	isOut := map[string]bool{}
	for _, o := range g.Output {
		isOut[o.Name] = true
	}
	reached := false
	seen := map[int]bool{}
	var walk func(values []string) bool
	walk = func(values []string) bool {
		for _, v := range values {
			if isOut[v] {
				reached = true
			}
			for _, c := range f.Static.Model.Index.Consumers(v) {
				if seen[c] {
					continue
				}
				seen[c] = true
				if !ops.Lookup(ops.Default, g.Node[c].OpType).Is(ops.Tail) {
					return false
				}
				if !walk(g.Node[c].Output) {
					return false
				}
			}
		}
		return true
	}
	return walk(n.Output) && reached
}

// headroom is log2(limit / fp32 max |x|) of value v against the largest
// finite value of the format the policy holds it in; ok is false for values
// held in fp32 and for values without a nonzero finite element.
func (f *Facts) headroom(v string) (bits float64, ok bool) {
	limit := formatMax(f.Static.Assign.Value[v])
	st, found := f.Passes[PassFP32].Stats[v]
	if limit == 0 || !found || st.Finite == 0 || st.MaxAbs == 0 {
		return 0, false
	}
	return math.Log2(limit / float64(st.MaxAbs)), true
}

// formatMax is the largest finite value of a reduced precision, 0 for the
// others.
func formatMax(p precision.Precision) float64 {
	switch p {
	case precision.FP16:
		return tensor.FP16Max
	case precision.BF16:
		return tensor.BF16Max
	}
	return 0
}

// Masked reports whether node ni's values carry a mask — infinities the
// model writes on purpose, a constant written beyond the format's range,
// or a number torch.finfo(dtype) wrote — rather than computed values: they
// have no headroom to lose.
func (f *Facts) Masked(ni int) bool { return f.masked[ni] }

// MinHeadroom is the smallest headroom over the observed values the policy
// holds in reduced precision (mask values aside), the value that has it and
// the format's limit; ok is false when there is none.
func (f *Facts) MinHeadroom() (bits float64, value string, limit float64, ok bool) {
	for _, v := range f.Values {
		if p := f.Static.Model.Index.Producer(v); p >= 0 && f.masked[p] {
			continue
		}
		h, found := f.headroom(v)
		if !found {
			continue
		}
		if !ok || h < bits {
			bits, value, limit, ok = h, v, formatMax(f.Static.Assign.Value[v]), true
		}
	}
	return bits, value, limit, ok
}

func isInfOrNaN(x float64) bool { return math.IsInf(x, 0) || math.IsNaN(x) }

func sortedKeys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}
