package precision

import (
	"encoding/binary"
	"math"
	"slices"

	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
)

// Assignment is the precision of every value and node of a graph under a
// policy: the emulation rounds a value to fp16 or bf16 exactly where the
// assignment holds it there.
type Assignment struct {
	// Value holds the precision of every value the graph defines: graph
	// inputs, initializers and the outputs of the nodes in the order.
	// Integer, boolean and string values are NotFloat, which is also what a
	// lookup of a missing name returns.
	Value map[string]Precision
	// Node holds, per node index, the precision the node computes in:
	// NotFloat for nodes without float outputs and for nodes not in the
	// order.
	Node []Precision
	// CastInputs holds, per node index and input slot, whether the op casts
	// that input to the node's precision before it computes. It is set for
	// every float input of a lower-precision op that is not already in the
	// lower precision (autocast casts parameters, and an input above 65504
	// is Inf before the op runs), for every 16-bit input of an fp32 op, for
	// the narrower tensor inputs of promoting ops, and for a Linear bias
	// added in the lower precision. It is never set for 0-dim inputs of
	// promoting ops: kernels hold scalars at their compute precision.
	CastInputs [][]bool
	// Unknown lists, in processing order, the nodes whose op is not a
	// standard ONNX op (custom domains, onnxruntime contrib ops, unknown op
	// types). They were assumed to follow their inputs.
	Unknown []int
	// Why holds the provenance of every value held in FP16 or BF16: why it
	// is there (see Reason). Casts lists, for such a value, the model's own
	// half casts (node indices, ascending) its precision comes from.
	Why   map[string]Reason
	Casts map[string][]int
}

// Reason is a set of reasons a value is held in reduced precision.
type Reason uint8

// Reasons. A value inherits the reasons of the inputs whose precision it
// takes; an op on autocast's lower-precision list starts afresh.
const (
	// ReasonAutocast: an op autocast runs in the lower precision (Conv,
	// MatMul, Linear...) made the value, or an input it inherits from.
	ReasonAutocast Reason = 1 << iota
	// ReasonHalfPolicy: the half policy holds the graph's inputs and
	// parameters in fp16 (model.half()).
	ReasonHalfPolicy
	// ReasonCast: the model's own Cast or CastLike to half, or a factory
	// told dtype=float16, made the value or an input it inherits from.
	ReasonCast
	// ReasonHalfModel: the model stores the value's source in half: fp16
	// weights or inputs, as an export after model.half() has.
	ReasonHalfModel
)

// Explicit reports whether one of the reasons the value is in reduced
// precision is the model's own half cast, upstream or at the value itself,
// whatever else holds it there (autocast's fp16 op before the cast, the
// half policy): whether that cast is to blame is for the run without mixed
// precision to say (the as-written pass).
func (a *Assignment) Explicit(name string) bool {
	return a.Why[name]&ReasonCast != 0
}

// Names returns the reasons as the report writes them.
func (r Reason) Names() []string {
	var out []string
	for _, x := range []struct {
		r    Reason
		name string
	}{{ReasonAutocast, "autocast"}, {ReasonHalfPolicy, "half-policy"}, {ReasonCast, "explicit-cast"}, {ReasonHalfModel, "fp16-model"}} {
		if r&x.r != 0 {
			out = append(out, x.name)
		}
	}
	return out
}

