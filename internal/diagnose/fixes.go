package diagnose

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"fp16audit/internal/batch"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/report"
)

// Rerun is one extra run of the policy's emulated pass that verifies a
// fix.
type Rerun struct {
	// Name names the pass in progress reports ("fp16+standardized").
	Name string
	// Assign is the precision assignment to emulate (nodes kept in fp32,
	// casts removed); the policy's own when nothing changes.
	Assign *precision.Assignment
	// Batches are the inputs (standardized ones for that fix).
	Batches []batch.Batch
	// Clamp holds constants (initializers or Constant outputs) to replace
	// by their values clamped to ±limit: torch.finfo(dtype).min in place of
	// a fixed mask value.
	Clamp map[string]float64
	// Reference runs the fp32 reference graph (no rounding at all) instead
	// of an emulated pass; Assign and Clamp are ignored.
	Reference bool
	// Epsilon, with Reference, adds eps[v] inside every Sqrt of the value
	// v (rewrite.AddEpsilon): a normalization's missing epsilon put back.
	Epsilon map[string]float32
}

// Runner reruns the policy's emulated pass, to verify a fix, or the fp32
// reference on some samples, to locate them. The audit's execution stage
// implements it.
type Runner interface {
	Rerun(ctx context.Context, r Rerun) (*observe.PassResult, error)
}

// verify runs r and returns the fix with its outcome and the origins of
// the rerun that reach an output: the fix works when there are none (or a
// constant origin that raises) and every graph output is finite and
// within the tolerance of fp32's on the same inputs. Infinities the model
// writes on purpose count neither as origins nor among the remaining
// NaN/Inf.
func (f *Facts) verify(ctx context.Context, run Runner, r Rerun, fix *report.Fix) ([]report.Origin, error) {
	if r.Assign == nil {
		r.Assign = f.Static.Assign
	}
	res, err := run.Rerun(ctx, r)
	if err != nil {
		return nil, err
	}
	origins, deliberate, _ := f.passOrigins(f.Main, res, r.Assign)
	fix.Pass = r.Name
	fix.NonFiniteAfter = f.countNonFinite(res, deliberate)
	deciding := f.deciding(origins)
	fix.Works = len(deciding) == 0 && f.outputsAgree(res)
	f.recordAgreement(res)
	return deciding, nil
}

// remains says what is left after a fix that does not work: the NaN/Inf,
// or outputs that stay finite but wrong (from the agreement recorded for
// the pass the fix was judged by).
func (f *Facts) remains(fix *report.Fix) string {
	if fix.NonFiniteAfter > 0 {
		return fmt.Sprintf("%d non-finite values remain", fix.NonFiniteAfter)
	}
	if w := wrongTextOf(f.agreements[fix.Pass]); w != "" {
		return "the " + w
	}
	return "an overflow still reaches the outputs"
}

// countNonFinite counts the NaN/Inf of the observed values of a pass,
// leaving out the infinities the model writes on purpose.
func (f *Facts) countNonFinite(res *observe.PassResult, deliberate map[string]bool) int64 {
	var n int64
	for _, v := range f.Values {
		if s, ok := res.Stats[v]; ok && !deliberate[v] {
			n += s.NonFinite()
		}
	}
	return n
}

// nonFinite is countNonFinite for a pass that ran with the audit.
func (f *Facts) nonFinite(res *observe.PassResult, pass string) int64 {
	return f.countNonFinite(res, f.deliberate[pass])
}

// fixStandardize re-runs the emulated pass with standardized inputs: each
// flagged input alone first, so that the fix names the input at fault,
// then all of them together.
func (f *Facts) fixStandardize(ctx context.Context, run Runner, batches []batch.Batch, flagged []*Input, before int64) (*report.Fix, error) {
	tries := [][]*Input{}
	for _, in := range flagged {
		tries = append(tries, []*Input{in})
	}
	if len(flagged) > 1 {
		tries = append(tries, flagged)
	}
	var fix *report.Fix
	for _, try := range tries {
		fix = &report.Fix{Kind: report.FixStandardize, NonFiniteBefore: before}
		bs := batches
		var names []string
		for _, in := range try {
			var err error
			if bs, err = in.standardize(bs); err != nil {
				return nil, err
			}
			fix.Normalize = append(fix.Normalize, in.normalizeAdvice())
			fix.Inputs = append(fix.Inputs, in.Spec.Name)
			names = append(names, fmt.Sprintf("%q", in.Spec.Name))
		}
		if _, err := f.verify(ctx, run, Rerun{Name: f.Main + "+standardized", Batches: bs}, fix); err != nil {
			return nil, err
		}
		what := "standardizing input " + names[0]
		if len(names) > 1 {
			what = "standardizing the inputs " + strings.Join(names, ", ")
		} else if len(f.Inputs) > 1 {
			what += " alone"
		}
		if fix.Works {
			fix.Summary = what + " removes every overflow; " + adviceText(try)
			return fix, nil
		}
		fix.Summary = fmt.Sprintf("%s does not remove the overflow: %s", what, f.remains(fix))
	}
	return fix, nil
}

