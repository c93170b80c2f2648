// Package grad generates the backward pass of an ONNX model as an ONNX
// graph: it appends to the forward graph the nodes that compute a loss the
// way fastai does (mean reduction, on fp32 predictions), the seed gradient
// scale × dL/dpred, and the vector–Jacobian product of every op back to the
// parameters, and it exposes as graph outputs the gradient of every float
// activation and every float initializer. ONNX Runtime then runs forward and
// backward in one session.
//
// The generated graph is specialised to one set of input shapes: a probe
// (backward.Probe, next to the execution stage) runs the forward model once
// on a batch and records the shape of every value (and the contents of the
// small integer values that shape arithmetic computes), and the rules use those static shapes to sum broadcast
// gradients back, to undo slicing and padding, and to size the transposed
// convolutions. A batch of another shape needs a new probe and Build.
//
// Rules (vector–Jacobian products) exist for these default-domain ops, at
// opsets 13 and newer (the reductions' axes are read as an attribute or an
// input as the opset says):
//
//	arithmetic:  Add Sub Mul Div Pow Sum Max Min Neg Abs Exp Log Sqrt Reciprocal
//	             Sin Cos
//	activations: Relu LeakyRelu Elu Sigmoid Tanh Erf Gelu Softplus Softsign
//	             HardSigmoid HardSwish Clip (SiLU is Mul by Sigmoid)
//	linear:      Gemm MatMul Conv Attention
//	normalizing: Softmax LogSoftmax BatchNormalization LayerNormalization
//	             RMSNormalization RotaryEmbedding
//	reductions:  ReduceSum ReduceMean ReduceSumSquare ReduceL2 ReduceMax ReduceMin
//	pooling:     MaxPool AveragePool GlobalAveragePool GlobalMaxPool
//	shape:       Reshape Flatten Squeeze Unsqueeze Transpose Concat Split Slice
//	             Gather GatherElements GatherND Expand Tile Pad Where Trilu
//	pass-through: Identity Dropout Cast CastLike
//	sequences:   SplitToSequence SequenceAt
//
// Comparisons, index and shape queries, random generators and rounding ops
// (Floor, Ceil, Round, Sign) pass no gradient. Any other op is reported in
// Result.Unsupported by name; the gradient stops there and the rest of the
// graph is still differentiated. A sequence's gradient is carried in the
// layout of the tensor SplitToSequence cut it from (chunk and split in a
// dynamo export without its optimizer): no gradient of its own.
//
// For the fp16 backward audit, Rounding names the gradients autocast holds
// in half precision; each passes through Cast(FLOAT16)→Cast(FLOAT) (or
// BFLOAT16), as the forward emulation does for activations, and the
// unrounded value is exposed beside it, so a caller can see what rounding
// did to each value from one run. Mass reads where a gradient's norm lies
// by binary exponent (the in-session histogram backward.MassSession
// fetches) and says, for every loss scale, whether it overflows and how
// much of its norm rounding loses.
//
// The nodes themselves — the rules, the loss and the summaries — are
// emitted by package vjp; this package walks the graph and says where each
// gradient goes.
//
// Typical use: facts := backward.Probe(ctx, lib, model, file, batch, opts);
// res := Build(model, facts, Options{Loss: MSE, Rounding:
// AutocastRounding(graph, assignment)}); s := backward.NewSession(res,
// opts, nil); outs := s.Run(batch, target, 65536); then res.Grads maps
// each forward value to its gradient output.
package grad

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"fp16audit/internal/grad/vjp"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/rewrite"
	"fp16audit/internal/tensor"
)

// Loss is the loss applied to the prediction output, computed as fastai's
// flat losses compute it, with mean reduction (see vjp.Loss).
type Loss = vjp.Loss

// Supported losses.
const (
	CrossEntropy = vjp.CrossEntropy
	BCE          = vjp.BCE
	MSE          = vjp.MSE
	L1           = vjp.L1
	ModelOutput  = vjp.ModelOutput
)

