package statsop

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
)

// internalSuffix marks the names this package invents, as audit's rewrites
// do, so they cannot collide with a model's names.
const internalSuffix = "::fp16audit"

// Pass is one pass of an audit: its graph and the pass it is compared with.
type Pass struct {
	// Name tells the pass's values apart in a combined graph ("fp16").
	Name string
	// Model is the pass's graph, the model's values under the model's
	// names (audit.Upcast's or audit.Emulate's result, uninstrumented).
	Model *onnx.ModelProto
	// Ref is the index of the pass compared with (an earlier one), or -1.
	Ref int
	// OutputsOnly runs the pass for its graph outputs alone (a reference
	// for the outputs of a rerun): none of its values is observed, and no
	// pass may name it as Ref.
	OutputsOnly bool
}

// Output is what one Observe node of a combined graph records: value
// Value in the passes Passes (record Slot+i for pass Passes[i]; the first
// is the reference the others are compared with).
type Output struct {
	Name   string
	Value  string
	Passes []int
	Slot   int
}

// Fetch is a graph output of one pass that a run returns: the pass's
// value Value (a graph output of the model) under the combined graph's
// output Name, as FLOAT.
type Fetch struct {
	Name  string
	Value string
	Pass  int
}

// Plan is a graph that runs passes side by side and observes values in
// each. Its Observe nodes write Records records (RecordLen int64 each) into
// the session's record sink, in a chain whose last token is the graph's
// first output, Token; the float graph outputs of every pass follow it
// (Fetch), so that they can be compared with fp32's as the user's loss or
// prediction would see them.
type Plan struct {
	Model   *onnx.ModelProto
	Outputs []Output
	Records int
	Token   string
	Fetch   []Fetch
	// Origin gives, for each node of Model.Graph, the index in its pass's
	// graph of the node it copies, or -1 for a node Combine adds (the
	// rounding, casting and Observe nodes): what Split needs to place the
	// nodes of every pass along the model's order.
	Origin []int
	// Hand is set in a block of a split plan (Split): the values its graph
	// returns for later blocks, the last token among them. A whole plan's
	// one output is Token.
	Hand []string
	// Declared, when set, names a file in the session's external-data
	// folder (the model's own file) that the weights HandsOver takes are
	// declared to lie in: a session then hands them to ONNX Runtime over
	// the loaded model's memory instead of letting it copy them. "" hands
	// nothing over.
	Declared string
	// Weights, when set, are the audit's weights every session of it
	// shares: those it holds are handed over from it (see Weights).
	Weights *Weights
}

const (
	elemFloat  = int32(onnx.TensorProto_FLOAT)
	elemDouble = int32(onnx.TensorProto_DOUBLE)
	elemF16    = int32(onnx.TensorProto_FLOAT16)
	elemBF16   = int32(onnx.TensorProto_BFLOAT16)
)

