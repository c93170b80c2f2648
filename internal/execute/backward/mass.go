package backward

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"unsafe"

	"fp16audit/internal/grad"
	"fp16audit/internal/grad/vjp"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/ortcapi"
	"fp16audit/internal/rewrite"
	"fp16audit/internal/statsop"
	"fp16audit/internal/tensor"
)

// RoundInput is the scalar float input of a MassSession's graph that
// switches the rounding of the 16-bit gradients on (1: the rounding res
// was built with, 2: the alternative one) or off (0).
const RoundInput = "round::fp16audit"

// HoldInput is the scalar float input that switches the rounding of the
// forward values held in 16 bits (grad.Result.Held) on (1: the rounding
// res was built with, 2: the alternative one) or off (0), apart from the
// gradients': on with the gradients' off, a run differentiates exactly at
// the values the 16-bit forward saved (RunSaved), the reference its
// rounded runs are compared with.
const HoldInput = "hold::fp16audit"

// MassInput is the scalar float input that switches the Mass histograms
// on (1) or off (0): only the unrounded run's are read (they judge every
// scale), so a rounded run skips their pass over every 16-bit gradient.
const MassInput = "mass::fp16audit"

// MassSession runs a backward graph built with autocast's rounding for the
// backward audit. Every rounding Cast pair becomes statsop's Round, which
// the inputs RoundInput (the gradients') and HoldInput (the forward
// values') switch off, so one session runs the fp32 backward (the
// reference), the backward at the values the 16-bit forward saved and
// the emulated ones; every gradient held in 16 bits is summarised before
// its rounding by statsop's Mass; and only those summaries, the loss and
// the parameter gradients leave ONNX Runtime, into buffers allocated once.
type MassSession struct {
	rt     *ortcapi.Runtime
	s      *statsop.ModelSession
	res    *grad.Result
	alt    *grad.Rounding
	inputs []*tensor.Tensor
	target *tensor.Tensor
	// The outputs, in the session's output order: the loss and the
	// masses (grads, then sites) into buffers allocated once, and the
	// parameter gradients (of plens elements each) into new ones per run,
	// which the run's result keeps.
	loss   []float32
	masses [][]float64
	plens  []int64
	keys   []massKey
	pnames []string
}

type massKey struct {
	key  string
	site bool
}

// NewMassSession opens the session of res (built with a Rounding) that
// feeds inputs and target on every run. opt configures ONNX Runtime as
// for the forward passes; library is the ONNX Runtime library. modelFile
// is the file the model was loaded from: when it lies in
// opt.ExternalDataDir, the weights are handed to ONNX Runtime over the
// memory res.Model holds them in rather than copied (statsop.HandsOver);
// w, when set, hands over the audit's shared weights (statsop.Weights).
// alt, when set, is a second rounding of the same points (another
// policy's: bf16 where res was built for fp16, see SameSites) that RunAlt
// runs in this session.
func NewMassSession(library string, res *grad.Result, opt onnxrt.SessionOptions, modelFile string, w *statsop.Weights, inputs []*tensor.Tensor, target *tensor.Tensor, alt *grad.Rounding) (*MassSession, error) {
	rt, err := ortcapi.Open(library)
	if err != nil {
		return nil, err
	}
	ms := &MassSession{rt: rt, res: res, inputs: inputs, target: target, alt: alt}
	m, outputs, err := ms.graph()
	if err != nil {
		return nil, err
	}
	// The audit runs the session two to five times.
	o, err := fewRunOptions(opt)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, vi := range onnxIndexInputs(res.Model) {
		if vi != res.Target && vi != res.Scale {
			names = append(names, vi)
		}
	}
	if len(names) != len(inputs) {
		return nil, fmt.Errorf("backward session: the model takes %d inputs, got %d", len(names), len(inputs))
	}
	if res.Target != "" {
		names = append(names, res.Target)
	}
	names = append(names, res.Scale, RoundInput, HoldInput, MassInput)
	if ms.s, err = statsop.NewModelSession(rt, m, declared(modelFile, opt.ExternalDataDir), w, names, outputs, o); err != nil {
		return nil, fmt.Errorf("backward session: %w", err)
	}
	return ms, nil
}

// declared returns the name of modelFile when it lies in the folder dir
// (the file ONNX Runtime is told the weights handed over lie in), "" when
// not.
func declared(modelFile, dir string) string {
	if modelFile == "" || dir == "" {
		return ""
	}
	a, err1 := filepath.Abs(filepath.Dir(modelFile))
	b, err2 := filepath.Abs(dir)
	if err1 != nil || err2 != nil || a != b {
		return ""
	}
	return filepath.Base(modelFile)
}

