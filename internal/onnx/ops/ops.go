// Package ops is the registry of what fp16audit knows about each ONNX
// operator: one entry per op, in the file of its family (math.go,
// logic.go, activation.go, nn.go, shape.go, reduce.go, selection.go,
// opset23.go, control.go, random.go, quant.go, signal.go, ml.go,
// contrib.go). An entry holds the CUDA autocast list of the aten op it
// comes from, which inputs take part in type promotion, its output
// types, the shape rule shapes.Infer applies and the gradient rule
// package vjp emits for it (by name), whether it chooses (a selection)
// or gathers at chosen indices, whether it draws random numbers, runs
// subgraphs, has data-dependent shapes or carries an epsilon attribute,
// the constant a PyTorch fill writes through it, its roles in the
// analyses that follow a value through a graph (Role), and what ONNX
// Runtime's kernel does with NaN and ±Inf beside PyTorch's op
// (NonFinite, measured by fixtures/torch/nonfinite.py). The packages that
// act on these facts (onnx, shapes, precision, rewrite, vjp, grad, lint,
// statsop, diagnose, batch, execute/backward, conformance, audit) ask
// the registry instead of keeping lists of their own, so a new operator,
// or a new opset's form of one, is an entry and the tests that run it:
// ops_test.go here (every op the fixtures' exports use is registered;
// every rule an entry names exists), shapes' TestTableShapes (every
// entry with a generic shape rule against ONNX Runtime) and grad's
// TestTableGradients (every entry with a gradient rule against central
// differences). Code particular to one op (a shape rule, a gradient
// rule) stays where its stage keeps its code; the entry names it.
//
// The package is data: it imports nothing of the project, so every stage
// may read it.
package ops

import "slices"

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

// Type is how the element type of an op's outputs follows from its
// inputs and attributes: what an index infers for a value the model does
// not declare.
type Type int

const (
	// TypeUnknown: not inferred.
	TypeUnknown Type = iota
	// TypeInput: the first output has the first input's type (the index
	// outputs have IndexType).
	TypeInput
	// TypeInputAll: every output has the first input's type (Split).
	TypeInputAll
	// TypeSecond: every output has the second input's type (CastLike's
	// target, Where's values, DequantizeLinear's scale).
	TypeSecond
	// TypeTo: every output has the type the "to" attribute names (Cast).
	TypeTo
	// TypeValue: every output has the type of the "value" attribute's
	// tensor, float without one (ConstantOfShape).
	TypeValue
	// TypeInt64: every output holds int64 (shapes, sizes, indices).
	TypeInt64
	// TypeBool: every output holds bool (comparisons and logic).
	TypeBool
)

// Holds is what an op's outputs are when they are not tensors: ONNX's
// sequences, optionals and maps carry tensors but are none, so no tensor
// op (a rounding Cast, a statistics node) may read them, and a stage that
// acts on values by type acts on the tensors taken out of them instead.
type Holds int

const (
	// HoldsTensors: every output is a tensor (the zero value).
	HoldsTensors Holds = iota
	// HoldsSequences: every output is a sequence of tensors
	// (SplitToSequence, which the dynamo exporter writes for chunk,
	// split and unbind without its optimizer; SequenceConstruct, …).
	HoldsSequences
	// HoldsOptionals: every output is an optional value (Optional).
	HoldsOptionals
	// HoldsMaps: every output is a sequence of maps (ai.onnx.ml's
	// ZipMap).
	HoldsMaps
	// HoldsInput: every output holds what the first input holds
	// (Identity passes a sequence on as a sequence).
	HoldsInput
	// HoldsElement: every output is what the first input carries: the
	// value inside an optional (OptionalGetElement; a tensor or a
	// sequence read through it is itself).
	HoldsElement
)

// NoGrad is Op.Grad for ops whose float outputs carry no gradient back to
// their inputs: comparisons and index computations, shape queries, random
// generators and rounding steps (zero derivative almost everywhere).
const NoGrad = "-"

// Domains of the entries.
const (
	// Default is ai.onnx, written "" in a model.
	Default = ""
	// ML is ai.onnx.ml.
	ML = "ai.onnx.ml"
	// Microsoft is ONNX Runtime's contrib domain.
	Microsoft = "com.microsoft"
)

// Role is a set of facts about what an op does with the values it reads,
// for the analyses that follow a value through a graph. Each bit names
// the analysis that reads it.
type Role uint32