// Combine builds one graph holding every pass: pass 0 keeps the model's
// names, the values and nodes of every later pass are renamed
// "<name>::<pass>::fp16audit", and
// all passes read the same graph inputs and, where their initializers are
// the same tensors (as audit's rewrites leave them), the same weights.
// Each value in values gets one Observe node per reference pass (a pass
// whose Ref is -1 that is not OutputsOnly), reading the value in that pass and in every pass
// compared with it: ONNX Runtime then runs the passes in step, value by
// value (see the node order below), and a reference value dies as soon as
// the one node that compares with it has read it. elemType gives each
// value's element type (0 when unknown: read as FLOAT); DOUBLE and half
// values are cast to FLOAT first, as audit.Instrument does. Values no pass
// makes are skipped. Every pass's float graph outputs come back as FLOAT
// (Plan.Fetch), to be compared with the fp32 pass's.
//
// chunk is the chunk length the statistics cut values into (0: audit's
// DefaultChunk); a shorter one lets ONNX Runtime's threads share a value
// and keeps the inputs of one Observe node in cache while it reads them,
// at the price of rounding Sum, SumSq and the differences' sums of values
// longer than chunk otherwise than today.
func Combine(passes []Pass, values []string, elemType func(string) int32, chunk int) (*Plan, error) {
	if len(passes) == 0 {
		return nil, fmt.Errorf("combine: no passes")
	}
	base := passes[0].Model
	g := &onnx.GraphProto{Name: base.Graph.Name, Input: base.Graph.Input, Initializer: append([]*onnx.TensorProto(nil), base.Graph.Initializer...),
		SparseInitializer: base.Graph.SparseInitializer}
	baseInit := map[string]*onnx.TensorProto{}
	for _, t := range base.Graph.Initializer {
		baseInit[t.Name] = t
	}
	inputs := map[string]bool{}
	for _, vi := range base.Graph.Input {
		inputs[vi.Name] = true
	}
	inputDims := inputDimParams(base.Graph)
	// made[p] maps the model's value names made in pass p to their names in
	// the combined graph.
	made := make([]map[string]string, len(passes))
	origin := map[*onnx.NodeProto]int{}
	for p, ps := range passes {
		if ps.Ref >= p || ps.Ref < -1 {
			return nil, fmt.Errorf("combine: pass %s compares with pass %d, which does not come before it", ps.Name, ps.Ref)
		}
		if ps.Ref >= 0 && passes[ps.Ref].OutputsOnly {
			return nil, fmt.Errorf("combine: pass %s compares its values with pass %s, which observes none", ps.Name, passes[ps.Ref].Name)
		}
		pg := ps.Model.Graph
		for _, vi := range pg.Input {
			if !inputs[vi.Name] && baseInit[vi.Name] == nil {
				return nil, fmt.Errorf("combine: pass %s has graph input %q that pass %s lacks", ps.Name, vi.Name, passes[0].Name)
			}
		}
		rename := map[string]string{}
		suffix := ""
		if p > 0 {
			suffix = "::" + ps.Name + internalSuffix
		}
		written := writtenInPlace(pg)
		for _, t := range pg.Initializer {
			if p > 0 && (baseInit[t.Name] != t || written[t.Name]) {
				// A tensor of this pass's own, or one a node updates in
				// place: kept apart.
				rename[t.Name] = t.Name + suffix
				c := proto.Clone(t).(*onnx.TensorProto)
				c.Name = rename[t.Name]
				g.Initializer = append(g.Initializer, c)
			}
		}
		if p > 0 {
			for name := range written {
				if !inputs[name] {
					continue
				}
				// A graph input a node updates in place: the pass reads
				// a copy (x*1 is x bit for bit, NaN aside).
				cp := name + "::copy" + suffix
				one := cp + "::one"
				g.Initializer = append(g.Initializer, oneOf(one, elemType(name)))
				g.Node = append(g.Node, onnx.Node("Mul", cp, []string{name, one}, []string{cp}))
				rename[name] = cp
			}
		}
		made[p] = map[string]string{}
		for _, n := range pg.Node {
			for _, o := range n.Output {
				if o != "" {
					rename[o] = o + suffix
					made[p][o] = o + suffix
				}
			}
		}
		if p == 0 {
			for i, n := range pg.Node {
				c := seeded(n, i)
				origin[c] = i
				g.Node = append(g.Node, c)
			}
			g.ValueInfo = append(g.ValueInfo, pg.ValueInfo...)
		} else {
			for i, n := range pg.Node {
				c := renameNode(seeded(n, i), rename, suffix)
				origin[c] = i
				g.Node = append(g.Node, c)
			}
			for _, vi := range pg.ValueInfo {
				if r, ok := rename[vi.Name]; ok {
					g.ValueInfo = append(g.ValueInfo, passDims(renamedInfo(vi, r), inputDims, suffix))
				}
			}
		}
		// The pass's own outputs stop being outputs; their declared types
		// still help ONNX Runtime's inference.
		for _, vi := range pg.Output {
			if r, ok := rename[vi.Name]; ok && !inputs[vi.Name] {
				g.ValueInfo = append(g.ValueInfo, passDims(renamedInfo(vi, r), inputDims, suffix))
			}
		}
	}

	g.Node = fuseRounds(g, elemType)

	plan := &Plan{}
	// A value is cast once, whatever reads it.
	cast := map[string]string{}
	toFloat := func(name, v string) string {
		switch elemType(v) {
		case elemDouble, elemF16, elemBF16:
		default:
			return name
		}
		if f, ok := cast[name]; ok {
			return f
		}
		f := name + "::f32" + internalSuffix
		g.Node = append(g.Node, onnx.Node("Cast", f, []string{name}, []string{f}, onnx.AttrInt("to", int64(elemFloat))))
		cast[name] = f
		return f
	}
	var stats []*onnx.NodeProto
	token := "token" + internalSuffix
	g.Initializer = append(g.Initializer, onnx.FloatTensor(token, []int64{1}, []float32{0}))
	for _, v := range values {
		for r, rs := range passes {
			if rs.Ref >= 0 || rs.OutputsOnly {
				continue
			}
			name, ok := made[r][v]
			if !ok {
				continue
			}
			out := Output{Name: v + "::stats-" + rs.Name + internalSuffix, Value: v, Passes: []int{r}, Slot: plan.Records}
			in := []string{token, toFloat(name, v)}
			for p, ps := range passes {
				if ps.Ref != r {
					continue
				}
				y, ok := made[p][v]
				if !ok {
					return nil, fmt.Errorf("combine: pass %s does not make %q, which its reference pass %s makes", ps.Name, v, rs.Name)
				}
				in = append(in, toFloat(y, v))
				out.Passes = append(out.Passes, p)
			}
			node := onnx.Node(OpObserve, out.Name, in, []string{out.Name},
				onnx.AttrInt(AttrSink, 0), onnx.AttrInt(AttrSlot, int64(out.Slot)))
			node.Domain = Domain
			if chunk > 0 {
				node.Attribute = append(node.Attribute, onnx.AttrInt(AttrChunk, int64(chunk)))
			}
			stats = append(stats, node)
			token = out.Name
			plan.Records += len(out.Passes)
			plan.Outputs = append(plan.Outputs, out)
		}
	}
	if len(plan.Outputs) == 0 {
		return nil, fmt.Errorf("combine: none of the %d values is made by any pass", len(values))
	}
	// The chain of tokens runs the Observe nodes in value order, each value
	// computed right before its node reads it and dying right after, so a
	// run holds about what a plain inference holds; the graph outputs,
	// small next to the values, stay until the run ends.
	g.Node = append(g.Node, stats...)
	g.Output = append(g.Output, onnx.TensorValueInfo(token, onnx.TensorProto_FLOAT, 1))
	plan.Token = token
	for p, ps := range passes {
		fetched := map[string]bool{} // a graph may list an output twice
		for _, vi := range ps.Model.Graph.Output {
			name, ok := made[p][vi.Name]
			if !ok || !isFloat(elemType(vi.Name)) || fetched[vi.Name] {
				continue
			}
			fetched[vi.Name] = true
			// The copy adds the chain's last token (a 0): it runs after
			// every Observe node, and ONNX Runtime keeps the order of
			// the chain instead of computing the graph output's whole
			// path first and holding every value it observes later
			// (measured: 3x the time of a 20 000-node chain). Add
			// broadcasts from opset 7; older models copy unordered.
			f := name + "::out" + internalSuffix
			if opset(base) >= 7 {
				g.Node = append(g.Node, onnx.Node("Add", f, []string{toFloat(name, vi.Name), token}, []string{f}))
			} else {
				g.Node = append(g.Node, onnx.Node("Identity", f, []string{toFloat(name, vi.Name)}, []string{f}))
			}
			g.Output = append(g.Output, &onnx.ValueInfoProto{Name: f, Type: &onnx.TypeProto{Value: &onnx.TypeProto_TensorType{
				TensorType: &onnx.TypeProto_Tensor{ElemType: elemFloat}}}})
			plan.Fetch = append(plan.Fetch, Fetch{Name: f, Value: vi.Name, Pass: p})
		}
	}
	plan.Origin = make([]int, len(g.Node))
	for i, n := range g.Node {
		if o, ok := origin[n]; ok {
			plan.Origin[i] = o
		} else {
			plan.Origin[i] = -1
		}
	}
	plan.Model = &onnx.ModelProto{
		IrVersion: base.IrVersion, ProducerName: base.ProducerName, ProducerVersion: base.ProducerVersion,
		Domain: base.Domain, ModelVersion: base.ModelVersion, DocString: base.DocString, Graph: g,
		MetadataProps: base.MetadataProps, Functions: base.Functions,
		OpsetImport: append(append([]*onnx.OperatorSetIdProto(nil), base.OpsetImport...), &onnx.OperatorSetIdProto{Domain: Domain, Version: 1}),
	}
	return plan, nil
}