// Assign runs the policy over g in the given topological order (node
// indices; nil means the node order of g, which ONNX requires to be
// topological) and returns the precision of every value and node.
// elemType reports the ONNX element type of a value (0 when unknown, for
// example without shape inference); nil means unknown everywhere, and
// Assign then infers which node outputs are float from the ops.
//
// The rules, which emulate PyTorch eager mode on the model the graph was
// exported from:
//
//   - Graph inputs, initializers and Constant outputs are sources. A float
//     source is held at the policy's Params precision (fp32; fp16 under half,
//     where the user calls model.half() and x.half()), except that an
//     initializer or Constant typed FLOAT16 or BFLOAT16 in the graph keeps
//     that type under every policy (user code made it half), and under half
//     an initializer used only as BatchNormalization scale, bias, mean or
//     variance stays fp32 (fastai keeps BatchNorm layers in fp32). In a
//     model stored in half (Storage) the stored type counts as FLOAT here
//     and in the two rules below: it is the checkpoint's own dtype.
//   - Cast to FLOAT16 yields fp16, to BFLOAT16 bf16, to FLOAT or DOUBLE
//     fp32, to any other type NotFloat, under every policy: an explicit cast
//     is user code that autocast cannot override. A Cast to the type the
//     model is stored in yields the policy's Params precision. CastLike
//     yields the precision of its second input. One Cast to FLOAT is not
//     user code: the exporter's promotion of a 16-bit operand that meets a
//     float32 one (r.half() + proj(r), traced without autocast) follows its
//     input, and its reader promotes by the policy's types (see
//     promotionCast).
//   - A node without float outputs (Shape, Equal, ArgMax, ...) computes in
//     NotFloat. A node with float outputs but no float inputs
//     (ConstantOfShape, RandomNormal, Range over ints, windows) produces fp32
//     unless a dtype attribute says FLOAT16 or BFLOAT16, as torch factories
//     use the default dtype; If, Loop, Scan and SequenceMap without float
//     inputs produce the Params precision, since their bodies are not
//     visited.
//   - LowerPrecision ops (Conv, MatMul, Gemm, ...) compute in the policy's
//     lower precision and cast all float inputs to it.
//   - AlwaysFP32 ops (Softmax, Exp, LayerNormalization, ...) compute in fp32
//     and cast 16-bit inputs up. Under autocast, rsqrt counts as one of them:
//     the exporter writes torch.rsqrt(x) as Div(1, Sqrt(x)), so that Div and
//     a Sqrt whose only consumers are such Divs or Reciprocal are fp32.
//   - Promote and FollowInputs ops compute in the widest float input type
//     (PyTorch type promotion: fp32 beats fp16 and bf16, fp16 with bf16 is
//     fp32), with PyTorch's scalar rule: a 0-dim input (a Python scalar in
//     the model, exported as a 0-dim Constant or initializer, or a value
//     declared rank 0 in the graph) takes part only when no input has
//     dimensions. So x*0.5, gelu's x/1.4142 and masked_fill(mask, -1e9) stay
//     in the type of x. Only the data inputs count: the roi and scales of
//     Resize/Upsample, the ratio of Dropout and the scale and bias of the
//     normalization ops do not promote.
//   - An Add or Sub of a 1-D constant to the output of MatMul, Gemm, Conv
//     or ConvTranspose that has no other consumer is the exporter's split
//     of a Linear layer's bias, which PyTorch adds inside the fp16 linear:
//     it computes in the precision of the MatMul and casts the bias to it.
//   - BatchNormalization and InstanceNormalization output their X input's
//     precision (cudnn returns the input type); BatchNormalization computes
//     in fp32 under half and in X's precision otherwise, and never casts its
//     parameters. A training BatchNormalization's running-statistics
//     outputs are fp32, as PyTorch's buffers are.
//   - Every other op, and every op outside the standard domains, follows its
//     inputs; nodes with subgraphs are not descended into.
//   - A sequence or an optional (onnx.Kinds) is held in the precision of
//     the tensors it holds, as its maker follows its inputs, and is never
//     cast: SequenceAt hands on what SplitToSequence put in.
func Assign(p *Policy, g *onnx.GraphProto, order []int, elemType func(name string) int32) *Assignment {
	return AssignKeepFP32(p, g, order, elemType, nil)
}

// AssignKeepFP32 is Assign with the nodes in keep computing in fp32 and
// producing fp32, as when the user wraps their modules in
// torch.autocast(device_type="cuda", enabled=False) and feeds them
// x.float(). Nodes after them follow the usual rules, so a follow-inputs op
// fed by a kept node becomes fp32 too. A kept Cast to half stands for
// removing that cast from the model: its output keeps its input's
// precision (a cast right after an op autocast runs in fp16 removed still
// leaves the value in fp16). The fix search uses it to verify which
// modules must stay in fp32.
func AssignKeepFP32(p *Policy, g *onnx.GraphProto, order []int, elemType func(name string) int32, keep map[int]bool) *Assignment {
	s := newAssigner(p, g, elemType)
	s.keep = keep
	if order == nil {
		order = make([]int, len(g.Node))
		for i := range order {
			order[i] = i
		}
	}
	for _, i := range order {
		s.node(i)
	}
	// A sequence or an optional holds its tensors in the precision they
	// were made in, and no op casts a container: it is never rounded
	// itself (the tensors taken out of it follow it, as chunk's pieces of
	// an fp16 tensor are fp16 views).
	for name := range onnx.Kinds(g, order) {
		for _, u := range s.consumers[name] {
			s.a.CastInputs[u.node][u.slot] = false
		}
	}
	return s.a
}

// use is one consumption of a value: input slot of node.
type use struct{ node, slot int }

type assigner struct {
	p        *Policy
	g        *onnx.GraphProto
	elemType func(string) int32
	a        *Assignment

	consts    map[string]*onnx.TensorProto // initializers and Constant outputs
	producer  map[string]int
	consumers map[string][]use
	rank0     map[string]bool // values whose declared shape has no dims
	keep      map[int]bool    // nodes forced to fp32 (AssignKeepFP32)
	// upcasts maps the nodes of the normalization modules that compute
	// in float32 under model.half() to their module (upcastNorms).
	upcasts map[int]string
	// storage is the half type the model is stored in (Storage), 0 for
	// fp32: values of that type follow the policy's Params.
	storage int32
	// fromShape marks values computed from tensor shapes and constants
	// alone (Shape → Gather → Cast → Pow): Python numbers in eager
	// PyTorch, where x.shape[-1] ** -0.5 is a float, not a tensor.
	fromShape map[string]bool
}

