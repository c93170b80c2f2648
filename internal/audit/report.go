package audit

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/batch"
	"fp16audit/internal/diagnose/evidence"
	"fp16audit/internal/diagnose/inputs"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/precision"
	"fp16audit/internal/tensor"
	"fp16audit/report"
)

// newReport starts the report of an audit: what ran, on what.
func newReport(m *onnx.Model, policy *precision.Policy, device string, threads int, batches []batch.Batch) *report.Report {
	r := &report.Report{
		Schema:   report.ReportSchema,
		Tool:     report.ToolInfo{Version: report.Version, ORTVersion: onnxrt.Version(), Device: device, ORTThreads: threads},
		Model:    modelInfo(m),
		Policy:   policy.Name,
		Notes:    []string{},
		Origins:  []report.Origin{},
		Fixes:    []report.Fix{},
		Findings: []checks.Finding{},
		// Filled by the diagnosis; a report that stops before it says so
		// with an empty list rather than null.
		OutputAgreement: []report.OutputAgreement{},
	}
	for _, b := range batches {
		rb := report.Batch{Source: b.Source, Synthetic: strings.HasPrefix(b.Source, "synthetic")}
		for _, t := range b.Inputs {
			rb.Shapes = append(rb.Shapes, t.Name+tensor.ShapeString(t.Shape))
		}
		r.Batches = append(r.Batches, rb)
	}
	return r
}

// inputReports are the inputs' part of the report, with the statistics
// of every float input.
func inputReports(ins []*inputs.Input) []report.InputReport {
	out := make([]report.InputReport, len(ins))
	for i, in := range ins {
		out[i] = in.Report()
		if in.Float() {
			out[i].Stats[report.PassFP32] = statsReport(in.Stats, nil)
		}
	}
	return out
}

// statsReport is the report's form of the statistics of one value in one
// pass and, for an emulated pass, of its comparison with fp32 (d may be
// nil). Magnitudes that would be infinite are left out.
func statsReport(s observe.Stats, d *observe.Diff) report.StatsReport {
	r := report.StatsReport{
		Count: s.Count, Finite: s.Finite, ArgMaxBatch: s.ArgMaxBatch, ArgMax: s.ArgMax,
		NaN: s.NaN, PosInf: s.PosInf, NegInf: s.NegInf, Zeros: s.Zeros,
		AboveFP16Max: s.AboveFP16Max, FP16Subnormal: s.FP16Subnormal, FP16Flush: s.FP16Flush,
	}
	if s.Finite > 0 {
		r.MaxAbs, r.Mean, r.RMS = ptr(float64(s.MaxAbs)), ptr(s.Mean()), ptr(s.RMS())
	}
	if s.MinNonzero != 0 {
		r.MinNonzero = ptr(float64(s.MinNonzero))
	}
	if h := s.HeadroomBits(); s.Finite > 0 && !isInfOrNaN(h) {
		r.HeadroomBits = &h
	}
	if d != nil {
		r.Compared = d.BothFinite
		if re := d.RelErr(); !isInfOrNaN(re) {
			r.RelErr = &re
		}
		r.NewNonFinite = d.NewNonFinite
		r.FlushedFraction = d.FlushedFraction()
	}
	return r
}

func ptr(x float64) *float64 { return &x }

func isInfOrNaN(x float64) bool { return math.IsInf(x, 0) || math.IsNaN(x) }

func valueInfo(vi *onnx.ValueInfoProto) report.IOInfo {
	tt := vi.GetType().GetTensorType()
	if tt == nil {
		return report.IOInfo{Name: vi.Name, DType: "non-tensor", Shape: "?"}
	}
	dims := make([]string, 0, len(tt.GetShape().GetDim()))
	for _, d := range tt.GetShape().GetDim() {
		switch {
		case d.GetDimParam() != "":
			dims = append(dims, d.GetDimParam())
		case d.GetValue() == nil:
			dims = append(dims, "?")
		default:
			dims = append(dims, fmt.Sprint(d.GetDimValue()))
		}
	}
	return report.IOInfo{Name: vi.Name, DType: tensor.DType(tt.GetElemType()).String(), Shape: "[" + strings.Join(dims, ",") + "]"}
}