// opset is the version of the default ONNX domain m imports.
func opset(m *onnx.ModelProto) int64 {
	for _, o := range m.OpsetImport {
		if onnx.IsDefaultDomain(o.Domain) {
			return o.Version
		}
	}
	return 0
}

// isFloat reports whether a declared element type is one whose values are
// fetched as FLOAT.
func isFloat(t int32) bool {
	return t == elemFloat || t == elemDouble || t == elemF16 || t == elemBF16
}

// seeded returns n, the node at index i of its pass's graph (the same
// index in every pass), with a seed of i when it is a random op without
// one, so that every pass's copy draws the same numbers.
func seeded(n *onnx.NodeProto, i int) *onnx.NodeProto {
	// (Random ops draw different numbers in each copy of a node in one
	// session unless seeded; separate sessions, one per pass, drew the
	// same.)
	if !ops.Random(n.Domain, n.OpType) {
		return n
	}
	for _, a := range n.Attribute {
		if a.Name == "seed" {
			return n
		}
	}
	c := &onnx.NodeProto{Input: n.Input, Output: n.Output, Name: n.Name, OpType: n.OpType, Domain: n.Domain,
		Overload: n.Overload, DocString: n.DocString, MetadataProps: n.MetadataProps,
		Attribute: append(append([]*onnx.AttributeProto(nil), n.Attribute...), onnx.AttrFloat("seed", float32(i)))}
	return c
}