func newAssigner(p *Policy, g *onnx.GraphProto, elemType func(string) int32) *assigner {
	s := &assigner{
		p: p, g: g, elemType: elemType,
		a: &Assignment{
			Value:      make(map[string]Precision),
			Node:       make([]Precision, len(g.Node)),
			CastInputs: make([][]bool, len(g.Node)),
			Why:        make(map[string]Reason),
			Casts:      make(map[string][]int),
		},
		consts:    make(map[string]*onnx.TensorProto),
		producer:  make(map[string]int),
		consumers: make(map[string][]use),
		rank0:     make(map[string]bool),
		fromShape: make(map[string]bool),
		storage:   Storage(g),
	}
	if p.kind == kindHalf {
		s.upcasts = upcastNorms(g)
	}
	for i, n := range g.Node {
		s.a.CastInputs[i] = make([]bool, len(n.Input))
		for j, in := range n.Input {
			if in != "" {
				s.consumers[in] = append(s.consumers[in], use{i, j})
			}
		}
		for _, out := range n.Output {
			if out != "" {
				s.producer[out] = i
			}
		}
		if onnx.IsStandardDomain(n.Domain) && n.OpType == "Constant" && len(n.Output) == 1 {
			if t := constantTensor(n); t != nil {
				s.consts[n.Output[0]] = t
			}
		}
	}
	for _, vis := range [][]*onnx.ValueInfoProto{g.Input, g.Output, g.ValueInfo} {
		for _, vi := range vis {
			if sh := vi.GetType().GetTensorType().GetShape(); sh != nil && len(sh.GetDim()) == 0 {
				s.rank0[vi.GetName()] = true
			}
		}
	}
	for _, t := range g.Initializer {
		s.consts[t.Name] = t
	}
	for _, vi := range g.Input {
		if _, isInit := s.consts[vi.GetName()]; isInit {
			continue // IR < 4 lists initializers as inputs too
		}
		t := vi.GetType().GetTensorType().GetElemType()
		if t == 0 && elemType != nil {
			t = elemType(vi.GetName())
		}
		s.setSource(vi.GetName(), t)
	}
	for _, t := range g.Initializer {
		s.setSource(t.Name, t.DataType)
	}
	return s
}

// setSource records the precision of a graph input or initializer and,
// when it is reduced, why.
func (s *assigner) setSource(name string, elemType int32) {
	s.a.Value[name] = s.source(elemType, name)
	if w := s.sourceWhy(elemType, name); w != 0 {
		s.a.Why[name] = w
	}
}

// sourceWhy is the provenance of a source held in reduced precision: the
// model's own half data, or the half policy.
func (s *assigner) sourceWhy(elemType int32, name string) Reason {
	switch pr := s.source(elemType, name); {
	case pr != FP16 && pr != BF16:
		return 0
	case PrecisionOf(s.unstored(elemType)) == pr:
		return ReasonHalfModel
	}
	return ReasonHalfPolicy
}

// why returns the provenance of a consumed value (see prec).
func (s *assigner) why(name string) (Reason, []int) {
	if _, ok := s.a.Value[name]; ok {
		return s.a.Why[name], s.a.Casts[name]
	}
	if s.elemType != nil {
		if t := s.elemType(name); t != 0 {
			return s.sourceWhy(t, name), nil
		}
	}
	return 0, nil
}

// source returns the precision of a graph input, initializer or Constant
// output of the given element type.
//
// Under half, a float32 tensor of a model stored in half is one the
// checkpoint keeps in fp32 as it runs: transformers loads the modules a
// class lists in _keep_in_fp32_modules in float32 when from_pretrained
// is given dtype=torch.float16 (T5's wo), and models compute their RoPE
// frequencies from float32 buffers. The export of such a model holds the
// dtypes of its eager run, so the tensor stays fp32, and the ops that read
// only fp32 follow it (T5 casts wo's input to wo's dtype).
func (s *assigner) source(elemType int32, name string) Precision {
	if s.p.kind == kindHalf && s.storage != 0 && elemType == int32(onnx.TensorProto_FLOAT) {
		return FP32
	}
	pr := PrecisionOf(s.unstored(elemType))
	if pr != FP32 {
		return pr
	}
	if s.p.kind == kindHalf && s.onlyBatchNormParam(name) {
		return FP32
	}
	return s.p.Params
}

// unstored maps the type the model is stored in to FLOAT: a stored half
// tensor is the checkpoint's parameter, held as the policy holds
// parameters (see Storage).
func (s *assigner) unstored(elemType int32) int32 {
	if s.storage != 0 && elemType == s.storage {
		return int32(onnx.TensorProto_FLOAT)
	}
	return elemType
}