func modelInfo(m *onnx.Model) report.ModelInfo {
	p := m.Proto
	info := report.ModelInfo{
		Path: m.Path, Producer: p.ProducerName, ProducerVersion: p.ProducerVersion,
		IRVersion: p.IrVersion, Opsets: map[string]int64{}, NodeCount: len(p.Graph.Node),
	}
	for _, o := range p.OpsetImport {
		d := o.Domain
		if d == "" {
			d = "ai.onnx"
		}
		info.Opsets[d] = o.Version
	}
	for _, vi := range m.Index.GraphInputs() {
		info.Inputs = append(info.Inputs, valueInfo(vi))
	}
	for _, vi := range p.Graph.Output {
		info.Outputs = append(info.Outputs, valueInfo(vi))
	}
	return info
}

// nodeReports lists every node of the model in topological order with the
// statistics of its float outputs in each pass and, for emulated passes,
// their comparison with fp32.
func (a *audit) nodeReports() []report.NodeReport {
	g := a.model.Proto.Graph
	constant := constantNodes(g, a.model.Index, a.static.Order)
	nodes := make([]report.NodeReport, 0, len(a.static.Order))
	for _, ni := range a.static.Order {
		n := g.Node[ni]
		nr := report.NodeReport{Index: ni, Name: n.Name, OpType: n.OpType, Domain: n.Domain,
			Module: onnx.ModulePath(n), Precision: a.static.Assign.Node[ni].String(), Constant: constant[ni],
			Outputs: []report.ValueReport{}}
		for _, o := range n.Output {
			if w := a.static.Assign.Why[o]; w != 0 {
				nr.Provenance = &report.Provenance{Reasons: w.Names()}
				for _, c := range a.static.Assign.Casts[o] {
					nr.Provenance.Casts = append(nr.Provenance.Casts, onnx.NodeName(g, c))
				}
				break
			}
		}
		for _, o := range n.Output {
			var vr *report.ValueReport
			for _, p := range a.report.Passes {
				res := a.passes[p]
				st, ok := res.Stats[o]
				if !ok {
					continue
				}
				if vr == nil {
					vr = &report.ValueReport{Name: o, DType: tensor.DType(a.engine.ElemType(o)).String(),
						Shape: tensor.ShapeString(res.Shapes[o]), Stats: map[string]report.StatsReport{}}
				}
				sr := statsReport(*st, res.Diffs[o])
				if sr.NonFinite() > 0 {
					nr.Flagged = true
				}
				vr.Stats[p] = sr
			}
			if vr != nil {
				nr.Outputs = append(nr.Outputs, *vr)
			}
		}
		nodes = append(nodes, nr)
	}
	return nodes
}

// constantNodes marks the nodes that compute only from initializers and
// constants: a Constant, or a node whose every input (its subgraphs' outer
// names included) is an initializer or the output of a marked node. These
// are what the exporter leaves around weights (an Identity per shared
// parameter, folding leftovers); the renderers keep them out of the way.
// Random generators are never constant, whatever they read.
func constantNodes(g *onnx.GraphProto, ix *onnx.Index, order []int) map[int]bool {
	constant := map[int]bool{}
	fromConstants := func(name string) bool {
		if name == "" || ix.IsInitializer(name) {
			return true // "" is an omitted optional input
		}
		p := ix.Producer(name)
		return p >= 0 && constant[p]
	}
	for _, ni := range order {
		n := g.Node[ni]
		if n.Domain != "" && n.Domain != "ai.onnx" || ops.Random(n.Domain, n.OpType) {
			continue
		}
		inputs := append(slices.Clone(n.Input), ix.ImplicitInputs(ni)...)
		if len(inputs) == 0 && n.OpType != "Constant" {
			continue
		}
		if !slices.ContainsFunc(inputs, func(name string) bool { return !fromConstants(name) }) {
			constant[ni] = true
		}
	}
	return constant
}

// summarize condenses the node statistics; the headroom is over the values
// held in reduced precision, against their format's limit.
func summarize(r *report.Report, f *evidence.Facts) report.Summary {
	var s report.Summary
	for _, n := range r.Nodes {
		for _, o := range n.Outputs {
			st, ok := o.Stats[report.PassFP32]
			if !ok {
				continue
			}
			s.FloatValues++
			if st.NonFinite() > 0 {
				s.NonFiniteFP32++
			}
		}
	}
	if bits, v, limit, ok := f.MinHeadroom(); ok {
		s.MinHeadroomBits, s.MinHeadroomValue, s.HeadroomLimit = &bits, v, limit
	}
	return s
}