// writtenInPlace lists the initializers a node of g may overwrite: the
// running mean and variance of a BatchNormalization in training mode,
// whose outputs ONNX Runtime may place in its inputs' memory. Each pass
// needs its own copy of those.
func writtenInPlace(g *onnx.GraphProto) map[string]bool {
	out := map[string]bool{}
	for _, n := range g.Node {
		if n.OpType != "BatchNormalization" || (n.Domain != "" && n.Domain != "ai.onnx") {
			continue
		}
		for _, a := range n.Attribute {
			if a.Name == "training_mode" && a.I != 0 {
				for _, k := range []int{3, 4} {
					if k < len(n.Input) {
						out[n.Input[k]] = true
					}
				}
			}
		}
	}
	return out
}

// oneOf is a scalar initializer 1 of element type t (FLOAT when unknown).
func oneOf(name string, t int32) *onnx.TensorProto {
	if t == elemDouble {
		return &onnx.TensorProto{Name: name, DataType: t, DoubleData: []float64{1}}
	}
	return onnx.FloatTensor(name, nil, []float32{1})
}

// inputDimParams returns the symbolic dimensions of a graph's inputs: the
// same in every pass, since all passes read the same inputs.
func inputDimParams(g *onnx.GraphProto) map[string]bool {
	out := map[string]bool{}
	for _, vi := range g.Input {
		for _, d := range vi.GetType().GetTensorType().GetShape().GetDim() {
			if p := d.GetDimParam(); p != "" {
				out[p] = true
			}
		}
	}
	return out
}