func (s *assigner) onlyBatchNormParam(name string) bool {
	uses := s.consumers[name]
	for _, u := range uses {
		n := s.g.Node[u.node]
		if !onnx.IsStandardDomain(n.Domain) || n.OpType != "BatchNormalization" || u.slot == 0 {
			return false
		}
	}
	return len(uses) > 0
}

// promotionCast reports whether Cast node i (to FLOAT) is the exporter's
// type promotion rather than the model's own .float(): its input is 16-bit
// in the traced graph, and every reader is a promoting op
// (ops.TypePromotes) that also reads a float32 tensor. PyTorch promoted there because the other operand was
// float32 when the model was traced (autocast off); under a policy that
// holds that operand in 16 bits too, the eager op runs in 16 bits, so the
// cast follows its input and the reader promotes by the policy's types.
// (The graph cannot tell this from a hand-written x.float() + y; the
// exporter's promotion is the common case.)
func (s *assigner) promotionCast(i int) bool {
	n := s.g.Node[i]
	if s.elemType == nil || len(n.Input) == 0 || len(n.Output) != 1 || n.Input[0] == "" {
		return false
	}
	// In a model stored in half the 16-bit values are the checkpoint's own
	// dtype, and a cast to FLOAT is the model's upcast.
	if t := s.elemType(n.Input[0]); t != int32(onnx.TensorProto_FLOAT16) && t != int32(onnx.TensorProto_BFLOAT16) || t == s.storage {
		return false
	}
	out := n.Output[0]
	for _, o := range s.g.Output {
		if o.GetName() == out {
			return false
		}
	}
	uses := s.consumers[out]
	for _, u := range uses {
		c := s.g.Node[u.node]
		if !onnx.IsDefaultDomain(c.Domain) || !ops.Lookup(ops.Default, c.OpType).Is(ops.TypePromotes) {
			return false
		}
		fp32 := false
		for j, in := range c.Input {
			if j != u.slot && in != "" && in != out && s.elemType(in) == int32(onnx.TensorProto_FLOAT) && !s.zeroDim(in) && !s.fromHalf(in) {
				fp32 = true
			}
		}
		if !fp32 {
			return false
		}
	}
	return len(uses) > 0
}

// fromHalf reports whether value name is a Cast to FLOAT of a 16-bit
// value. Such an operand was 16-bit in the traced model too, so it is not
// the float32 tensor that made PyTorch promote: x.half().float() +
// y.half().float() is the model's own pair of upcasts, computed in fp32.
func (s *assigner) fromHalf(name string) bool {
	i, ok := s.producer[name]
	if !ok {
		return false
	}
	n := s.g.Node[i]
	if !onnx.IsDefaultDomain(n.Domain) || n.OpType != "Cast" || len(n.Input) == 0 || n.Input[0] == "" {
		return false
	}
	return onnx.IsHalfType(s.elemType(n.Input[0]))
}

// prec returns the precision of a value consumed by a node. A value no node
// in the order produced (an outer-scope value, or an order that is not
// topological) counts as a source when elemType knows it.
func (s *assigner) prec(name string) Precision {
	if v, ok := s.a.Value[name]; ok {
		return v
	}
	if s.elemType != nil {
		if t := s.elemType(name); t != 0 {
			return s.source(t, name)
		}
	}
	return NotFloat
}

// zeroDim reports whether a value takes part in type promotion as a
// scalar: a 0-dim constant or declared value, or a number computed from
// shapes (a Python scalar in the eager model).
func (s *assigner) zeroDim(name string) bool {
	if t := s.consts[name]; t != nil {
		return len(t.Dims) == 0
	}
	return s.rank0[name] || s.fromShape[name]
}

// markShape records whether node i's outputs are computed from shapes and
// constants alone: Shape and Size, data movement whose data input is such
// a value (Gather of a shape, Cast, Unsqueeze...: ops.ShapeMove), and
// arithmetic whose every operand is such a value or a one-element
// constant (ops.ShapeArith). A Slice of a weight with bounds from a shape
// is a tensor, not a number; tensor factories such as ConstantOfShape,
// Expand and Range make tensors of those sizes.
func (s *assigner) markShape(i int) {
	n := s.g.Node[i]
	if !onnx.IsDefaultDomain(n.Domain) {
		return
	}
	from := n.OpType == "Shape" || n.OpType == "Size"
	switch {
	case from:
	case ops.Lookup(ops.Default, n.OpType).Is(ops.ShapeMove):
		from = len(n.Input) > 0 && s.fromShape[n.Input[0]]
	case ops.Lookup(ops.Default, n.OpType).Is(ops.ShapeArith):
		for _, in := range n.Input {
			switch t := s.consts[in]; {
			case in == "":
			case s.fromShape[in]:
				from = true
			case t != nil && tensorLen(t) <= 1:
			default:
				return
			}
		}
	}
	if from {
		for _, o := range n.Output {
			if o != "" {
				s.fromShape[o] = true
			}
		}
	}
}