// adviceText is how to standardize the inputs, in the user's API for
// their kind.
func adviceText(inputs []*Input) string {
	var parts []string
	for _, in := range inputs {
		ns := in.normalizeAdvice()
		switch {
		case in.Kind == report.KindImage:
			parts = append(parts, fmt.Sprintf("for %q add %s to the DataLoaders' batch_tfms (fastai) or use %s (PyTorch)", in.Spec.Name, ns.Fastai, ns.Torch))
		case ns.Fastai != "":
			parts = append(parts, fmt.Sprintf("for %q use %s (fastai) or %s (PyTorch)", in.Spec.Name, ns.Fastai, ns.Torch))
		default:
			parts = append(parts, fmt.Sprintf("for %q: %s", in.Spec.Name, ns.Torch))
		}
	}
	return strings.Join(parts, "; ")
}

// fixBF16 reads the bf16 pass, which ran beside the fp16 one: would
// to_bf16() remove the overflow?
func (f *Facts) fixBF16(before int64) (*report.Fix, bool) {
	bf, ok := f.Passes[PassBF16]
	if !ok || f.Main == PassBF16 {
		return nil, false
	}
	after := f.nonFinite(bf, PassBF16)
	fix := &report.Fix{Kind: report.FixBF16, Pass: PassBF16, NonFiniteBefore: before, NonFiniteAfter: after,
		Works: len(f.deciding(f.Origins(PassBF16))) == 0 && f.outputsAgree(bf)}
	f.recordAgreement(bf)
	if fix.Works {
		fix.Summary = "learn.to_bf16() removes every overflow (needs an Ampere or newer GPU)"
		if a := f.agreeText(bf); a != "" {
			fix.Summary += "; its " + a
		}
	} else {
		fix.Summary = fmt.Sprintf("learn.to_bf16() does not remove the overflow: %s in the bf16 pass", f.remains(fix))
	}
	return fix, true
}

// fixRemoveCast re-runs the emulated pass without the model's own half
// casts that the explicit-cast origins come from.
func (f *Facts) fixRemoveCast(ctx context.Context, run Runner, batches []batch.Batch, origins []report.Origin, before int64) (*report.Fix, error) {
	casts := f.castsOf(origins)
	fix := &report.Fix{Kind: report.FixRemoveCast, NonFiniteBefore: before}
	asg := precision.AssignKeepFP32(f.Static.Policy, f.graph(), f.Static.Order, f.Static.Model.Index.ElemType, casts)
	if _, err := f.verify(ctx, run, Rerun{Name: f.Main + "+no-half-cast", Assign: asg, Batches: batches}, fix); err != nil {
		return nil, err
	}
	for _, c := range sortedKeys(casts) {
		fix.Nodes = append(fix.Nodes, f.nodeName(c))
		if m := onnx.ModulePath(f.graph().Node[c]); m != "" && !slices.Contains(fix.Modules, m) {
			fix.Modules = append(fix.Modules, m)
		}
	}
	list := strings.Join(fix.Nodes, ", ")
	if fix.Works {
		fix.Summary = fmt.Sprintf("without the model's own half cast (%s) every overflow is gone: remove the .half()/.to(torch.float16) in forward, or move it after the op that overflows, or scale before it", list)
	} else {
		fix.Summary = fmt.Sprintf("removing the model's own half cast (%s) does not remove the overflow: %s", list, f.remains(fix))
	}
	return fix, nil
}

// castsOf returns the model's own half casts the origins' precision comes
// from (an origin that is such a cast included).
func (f *Facts) castsOf(origins []report.Origin) map[int]bool {
	casts := map[int]bool{}
	for _, o := range origins {
		if o.Index < 0 {
			continue
		}
		if f.HalfCasts[o.Index] {
			casts[o.Index] = true
		}
		for _, c := range f.Static.Assign.Casts[o.Value] {
			casts[c] = true
		}
	}
	return casts
}