// passDims gives the symbolic dimensions of a pass's value that no graph
// input has (a count of boxes NonMaxSuppression keeps, say) the pass's
// own names: ONNX Runtime takes two values with the same dim_param to be
// of the same size and shares their buffers, but each pass keeps its own
// number of boxes. suffix "" (the first pass) keeps the names.
func passDims(vi *onnx.ValueInfoProto, inputDims map[string]bool, suffix string) *onnx.ValueInfoProto {
	tt := vi.GetType().GetTensorType()
	if suffix == "" || tt.GetShape() == nil {
		return vi
	}
	var dims []*onnx.TensorShapeProto_Dimension
	changed := false
	for _, d := range tt.Shape.Dim {
		if p := d.GetDimParam(); p != "" && !inputDims[p] {
			d = &onnx.TensorShapeProto_Dimension{Value: &onnx.TensorShapeProto_Dimension_DimParam{DimParam: p + suffix}, Denotation: d.Denotation}
			changed = true
		}
		dims = append(dims, d)
	}
	if !changed {
		return vi
	}
	return &onnx.ValueInfoProto{Name: vi.Name, DocString: vi.DocString, MetadataProps: vi.MetadataProps, Type: &onnx.TypeProto{Denotation: vi.Type.Denotation,
		Value: &onnx.TypeProto_TensorType{TensorType: &onnx.TypeProto_Tensor{ElemType: tt.ElemType, Shape: &onnx.TensorShapeProto{Dim: dims}}}}}
}

func renamedInfo(vi *onnx.ValueInfoProto, name string) *onnx.ValueInfoProto {
	return &onnx.ValueInfoProto{Name: name, Type: vi.Type, DocString: vi.DocString, MetadataProps: vi.MetadataProps}
}

// renameNode copies n with its inputs and outputs renamed and its name
// suffixed; subgraphs get their references to renamed outer values
// renamed.
func renameNode(n *onnx.NodeProto, rename map[string]string, suffix string) *onnx.NodeProto {
	c := &onnx.NodeProto{
		Name: n.Name, OpType: n.OpType, Domain: n.Domain, Overload: n.Overload, DocString: n.DocString,
		MetadataProps: n.MetadataProps,
	}
	if n.Name != "" {
		// ONNX Runtime wants node names unique, except empty ones.
		c.Name += suffix
	}
	for _, in := range n.Input {
		if r, ok := rename[in]; ok {
			in = r
		}
		c.Input = append(c.Input, in)
	}
	for _, o := range n.Output {
		if r, ok := rename[o]; ok {
			o = r
		}
		c.Output = append(c.Output, o)
	}
	for _, a := range n.Attribute {
		if a.G != nil || len(a.Graphs) > 0 {
			ca := &onnx.AttributeProto{Name: a.Name, RefAttrName: a.RefAttrName, DocString: a.DocString, Type: a.Type}
			if a.G != nil {
				ca.G = renameOuter(a.G, rename)
			}
			for _, sg := range a.Graphs {
				ca.Graphs = append(ca.Graphs, renameOuter(sg, rename))
			}
			a = ca
		}
		c.Attribute = append(c.Attribute, a)
	}
	return c
}

// renameOuter copies subgraph g with its references to outer values
// renamed; names g defines itself (inputs, initializers, node outputs)
// shadow the outer ones and stay.
func renameOuter(g *onnx.GraphProto, rename map[string]string) *onnx.GraphProto {
	inner := map[string]string{}
	for k, v := range rename {
		inner[k] = v
	}
	for _, vi := range g.Input {
		delete(inner, vi.Name)
	}
	for _, t := range g.Initializer {
		delete(inner, t.Name)
	}
	for _, n := range g.Node {
		for _, o := range n.Output {
			delete(inner, o)
		}
	}
	c := &onnx.GraphProto{Name: g.Name, Initializer: g.Initializer, SparseInitializer: g.SparseInitializer, DocString: g.DocString,
		Input: g.Input, ValueInfo: g.ValueInfo, QuantizationAnnotation: g.QuantizationAnnotation, MetadataProps: g.MetadataProps}
	for _, n := range g.Node {
		c.Node = append(c.Node, renameNode(n, inner, ""))
	}
	for _, vi := range g.Output {
		// A subgraph may return an outer value as it is.
		if r, ok := inner[vi.Name]; ok {
			vi = renamedInfo(vi, r)
		}
		c.Output = append(c.Output, vi)
	}
	return c
}