func tensorLen(t *onnx.TensorProto) int64 {
	n := int64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

func (s *assigner) node(i int) {
	s.markShape(i)
	s.assignNode(i)
	if _, ok := s.upcasts[i]; ok {
		s.upcast(i)
	}
	if !s.keep[i] {
		return
	}
	if n := s.g.Node[i]; n.OpType == "Cast" && len(n.Input) > 0 && onnx.IsHalfType(int32(onnx.FindAttr(n, "to").GetI())) {
		// A removed cast to half passes its input on as it is: a value
		// autocast (or the policy) holds in 16 bits stays there.
		pr := s.prec(n.Input[0])
		if pr == NotFloat {
			pr = FP32
		}
		s.a.Node[i] = pr
		for _, name := range n.Output {
			if name == "" {
				continue
			}
			s.a.Value[name] = pr
			delete(s.a.Why, name)
			delete(s.a.Casts, name)
			if pr == FP16 || pr == BF16 {
				if w, casts := s.why(n.Input[0]); w != 0 {
					s.a.Why[name] = w
					if len(casts) > 0 {
						s.a.Casts[name] = casts
					}
				}
			}
		}
		return
	}
	s.computeFP32(i)
}

// computeFP32 makes node i compute in fp32 and produce fp32 where it was
// held in 16 bits, reading its inputs as they are (an fp16 value is exact
// in fp32).
func (s *assigner) computeFP32(i int) {
	if pr := s.a.Node[i]; pr == FP16 || pr == BF16 {
		s.a.Node[i] = FP32
	}
	for _, name := range s.g.Node[i].Output {
		if pr := s.a.Value[name]; pr == FP16 || pr == BF16 {
			s.a.Value[name] = FP32
			delete(s.a.Why, name)
			delete(s.a.Casts, name)
		}
	}
	for j := range s.a.CastInputs[i] {
		s.a.CastInputs[i][j] = false
	}
}

func (s *assigner) assignNode(i int) {
	n := s.g.Node[i]
	cast := s.a.CastInputs[i]
	cat, known := s.p.Category(n.Domain, n.OpType)
	if !known {
		s.a.Unknown = append(s.a.Unknown, i)
	}
	std := known && onnx.IsStandardDomain(n.Domain)

	if std {
		switch n.OpType {
		case "Constant":
			pr := NotFloat
			var w Reason
			if t := s.consts[first(n.Output)]; t != nil {
				pr, w = s.source(t.DataType, first(n.Output)), s.sourceWhy(t.DataType, first(n.Output))
			}
			s.finish(i, pr, pr, nil)
			s.provenance(i, w, nil)
			return
		case "Cast", "CastLike":
			to := int32(onnx.FindAttr(n, "to").GetI())
			pr := PrecisionOf(to)
			// A cast to the type the model is stored in is the export's
			// record of x.to(self.weight.dtype): the policy's Params.
			stored := n.OpType == "Cast" && s.storage != 0 && to == s.storage
			if stored {
				pr = s.p.Params
			}
			if n.OpType == "CastLike" {
				pr = NotFloat
				if len(n.Input) > 1 {
					pr = s.prec(n.Input[1])
				}
			}
			if n.OpType == "Cast" && !stored && to == int32(onnx.TensorProto_FLOAT) && s.promotionCast(i) {
				pr = s.prec(n.Input[0])
			}
			s.finish(i, pr, pr, nil)
			// A cast to the precision its input already has changes
			// nothing under the policy, but it is still the model's own
			// cast: without mixed precision the value would be half
			// because of it. The value keeps its input's reasons and
			// gains this one.
			switch {
			case len(n.Input) > 0 && s.prec(n.Input[0]) == pr:
				w, casts := s.why(n.Input[0])
				if !stored && onnx.IsHalfType(to) {
					w, casts = w|ReasonCast, mergeSorted(casts, []int{i})
				}
				s.provenance(i, w, casts)
			case stored:
				s.provenance(i, ReasonHalfPolicy, nil)
			default:
				s.provenance(i, ReasonCast, []int{i})
			}
			return
		}
	}

	floatOut := make([]bool, len(n.Output))
	anyFloatOut := false
	for k := range n.Output {
		floatOut[k] = s.outputIsFloat(n, k, std)
		anyFloatOut = anyFloatOut || floatOut[k]
	}
	if !anyFloatOut {
		s.finish(i, NotFloat, NotFloat, nil)
		return
	}
	var floatIn []int
	for j, in := range n.Input {
		if in != "" && s.prec(in) != NotFloat {
			floatIn = append(floatIn, j)
		}
	}
	castAll := func(np Precision) {
		for _, j := range floatIn {
			cast[j] = s.prec(n.Input[j]) != np
		}
	}

	autocast := s.p.kind == kindAutocast
	var np, out Precision
	// from lists the inputs whose provenance the outputs inherit; own is a
	// reason the node itself adds.
	var from []int
	var own Reason
	var ownCasts []int
	switch {
	case len(floatIn) == 0:
		np = s.generated(n)
		out = np
		if t, ok := explicitDType(n); ok && t != s.storage && PrecisionOf(t) == out {
			own, ownCasts = ReasonCast, []int{i}
		} else if out == FP16 || out == BF16 {
			own = ReasonHalfPolicy
		}
	case std && (n.OpType == "BatchNormalization" || n.OpType == "InstanceNormalization"):
		out = s.prec(n.Input[0])
		np = out
		if cat == AlwaysFP32 {
			np = FP32
		}
		cast[0] = out != np
		from = []int{0}
	case std && autocast && (s.isRsqrtDiv(n) || s.isRsqrtSqrt(n)):
		np, out = FP32, FP32
		castAll(np)
	case std && s.linearBias(n) >= 0:
		mm := s.linearBias(n)
		np = s.prec(n.Input[mm])
		out = np
		cast[1-mm] = s.prec(n.Input[1-mm]) != np
		from = []int{mm}
	case cat == LowerPrecision:
		np, out = s.p.Lower, s.p.Lower
		castAll(np)
		own = ReasonAutocast
		own, ownCasts = s.halfAsWritten(n, floatIn, np, own)
	case std && s.p.kind == kindHalf && (IsLowerPrecisionOp(n.Domain, n.OpType) || halfWeights(n)) && s.anyIn(floatIn, n, FP16):
		// PyTorch refuses a matmul, convolution or nn.LayerNorm of mixed
		// dtypes, so under model.half() the model itself must hand its
		// fp16 weights fp16 activations, even where an fp32 trace shows
		// fp32 ones (T5's "if self.weight.dtype == torch.float16: h =
		// h.to(self.weight.dtype)" vanishes from a graph exported in
		// fp32; an fp32 value kept by the keep-fp32 fix is cast down
		// before the next such layer).
		np, out = FP16, FP16
		castAll(np)
		own, ownCasts = s.halfAsWritten(n, floatIn, np, ReasonHalfPolicy)
	case cat == AlwaysFP32:
		np, out = FP32, FP32
		castAll(np)
	default:
		data := floatIn
		if k := dataInputs(n.OpType); k > 0 && std {
			data = nil
			for _, j := range floatIn {
				if j < k {
					data = append(data, j)
				}
			}
		}
		np = s.promote(n, data)
		out = np
		for _, j := range data {
			cast[j] = !s.zeroDim(n.Input[j]) && s.prec(n.Input[j]) != np
			if s.prec(n.Input[j]) == out {
				from = append(from, j)
			}
		}
	}
	s.finish(i, np, out, floatOut)
	if std && n.OpType == "BatchNormalization" {
		// The outputs after Y are the updated running statistics (and,
		// before opset 14, the batch's saved statistics) of a training
		// step: PyTorch keeps them in fp32 buffers whatever Y's type.
		for _, name := range n.Output[1:] {
			if name != "" && s.a.Value[name] != NotFloat {
				s.a.Value[name] = FP32
			}
		}
	}
	w, casts := own, ownCasts
	for _, j := range from {
		iw, ic := s.why(n.Input[j])
		w |= iw
		casts = mergeSorted(casts, ic)
	}
	s.provenance(i, w, casts)
}

// halfAsWritten adds the model's own casts to the reasons own of an op
// that computes in np whatever its inputs (autocast's lower-precision ops,
// a weighted op under half) when every float tensor input is in np for a
// reason that holds without mixed precision too (the model's cast, half
// weights it stores): then the op computes in np without mixed precision
// as well (q.half() @ k.half().transpose(1, 2), F.linear(h.half(),
// w.half())), and it is for the as-written pass to say whether the casts
// are to blame. An op with an fp32 operand there would not run as written
// (PyTorch refuses mixed dtypes), so it gains nothing.
func (s *assigner) halfAsWritten(n *onnx.NodeProto, floatIn []int, np Precision, own Reason) (Reason, []int) {
	var casts []int
	w := Reason(0)
	for _, j := range floatIn {
		in := n.Input[j]
		if s.zeroDim(in) {
			continue
		}
		iw, ic := s.why(in)
		if s.prec(in) != np || iw&(ReasonCast|ReasonHalfModel) == 0 {
			return own, nil
		}
		w |= iw & ReasonCast
		casts = mergeSorted(casts, ic)
	}
	if w == 0 {
		return own, nil
	}
	return own | w, casts
}

// halfWeights reports whether n's op computes in its weights' dtype
// whatever it is fed (ops.Op.HalfWeights: nn.LayerNorm and its kin, RoPE).
func halfWeights(n *onnx.NodeProto) bool {
	o := ops.Lookup(n.Domain, n.OpType)
	return o != nil && o.HalfWeights
}

// anyIn reports whether one of the float input slots of n holds p.
func (s *assigner) anyIn(slots []int, n *onnx.NodeProto, p Precision) bool {
	for _, j := range slots {
		if s.prec(n.Input[j]) == p {
			return true
		}
	}
	return false
}

// provenance records why node i's outputs held in reduced precision are
// there.
func (s *assigner) provenance(i int, w Reason, casts []int) {
	for _, name := range s.g.Node[i].Output {
		if pr := s.a.Value[name]; name == "" || (pr != FP16 && pr != BF16) {
			continue
		}
		if w != 0 {
			s.a.Why[name] = w
		}
		if len(casts) > 0 {
			s.a.Casts[name] = casts
		}
	}
}

// mergeSorted returns the union of two ascending lists of node indices.
func mergeSorted(a, b []int) []int {
	if len(b) == 0 {
		return a
	}
	if len(a) == 0 {
		return b
	}
	out := make([]int, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i] < b[j]):
			out = append(out, a[i])
			i++
		case i == len(a) || b[j] < a[i]:
			out = append(out, b[j])
			j++
		default:
			out = append(out, a[i])
			i, j = i+1, j+1
		}
	}
	return out
}