// heldWithoutCasts reports whether an explicit-cast origin's value would
// still be held in 16 bits with the model's own casts it comes from
// removed: autocast (or the half policy) puts it there too, as with a
// .half() right after a Linear.
func (f *Facts) heldWithoutCasts(o report.Origin) bool {
	if o.Index < 0 {
		return false
	}
	asg := precision.AssignKeepFP32(f.Static.Policy, f.graph(), f.Static.Order, f.Static.Model.Index.ElemType, f.castsOf([]report.Origin{o}))
	p := asg.Value[o.Value]
	return p == precision.FP16 || p == precision.BF16
}

// fixConstant re-runs the emulated pass with the out-of-range constants
// clamped to the format's range, as torch.finfo(x.dtype).min would write.
func (f *Facts) fixConstant(ctx context.Context, run Runner, batches []batch.Batch, origins []report.Origin, before int64) (*report.Fix, error) {
	clamp := map[string]float64{}
	fix := &report.Fix{Kind: report.FixConstant, NonFiniteBefore: before}
	var readers []string
	for _, o := range origins {
		if o.Cause != report.CauseConstant {
			continue
		}
		limit := formatMax(f.Static.Assign.Node[o.Index])
		if limit == 0 {
			limit = formatMax(f.Static.Policy.Lower)
		}
		// The constant may be computed from a source constant (the
		// exporter's Identity of an initializer): clamp at the source.
		clamp[f.constantSource(o.Constant)] = limit
		readers = append(readers, o.Node)
		fix.Nodes = append(fix.Nodes, o.Node)
		if o.Module != "" {
			fix.Modules = append(fix.Modules, o.Module)
		}
	}
	if _, err := f.verify(ctx, run, Rerun{Name: f.Main + "+finfo", Batches: batches, Clamp: clamp}, fix); err != nil {
		return nil, err
	}
	if fix.Works {
		fix.Summary = fmt.Sprintf("with the constants in range (torch.finfo(scores.dtype).min instead of the fixed value, at %s) nothing non-finite reaches the outputs and nothing raises", strings.Join(readers, ", "))
	} else {
		fix.Summary = fmt.Sprintf("constants in range at %s do not remove the NaN/Inf: %s", strings.Join(readers, ", "), f.remains(fix))
	}
	return fix, nil
}

// constantSource follows pass-through nodes from a constant value back to
// the initializer or Constant output it comes from.
func (f *Facts) constantSource(name string) string {
	for range 64 {
		p := f.Static.Model.Index.Producer(name)
		if p < 0 {
			return name
		}
		n := f.graph().Node[p]
		if n.OpType == "Constant" || len(n.Input) == 0 || !passesThrough(n) {
			return name
		}
		name = n.Input[0]
	}
	return name
}

// fixKeepFP32 searches the smallest set of nodes to keep in fp32: it forces
// the current origins to fp32, re-runs, and repeats with the new origins
// until nothing reaches an output or the iteration limit is reached. The
// nodes in seed (the model's own casts, removed) stay in fp32 throughout.
func (f *Facts) fixKeepFP32(ctx context.Context, run Runner, batches []batch.Batch, origins []report.Origin, before int64, seed map[int]bool) (*report.Fix, error) {
	g := f.graph()
	keep := maps.Clone(seed)
	if keep == nil {
		keep = map[int]bool{}
	}
	fix := &report.Fix{Kind: report.FixKeepFP32, NonFiniteBefore: before, NonFiniteAfter: before}
	cur := origins
	asg := f.Static.Assign
	for it := 1; it <= f.Thresholds.FixIterations && len(cur) > 0; it++ {
		grown := false
		for _, o := range cur {
			if o.Index >= 0 && !keep[o.Index] {
				keep[o.Index], grown = true, true
			}
		}
		if !grown && it > 1 {
			// Every origin already computes in fp32 and still fails: what
			// it reads was lost upstream (an epsilon rounded to zero in
			// 16 bits before the kept division). Keep the rest of its
			// module, as the user's module.float() does, and once that is
			// all kept, the 16-bit producers of what the kept nodes read.
			if !f.growKept(keep, cur, asg) {
				break
			}
		}
		asg = precision.AssignKeepFP32(f.Static.Policy, g, f.Static.Order, f.Static.Model.Index.ElemType, keep)
		deciding, err := f.verify(ctx, run, Rerun{Name: fmt.Sprintf("%s+keep-fp32#%d", f.Main, it), Assign: asg, Batches: batches}, fix)
		if err != nil {
			return nil, err
		}
		fix.Iterations = it
		cur = deciding
	}
	f.nameKept(fix, keep, seed)
	if fix.Works {
		fix.Summary = fmt.Sprintf("keeping %s in fp32 removes every overflow (%s)",
			strings.Join(fix.Modules, ", "), f.keepHow("it", "its", "returns"))
		if len(seed) > 0 {
			fix.Summary += ", with the model's own half cast removed"
		}
	} else {
		fix.Summary = fmt.Sprintf("keeping %d node(s) in fp32 does not remove the overflow after %d rerun(s): %s",
			len(fix.Nodes), fix.Iterations, f.remains(fix))
	}
	return fix, nil
}

