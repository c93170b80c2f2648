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
	"sync"

	"fp16audit/internal/lint"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/internal/tensor"
	"fp16audit/report"
)

// Pass names, as the report has them.
const (
	PassFP32 = report.PassFP32
	PassFP16 = report.PassFP16
	PassBF16 = report.PassBF16
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

// Facts is what the dynamic analyzers know about one audit. Origins are
// computed on first use and shared.
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
	// policy's emulated pass (Main) and, under autocast-fp16, the bf16
	// pass, when they ran.
	Passes map[string]*observe.PassResult
	// Main names the policy's emulated pass; "" under the fp32 policy.
	Main string
	// Values are the node outputs the passes observed, in topological
	// order.
	Values     []string
	Thresholds Thresholds

	originsMu sync.Mutex
	origins   map[string][]report.Origin
	notes     []string
	// consts marks the values fixed without running the model.
	consts map[string]bool
	// maskedNodes caches masked.
	maskedNodes map[int]bool
	// agreements holds the output agreement of every compared pass, by
	// pass name (recordAgreement).
	agreements map[string][]report.OutputAgreement
}

func (f *Facts) graph() *onnx.GraphProto { return f.Static.Model.Proto.GetGraph() }

// nodeName names node i in findings and origins.
func (f *Facts) nodeName(i int) string { return onnx.NodeName(f.graph(), i) }

// note records a fact about the diagnosis that the report's notes carry.
func (f *Facts) note(s string) { f.notes = append(f.notes, s) }

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
// under the policy's assignment: those that reach a graph output and those
// whose NaN/Inf are absorbed on the way (see Reaches).
func (f *Facts) Origins(pass string) []report.Origin {
	f.originsMu.Lock()
	defer f.originsMu.Unlock()
	if o, ok := f.origins[pass]; ok {
		return o
	}
	if f.origins == nil {
		f.origins = map[string][]report.Origin{}
	}
	res, ok := f.Passes[pass]
	if !ok {
		return nil
	}
	o := f.passOrigins(pass, res, f.Static.Assign)
	f.origins[pass] = o
	return o
}

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
	case o.ExplicitCast:
		return classHalfCast
	case f.isFinalLayer(o.Index) || f.isFinalBias(o.Index):
		return classLogits
	}
	return classOverflow
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

// tailOps may follow the final layer without making it an inner layer:
// shape ops, activations, softmax, casts and the Linear bias.
var tailOps = map[string]bool{
	"Reshape": true, "Flatten": true, "Squeeze": true, "Unsqueeze": true, "Transpose": true,
	"Identity": true, "Dropout": true, "Cast": true, "Relu": true, "LeakyRelu": true,
	"Sigmoid": true, "Tanh": true, "Softmax": true, "LogSoftmax": true, "Gelu": true,
	"Clip": true, "Add": true,
}

// isFinalLayer reports whether node ni is the last layer op (one autocast
// runs in its lower precision: Gemm, MatMul, Conv...) before a graph
// output: every path from its outputs reaches a graph output through tail
// ops only. It does not depend on the policy: the same head is the final
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
				if !tailOps[g.Node[c].OpType] {
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

// masked marks the nodes whose values carry a mask constant: the readers
// of a constant out of the format's range in the emulated pass and what
// its ±Inf reached. Their magnitude is the mask's, not the model's, so
// headroom says nothing about them.
func (f *Facts) masked() map[int]bool {
	if f.maskedNodes != nil {
		return f.maskedNodes
	}
	f.maskedNodes = map[int]bool{}
	idx := f.Static.Model.Index
	for _, p := range []string{PassFP32, f.Main} {
		for _, o := range f.Origins(p) {
			if o.Cause != report.CauseConstant || o.Index < 0 {
				continue
			}
			f.maskedNodes[o.Index] = true
			for _, name := range o.Affected {
				for ni, n := range f.graph().Node {
					if onnx.NodeName(f.graph(), ni) == name && len(n.Output) > 0 && idx.Producer(n.Output[0]) == ni {
						f.maskedNodes[ni] = true
					}
				}
			}
		}
	}
	return f.maskedNodes
}

// MinHeadroom is the smallest headroom over the observed values the policy
// holds in reduced precision (mask values aside), the value that has it and
// the format's limit; ok is false when there is none.
func (f *Facts) MinHeadroom() (bits float64, value string, limit float64, ok bool) {
	for _, v := range f.Values {
		if p := f.Static.Model.Index.Producer(v); p >= 0 && f.masked()[p] {
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
