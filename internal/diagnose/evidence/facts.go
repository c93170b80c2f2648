// Package evidence is what the dynamic checks of one audit read, derived
// once before any of them runs: the Facts (the static facts of the model,
// the input analysis, the pass results), the origins of NaN/Inf in every
// pass (origins.go), the infinities a model writes on purpose and the
// mask fills (deliberate.go), how the graph outputs agree with fp32's and
// the origins of outputs finite but wrong (outputs.go), and the roots
// without an epsilon (epsilon.go). The analyzers and the verdict tree
// (package diagnose) and the fixes (package fix) read it; a fix's rerun
// is judged by the same rules as the passes.
package evidence

import (
	"math"
	"sort"

	"fp16audit/internal/diagnose/inputs"
	"fp16audit/internal/diagnose/words"
	"fp16audit/internal/lint"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
	"fp16audit/internal/tensor"
	"fp16audit/report"
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
// fills the exported fields; Prepare derives the rest once (origins, the
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
	Inputs []*inputs.Input
	// Passes holds the results of the fp32 reference (report.PassFP32), the
	// policy's emulated pass (Main), under autocast-fp16 the bf16 pass,
	// and, when the model casts to half itself, the pass without mixed
	// precision that keeps those casts (report.PassAsWritten), when they ran
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
	// Trainer names the trainer whose words the fix texts use
	// (words.Names); "" is words.Default.
	Trainer string

	derived
}

// Words are the phrases of the trainer the fix texts follow.
func (f *Facts) Words() *words.Trainer {
	return words.For(f.Trainer)
}

// derived is what Prepare computes from the exported facts before the
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
	// is written (see PassOrigins).
	origins    map[string][]report.Origin
	deliberate map[string]map[string]bool
	fills      map[string][]Fill
	// finfo lists where the policy's emulated pass reads a number
	// torch.finfo(dtype) wrote as its format's limit (rewrite.FinfoFills).
	finfo []rewrite.FinfoFill
	// masked marks the nodes whose values carry a mask (see Prepare).
	masked map[int]bool
	// lowHeadroom lists the values of a clean emulated pass below the
	// headroom threshold, least headroom first.
	lowHeadroom []HeadroomValue
	// agreements holds the output agreement of every compared pass, by
	// pass name (RecordAgreement): the fix reruns add theirs after the
	// analyzers ran.
	agreements map[string][]report.OutputAgreement
}

// HeadroomValue is a value held in reduced precision close to its
// format's limit: Value, an output of node Node, Bits of headroom above
// it.
type HeadroomValue struct {
	Node  int
	Value string
	Bits  float64
}