const (
	// PassThrough: hands its first input's values on unchanged,
	// reshaped, broadcast, transposed or converted (Identity, Cast, the
	// reshapes, Expand): a constant read through it is still that
	// constant (diagnose), an index still that index (batch).
	PassThrough Role = 1 << iota
	// CarriesInf: hands infinities on without making new ones from
	// finite values: it moves, selects, broadcasts, adds or takes
	// extrema of values (or fills them: ConstantOfShape). An additive
	// -inf mask crosses it; an op without it that reads the mask
	// (Softmax, Exp, MatMul) is where a NaN the mask causes starts
	// (diagnose's deliberate infinities).
	CarriesInf
	// Tail: may follow a model's final layer without making it an inner
	// one: a shape op, an activation, softmax, a cast, the Linear bias
	// (diagnose's oversized logits).
	Tail
	// Scores: its output's last axis holds class scores: a Linear's
	// output features, softmax's classes (onnx.ClassScores).
	Scores
	// KeepsScores: its first input's last axis keeps its meaning in its
	// output (elementwise activations, casts, reshapes that keep the
	// last axis: onnx.ClassScores follows them).
	KeepsScores
	// Affine: adds a bias to or scales its computed operand, whose
	// meaning the output keeps (onnx.ClassScores).
	Affine
	// TypePromotes: PyTorch brings its operands to one type, so an
	// exporter tracing a 16-bit operand beside a float32 one writes a
	// Cast to FLOAT before it (precision's promotion casts).
	TypePromotes
	// ShapeMove and ShapeArith: applied to values computed from a shape
	// (ShapeMove: to its data input; ShapeArith: to operands that are
	// such values or one-element constants), the result is still a
	// number Python computed, not a tensor (precision's shape values).
	ShapeMove
	ShapeArith
	// Linear: a matrix product or convolution with its weight in input
	// 1, the layer whose output a Linear's split bias is added to
	// (precision, onnx's names of inlined layers).
	Linear
)

// NonFinite is how ONNX Runtime's CPU kernel of an op treats NaN and ±Inf
// beside the PyTorch op it is exported from, as fixtures/torch/nonfinite.py
// measured them (torch 1.13 with its TorchScript exporter, torch 2.15 with
// its dynamo exporter, ONNX Runtime 1.30): where the kernel absorbs what
// PyTorch propagates, package rewrite's TorchNonFinite puts them back, and
// its TestTorchNonFinite holds every measured case to PyTorch's outputs.
type NonFinite int

const (
	// NonFiniteUnknown: not measured.
	NonFiniteUnknown NonFinite = iota
	// NonFiniteAsTorch: NaN and ±Inf come out where PyTorch's do.
	NonFiniteAsTorch
	// NonFiniteSkipsNaN: an extremum (ReduceMax, ReduceMin, MaxPool,
	// GlobalMaxPool) returns the largest of the other values where a NaN
	// is among those it compares; PyTorch's amax, max(dim) and max_pool
	// return NaN there.
	NonFiniteSkipsNaN
	// NonFiniteGates: a recurrent layer (LSTM, GRU) whose gate
	// activations turn a NaN pre-activation into a finite value (ONNX
	// Runtime's sigmoid and tanh clamp their argument); PyTorch's gates
	// are NaN there, and from that step on the whole hidden state is,
	// through the recurrence. A NaN pre-activation is what an input that
	// is ±Inf after autocast's cast makes (Inf − Inf in W·x).
	NonFiniteGates
	// NonFiniteOpenBound: Clip reads an absent bound as float32's
	// largest value, so +Inf (-Inf) beyond it comes out as ±3.4e38;
	// PyTorch's clamp(min=...) keeps +Inf (clamp(max=...) keeps -Inf).
	NonFiniteOpenBound
	// NonFiniteSignNaN: Sign(NaN) is NaN; torch.sign(NaN) is 0.
	NonFiniteSignNaN
	// NonFiniteNaNOrder: TopK sorts a NaN where its comparisons leave
	// it, torch.topk and torch.sort take NaN for the largest value: the
	// values hold the NaN at another position (measured: always among
	// them). Not rewritten: what reaches the outputs is the same.
	NonFiniteNaNOrder
)

