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
}

// DefaultThresholds are the documented defaults.
var DefaultThresholds = Thresholds{HeadroomBits: 3, UnderflowFraction: 0.10, ColumnScale: 10, FixIterations: 8}

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
}

func (f *Facts) graph() *onnx.GraphProto { return f.Static.Model.Proto.GetGraph() }

// nodeName names node i in findings and origins.
func (f *Facts) nodeName(i int) string { return onnx.NodeName(f.graph(), i) }

// note records a fact about the diagnosis that the report's notes carry.
func (f *Facts) note(s string) { f.notes = append(f.notes, s) }

// poisoned reports whether a batch holds NaN/Inf in some input.
func (f *Facts) poisoned() bool {
	for _, in := range f.Inputs {
		if in.Stats.NonFinite() > 0 {
			return true
		}
	}
	return false
}

// Origins returns the origins of non-finite values in the named pass, under
// the policy's assignment.
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
	o := f.originsIn(pass, res, f.Static.Assign)
	f.origins[pass] = o
	return o
}

// originsIn finds the origins of non-finite values in one pass's results
// under assignment asg, with the fp32 magnitude of each origin's value.
func (f *Facts) originsIn(pass string, res *observe.PassResult, asg *precision.Assignment) []report.Origin {
	g := f.graph()
	idx := f.Static.Model.Index
	out := []report.Origin{}
	for _, o := range findOrigins(g, f.Static.Order, res, idx.Consumers) {
		n := g.Node[o.node]
		or := report.Origin{Pass: pass, Node: f.nodeName(o.node), Index: o.node, OpType: n.OpType,
			Module: onnx.ModulePath(n), Precision: asg.Node[o.node].String(),
			ExplicitCast: f.HalfCasts[o.node], Affected: []string{}, AffectedOutputs: o.outputs}
		if pass == PassFP32 {
			or.Precision = precision.FP32.String()
		}
		for _, v := range n.Output {
			if s, ok := res.Stats[v]; ok && s.NonFinite() > 0 {
				or.Value, or.NonFinite = v, s.NonFinite()
				if ref, ok := f.Passes[PassFP32].Stats[v]; ok {
					or.FP32MaxAbs = float64(ref.MaxAbs)
					if h := ref.HeadroomBits(); !isInfOrNaN(h) {
						or.HeadroomBits = &h
					}
				}
				break
			}
		}
		for _, ni := range o.affected {
			or.Affected = append(or.Affected, f.nodeName(ni))
		}
		if or.AffectedOutputs == nil {
			or.AffectedOutputs = []string{}
		}
		out = append(out, or)
	}
	return out
}

// mainOrigins returns the origins of the policy's emulated pass when they
// are the diagnosis's subject: the inputs are finite and the fp32 pass is
// clean (otherwise the fp16 pass only repeats an earlier problem).
func (f *Facts) mainOrigins() []report.Origin {
	if f.Main == "" || f.poisoned() || len(f.Origins(PassFP32)) > 0 {
		return nil
	}
	return f.Origins(f.Main)
}

// originClass is what an origin of the emulated pass is, for its finding
// and the verdict.
type originClass int

const (
	classOverflow originClass = iota // an op overflows (FP2001)
	classLogits                      // the final layer overflows (FP2003)
	classHalfCast                    // the model's own half cast overflows (FP4001)
)

func (f *Facts) classify(o report.Origin) originClass {
	switch {
	case o.ExplicitCast:
		return classHalfCast
	case f.isFinalLayer(o.Index):
		return classLogits
	}
	return classOverflow
}

// tailOps may follow the final layer without making it an inner layer:
// shape ops, activations, softmax, casts and the Linear bias.
var tailOps = map[string]bool{
	"Reshape": true, "Flatten": true, "Squeeze": true, "Unsqueeze": true, "Transpose": true,
	"Identity": true, "Dropout": true, "Cast": true, "Relu": true, "LeakyRelu": true,
	"Sigmoid": true, "Tanh": true, "Softmax": true, "LogSoftmax": true, "Gelu": true,
	"Clip": true, "Add": true,
}

// isFinalLayer reports whether node ni is the last lower-precision op before
// a graph output: every path from its outputs reaches a graph output through
// tail ops only.
func (f *Facts) isFinalLayer(ni int) bool {
	g := f.graph()
	n := g.Node[ni]
	if cat, _ := f.Static.Policy.Category(n.Domain, n.OpType); cat != precision.LowerPrecision {
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

// minHeadroom is the smallest fp32 headroom over the observed values and the
// value that has it; ok is false when every value is zero.
func (f *Facts) minHeadroom() (bits float64, value string, ok bool) {
	ref := f.Passes[PassFP32]
	for _, v := range f.Values {
		st, found := ref.Stats[v]
		if !found {
			continue
		}
		h := st.HeadroomBits()
		if isInfOrNaN(h) {
			continue
		}
		if !ok || h < bits {
			bits, value, ok = h, v, true
		}
	}
	return bits, value, ok
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