// CrossEntropyOptions say how the cross-entropy loss reads its logits and
// targets: the class axis, the ignored target value, the language model's
// shift (see vjp.CrossEntropyOptions).
type CrossEntropyOptions = vjp.CrossEntropyOptions

// CrossEntropyLayout is how a built cross-entropy loss reads its logits
// and target (see vjp.CrossEntropyLayout).
type CrossEntropyLayout = vjp.CrossEntropyLayout

// DefaultIgnoreIndex is PyTorch's ignore_index, -100.
const DefaultIgnoreIndex = vjp.DefaultIgnoreIndex

// ErrTargetShape marks a target whose shape fits no reading of the loss's
// output: a caller can say how to choose one.
var ErrTargetShape = vjp.ErrTargetShape

// ErrLossOutput marks a loss output that is not given when the model has
// several, or not among the model's outputs; the error lists them.
var ErrLossOutput = errors.New("loss output")

// Losses lists the losses Build accepts, in the order a help text shows
// them.
func Losses() []Loss { return vjp.Losses() }

// Names the generated graph adds (see vjp for each).
const (
	GradSuffix  = vjp.GradSuffix
	RawSuffix   = vjp.RawSuffix
	LossOutput  = vjp.LossOutput
	SeedOutput  = vjp.SeedOutput
	ScaleInput  = vjp.ScaleInput
	TargetInput = vjp.TargetInput
)

// Facts are what Build needs to know about one batch that the model file
// does not say (see vjp.Facts); backward.Probe records them.
type Facts = vjp.Facts

// Options configures Build.
type Options struct {
	// Loss is the loss applied to Output. Required.
	Loss Loss
	// Output is the graph output the loss applies to; "" means the graph's
	// only output.
	Output string
	// TargetShape is the shape of the target input; nil derives it from
	// the output's shape (the output's shape without the class axis for
	// CrossEntropy, the output's shape otherwise). Targets of another
	// shape with the same number of elements are reshaped, as fastai's
	// flat losses flatten both sides.
	TargetShape []int64
	// CrossEntropy configures the CrossEntropy loss; the zero value reads
	// the class axis from the target's shape and ignores PyTorch's -100.
	CrossEntropy CrossEntropyOptions
	// InputGrads also computes the gradients of float graph inputs. PyTorch
	// computes none (inputs do not require grad), and skipping them saves
	// the data gradient of the first layer, often the most expensive one.
	InputGrads bool
	// Rounding names the gradients held in 16 bits (nil: none).
	Rounding *Rounding
}

// Kind tells what a gradient's forward value is.
type Kind int

// Kinds of values with a gradient.
const (
	// Activation is a node output.
	Activation Kind = iota
	// Parameter is a float initializer.
	Parameter
	// Input is a float graph input (with Options.InputGrads).
	Input
)