// finish records a node's precision and its outputs' precisions: out for
// the outputs floatOut marks (all outputs when floatOut is nil), NotFloat
// for the others.
func (s *assigner) finish(i int, np, out Precision, floatOut []bool) {
	s.a.Node[i] = np
	for k, name := range s.g.Node[i].Output {
		if name == "" {
			continue
		}
		if floatOut == nil || floatOut[k] {
			s.a.Value[name] = out
		} else {
			s.a.Value[name] = NotFloat
		}
	}
}

// promote is PyTorch type promotion over the given input slots with the
// scalar rule: 0-dim inputs count only when no input has dimensions.
func (s *assigner) promote(n *onnx.NodeProto, slots []int) Precision {
	tensors, scalars := NotFloat, NotFloat
	for _, j := range slots {
		pr := s.prec(n.Input[j])
		if s.zeroDim(n.Input[j]) {
			scalars = widest(scalars, pr)
		} else {
			tensors = widest(tensors, pr)
		}
	}
	if tensors != NotFloat {
		return tensors
	}
	if scalars != NotFloat {
		return scalars
	}
	// No data input is float: only parameter inputs are (unusual).
	all := NotFloat
	for _, in := range n.Input {
		if in != "" {
			all = widest(all, s.prec(in))
		}
	}
	return all
}