// Prepare computes the derived facts. Everything an analyzer reads beyond
// the exported fields is made here, once, so that analyzers run on the
// same facts in any order and never write.
func (f *Facts) Prepare() {
	if f.prepared {
		return
	}
	f.prepared = true
	g := f.Graph()
	f.consts = constantValues(g, f.Static.Order)
	f.assign = map[string]*precision.Assignment{report.PassFP32: f.Static.Assign}
	if f.Main != "" {
		f.assign[f.Main] = f.Static.Assign
	}
	elemType := f.Static.Model.Index.ElemType
	if _, ok := f.Passes[report.PassBF16]; ok && f.Main != report.PassBF16 {
		bp, _ := precision.PolicyByName("autocast-bf16")
		f.assign[report.PassBF16] = precision.Assign(bp, g, f.Static.Order, elemType)
	}
	if _, ok := f.Passes[report.PassAsWritten]; ok {
		f.assign[report.PassAsWritten] = AsWrittenAssignment(f.Static)
	}
	f.origins, f.deliberate, f.fills = map[string][]report.Origin{}, map[string]map[string]bool{}, map[string][]Fill{}
	for _, p := range f.passNames() {
		if asg := f.assign[p]; asg != nil {
			f.origins[p], f.deliberate[p], f.fills[p] = f.PassOrigins(p, f.Passes[p], asg)
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
	for _, p := range []string{report.PassFP32, f.Main} {
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
	if f.CleanMain() {
		for _, ni := range f.Static.Order {
			if f.masked[ni] {
				continue
			}
			for _, v := range g.Node[ni].Output {
				if h, ok := f.headroom(v); ok && h < f.Thresholds.HeadroomBits {
					f.lowHeadroom = append(f.lowHeadroom, HeadroomValue{ni, v, h})
				}
			}
		}
		sort.SliceStable(f.lowHeadroom, func(i, j int) bool { return f.lowHeadroom[i].Bits < f.lowHeadroom[j].Bits })
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

// Graph is the model's main graph.
func (f *Facts) Graph() *onnx.GraphProto { return f.Static.Model.Proto.GetGraph() }

// NodeName names node i in findings and origins.
func (f *Facts) NodeName(i int) string { return onnx.NodeName(f.Graph(), i) }

// Poisoned reports whether a batch holds NaN/Inf in some input (other
// than unnormalized data saved in half precision).
func (f *Facts) Poisoned() bool {
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
	if o.Cause != report.CauseConstant || o.Index < 0 || DtypeAwareLimit(*o.ConstantValue) {
		return false
	}
	n := f.Graph().Node[o.Index]
	for j, in := range n.Input {
		if in == o.Constant && lint.FillAt(n, j).Raises {
			return true
		}
	}
	return false
}

// DtypeAwareLimit reports whether v is ±float32's largest value, the trace
// of torch.finfo(x.dtype).min/max in an fp32 export.
func DtypeAwareLimit(v float64) bool { return math.Abs(v) == math.MaxFloat32 }

// Deciding keeps the origins that reach an output or raise.
func (f *Facts) Deciding(os []report.Origin) []report.Origin {
	out := []report.Origin{}
	for _, o := range os {
		if f.Reaches(o) {
			out = append(out, o)
		}
	}
	return out
}

// Input returns the analysis of the graph input called name, or nil.
func (f *Facts) Input(name string) *inputs.Input {
	for _, in := range f.Inputs {
		if in.Spec.Name == name {
			return in
		}
	}
	return nil
}

// MainOrigins returns the origins of the policy's emulated pass when they
// are the diagnosis's subject: the inputs are finite and nothing the fp32
// pass produces reaches an output (otherwise the emulated pass only
// repeats an earlier problem).
func (f *Facts) MainOrigins() []report.Origin {
	if f.Main == "" || f.Poisoned() || len(f.Deciding(f.Origins(report.PassFP32))) > 0 {
		return nil
	}
	return f.Origins(f.Main)
}

// CleanMain reports whether the emulated pass ran on finite inputs, the fp32
// pass is clean and nothing in the emulated pass reaches an output: the
// case for the warnings about how close it came.
func (f *Facts) CleanMain() bool {
	return f.Main != "" && f.MainOrigins() != nil && len(f.Deciding(f.Origins(f.Main))) == 0
}

// headroom is log2(limit / fp32 max |x|) of value v against the largest
// finite value of the format the policy holds it in; ok is false for values
// held in fp32 and for values without a nonzero finite element.
func (f *Facts) headroom(v string) (bits float64, ok bool) {
	limit := FormatMax(f.Static.Assign.Value[v])
	st, found := f.Passes[report.PassFP32].Stats[v]
	if limit == 0 || !found || st.Finite == 0 || st.MaxAbs == 0 {
		return 0, false
	}
	return math.Log2(limit / float64(st.MaxAbs)), true
}

// FormatMax is the largest finite value of a reduced precision, 0 for the
// others.
func FormatMax(p precision.Precision) float64 {
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
			bits, value, limit, ok = h, v, FormatMax(f.Static.Assign.Value[v]), true
		}
	}
	return bits, value, limit, ok
}

// CountNonFinite counts the NaN/Inf of the observed values of a pass,
// leaving out the infinities the model writes on purpose.
func (f *Facts) CountNonFinite(res *observe.PassResult, deliberate map[string]bool) int64 {
	var n int64
	for _, v := range f.Values {
		if s, ok := res.Stats[v]; ok && !deliberate[v] {
			n += s.NonFinite()
		}
	}
	return n
}

// NonFinite is CountNonFinite for a pass that ran with the audit.
func (f *Facts) NonFinite(res *observe.PassResult, pass string) int64 {
	return f.CountNonFinite(res, f.deliberate[pass])
}

// CastsOf returns the model's own half casts the origins' precision comes
// from (an origin that is such a cast included).
func (f *Facts) CastsOf(origins []report.Origin) map[int]bool {
	casts := map[int]bool{}
	for _, o := range origins {
		if o.Index < 0 {
			continue
		}
		if f.HalfCasts[o.Index] {
			casts[o.Index] = true
		}
		for _, c := range f.Static.Assign.Casts[o.Value] {
			casts[c] = true
		}
	}
	return casts
}

// HeldWithoutCasts reports whether an explicit-cast origin's value would
// still be held in 16 bits with the model's own casts it comes from
// removed: autocast (or the half policy) puts it there too, as with a
// .half() right after a Linear.
func (f *Facts) HeldWithoutCasts(o report.Origin) bool {
	if o.Index < 0 {
		return false
	}
	asg := precision.AssignKeepFP32(f.Static.Policy, f.Graph(), f.Static.Order, f.Static.Model.Index.ElemType, f.CastsOf([]report.Origin{o}))
	p := asg.Value[o.Value]
	return p == precision.FP16 || p == precision.BF16
}

func isInfOrNaN(x float64) bool { return math.IsInf(x, 0) || math.IsNaN(x) }

// LowHeadroom lists the values of a clean emulated pass below the
// headroom threshold, least headroom first (masks aside).
func (f *Facts) LowHeadroom() []HeadroomValue { return f.lowHeadroom }

// Fills lists where a pass writes a mask constant beyond its format's
// range on purpose (see Fill).
func (f *Facts) Fills(pass string) []Fill { return f.fills[pass] }

// Finfo lists where the policy's emulated pass reads a number
// torch.finfo(dtype) wrote as its format's limit (rewrite.FinfoFills).
func (f *Facts) Finfo() []rewrite.FinfoFill { return f.finfo }

// Assignment is the precision assignment of a pass that ran.
func (f *Facts) Assignment(pass string) *precision.Assignment { return f.assign[pass] }

// Agreement is the output agreement recorded for a pass (RecordAgreement).
func (f *Facts) Agreement(pass string) []report.OutputAgreement { return f.agreements[pass] }