// String returns "activation", "parameter" or "input".
func (k Kind) String() string {
	switch k {
	case Activation:
		return "activation"
	case Parameter:
		return "parameter"
	case Input:
		return "input"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Grad maps a forward value to the graph output holding its gradient.
type Grad struct {
	// Value is the forward value's name.
	Value string
	// Name is the graph output holding scale × dL/dValue (rounded when
	// Rounding holds Value in 16 bits): Value + GradSuffix.
	Name string
	// Raw is the graph output holding the gradient before rounding, or ""
	// when it is not rounded.
	Raw string
	// Kind tells whether Value is an activation, a parameter or an input.
	Kind Kind
	// Node is the index of the forward node that produces Value, or -1 for
	// initializers and graph inputs.
	Node int
	// Shape is the gradient's (and Value's) shape.
	Shape []int64
	// Partial is set when the gradient misses the share of a consumer
	// the rules could not differentiate (see Result.Unsupported), directly
	// or through the values downstream of Value.
	Partial bool
}

// Site is one gradient contribution rounded to 16 bits because the op that
// computes it runs in half precision: autocast casts an fp32 input (a
// Conv or Linear weight, or an fp32 activation) to fp16 for the op, so the
// op's backward yields that input's gradient in fp16 before the cast back.
type Site struct {
	// Node and Input locate the forward op and its input slot.
	Node, Input int
	// Value is the forward value at that slot.
	Value string
	// Raw and Rounded are the graph outputs holding the contribution
	// before and after rounding.
	Raw, Rounded string
	// ElemType is the 16-bit ONNX type rounded to.
	ElemType int32
}

// Unsupported is a forward node whose gradient could not be generated; the
// gradient stops there, and the rest of the graph is still covered.
type Unsupported struct {
	// Node is the forward node's index.
	Node int
	// Name and OpType are the node's name and op type.
	Name, OpType string
	// Reason says why: no rule for the op, or a rule's precondition.
	Reason string
}

// Result is a generated backward graph and how to read it.
type Result struct {
	// Model is the forward model with the loss and backward nodes
	// appended. It takes the forward inputs plus Target and Scale.
	Model *onnx.ModelProto
	// Output is the prediction the loss applies to.
	Output string
	// Target and Scale are the added inputs: the loss target (with
	// TargetShape and TargetType) and the scalar loss scale.
	Target, Scale string
	// TargetShape and TargetType describe the Target input.
	TargetShape []int64
	TargetType  int32
	// CrossEntropy is how the CrossEntropy loss reads the output and the
	// target; nil for the other losses.
	CrossEntropy *CrossEntropyLayout
	// Loss and Seed are the outputs holding the mean loss and the fp32
	// seed scale × dL/dOutput.
	Loss, Seed string
	// Grads lists every value with a gradient, in forward topological
	// order, sources (inputs, then initializers) first.
	Grads []Grad
	// Sites lists the rounded gradient contributions.
	Sites []Site
	// Held lists the forward values rounded to 16 bits where the
	// Rounding has a Forward: the values every rule reads as autocast
	// saved them.
	Held []Held
	// Unsupported lists the nodes the gradient stops at.
	Unsupported []Unsupported
	// Blocked lists values that needed a gradient but got none because
	// every path from them to the loss passes an unsupported node.
	Blocked []string
	// Opset is the default-domain opset of Model.
	Opset int64
}

// GradOf returns the gradient entry of a forward value.
func (r *Result) GradOf(value string) (Grad, bool) {
	for _, g := range r.Grads {
		if g.Value == value {
			return g, true
		}
	}
	return Grad{}, false
}

// Outputs returns the names of every graph output of Model: the forward
// outputs, the loss and seed, every gradient (and its unrounded value) and
// every Site.
func (r *Result) Outputs() []string {
	out := make([]string, len(r.Model.Graph.Output))
	for i, vi := range r.Model.Graph.Output {
		out[i] = vi.Name
	}
	return out
}

// minOpset is the oldest default-domain opset Build reads: Softmax and
// LogSoftmax changed meaning at 13 (one axis instead of a flattened
// tail), as did Squeeze, Unsqueeze, Split and ReduceSum (axes became
// inputs).
const minOpset = 13

// emitOpset is the opset the backward graph needs: ScatterElements and
// ScatterND gained reduction="add" at 16.
const emitOpset = 16

// Build generates the backward graph of m (an fp32 model: run the model
// through an upcast first if it holds half values) for the loss in opt.
// facts must come from backward.Probe on the same model. m is not modified.
func Build(m *onnx.ModelProto, facts *Facts, opt Options) (*Result, error) {
	if m.GetGraph() == nil {
		return nil, errors.New("grad: model has no graph")
	}
	if facts == nil {
		return nil, errors.New("grad: no facts; run backward.Probe on a batch first")
	}
	if !slices.Contains(Losses(), opt.Loss) {
		return nil, fmt.Errorf("grad: loss %q: want one of cross-entropy, bce, mse, l1, output", opt.Loss)
	}
	opset := defaultOpset(m)
	if opset < minOpset {
		return nil, fmt.Errorf("grad: the model uses opset %d; the backward pass needs opset %d or newer (Softmax, Squeeze and the reductions changed meaning at 13): export with opset_version=%d or newer (torch ≥ 1.13 defaults to 14)",
			opset, minOpset, minOpset)
	}
	ix, err := onnx.NewIndex(m.Graph)
	if err != nil {
		return nil, fmt.Errorf("grad: %w", err)
	}
	out := opt.Output
	if out == "" {
		if len(m.Graph.Output) != 1 {
			return nil, fmt.Errorf("grad: %w not named: the model has %d outputs (%s); name the one the loss applies to", ErrLossOutput, len(m.Graph.Output), outputList(m, facts))
		}
		out = m.Graph.Output[0].Name
	}
	if !slices.ContainsFunc(m.Graph.Output, func(vi *onnx.ValueInfoProto) bool { return vi.Name == out }) {
		return nil, fmt.Errorf("grad: %w %q is not a graph output; the model's outputs are %s", ErrLossOutput, out, outputList(m, facts))
	}
	if t := ix.ElemType(out); t != 0 && t != elemFloat {
		return nil, fmt.Errorf("grad: output %q is %s; the loss needs a FLOAT output (upcast the model first)", out, onnx.DataTypeName(t))
	}

	b := vjp.NewBuilder(m, ix, facts, max(opset, emitOpset))
	res := &Result{Output: out, Scale: ScaleInput, Loss: LossOutput, Seed: SeedOutput, Opset: b.Opset()}
	if err := b.CheckNames(); err != nil {
		return nil, err
	}
	b.Upgrade(opset)

	tg, err := b.Loss(opt.Loss, out, opt.TargetShape, opt.CrossEntropy)
	if err != nil {
		return nil, err
	}
	res.Target, res.TargetShape, res.TargetType, res.CrossEntropy = tg.Name, tg.Shape, tg.Type, tg.CrossEntropy
	d := &driver{b: b, ix: ix, opt: opt, res: res, contrib: map[string][]string{}}
	d.run(out, SeedOutput)
	if f := opt.Rounding.forward(); f != nil {
		res.Held = d.saved(m, f)
	}
	res.Model = b.Model()
	return res, nil
}

// saved makes the forward of the backward graph the forward as f holds
// it, read by every rule at the values its op saved (vjp's Saved), and
// returns what it rounds. The forward is the graph the rules were given
// (the forward nodes the rules cloned included), emulated as the forward
// passes emulate it; node indices stay.
func (d *driver) saved(m *onnx.ModelProto, f *Forward) []Held {
	fwd := onnx.ShallowCopy(m)
	fwd.Graph.Node = d.b.Graph().Node
	emu, rounded := rewrite.EmulateHeld(fwd, f.Orig, f.Assign)
	d.b.Saved(emu.Graph)
	held := make([]Held, len(rounded))
	for k, r := range rounded {
		h := Held{Raw: r.Src, Rounded: r.Dst, Value: r.Value, ElemType: r.Precision.ElemType(), Cast: r.Cast}
		for _, s := range r.Slots {
			h.Slots = append(h.Slots, Slot{Node: s.Node, Input: s.Input})
		}
		held[k] = h
	}
	return held
}

// outputList names the graph outputs with their probed shapes.
func outputList(m *onnx.ModelProto, facts *Facts) string {
	var have []string
	for _, vi := range m.Graph.Output {
		if s, ok := facts.Shapes[vi.Name]; ok {
			have = append(have, fmt.Sprintf("%q %v", vi.Name, s))
		} else {
			have = append(have, fmt.Sprintf("%q", vi.Name))
		}
	}
	return strings.Join(have, ", ")
}

// driver walks the forward graph backwards, calling each node's rule and
// accumulating the contributions every value receives.
type driver struct {
	b       *vjp.Builder
	ix      *onnx.Index
	opt     Options
	res     *Result
	active  map[string]bool
	contrib map[string][]string
	// stopped holds values a consumer could not differentiate for
	// (an unsupported op), so that a value left without any
	// contribution can be told apart from one whose gradient is zero.
	stopped map[string]bool
	// partial holds values whose gradient misses a share: a consumer
	// was unsupported, or a contribution came from a partial gradient.
	partial map[string]bool
}

func (d *driver) run(out, seed string) {
	g := d.b.Graph()
	d.markActive(out)
	d.stopped = map[string]bool{}
	d.partial = map[string]bool{}
	d.contrib[out] = append(d.contrib[out], seed)

	order := d.ix.Order()
	for k := len(order) - 1; k >= 0; k-- {
		i := order[k]
		n := g.Node[i]
		gy := make([]string, len(n.Output))
		hasGrad := false
		for j, o := range n.Output {
			if o == "" || !d.active[o] {
				continue
			}
			gy[j] = d.finalize(o, Activation, i)
			hasGrad = hasGrad || gy[j] != ""
		}
		if !hasGrad {
			continue
		}
		need := make([]bool, len(n.Input))
		anyNeed := false
		for j, in := range n.Input {
			need[j] = in != "" && d.active[in]
			anyNeed = anyNeed || need[j]
		}
		if !anyNeed {
			continue
		}
		dxs, err := d.b.Apply(i, gy, need)
		if err != nil {
			reason := err.Error()
			if errors.Is(err, vjp.ErrNoRule) {
				reason = "no gradient rule for " + n.OpType
			}
			d.res.Unsupported = append(d.res.Unsupported, Unsupported{Node: i, Name: n.Name, OpType: n.OpType, Reason: reason})
			for j, in := range n.Input {
				if need[j] {
					d.stopped[in] = true
				}
			}
			continue
		}
		fromPartial := slices.ContainsFunc(n.Output, func(o string) bool { return o != "" && d.partial[o] })
		for j, dx := range dxs {
			if dx == "" || !need[j] {
				continue
			}
			if fromPartial {
				d.partial[n.Input[j]] = true
			}
			d.contrib[n.Input[j]] = append(d.contrib[n.Input[j]], d.roundSite(i, j, n.Input[j], dx))
		}
	}
	// Sources last: graph inputs first, then initializers, in file order.
	for _, vi := range d.ix.GraphInputs() {
		if d.active[vi.Name] {
			d.finalize(vi.Name, Input, -1)
		}
	}
	for _, t := range g.Initializer {
		if d.active[t.Name] {
			d.finalize(t.Name, Parameter, -1)
		}
	}
	// Grads were appended in reverse order for activations; report them
	// in forward order with sources first.
	pos := map[string]int{}
	for k, i := range order {
		for _, o := range g.Node[i].Output {
			pos[o] = k + 1
		}
	}
	sort.SliceStable(d.res.Grads, func(a, b int) bool {
		return pos[d.res.Grads[a].Value] < pos[d.res.Grads[b].Value]
	})
}

// markActive computes which values need a gradient: float values that
// depend on a parameter (or, with InputGrads, a float input) and on which
// the loss depends.
func (d *driver) markActive(out string) {
	g := d.b.Graph()
	req := map[string]bool{}
	// A dynamo export lifts the constants of the module's code into
	// initializers (the 2 of every RMSNorm's pow, whose "gradient" needs
	// the log of negative values; epsilons; scales), and marks the
	// parameters it kept as they were. A single number it does not mark a
	// parameter is such a constant, and gets no gradient, as in PyTorch;
	// so does what it marks a buffer or a constant tensor (BatchNorm's
	// running statistics, RoPE's inv_freq, whose path through Sin and Cos
	// needs no gradient). (Its other unmarked initializers stay: the
	// exporter folds weights into new ones, a Linear's transposed weight
	// among them, unmarked.)
	kinds, marked := onnx.TorchParameters(g)
	for _, t := range g.Initializer {
		kind, ok := kinds[t.Name]
		param := !marked || kind == "PARAMETER" || (!ok && tensor.NumElements(t.Dims) > 1)
		if t.DataType == elemFloat && param {
			req[t.Name] = true
		}
	}
	if d.opt.InputGrads {
		for _, vi := range d.ix.GraphInputs() {
			if d.ix.ElemType(vi.Name) == elemFloat {
				req[vi.Name] = true
			}
		}
	}
	order := d.ix.Order()
	for _, i := range order {
		n := g.Node[i]
		if nondiff(n.OpType) {
			continue
		}
		dep := false
		for _, in := range n.Input {
			dep = dep || req[in]
		}
		if !dep {
			continue
		}
		for _, o := range n.Output {
			if o != "" && d.b.IsFloat(o) {
				req[o] = true
			}
		}
	}
	reach := map[string]bool{out: true}
	for k := len(order) - 1; k >= 0; k-- {
		n := g.Node[order[k]]
		hit := false
		for _, o := range n.Output {
			hit = hit || reach[o]
		}
		if !hit || nondiff(n.OpType) {
			continue
		}
		for _, in := range n.Input {
			if in != "" {
				reach[in] = true
			}
		}
	}
	d.active = map[string]bool{}
	for v := range req {
		if reach[v] && d.b.IsFloat(v) {
			d.active[v] = true
		}
	}
}

// finalize sums the contributions v received into its gradient output,
// rounding it when Rounding holds v in 16 bits, and records the Grad. It
// returns the gradient's name, or "" when v received none.
func (d *driver) finalize(v string, kind Kind, node int) string {
	cs := d.contrib[v]
	if len(cs) == 0 {
		if d.stopped[v] {
			d.res.Blocked = append(d.res.Blocked, v)
		}
		return ""
	}
	if d.stopped[v] {
		d.partial[v] = true
	}
	b := d.b
	name := v + GradSuffix
	if !d.ix.Tensor(v) {
		// A sequence's gradient is carried in the layout of the tensor it
		// was cut from (package vjp's sequence rules): no gradient of its
		// own to report or round; that tensor's gradient is.
		b.SetLabel(v)
		if len(cs) == 1 {
			return cs[0]
		}
		b.Sum(cs, name)
		return name
	}
	et := d.opt.Rounding.value(v)
	target := name
	if et != 0 {
		target = name + RawSuffix
	}
	b.SetLabel(v)
	if len(cs) == 1 {
		b.Rename(cs[0], target)
	} else {
		b.Sum(cs, target)
	}
	gr := Grad{Value: v, Name: name, Kind: kind, Node: node, Shape: b.Shape(v), Partial: d.partial[v]}
	if et != 0 {
		b.Round(target, name, et)
		gr.Raw = target
		b.Output(target, gr.Shape)
	}
	b.Output(name, gr.Shape)
	d.res.Grads = append(d.res.Grads, gr)
	return name
}

// roundSite rounds the contribution dx of node i's input slot j when
// Rounding says the op computes it in 16 bits, and records the Site.
func (d *driver) roundSite(i, j int, v, dx string) string {
	et := d.opt.Rounding.input(i, j)
	if et == 0 {
		return dx
	}
	b := d.b
	label := vjp.NodeLabel(b.Graph().Node[i], i)
	raw := fmt.Sprintf("%s%s@%s%s", v, GradSuffix, label, RawSuffix)
	rounded := fmt.Sprintf("%s%s@%s", v, GradSuffix, label)
	b.Rename(dx, raw)
	b.Round(raw, rounded, et)
	shape := b.Shape(v)
	b.Output(raw, shape)
	b.Output(rounded, shape)
	site := Site{Node: i, Input: j, Value: v, Raw: raw, Rounded: rounded, ElemType: et}
	d.res.Sites = append(d.res.Sites, site)
	return rounded
}

// nondiff reports whether an op's float outputs carry no gradient back to
// its inputs (its entry's Grad is ops.NoGrad): comparisons and index
// computations, shape queries, random generators and rounding steps.
func nondiff(opType string) bool {
	o := ops.Lookup(ops.Default, opType)
	return o != nil && o.Grad == ops.NoGrad
}

func defaultOpset(m *onnx.ModelProto) int64 {
	for _, o := range m.OpsetImport {
		if o.Domain == "" || o.Domain == "ai.onnx" {
			return o.Version
		}
	}
	return 0
}

const elemFloat = int32(onnx.TensorProto_FLOAT)