// fuseRounds replaces each rounding the emulation made, Cast(to=FLOAT16 or
// BFLOAT16) → Cast(to=FLOAT) with nothing else reading the 16-bit value,
// by one Round node: the same result, bit for bit (NaN payloads aside),
// in one read and one write instead of two of each and a 16-bit buffer.
// Only the emulation's own pairs (internal names) from sources not known
// to be other than FLOAT are fused (a graph input the user feeds in fp16 is
// rounded through Casts); a model's own casts stay as written.
func fuseRounds(g *onnx.GraphProto, elemType func(string) int32) []*onnx.NodeProto {
	nodes := g.Node
	readers := map[string]int{}
	for _, vi := range g.Output {
		readers[vi.Name]++
	}
	known := map[string]int32{}
	for _, vi := range append(append([]*onnx.ValueInfoProto(nil), g.Input...), g.ValueInfo...) {
		if t := vi.GetType().GetTensorType(); t != nil && t.ElemType != 0 {
			known[vi.Name] = t.ElemType
		}
	}
	for _, t := range g.Initializer {
		known[t.Name] = t.DataType
	}
	// typeOf is a value's element type where something declares it: the
	// graph, or the model's value a renamed or internal name derives from
	// ("<name>::<tag>::fp16audit", repeated); 0 when nothing does.
	typeOf := func(name string) int32 {
		for {
			if t, ok := known[name]; ok {
				return t
			}
			if t := elemType(name); t != 0 {
				return t
			}
			base, ok := strings.CutSuffix(name, internalSuffix)
			if !ok {
				return 0
			}
			i := strings.LastIndex(base, "::")
			if i < 0 {
				return 0
			}
			name = base[:i]
		}
	}
	var count func(ns []*onnx.NodeProto)
	count = func(ns []*onnx.NodeProto) {
		for _, n := range ns {
			for _, in := range n.Input {
				readers[in]++
			}
			for _, a := range n.Attribute {
				if a.G != nil {
					count(a.G.Node)
				}
				for _, sg := range a.Graphs {
					count(sg.Node)
				}
			}
		}
	}
	count(nodes)
	castTo := func(n *onnx.NodeProto) int64 {
		if n.OpType != "Cast" || (n.Domain != "" && n.Domain != "ai.onnx") || len(n.Input) != 1 || len(n.Output) != 1 ||
			!strings.HasSuffix(n.Name, internalSuffix) {
			return -1
		}
		for _, a := range n.Attribute {
			if a.Name == "to" {
				return a.I
			}
		}
		return -1
	}
	down := map[string]*onnx.NodeProto{} // the 16-bit value → the Cast back
	for _, n := range nodes {
		if castTo(n) == int64(elemFloat) && readers[n.Input[0]] == 1 {
			down[n.Input[0]] = n
		}
	}
	fused := map[*onnx.NodeProto]bool{}
	out := make([]*onnx.NodeProto, 0, len(nodes))
	for _, n := range nodes {
		if fused[n] {
			continue
		}
		if to := castTo(n); (to == int64(elemF16) || to == int64(elemBF16)) && typeOf(n.Input[0]) <= elemFloat {
			if back, ok := down[n.Output[0]]; ok {
				r := onnx.Node(OpRound, back.Name, n.Input, back.Output, onnx.AttrInt(AttrTo, to))
				r.Domain = Domain
				out = append(out, r)
				fused[back] = true
				continue
			}
		}
		out = append(out, n)
	}
	return out
}