func onnxIndexInputs(m *onnx.ModelProto) []string {
	init := map[string]bool{}
	for _, t := range m.Graph.Initializer {
		init[t.Name] = true
	}
	var out []string
	for _, vi := range m.Graph.Input {
		if !init[vi.Name] {
			out = append(out, vi.Name)
		}
	}
	return out
}

// graph returns res.Model with Round in place of the rounding Cast pairs,
// a Mass node per 16-bit gradient and the outputs the session fetches,
// and allocates their buffers.
func (ms *MassSession) graph() (*onnx.ModelProto, []string, error) {
	res := ms.res
	// Every run of this session must draw the same numbers (a Dropout's
	// mask, a stochastic depth's): the runs are compared with one another.
	fixed, _, err := rewrite.FixedRandom(res.Model)
	if err != nil {
		return nil, nil, fmt.Errorf("backward session: %w", err)
	}
	m := onnx.ShallowCopy(fixed)
	g := m.Graph
	producer := map[string]int{}
	for i, n := range g.Node {
		for _, o := range n.Output {
			producer[o] = i
		}
	}
	drop := map[int]bool{}
	var added []*onnx.NodeProto
	// round replaces the Cast pair raw → mid → rounded by Round(raw, on),
	// alt the format of the alternative rounding there, switched by the
	// input on.
	round := func(raw, rounded string, et, alt int32, on string) error {
		i, ok := producer[rounded]
		if !ok || g.Node[i].OpType != "Cast" || len(g.Node[i].Input) != 1 {
			return fmt.Errorf("backward session: %q is not a rounding Cast", rounded)
		}
		j, ok := producer[g.Node[i].Input[0]]
		if !ok || g.Node[j].OpType != "Cast" || len(g.Node[j].Input) != 1 || g.Node[j].Input[0] != raw {
			return fmt.Errorf("backward session: %q is not rounded from %q", rounded, raw)
		}
		drop[i], drop[j] = true, true
		n := onnx.Node(statsop.OpRound, rounded+"::round"+vjp.Internal, []string{raw, on}, []string{rounded},
			onnx.AttrInt(statsop.AttrTo, int64(et)), onnx.AttrInt(statsop.AttrAlt, int64(alt)))
		n.Domain = statsop.Domain
		added = append(added, n)
		return nil
	}
	mass := func(raw string, k massKey) {
		out := raw + "::mass" + vjp.Internal
		n := onnx.Node(statsop.OpMass, out, []string{raw, MassInput}, []string{out})
		n.Domain = statsop.Domain
		added = append(added, n)
		ms.keys = append(ms.keys, k)
		ms.masses = append(ms.masses, make([]float64, statsop.MassLen))
	}
	var masses []string
	for _, gr := range res.Grads {
		if gr.Raw == "" {
			continue
		}
		et := elemTypeOf(g, gr.Name, producer)
		alt := et
		if ms.alt != nil {
			alt = ms.alt.Values[gr.Value]
		}
		if err := round(gr.Raw, gr.Name, et, alt, RoundInput); err != nil {
			return nil, nil, err
		}
		mass(gr.Raw, massKey{key: gr.Value})
		masses = append(masses, gr.Raw+"::mass"+vjp.Internal)
	}
	for _, s := range res.Sites {
		alt := s.ElemType
		if ms.alt != nil {
			alt = ms.alt.Inputs[grad.Slot{Node: s.Node, Input: s.Input}]
		}
		if err := round(s.Raw, s.Rounded, s.ElemType, alt, RoundInput); err != nil {
			return nil, nil, err
		}
		mass(s.Raw, massKey{key: s.Rounded, site: true})
		masses = append(masses, s.Raw+"::mass"+vjp.Internal)
	}
	// The forward values held in 16 bits (a Rounding with a Forward),
	// switched by their own input: off in the fp32 reference, on in an
	// emulated run, which differentiates at the values autocast saved, and
	// in the saved reference; no Mass, no output.
	for _, h := range res.Held {
		alt := h.ElemType
		if ms.alt != nil {
			if alt = ms.alt.HeldType(h); alt == 0 {
				return nil, nil, fmt.Errorf("backward session: the alternative rounding does not hold the forward value %q in 16 bits (see grad.Result.HeldBy)", h.Rounded)
			}
		}
		if err := round(h.Raw, h.Rounded, h.ElemType, alt, HoldInput); err != nil {
			return nil, nil, err
		}
	}
	var nodes []*onnx.NodeProto
	for i, n := range g.Node {
		if !drop[i] {
			nodes = append(nodes, n)
		}
	}
	g = &onnx.GraphProto{Node: append(nodes, added...), Name: g.Name, Initializer: g.Initializer,
		SparseInitializer: g.SparseInitializer, Input: append(append([]*onnx.ValueInfoProto(nil), g.Input...),
			onnx.TensorValueInfo(RoundInput, onnx.TensorProto_FLOAT), onnx.TensorValueInfo(HoldInput, onnx.TensorProto_FLOAT),
			onnx.TensorValueInfo(MassInput, onnx.TensorProto_FLOAT)), ValueInfo: g.ValueInfo}
	outputs := []string{res.Loss}
	g.Output = append(g.Output, onnx.TensorValueInfo(res.Loss, onnx.TensorProto_FLOAT))
	ms.loss = make([]float32, 1)
	for _, name := range masses {
		g.Output = append(g.Output, onnx.TensorValueInfo(name, onnx.TensorProto_DOUBLE, int64(statsop.MassLen)))
		outputs = append(outputs, name)
	}
	for _, p := range res.Params() {
		if p.Shape == nil {
			return nil, nil, fmt.Errorf("backward session: the gradient of %q has no known shape", p.Value)
		}
		dims := make([]any, len(p.Shape))
		n := int64(1)
		for i, d := range p.Shape {
			dims[i] = d
			n *= d
		}
		g.Output = append(g.Output, onnx.TensorValueInfo(p.Name, onnx.TensorProto_FLOAT, dims...))
		outputs = append(outputs, p.Name)
		ms.plens = append(ms.plens, n)
		ms.pnames = append(ms.pnames, p.Value)
	}
	m.Graph = g
	m.OpsetImport = append(append([]*onnx.OperatorSetIdProto(nil), m.OpsetImport...), &onnx.OperatorSetIdProto{Domain: statsop.Domain, Version: 1})
	return m, outputs, nil
}