// generated returns the precision of a node that makes floats without float
// inputs.
func (s *assigner) generated(n *onnx.NodeProto) Precision {
	if t, ok := explicitDType(n); ok {
		if s.storage != 0 && t == s.storage {
			return s.p.Params
		}
		if pr := PrecisionOf(t); pr == FP16 || pr == BF16 {
			return pr
		}
	}
	if o := ops.Lookup(n.Domain, n.OpType); o != nil && o.Subgraphs {
		return s.p.Params
	}
	return FP32
}

// outputIsFloat reports whether output k of n holds floats: from elemType
// when it knows, else from the op.
func (s *assigner) outputIsFloat(n *onnx.NodeProto, k int, std bool) bool {
	name := n.Output[k]
	if name == "" {
		return false
	}
	if s.elemType != nil {
		if t := s.elemType(name); t != 0 {
			return PrecisionOf(t) != NotFloat
		}
	}
	if std {
		if o := ops.Lookup(n.Domain, n.OpType); o != nil && (o.NonFloat || slices.Contains(o.IndexOutputs, k)) {
			return false
		}
		if t, ok := explicitDType(n); ok {
			return PrecisionOf(t) != NotFloat
		}
		if o := ops.Lookup(n.Domain, n.OpType); o != nil && o.FloatFactory {
			return true
		}
	}
	for _, in := range n.Input {
		if in != "" && s.prec(in) != NotFloat {
			return true
		}
	}
	return false
}

// linearBias returns the input slot of a MatMul-like output when n is the
// exporter's split of a Linear bias (see Assign), else -1.
func (s *assigner) linearBias(n *onnx.NodeProto) int {
	if (n.OpType != "Add" && n.OpType != "Sub") || len(n.Input) != 2 {
		return -1
	}
	for j := range 2 {
		mm, bias := n.Input[j], n.Input[1-j]
		pi, ok := s.producer[mm]
		if !ok {
			continue
		}
		p := s.g.Node[pi]
		if !onnx.IsStandardDomain(p.Domain) || !ops.Lookup(ops.Default, p.OpType).Is(ops.Linear) || len(s.consumers[mm]) != 1 {
			continue
		}
		if t := s.consts[bias]; t != nil && len(t.Dims) == 1 {
			return j
		}
	}
	return -1
}