// keepHow says how a user keeps modules in fp32 under the audited policy:
// under autocast, a region with autocast off fed float32; under
// model.half(), the modules back in float32 (module.float()), their input
// cast up and what they return cast back down where a half layer reads it
// (PyTorch's Linear, Conv and LayerNorm refuse a float32 input beside
// float16 weights). it, its and returns name the modules.
func (f *Facts) keepHow(it, its, returns string) string {
	if f.Static.Policy.ModelHalf() {
		return fmt.Sprintf("call .float() on %s and cast %s input with .float(); cast what %s %s back with .half() where a half Linear, Conv or LayerNorm reads it", it, its, it, returns)
	}
	device := f.AutocastDevice
	if device == "" {
		device = "cuda"
	}
	return fmt.Sprintf("wrap %s in torch.autocast(device_type=%q, enabled=False) and cast %s input with .float()", it, device, its)
}

// growKept adds to keep, for origins that are kept already, the other
// nodes of their modules that asg holds in 16 bits; where those are all
// kept, the nodes held in 16 bits that produce an input of a kept node. It
// reports whether keep grew.
func (f *Facts) growKept(keep map[int]bool, origins []report.Origin, asg *precision.Assignment) bool {
	g := f.graph()
	half := func(ni int) bool {
		p := asg.Node[ni]
		return !keep[ni] && (p == precision.FP16 || p == precision.BF16)
	}
	grown := false
	for _, o := range origins {
		if o.Index < 0 {
			continue
		}
		m := onnx.ModulePath(g.Node[o.Index])
		if m == "" {
			continue
		}
		for _, ni := range f.Static.Order {
			if half(ni) && onnx.ModulePath(g.Node[ni]) == m {
				keep[ni], grown = true, true
			}
		}
	}
	if grown {
		return true
	}
	ix := f.Static.Model.Index
	for _, ni := range sortedKeys(keep) {
		for _, in := range g.Node[ni].Input {
			if pi := ix.Producer(in); pi >= 0 && half(pi) {
				keep[pi], grown = true, true
			}
		}
	}
	return grown
}

// nameKept lists the nodes kept in fp32 (removed casts among them) and
// the modules of those that are not removed casts on a fix.
func (f *Facts) nameKept(fix *report.Fix, keep, removed map[int]bool) {
	g := f.graph()
	mods := map[string]bool{}
	for _, ni := range sortedKeys(keep) {
		if removed[ni] {
			fix.Nodes = append(fix.Nodes, f.nodeName(ni))
			continue
		}
		fix.Nodes = append(fix.Nodes, f.nodeName(ni))
		m := onnx.ModulePath(g.Node[ni])
		if m == "" {
			m = f.nodeName(ni)
		}
		if !mods[m] {
			mods[m] = true
			fix.Modules = append(fix.Modules, m)
		}
	}
}