// elemTypeOf returns the 16-bit type the Cast pair producing rounded
// goes through.
func elemTypeOf(g *onnx.GraphProto, rounded string, producer map[string]int) int32 {
	i := producer[rounded]
	j := producer[g.Node[i].Input[0]]
	return int32(onnx.IntAttr(g.Node[j], "to", int64(onnx.TensorProto_FLOAT16)))
}

// Close releases the session.
func (ms *MassSession) Close() {
	if ms.s != nil {
		ms.s.Close()
		ms.s = nil
	}
}

// Run runs forward and backward at loss scale 2^exp, with the 16-bit
// gradients (and the forward values held in 16 bits) rounded or left in
// fp32, and returns what the run says. Only the unrounded run summarises
// the 16-bit gradients (Grads and Sites): a rounded run's are empty, its
// Mass nodes switched off.
func (ms *MassSession) Run(exp int, rounded bool) (*grad.Run, error) {
	on := float32(0)
	if rounded {
		on = 1
	}
	return ms.run(exp, on, on, !rounded)
}

// HoldsForward reports whether the session's forward holds values in 16
// bits (a graph built with a grad.Forward that rounds something): then
// the rounded runs' reference is RunSaved's, not the fp32 run's.
func (ms *MassSession) HoldsForward() bool { return len(ms.res.Held) > 0 }

// RunSaved runs forward and backward at scale 1 with the forward values
// held in 16 bits rounded (the alternative rounding's with alt) and every
// gradient left unrounded: the backward exactly at the values the 16-bit
// forward saved, what a rounded run's gradients lose their mass against.
// The forward's own precision, which no loss scale changes, then counts
// in neither. Like a rounded run's, its result has no masses.
func (ms *MassSession) RunSaved(alt bool) (*grad.Run, error) {
	hold := float32(1)
	if alt {
		if ms.alt == nil {
			return nil, fmt.Errorf("backward: the session has no alternative rounding")
		}
		hold = 2
	}
	return ms.run(0, 0, hold, false)
}

// RunSummarised runs forward and backward at loss scale 2^exp with the
// 16-bit gradients rounded, and summarises every 16-bit gradient before
// its rounding as the unrounded run does: where a rounded run's gradients
// turn NaN/Inf first.
func (ms *MassSession) RunSummarised(exp int) (*grad.Run, error) {
	return ms.run(exp, 1, 1, true)
}

// HasAlt reports whether the session was opened with an alternative
// rounding (RunAlt).
func (ms *MassSession) HasAlt() bool { return ms.alt != nil }

// RunAlt runs forward and backward at loss scale 2^exp with the gradients
// rounded as the alternative rounding holds them; its result is a rounded
// run's.
func (ms *MassSession) RunAlt(exp int) (*grad.Run, error) {
	if ms.alt == nil {
		return nil, fmt.Errorf("backward: the session has no alternative rounding")
	}
	return ms.run(exp, 2, 2, false)
}