// isRsqrtDiv reports whether n is the exporter's torch.rsqrt:
// Div(ones(1), Sqrt(x)).
func (s *assigner) isRsqrtDiv(n *onnx.NodeProto) bool {
	if !onnx.IsStandardDomain(n.Domain) || n.OpType != "Div" || len(n.Input) != 2 {
		return false
	}
	if t := s.consts[n.Input[0]]; t == nil || !isOne(t) {
		return false
	}
	pi, ok := s.producer[n.Input[1]]
	return ok && onnx.IsStandardDomain(s.g.Node[pi].Domain) && s.g.Node[pi].OpType == "Sqrt"
}

// isRsqrtSqrt reports whether n is a Sqrt that only feeds rsqrt Divs and
// Reciprocals, so that PyTorch computed it inside an fp32 rsqrt.
func (s *assigner) isRsqrtSqrt(n *onnx.NodeProto) bool {
	if n.OpType != "Sqrt" || len(n.Output) != 1 {
		return false
	}
	uses := s.consumers[n.Output[0]]
	for _, u := range uses {
		c := s.g.Node[u.node]
		rsqrt := u.slot == 1 && s.isRsqrtDiv(c)
		recip := onnx.IsStandardDomain(c.Domain) && c.OpType == "Reciprocal"
		if !rsqrt && !recip {
			return false
		}
	}
	return len(uses) > 0
}

// DataSlot reports whether input slot j of an op of type opType takes part
// in type promotion: every input does, except the parameters after the
// leading data inputs of Resize, Upsample, Dropout and the normalization
// ops (roi and scales, the ratio, scale and bias), which keep their own
// type whatever the data's.
func DataSlot(opType string, j int) bool {
	k := dataInputs(opType)
	return k == 0 || j < k
}

// dataInputs is the entry's DataInputs of an op of the default domain: how
// many leading inputs take part in type promotion (0: all).
func dataInputs(opType string) int {
	if o := ops.Lookup(ops.Default, opType); o != nil {
		return o.DataInputs
	}
	return 0
}

// explicitDType returns the element type a factory-like op is told to
// produce by its attributes, if any: dtype, output_datatype, output_dtype,
// or the tensor type of ConstantOfShape's value.
func explicitDType(n *onnx.NodeProto) (int32, bool) {
	for _, a := range n.Attribute {
		switch a.Name {
		case "dtype", "output_datatype", "output_dtype":
			if a.I != 0 {
				return int32(a.I), true
			}
		case "value":
			if n.OpType == "ConstantOfShape" && a.T != nil {
				return a.T.DataType, true
			}
		}
	}
	return 0, false
}

func first(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return names[0]
}

// constantTensor returns the value of a Constant node as a tensor, whichever
// attribute holds it.
func constantTensor(n *onnx.NodeProto) *onnx.TensorProto {
	for _, a := range n.Attribute {
		switch a.Name {
		case "value":
			return a.T
		case "value_float":
			return &onnx.TensorProto{DataType: int32(onnx.TensorProto_FLOAT), FloatData: []float32{a.F}}
		case "value_floats":
			return &onnx.TensorProto{DataType: int32(onnx.TensorProto_FLOAT), Dims: []int64{int64(len(a.Floats))}, FloatData: a.Floats}
		case "value_int":
			return &onnx.TensorProto{DataType: int32(onnx.TensorProto_INT64), Int64Data: []int64{a.I}}
		case "value_ints":
			return &onnx.TensorProto{DataType: int32(onnx.TensorProto_INT64), Dims: []int64{int64(len(a.Ints))}, Int64Data: a.Ints}
		case "value_string":
			return &onnx.TensorProto{DataType: int32(onnx.TensorProto_STRING)}
		case "value_strings":
			return &onnx.TensorProto{DataType: int32(onnx.TensorProto_STRING), Dims: []int64{int64(len(a.Strings))}}
		}
	}
	return nil
}

// isOne reports whether t holds the single float value 1.
func isOne(t *onnx.TensorProto) bool {
	for _, d := range t.Dims {
		if d != 1 {
			return false
		}
	}
	switch onnx.TensorProto_DataType(t.DataType) {
	case onnx.TensorProto_FLOAT:
		if len(t.FloatData) == 1 {
			return t.FloatData[0] == 1
		}
		return len(t.RawData) == 4 && math.Float32frombits(binary.LittleEndian.Uint32(t.RawData)) == 1
	case onnx.TensorProto_DOUBLE:
		if len(t.DoubleData) == 1 {
			return t.DoubleData[0] == 1
		}
		return len(t.RawData) == 8 && math.Float64frombits(binary.LittleEndian.Uint64(t.RawData)) == 1
	case onnx.TensorProto_FLOAT16:
		if len(t.Int32Data) == 1 {
			return t.Int32Data[0] == 0x3C00
		}
		return len(t.RawData) == 2 && binary.LittleEndian.Uint16(t.RawData) == 0x3C00
	}
	return false
}