// fixKeepRegion keeps in fp32 the region where a pass's values drift from
// fp32's, when nothing overflows (underflow, rounding): the nodes from the
// origin on, in topological order, held in reduced precision, whose
// values differ from fp32's beyond the tolerance or flush to zero. The
// reruns grow the region (the first node, then twice as many each time,
// then all of it) until the outputs agree; a fix that does not work says
// how far it got.
func (f *Facts) fixKeepRegion(ctx context.Context, run Runner, batches []batch.Batch, o report.Origin, before int64) (*report.Fix, error) {
	region := f.driftRegion(o)
	fix := &report.Fix{Kind: report.FixKeepFP32, NonFiniteBefore: before, NonFiniteAfter: before}
	var keep map[int]bool
	for it, n := 1, 1; it <= f.Thresholds.FixIterations; it++ {
		n = min(n, len(region))
		if it == f.Thresholds.FixIterations {
			n = len(region) // the last rerun tries all of it
		}
		keep = map[int]bool{}
		for _, ni := range region[:n] {
			keep[ni] = true
		}
		asg := precision.AssignKeepFP32(f.Static.Policy, f.graph(), f.Static.Order, f.Static.Model.Index.ElemType, keep)
		if _, err := f.verify(ctx, run, Rerun{Name: fmt.Sprintf("%s+keep-fp32#%d", f.Main, it), Assign: asg, Batches: batches}, fix); err != nil {
			return nil, err
		}
		fix.Iterations = it
		if fix.Works || n == len(region) {
			break
		}
		n *= 2
	}
	f.nameKept(fix, keep, nil)
	if fix.Works {
		fix.Summary = fmt.Sprintf("keeping %d node(s) in fp32 (%s) brings the outputs back within the tolerance (%s)",
			len(fix.Nodes), strings.Join(limitList(fix.Modules, 8), ", "), f.keepHow("them", "their", "return"))
	} else {
		fix.Summary = fmt.Sprintf("keeping %d of the %d drifting node(s) in fp32 (%s) does not bring the outputs back after %d rerun(s): %s",
			len(fix.Nodes), len(region), strings.Join(limitList(fix.Modules, 8), ", "), fix.Iterations, f.remains(fix))
	}
	return fix, nil
}

// driftRegion lists the nodes, in topological order from o's on, held in
// reduced precision in the main pass whose outputs differ from fp32's
// beyond the tolerance or lose some of their nonzero values to zero.
func (f *Facts) driftRegion(o report.Origin) []int {
	res := f.Passes[f.Main]
	tol := f.tolerance(f.Main)
	asg := f.Static.Assign
	var out []int
	started := false
	for _, ni := range f.Static.Order {
		started = started || ni == o.Index
		if !started {
			continue
		}
		if p := asg.Node[ni]; p != precision.FP16 && p != precision.BF16 {
			continue
		}
		for _, v := range f.graph().Node[ni].Output {
			d, ok := res.Diffs[v]
			if !ok {
				continue
			}
			if e := d.RelErr(); ni == o.Index || d.Flushed > 0 || (!math.IsNaN(e) && e > tol) {
				out = append(out, ni)
				break
			}
		}
	}
	if len(out) == 0 && o.Index >= 0 {
		out = []int{o.Index}
	}
	return out
}

// underflows reports whether a precision origin's values are lost below
// the format's range rather than to its rounding: their fp32 magnitude
// stays under the smallest normal, or more of them flush to zero than
// --underflow-fraction allows.
func (f *Facts) underflows(o report.Origin) bool {
	if o.FP32MaxAbs > 0 && o.FP32MaxAbs < smallestNormal(f.passFormat(f.Main)) {
		return true
	}
	d := f.Passes[f.Main].Diffs[o.Value]
	return d != nil && d.FlushedFraction() > f.Thresholds.UnderflowFraction
}

// smallestNormal is the smallest positive normal number of a format.
func smallestNormal(p precision.Precision) float64 {
	if p == precision.BF16 {
		return 0x1p-126
	}
	return 0x1p-14
}

// untrainedNote says, when the fp32 outputs themselves are below fp16's
// smallest normal, that activations decaying like this are what an
// untrained network does; "" otherwise.
func (f *Facts) untrainedNote() string {
	ref := f.Passes[PassFP32]
	largest := 0.0
	for _, vi := range f.graph().Output {
		if s, ok := ref.Stats[vi.Name]; ok && s.Finite > 0 {
			largest = max(largest, float64(s.MaxAbs))
		}
	}
	if largest == 0 || largest >= smallestNormal(precision.FP16) {
		return ""
	}
	return fmt.Sprintf("the fp32 outputs themselves are tiny (max |x| %.3g, below fp16's smallest normal 6.1e-05): activations that shrink layer by layer like this are what an untrained network does (torchvision's models as constructed keep BatchNorm at its initial statistics); audit the trained weights, or calibrate BatchNorm on real batches, before changing the precision", largest)
}