// SameSites reports whether the roundings a and b hold gradients at the
// same points (the same values and op input slots), whatever their
// formats: then one session serves both (NewMassSession's alt).
func SameSites(a, b *grad.Rounding) bool {
	if len(a.Values) != len(b.Values) || len(a.Inputs) != len(b.Inputs) {
		return false
	}
	for v := range a.Values {
		if _, ok := b.Values[v]; !ok {
			return false
		}
	}
	for s := range a.Inputs {
		if _, ok := b.Inputs[s]; !ok {
			return false
		}
	}
	return true
}

// run runs the session with the gradients' rounding switch on and the
// forward values' hold (each 0 off, 1 the rounding res was built with, 2
// the alternative one) and the Mass histograms on or off (summarise).
func (ms *MassSession) run(exp int, on, hold float32, summarise bool) (*grad.Run, error) {
	rounded := on != 0
	scale := []float32{float32(math.Ldexp(1, exp))}
	masses := []float32{0}
	if summarise {
		masses[0] = 1
	}
	feeds := append([]*tensor.Tensor(nil), ms.inputs...)
	if ms.res.Target != "" {
		if ms.target == nil {
			return nil, fmt.Errorf("backward: the loss needs a target")
		}
		feeds = append(feeds, ms.target)
	}
	var out []*ortcapi.Value
	in, err := tensorValues(ms.rt, feeds)
	defer func() { release(append(in, out...)) }()
	if err != nil {
		return nil, fmt.Errorf("backward: %w", err)
	}
	for _, s := range [][]float32{scale, {on}, {hold}, masses} {
		v, err := tensorOf(ms.rt, []int64{}, s)
		if err != nil {
			return nil, err
		}
		in = append(in, v)
	}
	add := func(v *ortcapi.Value, err error) error {
		if err == nil {
			out = append(out, v)
		}
		return err
	}
	if err := add(tensorOf(ms.rt, []int64{}, ms.loss)); err != nil {
		return nil, err
	}
	for _, h := range ms.masses {
		if err := add(tensorOf(ms.rt, []int64{int64(len(h))}, h)); err != nil {
			return nil, err
		}
	}
	params := ms.res.Params()
	grads := make([][]float32, len(ms.plens))
	var total int64
	for _, n := range ms.plens {
		total += n
	}
	// The parameter gradients are as large as the model; fresh memory
	// ONNX Runtime writes once.
	all := make([]float32, total)
	ortcapi.AdviseHugePages(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(all))), 4*len(all)))
	for k, n := range ms.plens {
		grads[k], all = all[:n:n], all[n:]
		if err := add(tensorOf(ms.rt, params[k].Shape, grads[k])); err != nil {
			return nil, err
		}
	}
	if err := ms.s.Run(in, out); err != nil {
		return nil, fmt.Errorf("backward at scale 2^%d: %w", exp, err)
	}
	r := &grad.Run{Exp: exp, Rounded: rounded, Loss: float64(ms.loss[0]), Grads: map[string]*grad.Mass{},
		Sites: map[string]*grad.Mass{}, Params: map[string][]float32{}}
	// Mass nodes switched off (MassInput) wrote nothing.
	for k, h := range ms.masses {
		if !summarise {
			break
		}
		m, err := grad.MassFrom(h)
		if err != nil {
			return nil, err
		}
		if ms.keys[k].site {
			r.Sites[ms.keys[k].key] = m
		} else {
			r.Grads[ms.keys[k].key] = m
		}
	}
	for k, g := range grads {
		r.Params[ms.pnames[k]] = g
	}
	return r, nil
}

// tensorOf wraps a Go slice as a float32 or float64 tensor of shape,
// without copying (pinned until the value is released).
func tensorOf[T float32 | float64](rt *ortcapi.Runtime, shape []int64, data []T) (*ortcapi.Value, error) {
	var zero T
	t := ortcapi.Float32
	if _, ok := any(zero).(float64); ok {
		t = ortcapi.Float64
	}
	return rt.NewTensor(t, shape, unsafe.Pointer(unsafe.SliceData(data)), len(data)*int(unsafe.Sizeof(zero)))
}

// StopOn stops the session's runs when ctx ends (ortcapi.Session.StopOn):
// the run in flight ends at its next node, with ctx's cause. The function
// returned detaches ctx.
func (ms *MassSession) StopOn(ctx context.Context) (detach func() bool) { return ms.s.StopOn(ctx) }
