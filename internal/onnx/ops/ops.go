// Package ops is what fp16audit knows about each ONNX operator, one row
// per op (table.go): the CUDA autocast list of the aten op it comes from,
// which inputs take part in type promotion, its output types, the shape
// rule family shapes.Infer applies, the gradient rule package vjp emits
// for it (or that it passes no gradient), whether it draws random numbers,
// runs subgraphs, has data-dependent shapes or carries an epsilon
// attribute. The packages that act on these facts (precision, shapes,
// onnx, vjp, grad, lint, statsop, diagnose, execute/backward, conformance)
// read them here instead of keeping lists of their own, so a new
// operator, or a new opset's form of one, is a row of the table and the
// tests that run it: ops_test.go here, shapes' TestTableShapes (every row
// with a shape family against ONNX Runtime) and grad's TestTableGradients
// (every row with a gradient rule has a central-difference case). Code
// particular to one op (a shape rule of its own, a gradient rule family)
// stays where its stage keeps its code; the row names it.
//
// The package is data: it imports nothing of the project, so every stage
// may read it.
package ops

// Autocast is the CUDA autocast list an op's aten counterpart is on
// (aten/src/ATen/autocast_mode.h, PyTorch 2.x), as DESIGN.md translates
// them.
type Autocast int

const (
	// Follow: on no list; computes in the type of its inputs.
	Follow Autocast = iota
	// Lower: lower_precision_fp (conv, matmul, linear, einsum, rnn cells,
	// prelu, scaled_dot_product_attention).
	Lower
	// FP32: fp32 (exp, log, pow, softmax, the norms, sums, the losses …).
	FP32
	// Promote: promote (cat, stack, index_put, scatter_add, grid_sampler;
	// where promotes the same way).
	Promote
)

// Shape is the family of shape rules an op's outputs follow.
type Shape int

const (
	// ShapeOwn: shapes.Infer has a rule of its own for the op, or none.
	ShapeOwn Shape = iota
	// ShapeUnary: every output has the first input's shape (Dropout's
	// mask too).
	ShapeUnary
	// ShapeBroadcast: the numpy broadcast of every input's shape.
	ShapeBroadcast
	// ShapeReduce: the first input reduced over axes (attribute or input),
	// keepdims as the attribute says.
	ShapeReduce
)

// NoGrad is Op.Grad for ops whose float outputs carry no gradient back to
// their inputs: comparisons and index computations, shape queries, random
// generators and rounding steps (zero derivative almost everywhere).
const NoGrad = "-"

// Domains of the rows.
const (
	// Default is ai.onnx, written "" in a model.
	Default = ""
	// ML is ai.onnx.ml.
	ML = "ai.onnx.ml"
	// Microsoft is ONNX Runtime's contrib domain.
	Microsoft = "com.microsoft"
)

// Op is one operator's row.
type Op struct {
	Name string
	// Domain is Default, ML or Microsoft (ops fp16audit meets in exports
	// without their semantics being standard).
	Domain string
	// Autocast is the op's autocast list; Follow when on none.
	Autocast Autocast
	// DataInputs, when not 0, is how many leading inputs take part in
	// type promotion (Resize's roi and scales, a normalization's scale and
	// bias keep their own type); 0: all of them.
	DataInputs int
	// FloatFactory: makes floats from nothing when no dtype attribute says
	// otherwise (ConstantOfShape, RandomNormal, the windows).
	FloatFactory bool
	// SameType: the first output has the first input's element type.
	SameType bool
	// NonFloat: no float outputs whatever the inputs (comparisons, shape
	// queries, integer and quantized kernels); IndexOutputs are the index
	// and mask outputs of an op whose others are float (TopK's indices).
	NonFloat     bool
	IndexOutputs []int
	// Subgraphs: runs graphs of its own (If, Loop, Scan, SequenceMap),
	// which read the enclosing scope.
	Subgraphs bool
	// DataShaped: an output's shape depends on the values of the inputs
	// (NonZero, Compress, Unique, Range), not on their shapes alone.
	DataShaped bool
	// Shape is the op's shape rule family.
	Shape Shape
	// Grad names the gradient rule package vjp registers for the op
	// ("unary", "arith", "conv", …), NoGrad, or "" for none (the backward
	// reports the op by name and stops there).
	Grad string
	// ParamInputs are the input slots the gradient rule reads as fixed
	// parameters rather than data (a Slice's starts and ends): a probe
	// records their contents when they are computed at run time.
	ParamInputs []int
	// Random: draws random numbers, so two copies of a node differ.
	Random bool
	// Epsilon: a normalization with an epsilon attribute.
	Epsilon bool
	// HalfWeights: PyTorch's op refuses an input of another dtype than
	// its scale and bias (F.layer_norm: "expected scalar type Float but
	// found Half"), so under model.half() its fp16 weights make it
	// compute in fp16 whatever it is fed. (Matmuls and convolutions do
	// the same; autocast's lower-precision list already names them.)
	HalfWeights bool
}

// byName holds the rows of each op type, one per domain.
var byName = map[string][]*Op{}

func init() {
	for i := range table {
		o := &table[i]
		byName[o.Name] = append(byName[o.Name], o)
	}
}

// Lookup returns the row of op type opType in domain ("" or "ai.onnx" is
// the default domain), nil when fp16audit has none.
func Lookup(domain, opType string) *Op {
	if domain == "ai.onnx" {
		domain = Default
	}
	for _, o := range byName[opType] {
		if o.Domain == domain {
			return o
		}
	}
	return nil
}

// Standard reports whether an op belongs to the ONNX standard (ai.onnx or
// ai.onnx.ml), whose semantics fp16audit knows.
func Standard(domain, opType string) bool {
	o := Lookup(domain, opType)
	return o != nil && (o.Domain == Default || o.Domain == ML)
}

// All returns every row, in the table's order.
func All() []Op { return append([]Op(nil), table...) }

// Random reports whether an op draws random numbers (its row's Random).
func Random(domain, opType string) bool {
	o := Lookup(domain, opType)
	return o != nil && o.Random
}

// Epsilon reports whether an op is a normalization with an epsilon
// attribute (its row's Epsilon).
func Epsilon(domain, opType string) bool {
	o := Lookup(domain, opType)
	return o != nil && o.Epsilon
}
