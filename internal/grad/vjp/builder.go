package vjp

import (
	"fmt"
	"math"
	"regexp"
	"slices"

	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

const (
	elemFloat    = int32(onnx.TensorProto_FLOAT)
	elemFloat16  = int32(onnx.TensorProto_FLOAT16)
	elemBFloat16 = int32(onnx.TensorProto_BFLOAT16)
	elemInt64    = int32(onnx.TensorProto_INT64)
)

// builder accumulates the backward graph: the forward graph (nodes cloned
// where a rule needs an extra output of a forward op), the appended nodes,
// the constants they use and the declared outputs.
type Builder struct {
	m     *onnx.ModelProto
	src   *onnx.GraphProto // shallow copy of the forward graph
	ix    *onnx.Index      // of the forward graph as given
	facts *Facts
	opset int64

	nodes   []*onnx.NodeProto
	inits   []*onnx.TensorProto
	inputs  []*onnx.ValueInfoProto
	outputs []*onnx.ValueInfoProto
	// produced maps a name an appended node outputs to that node; used
	// holds the names appended nodes read. rename moves a fresh value to
	// its final name only when nothing reads it yet.
	produced map[string]*onnx.NodeProto
	used     map[string]bool
	declared map[string]bool
	consts   map[string]string
	cloned   map[int]bool
	// ruled holds, per forward node, the range of nodes its rule
	// appended: the nodes that read the forward values it saved.
	ruled map[int][2]int

	// label prefixes the names of the values a rule invents: the forward
	// node's name, so a reader of the graph sees where each came from.
	label string
	count int
}

// NewBuilder starts the backward graph of m (indexed by ix) for the probed
// facts, emitting nodes of the given default-domain opset. m is never
// modified: a forward node a rule must change is cloned first.
func NewBuilder(m *onnx.ModelProto, ix *onnx.Index, facts *Facts, opset int64) *Builder {
	g := m.Graph
	src := &onnx.GraphProto{
		Node:              append([]*onnx.NodeProto(nil), g.Node...),
		Name:              g.Name,
		Initializer:       g.Initializer,
		SparseInitializer: g.SparseInitializer,
		DocString:         g.DocString,
		Input:             g.Input,
		Output:            g.Output,
		ValueInfo:         g.ValueInfo,
		MetadataProps:     g.MetadataProps,
	}
	return &Builder{m: m, src: src, ix: ix, facts: facts, opset: opset,
		produced: map[string]*onnx.NodeProto{}, used: map[string]bool{},
		declared: map[string]bool{}, consts: map[string]string{}, cloned: map[int]bool{}, ruled: map[int][2]int{}}
}

// reserved matches the names the backward graph (and a probe) mints: a
// model value with such a name could collide with one of them. Names the
// other rewrites mint (an upcast input, private BatchNorm statistics) also
// end in Internal but never match.
var reserved = regexp.MustCompile(`::grad|::bw\d+::fp16audit$|^const\d+::fp16audit$|::(shape|mask|indices|FLOAT16|BFLOAT16)::fp16audit$|^(loss|seed|loss_scale|target)::fp16audit$`)

// CheckNames refuses models whose own names could collide with the names
// the backward graph adds.
func (b *Builder) CheckNames() error {
	check := func(name string) error {
		if reserved.MatchString(name) {
			return fmt.Errorf("grad: the model already has a value named %q; names containing %q and a few ending in %q are reserved for the backward graph: rename it in the export", name, GradSuffix, internal)
		}
		return nil
	}
	for _, n := range b.src.Node {
		for _, o := range n.Output {
			if err := check(o); err != nil {
				return err
			}
		}
	}
	for _, vi := range b.src.Input {
		if err := check(vi.Name); err != nil {
			return err
		}
	}
	for _, t := range b.src.Initializer {
		if err := check(t.Name); err != nil {
			return err
		}
	}
	return nil
}

// Upgrade lifts the forward nodes from opset from to b.opset where their
// meaning would otherwise change: BatchNormalization before 14 signalled
// training by its extra outputs, and RoiAlign's default
// coordinate_transformation_mode changed at 16. Every other op between 13
// and 16 only gained types or optional attributes.
func (b *Builder) Upgrade(from int64) {
	if from >= b.opset {
		return
	}
	for i, n := range b.src.Node {
		if n.Domain != "" && n.Domain != "ai.onnx" {
			continue
		}
		switch {
		case n.OpType == "BatchNormalization" && from < 14 && len(n.Output) > 1:
			c := b.fwd(i)
			c.Attribute = append(c.Attribute, onnx.AttrInt("training_mode", 1))
			if len(c.Output) > 3 {
				// saved_mean and saved_inv_std (BatchNormalization-9)
				// no longer exist; the exporter never reads them.
				c.Output = c.Output[:3]
			}
		case n.OpType == "RoiAlign" && from < 16 && attr(n, "coordinate_transformation_mode") == nil:
			c := b.fwd(i)
			c.Attribute = append(c.Attribute, onnx.AttrString("coordinate_transformation_mode", "output_half_pixel"))
		}
	}
}

// fwd returns forward node i for modification: a clone, so the caller's
// model is left as it is.
func (b *Builder) fwd(i int) *onnx.NodeProto {
	if !b.cloned[i] {
		n := b.src.Node[i]
		b.src.Node[i] = &onnx.NodeProto{
			Input: append([]string(nil), n.Input...), Output: append([]string(nil), n.Output...),
			Name: n.Name, OpType: n.OpType, Domain: n.Domain, Overload: n.Overload,
			Attribute: append([]*onnx.AttributeProto(nil), n.Attribute...),
			DocString: n.DocString, MetadataProps: n.MetadataProps,
		}
		b.cloned[i] = true
	}
	return b.src.Node[i]
}

// fresh returns a new intermediate name.
func (b *Builder) fresh() string {
	b.count++
	return fmt.Sprintf("%s::bw%d%s", b.label, b.count, internal)
}

// op appends a single-output node and returns its output.
func (b *Builder) op(opType string, inputs []string, attrs ...*onnx.AttributeProto) string {
	out := b.fresh()
	b.emit(opType, inputs, []string{out}, attrs...)
	return out
}

// emitTo appends a single-output node writing to out.
func (b *Builder) emitTo(opType string, inputs []string, out string, attrs ...*onnx.AttributeProto) {
	b.emit(opType, inputs, []string{out}, attrs...)
}

func (b *Builder) emit(opType string, inputs, outputs []string, attrs ...*onnx.AttributeProto) *onnx.NodeProto {
	n := onnx.Node(opType, outputs[0], inputs, outputs, attrs...)
	b.nodes = append(b.nodes, n)
	for _, in := range inputs {
		b.used[in] = true
	}
	for _, o := range outputs {
		b.produced[o] = n
	}
	return n
}

// rename gives the value from the name to: in place when an appended node
// produced it and nothing reads it yet, else through an Identity.
func (b *Builder) rename(from, to string) {
	if n, ok := b.produced[from]; ok && !b.used[from] && !b.declared[from] {
		for k, o := range n.Output {
			if o == from {
				n.Output[k] = to
			}
		}
		delete(b.produced, from)
		b.produced[to] = n
		return
	}
	b.emitTo("Identity", []string{from}, to)
}

// round writes src rounded through the 16-bit type et to dst.
func (b *Builder) round(src, dst string, et int32) {
	mid := dst + "::" + onnx.DataTypeName(et) + internal
	b.emitTo("Cast", []string{src}, mid, onnx.AttrInt("to", int64(et)))
	b.emitTo("Cast", []string{mid}, dst, onnx.AttrInt("to", int64(elemFloat)))
}

// output declares name a FLOAT graph output of the given shape (unknown
// when nil).
func (b *Builder) output(name string, shape []int64) {
	if b.declared[name] {
		return
	}
	b.declared[name] = true
	var vi *onnx.ValueInfoProto
	if shape == nil {
		vi = &onnx.ValueInfoProto{Name: name, Type: &onnx.TypeProto{Value: &onnx.TypeProto_TensorType{
			TensorType: &onnx.TypeProto_Tensor{ElemType: elemFloat}}}}
	} else {
		dims := make([]any, len(shape))
		for i, d := range shape {
			dims[i] = d
		}
		vi = onnx.TensorValueInfo(name, onnx.TensorProto_FLOAT, dims...)
	}
	b.outputs = append(b.outputs, vi)
}

// ints returns a 1-D INT64 constant.
func (b *Builder) ints(v ...int64) string {
	key := fmt.Sprint("i", v)
	if name, ok := b.consts[key]; ok {
		return name
	}
	name := fmt.Sprintf("const%d%s", len(b.consts), internal)
	b.consts[key] = name
	b.inits = append(b.inits, onnx.Int64Tensor(name, []int64{int64(len(v))}, v))
	return name
}

// int0 returns a 0-d INT64 constant.
func (b *Builder) int0(v int64) string {
	key := fmt.Sprint("i0 ", v)
	if name, ok := b.consts[key]; ok {
		return name
	}
	name := fmt.Sprintf("const%d%s", len(b.consts), internal)
	b.consts[key] = name
	b.inits = append(b.inits, onnx.Int64Tensor(name, []int64{}, []int64{v}))
	return name
}

// scalar returns a 0-d FLOAT constant.
func (b *Builder) scalar(v float32) string {
	key := fmt.Sprint("f", math.Float32bits(v))
	if name, ok := b.consts[key]; ok {
		return name
	}
	name := fmt.Sprintf("const%d%s", len(b.consts), internal)
	b.consts[key] = name
	b.inits = append(b.inits, onnx.FloatTensor(name, []int64{}, []float32{v}))
	return name
}

// floats returns a FLOAT constant of the given shape.
func (b *Builder) floats(dims []int64, v []float32) string {
	name := fmt.Sprintf("const%d%s", len(b.consts), internal)
	b.consts[name] = name
	b.inits = append(b.inits, onnx.FloatTensor(name, dims, v))
	return name
}

// isFloat reports whether a forward value is FLOAT.
func (b *Builder) isFloat(v string) bool { return b.ix.ElemType(v) == elemFloat }

// shape returns the static shape of a forward value.
func (b *Builder) shape(v string) ([]int64, error) {
	if s, ok := b.facts.Shapes[v]; ok {
		return s, nil
	}
	if s, ok := b.ix.Shape(v); ok {
		fixed := true
		for _, d := range s.Dims {
			fixed = fixed && d >= 0
		}
		if fixed {
			return s.Dims, nil
		}
	}
	return nil, fmt.Errorf("shape of %q unknown (not probed)", v)
}

// mustShape is shape, with nil for unknown.
func (b *Builder) mustShape(v string) []int64 {
	s, _ := b.shape(v)
	return s
}

// constant returns the contents of a value fixed for the probed batch: an
// initializer, a Constant output, or a small integer value the probe
// recorded.
func (b *Builder) constant(v string) (*tensor.Tensor, error) {
	if t, err := b.ix.ConstantValue(v); err == nil {
		return t, nil
	}
	if t, ok := b.facts.Values[v]; ok {
		return t, nil
	}
	return nil, fmt.Errorf("value %q is computed at run time and was not recorded by the probe", v)
}

// constInts returns a constant's elements as int64.
func (b *Builder) constInts(v string) ([]int64, error) {
	t, err := b.constant(v)
	if err != nil {
		return nil, err
	}
	f, err := int64s(t)
	if err != nil {
		return nil, fmt.Errorf("value %q: %w", v, err)
	}
	return f, nil
}

// constFloat returns a scalar constant as float64.
func (b *Builder) constFloat(v string) (float64, error) {
	t, err := b.constant(v)
	if err != nil {
		return 0, err
	}
	if t.Elements() != 1 {
		return 0, fmt.Errorf("value %q: want one element, got shape %v", v, t.Shape)
	}
	f, err := t.Float32s()
	if err != nil {
		return 0, err
	}
	return float64(f[0]), nil
}

func int64s(t *tensor.Tensor) ([]int64, error) {
	n := int(t.Elements())
	out := make([]int64, n)
	switch t.DType {
	case tensor.Int64:
		for i := range out {
			out[i] = int64(leUint64(t.Data[8*i:]))
		}
	case tensor.Int32:
		for i := range out {
			out[i] = int64(int32(leUint32(t.Data[4*i:])))
		}
	case tensor.Bool, tensor.Uint8:
		for i := range out {
			out[i] = int64(t.Data[i])
		}
	default:
		return nil, fmt.Errorf("want integers, got %s", t.DType)
	}
	return out, nil
}

func leUint64(b []byte) uint64 {
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

func leUint32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// Helpers for the ops rules emit most.

func (b *Builder) mul(x, y string) string { return b.op("Mul", []string{x, y}) }
func (b *Builder) add(x, y string) string { return b.op("Add", []string{x, y}) }
func (b *Builder) sub(x, y string) string { return b.op("Sub", []string{x, y}) }
func (b *Builder) div(x, y string) string { return b.op("Div", []string{x, y}) }
func (b *Builder) neg(x string) string    { return b.op("Neg", []string{x}) }

func (b *Builder) scale(x string, k float64) string { return b.mul(x, b.scalar(float32(k))) }

func (b *Builder) reshape(x string, shape []int64) string {
	return b.op("Reshape", []string{x, b.ints(shape...)})
}

func (b *Builder) transpose(x string, perm []int64) string {
	return b.op("Transpose", []string{x}, onnx.AttrInts("perm", perm...))
}

// reduceSum sums x over axes (ReduceSum takes axes as an input from 13 on).
func (b *Builder) reduceSum(x string, axes []int64, keepdims bool) string {
	k := int64(0)
	if keepdims {
		k = 1
	}
	return b.op("ReduceSum", []string{x, b.ints(axes...)}, onnx.AttrInt("keepdims", k))
}

// sumAll sums every element to a scalar.
func (b *Builder) sumAll(x string) string {
	return b.op("ReduceSum", []string{x}, onnx.AttrInt("keepdims", 0))
}

// expandTo broadcasts x to shape.
func (b *Builder) expandTo(x string, shape []int64) string {
	return b.op("Expand", []string{x, b.ints(shape...)})
}

// zeros returns a FLOAT zero tensor of shape.
func (b *Builder) zeros(shape []int64) string {
	return b.op("ConstantOfShape", []string{b.ints(shape...)})
}

// slice takes [start, end) of x along axis.
func (b *Builder) slice(x string, axis, start, end int64) string {
	return b.op("Slice", []string{x, b.ints(start), b.ints(end), b.ints(axis)})
}

// unbroadcast sums a gradient g of shape gs back to the shape xs of an input
// that numpy-style broadcasting stretched to gs.
func (b *Builder) unbroadcast(g string, gs, xs []int64) string {
	if slices.Equal(gs, xs) {
		return g
	}
	lead := len(gs) - len(xs)
	var axes []int64
	for i := range gs {
		j := i - lead
		if j < 0 || xs[j] == 1 && gs[i] != 1 {
			axes = append(axes, int64(i))
		}
	}
	out := g
	if len(axes) > 0 {
		out = b.reduceSum(g, axes, true)
	}
	if lead != 0 {
		out = b.reshape(out, xs)
	}
	return out
}

// Model assembles the forward graph, every appended node, constant, input
// and output into the backward model.
func (b *Builder) Model() *onnx.ModelProto {
	g := b.src
	ng := &onnx.GraphProto{
		Node:              append(append([]*onnx.NodeProto(nil), g.Node...), b.nodes...),
		Name:              g.Name,
		Initializer:       append(append([]*onnx.TensorProto(nil), g.Initializer...), b.inits...),
		SparseInitializer: g.SparseInitializer,
		DocString:         g.DocString,
		Input:             append(append([]*onnx.ValueInfoProto(nil), g.Input...), b.inputs...),
		Output:            append(append([]*onnx.ValueInfoProto(nil), g.Output...), b.outputs...),
		ValueInfo:         g.ValueInfo,
		MetadataProps:     g.MetadataProps,
	}
	m := b.m
	ops := make([]*onnx.OperatorSetIdProto, 0, len(m.OpsetImport))
	for _, o := range m.OpsetImport {
		if o.Domain == "" || o.Domain == "ai.onnx" {
			o = &onnx.OperatorSetIdProto{Domain: o.Domain, Version: b.opset}
		}
		ops = append(ops, o)
	}
	ir := m.IrVersion
	if ir < 8 {
		// opset 16 needs IR version 8
		ir = 8
	}
	return &onnx.ModelProto{
		IrVersion: ir, OpsetImport: ops, ProducerName: m.ProducerName,
		ProducerVersion: m.ProducerVersion, Domain: m.Domain, ModelVersion: m.ModelVersion,
		DocString: m.DocString, Graph: ng, MetadataProps: m.MetadataProps, Functions: m.Functions,
	}
}

// attr returns a node's attribute, or nil.
func attr(n *onnx.NodeProto, name string) *onnx.AttributeProto {
	for _, a := range n.Attribute {
		if a.Name == name {
			return a
		}
	}
	return nil
}

func attrInt(n *onnx.NodeProto, name string, def int64) int64 {
	if a := attr(n, name); a != nil {
		return a.I
	}
	return def
}

func attrFloat(n *onnx.NodeProto, name string, def float32) float32 {
	if a := attr(n, name); a != nil {
		return a.F
	}
	return def
}

func attrInts(n *onnx.NodeProto, name string) []int64 {
	if a := attr(n, name); a != nil {
		return a.Ints
	}
	return nil
}

func attrString(n *onnx.NodeProto, name, def string) string {
	if a := attr(n, name); a != nil {
		return string(a.S)
	}
	return def
}