// Op is one operator's entry.
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
	// Type is how its outputs' element types follow from its inputs.
	Type Type
	// NonFloat: no float outputs whatever the inputs (comparisons, shape
	// queries, integer and quantized kernels); IndexOutputs are the index
	// and mask outputs of an op whose others are float (TopK's indices),
	// of type IndexType where it is known.
	NonFloat     bool
	IndexOutputs []int
	IndexType    Type
	// Subgraphs: runs graphs of its own (If, Loop, Scan, SequenceMap),
	// which read the enclosing scope.
	Subgraphs bool
	// DataShaped: an output's shape depends on the values of the inputs
	// (NonZero, Compress, Unique, Range), not on their shapes alone.
	DataShaped bool
	// Shape names the shape rule package shapes registers for the op
	// ("unary": every output the first input's shape; "broadcast": the
	// numpy broadcast of its inputs; "reduce": the first input reduced
	// over its axes; or a rule of the op's own: "matmul", "window", …);
	// "" for none (the memory plan asks ONNX Runtime).
	Shape string
	// Grad names the gradient rule package vjp registers for the op
	// ("unary", "arith", "conv", …), NoGrad, or "" for none (the backward
	// reports the op by name and stops there).
	Grad string
	// ParamInputs are the input slots the gradient rule reads as fixed
	// parameters rather than data (a Slice's starts and ends): a probe
	// records their contents when they are computed at run time.
	ParamInputs []int
	// Role is what the op does with the values it reads, for the
	// analyses that follow a value (see the Role bits).
	Role Role
	// Random: draws random numbers, so two copies of a node differ.
	Random bool
	// Epsilon: a normalization with an epsilon attribute.
	Epsilon bool
	// HalfWeights: under model.half() the op computes in fp16 whatever
	// an fp32 trace feeds it beside its fp16 data. PyTorch's op refuses
	// an input of another dtype than its scale and bias (F.layer_norm:
	// "expected scalar type Float but found Half"), or the model casts
	// what the op reads to its data's dtype (RoPE's cos and sin, which
	// ONNX's RotaryEmbedding takes in its input's type and Hugging
	// Face's rotary embedding returns .to(x.dtype), a cast an fp32 trace
	// drops). (Matmuls and convolutions refuse mixed dtypes too;
	// autocast's lower-precision list already names them.)
	HalfWeights bool
	// HalfFP32: fastai's model.half() keeps its layers in fp32
	// (BatchNorm), so under the half policy it computes in fp32.
	HalfFP32 bool
	// BiasInput, when not 0, is the input slot of the layer's bias
	// (Conv's, Gemm's C): where the dynamo exporter folds a following
	// BatchNorm's shift.
	BiasInput int
	// Chooses, when not nil, makes the op a data-dependent selection: the
	// input slots whose values it ranks (TopK's scores, NMS's boxes and
	// scores); every output is chosen (onnx.FindSelections).
	Chooses []int
	// GathersAt, when not 0, is the first input slot that says where the
	// op reads its data (input 0): Gather's indices, Slice's starts.
	// With chosen values there, its data is ranked and its outputs
	// chosen.
	GathersAt int
	// Fill names the PyTorch call that exports as this op when it writes
	// a constant into a tensor (masked_fill as Where, index_put_ as
	// ScatterND, torch.full as ConstantOfShape); PyTorch raises when the
	// constant is beyond the tensor's dtype. FillInputs are the slots
	// holding the written value; nil: any (an attribute).
	Fill       string
	FillInputs []int
	// NonFinite is what its ONNX Runtime kernel does with NaN and ±Inf
	// beside PyTorch's op (see NonFinite).
	NonFinite NonFinite
	// Holds is what its outputs are when they are not tensors (see
	// Holds); every other output is a tensor.
	Holds Holds
}

// Is reports whether o has every role in r; a nil o (an op without an
// entry) has none.
func (o *Op) Is(r Role) bool { return o != nil && o.Role&r == r }

// table holds every entry: the ONNX standard's (ai.onnx up to opset 24,
// deprecated ops included because old exports still use them; ai.onnx.ml,
// none of which exists in PyTorch, so they all follow their inputs),
// then the contrib ops exporters write. A fact an entry leaves out is
// the zero value: on no autocast list, every input promotes, no shape
// rule, no gradient rule, no role.
var table = slices.Concat(mathOps, logicOps, activationOps, nnOps, shapeOps, reduceOps, selectionOps,
	opset23Ops, controlOps, randomOps, quantOps, signalOps, mlOps, contribOps)

// byName holds the entries of each op type, one per domain.
var byName = map[string][]*Op{}

func init() {
	for i := range table {
		o := &table[i]
		byName[o.Name] = append(byName[o.Name], o)
	}
}

// Lookup returns the entry of op type opType in domain ("" or "ai.onnx"
// is the default domain), nil when fp16audit has none.
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

// All returns every entry, family by family.
func All() []Op { return append([]Op(nil), table...) }

// Random reports whether an op draws random numbers (its entry's Random).
func Random(domain, opType string) bool {
	o := Lookup(domain, opType)
	return o != nil && o.Random
}

// Epsilon reports whether an op is a normalization with an epsilon
// attribute (its entry's Epsilon).
func Epsilon(domain, opType string) bool {
	o := Lookup(domain, opType)
	return o != nil && o.Epsilon
}
