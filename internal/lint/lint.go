// Package lint finds fp16 hazards in an ONNX model without running it: the
// static checks (FP4xxx) behind `fp16audit lint`. Each check is a value, an
// Analyzer, that reads the facts about one model under one precision policy
// and returns findings; nothing here prints. The command line chooses the
// analyzers, renders the findings and turns them into an exit code.
//
// Lint needs neither ONNX Runtime nor sample batches: everything comes from
// the graph, its attributes and its constants, and from precision.Assign, which
// says in which precision the policy holds every value.
package lint

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"fp16audit/checks"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
)

// Analyzer is one static check over the facts of one model.
type Analyzer = checks.Analyzer[*Facts]

// Analyzers returns every static check, sorted by ID.
func Analyzers() []*Analyzer {
	out := []*Analyzer{halfCastAnalyzer, UnknownOpsAnalyzer,
		constRangeAnalyzer, epsilonAnalyzer, flushAnalyzer, versionAnalyzer, DroppedEpsilonAnalyzer, FoldedBatchNormAnalyzer, HalfDtypeAnalyzer}
	slices.SortFunc(out, func(a, b *Analyzer) int { return strings.Compare(a.Check.ID, b.Check.ID) })
	return out
}

// Options choose what Run checks.
type Options struct {
	// Policy names the precision policy (precision.PolicyByName); "" means
	// precision.DefaultPolicy.
	Policy string
	// Checks selects the analyzers; the zero value selects all of them.
	Checks checks.Selection
}

// Run lints m: it runs every selected analyzer that applies to the policy
// and returns their findings in a stable order: by analyzer, then as each
// analyzer walks the graph (nodes in topological order, initializers in
// file order). An error means the model could not be examined (an unknown
// policy, an unreadable constant), not that it has hazards.
func Run(m *onnx.Model, opt Options) ([]checks.Finding, error) {
	name := opt.Policy
	if name == "" {
		name = precision.DefaultPolicy
	}
	p, err := precision.PolicyByName(name)
	if err != nil {
		return nil, err
	}
	return checks.RunAnalyzers(Analyzers(), NewFacts(m, p), opt.Checks, p.Name)
}

// Facts is what the analyzers know about one model under one policy. The
// constant scan and the epsilon sites are computed on first use and shared
// by the analyzers that need them.
type Facts struct {
	Model  *onnx.Model
	Policy *precision.Policy
	// Assign is the policy's precision of every value and node.
	Assign *precision.Assignment
	// Order is the graph's topological order.
	Order []int
	// Storage is the half type the model is stored in, 0 for fp32
	// (precision.Storage): casts to it follow the policy.
	Storage int32

	constOnce   sync.Once
	consts      []*Constant
	constByName map[string]*Constant
	constErr    error

	epsOnce sync.Once
	eps     []epsSite

	// Dropped, when not nil, are the roots whose epsilon the exporter
	// dropped (onnx.DroppedAdds) in the file as exported: the audit sets
	// it, since it lints the model with them restored.
	Dropped []onnx.DroppedAdd
}

// NewFacts indexes m under policy p.
func NewFacts(m *onnx.Model, p *precision.Policy) *Facts {
	order := m.Index.Order()
	return &Facts{
		Model: m, Policy: p, Order: order, Storage: precision.Storage(m.Proto.GetGraph()),
		Assign: precision.Assign(p, m.Proto.GetGraph(), order, m.Index.ElemType),
	}
}

// node returns node i of the main graph.
func (f *Facts) node(i int) *onnx.NodeProto { return f.Model.Proto.GetGraph().GetNode()[i] }

// nodeName names node i in findings, as every report does.
func (f *Facts) nodeName(i int) string { return onnx.NodeName(f.Model.Proto.GetGraph(), i) }

// where describes node i for a message: `node "/attn/Add" (module attn)`.
func (f *Facts) where(i int) string {
	s := fmt.Sprintf("node %q", f.nodeName(i))
	if mod := onnx.ModulePath(f.node(i)); mod != "" {
		s += fmt.Sprintf(" (module %s)", mod)
	}
	return s
}

// finding returns a finding of c at node i (-1: the whole model).
func (f *Facts) finding(c *checks.Check, sev checks.Severity, node int, value, msg string) checks.Finding {
	fd := c.Finding(msg)
	fd.Severity, fd.Value = sev, value
	if node >= 0 {
		fd.Node, fd.Module = f.nodeName(node), onnx.ModulePath(f.node(node))
	}
	return fd
}

// HeldAt returns the precision the value called name has when node i reads
// it: its own precision when that is 16-bit, else the node's precision
// when the node converts it (a Cast, an autocast input cast, or a 0-dim
// scalar that a kernel holds at its compute precision), else fp32.
func (f *Facts) HeldAt(name string, i int) precision.Precision {
	return f.HeldAtIn(f.Assign, name, i)
}

// HeldAtIn is HeldAt under another assignment of the same graph (a fix
// being verified).
func (f *Facts) HeldAtIn(asg *precision.Assignment, name string, i int) precision.Precision {
	own := asg.Value[name]
	if own == precision.FP16 || own == precision.BF16 {
		return own
	}
	n := f.node(i)
	np := asg.Node[i]
	if np != precision.FP16 && np != precision.BF16 {
		return own
	}
	if n.GetOpType() == "Cast" && onnx.IsDefaultDomain(n.GetDomain()) {
		return np
	}
	for j, in := range n.GetInput() {
		if in != name {
			continue
		}
		if asg.CastInputs[i][j] {
			return np
		}
		if s, ok := f.Model.Index.Shape(name); ok && s.Rank() == 0 && precision.DataSlot(n.GetOpType(), j) {
			return np
		}
	}
	return own
}
