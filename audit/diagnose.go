package audit

import (
	"context"
	"fmt"
	"fp16audit/checks"
	"math"
	"sort"
	"strings"

	"fp16audit/internal/precision"
	"fp16audit/internal/tensor"
)

const fp16Max = 65504

func isInfOrNaN(x float64) bool { return math.IsInf(x, 0) || math.IsNaN(x) }

// inputAnalysis is what the input checks learned about one graph input.
type inputAnalysis struct {
	kind      string
	chans     []channelAcc
	stats     Stats
	rawPixels bool
	flagged   bool // raw pixels, unscaled columns or beyond the fp16 range
}

func (a *audit) analyzeInputs() []inputAnalysis {
	out := make([]inputAnalysis, len(a.specs))
	for i := range a.specs {
		ia := &out[i]
		ia.stats = NewStats()
		ia.kind, ia.chans = analyzeInput(a.batches, i, &ia.stats)
	}
	return out
}

// inputReports summarises every graph input and runs the input checks.
func (a *audit) inputReports() []InputReport {
	th := a.cfg.Thresholds
	an := a.analyzeInputs()
	a.inputs = an
	reports := make([]InputReport, len(a.specs))
	for i, spec := range a.specs {
		ia := &an[i]
		var first *tensor.Tensor
		if len(a.batches) > 0 {
			first = a.batches[0].Inputs[i]
		}
		ir := InputReport{ValueReport: ValueReport{Name: spec.Name, Stats: map[string]StatsReport{}}, Kind: ia.kind}
		if first != nil {
			ir.DType, ir.Shape = first.DType.String(), tensor.ShapeString(first.Shape)
		}
		if ia.kind == KindInteger {
			reports[i] = ir
			continue
		}
		ir.Stats["fp32"] = statsReport(ia.stats)
		integral := true
		minAll, maxAll := math.Inf(1), math.Inf(-1)
		for c := range ia.chans {
			ch := &ia.chans[c]
			cr := ChannelReport{Index: c, Mean: ch.mean(), Std: ch.std(), Min: ch.min, Max: ch.max}
			if ia.kind == KindTabular && (math.Abs(cr.Mean) > th.ColumnScale || cr.Std > th.ColumnScale) {
				cr.Flagged = true
			}
			ir.Channels = append(ir.Channels, cr)
			if ch.nonIntegral > 0 {
				integral = false
			}
			if ch.n > 0 {
				minAll = math.Min(minAll, ch.min)
				maxAll = math.Max(maxAll, ch.max)
			}
		}
		s := ia.stats
		if s.NonFinite() > 0 {
			a.add(checkPoisonedInput.Finding(fmt.Sprintf("input %q holds %d NaN, %d +Inf and %d -Inf values (of %d)",
				spec.Name, s.NaN, s.PosInf, s.NegInf, s.Count)), "", spec.Name)
		}
		if s.MaxAbs > fp16Max {
			ia.flagged = true
			a.add(checkInputRange.Finding(fmt.Sprintf("input %q reaches |x| = %.4g, beyond fp16's 65504 (%d values): its fp16 cast is Inf",
				spec.Name, s.MaxAbs, s.AboveFP16Max)), "", spec.Name)
		}
		if ia.kind == KindImage && integral && minAll >= 0 && maxAll <= 255 && maxAll > 1 {
			ia.rawPixels, ir.RawPixels, ia.flagged = true, true, true
			a.add(checkRawPixels.Finding(fmt.Sprintf("input %q looks like raw pixels: integer values in [%g, %g], per-channel mean %s",
				spec.Name, minAll, maxAll, formatList(channelMeans(ia.chans), 1))), "", spec.Name)
		}
		if ia.kind == KindTabular {
			var cols []string
			for _, cr := range ir.Channels {
				if cr.Flagged {
					cols = append(cols, fmt.Sprintf("%d (mean %.3g, std %.3g)", cr.Index, cr.Mean, cr.Std))
				}
			}
			if len(cols) > 0 {
				ia.flagged = true
				a.add(checkUnscaledColumns.Finding(fmt.Sprintf("input %q has %d column(s) far from standardized: %s",
					spec.Name, len(cols), strings.Join(limitList(cols, 8), ", "))), "", spec.Name)
			}
		}
		reports[i] = ir
	}
	return reports
}

func channelMeans(chans []channelAcc) []float64 {
	out := make([]float64, len(chans))
	for i := range chans {
		out[i] = chans[i].mean()
	}
	return out
}

func formatList(xs []float64, prec int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.*f", prec, x)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// add appends a finding for a node (by index, or -1) or a named value.
func (a *audit) add(f checks.Finding, node string, value string) {
	if node != "" {
		f.Node = node
	}
	if value != "" {
		f.Value = value
	}
	a.report.Findings = append(a.report.Findings, f)
}

func (a *audit) nodeFinding(c *checks.Check, ni int, value, pass, msg string) {
	n := a.model.Proto.Graph.Node[ni]
	f := c.Finding(msg)
	f.Node, f.Module, f.Value, f.Pass = a.nodeName(ni), precision.ModulePath(n), value, pass
	a.report.Findings = append(a.report.Findings, f)
}

// origins finds the origins of non-finite values in one pass's results.
func (a *audit) origins(pass string, res *passResult) []Origin {
	g := a.model.Proto.Graph
	idx := a.model.Index
	var out []Origin
	for _, o := range findOrigins(g, a.order, res, idx.Consumers) {
		n := g.Node[o.node]
		or := Origin{Pass: pass, Node: a.nodeName(o.node), Index: o.node, OpType: n.OpType,
			Module: precision.ModulePath(n), Precision: a.assign.Node[o.node].String(),
			ExplicitCast: a.halfCast[o.node], Affected: []string{}, AffectedOutputs: o.outputs}
		if pass == "fp32" {
			or.Precision = "fp32"
		}
		for _, v := range n.Output {
			if s, ok := res.Stats[v]; ok && s.NonFinite() > 0 {
				or.Value, or.NonFinite = v, s.NonFinite()
				if ref, ok := a.passes["fp32"].Stats[v]; ok {
					or.FP32MaxAbs = float64(ref.MaxAbs)
					if h := ref.HeadroomBits(); !isInfOrNaN(h) {
						or.HeadroomBits = &h
					}
				}
				break
			}
		}
		for _, ni := range o.affected {
			or.Affected = append(or.Affected, a.nodeName(ni))
		}
		if or.AffectedOutputs == nil {
			or.AffectedOutputs = []string{}
		}
		out = append(out, or)
	}
	return out
}

// tailOps may follow the final layer without making it an inner layer:
// shape ops, activations, softmax, casts and the Linear bias.
var tailOps = map[string]bool{
	"Reshape": true, "Flatten": true, "Squeeze": true, "Unsqueeze": true, "Transpose": true,
	"Identity": true, "Dropout": true, "Cast": true, "Relu": true, "LeakyRelu": true,
	"Sigmoid": true, "Tanh": true, "Softmax": true, "LogSoftmax": true, "Gelu": true,
	"Clip": true, "Add": true,
}

// isFinalLayer reports whether node ni is the last lower-precision op before
// a graph output: every path from its outputs reaches a graph output through
// tail ops only.
func (a *audit) isFinalLayer(ni int) bool {
	g := a.model.Proto.Graph
	n := g.Node[ni]
	if cat, _ := a.policy.Category(n.Domain, n.OpType); cat != precision.LowerPrecision {
		return false
	}
	isOut := map[string]bool{}
	for _, o := range g.Output {
		isOut[o.Name] = true
	}
	reached := false
	seen := map[int]bool{}
	var walk func(values []string) bool
	walk = func(values []string) bool {
		for _, v := range values {
			if isOut[v] {
				reached = true
			}
			for _, c := range a.model.Index.Consumers(v) {
				if seen[c] {
					continue
				}
				seen[c] = true
				if !tailOps[g.Node[c].OpType] {
					return false
				}
				if !walk(g.Node[c].Output) {
					return false
				}
			}
		}
		return true
	}
	return walk(n.Output) && reached
}

// nonFiniteTotal counts non-finite elements over all node outputs of a pass.
func (a *audit) nonFiniteTotal(res *passResult) int64 {
	var t int64
	for _, v := range a.names {
		if s, ok := res.Stats[v]; ok {
			t += s.NonFinite()
		}
	}
	return t
}

// diagnose runs the checks on the pass results, walks the verdict tree and
// verifies the fixes.
func (a *audit) diagnose(ctx context.Context) error {
	r := a.report
	if len(a.assign.Unknown) > 0 {
		var labels []string
		for _, ni := range a.assign.Unknown {
			labels = append(labels, a.nodeName(ni))
		}
		a.add(checkUnknownOps.Finding(fmt.Sprintf("%d node(s) of unknown precision, emulated as following their inputs: %s",
			len(labels), strings.Join(limitList(labels, 10), ", "))), "", "")
	}
	poisoned := false
	for _, ia := range a.inputs {
		if ia.stats.NonFinite() > 0 {
			poisoned = true
		}
	}
	fp32Origins := a.origins("fp32", a.passes["fp32"])
	for _, o := range fp32Origins {
		a.nodeFinding(checkFP32Broken, o.Index, o.Value, "fp32", fmt.Sprintf("%s %s produces %d NaN/Inf values in fp32 from finite inputs; %d downstream node(s) affected, graph outputs reached: %s",
			o.OpType, o.Node, o.NonFinite, len(o.Affected), listOrNone(o.AffectedOutputs)))
	}
	switch {
	case poisoned:
		r.Verdict = VerdictPoisoned
		r.VerdictText = "the batch already holds NaN/Inf: clean the data before looking at precision"
		r.Origins = fp32Origins
		return nil
	case len(fp32Origins) > 0:
		r.Verdict = VerdictFP32Broken
		r.VerdictText = fmt.Sprintf("the model produces NaN/Inf even in fp32, first at %s (%s): fix the model or data first", fp32Origins[0].Node, fp32Origins[0].OpType)
		r.Origins = fp32Origins
		return nil
	}
	if a.mainRun == "" {
		r.Verdict, r.VerdictText = VerdictHealthy, "the fp32 pass is clean (policy fp32: no emulated pass)"
		return nil
	}
	main := a.passes[a.mainRun]
	origins := a.origins(a.mainRun, main)
	r.Origins = origins
	if len(origins) == 0 {
		a.healthyWarnings(main)
		r.Verdict = VerdictHealthy
		r.VerdictText = fmt.Sprintf("no NaN/Inf in the %s pass", a.mainRun)
		if r.Summary.MinHeadroomBits != nil {
			r.VerdictText += fmt.Sprintf("; smallest headroom %.1f bits", *r.Summary.MinHeadroomBits)
		}
		return nil
	}
	before := a.nonFiniteTotal(main)

	explicit := false
	finalOnly := true
	for _, o := range origins {
		switch {
		case o.ExplicitCast:
			explicit = true
			a.nodeFinding(checkHalfCast, o.Index, o.Value, a.mainRun, fmt.Sprintf("the model's own Cast to half at %s overflows: fp32 max |x| %.4g > 65504", moduleOr(o), o.FP32MaxAbs))
		case a.isFinalLayer(o.Index):
			a.nodeFinding(checkLogits, o.Index, o.Value, a.mainRun, fmt.Sprintf("final layer %s (%s) outputs fp32 max |x| %.4g > 65504: Inf in %s, reaching %s",
				moduleOr(o), o.OpType, o.FP32MaxAbs, a.mainRun, strings.Join(o.AffectedOutputs, ", ")))
		default:
			finalOnly = false
			a.nodeFinding(checkOverflow, o.Index, o.Value, a.mainRun, fmt.Sprintf("%s (%s, %s) overflows in %s: fp32 max |x| %.4g > 65504; %d downstream node(s) non-finite",
				moduleOr(o), o.OpType, o.Node, a.mainRun, o.FP32MaxAbs, len(o.Affected)))
		}
		if o.ExplicitCast {
			finalOnly = false
		}
	}

	// Fixes, each verified by a rerun.
	inputsFlagged := false
	for _, ia := range a.inputs {
		inputsFlagged = inputsFlagged || ia.flagged
	}
	var stdFix *Fix
	if !a.cfg.NoFixes && inputsFlagged {
		f, err := a.fixStandardize(ctx, before)
		if err != nil {
			return err
		}
		stdFix = f
		r.Fixes = append(r.Fixes, *f)
	}
	if bf, ok := a.passes["bf16"]; ok {
		after := a.nonFiniteTotal(bf)
		f := Fix{Kind: FixBF16, Works: after == 0, NonFiniteBefore: before, NonFiniteAfter: after}
		if f.Works {
			f.Summary = "learn.to_bf16() removes every overflow (needs an Ampere or newer GPU)"
		} else {
			f.Summary = fmt.Sprintf("learn.to_bf16() does not remove the overflow: %d non-finite values remain in the bf16 pass", after)
		}
		r.Fixes = append(r.Fixes, f)
	}
	if !a.cfg.NoFixes {
		f, err := a.fixKeepFP32(ctx, origins, before)
		if err != nil {
			return err
		}
		r.Fixes = append(r.Fixes, *f)
	}

	switch {
	case explicit:
		r.Verdict = VerdictHalfCast
		r.VerdictText = "the model casts to half precision itself and overflows there; autocast cannot protect an explicit cast"
	case stdFix != nil && stdFix.Works:
		r.Verdict = VerdictUnnormalized
		r.VerdictText = "the inputs are not normalized; with standardized inputs the fp16 pass is clean"
	case finalOnly:
		r.Verdict = VerdictLogits
		r.VerdictText = fmt.Sprintf("the final layer %s outputs values beyond fp16's range (fp32 max |x| %.4g)", moduleOr(origins[0]), origins[0].FP32MaxAbs)
	default:
		r.Verdict = VerdictOverflow
		r.VerdictText = fmt.Sprintf("%s (%s) overflows fp16 on normalized inputs (fp32 max |x| %.4g)", moduleOr(origins[0]), origins[0].OpType, origins[0].FP32MaxAbs)
	}
	return nil
}

// moduleOr names an origin by module path, else by node name.
func moduleOr(o Origin) string {
	if o.Module != "" {
		return o.Module
	}
	return o.Node
}

// healthyWarnings adds the headroom and underflow warnings of a clean pass.
func (a *audit) healthyWarnings(main *passResult) {
	th := a.cfg.Thresholds
	g := a.model.Proto.Graph
	type warn struct {
		ni   int
		v    string
		bits float64
	}
	var low []warn
	for _, ni := range a.order {
		for _, v := range g.Node[ni].Output {
			p := a.assign.Value[v]
			if p != precision.FP16 && p != precision.BF16 {
				continue
			}
			ref, ok := a.passes["fp32"].Stats[v]
			if !ok {
				continue
			}
			if h := ref.HeadroomBits(); p == precision.FP16 && h < th.HeadroomBits {
				low = append(low, warn{ni, v, h})
			}
			if d := main.Diffs[v]; d != nil && d.NonzeroRef >= 16 && d.FlushedFraction() > th.UnderflowFraction {
				a.nodeFinding(checkUnderflow, ni, v, a.mainRun, fmt.Sprintf("%.0f%% of the nonzero values of %q become 0 in %s (smallest nonzero |x| %.3g)",
					100*d.FlushedFraction(), v, a.mainRun, ref.MinNonzero))
			}
		}
	}
	sort.SliceStable(low, func(i, j int) bool { return low[i].bits < low[j].bits })
	for k, w := range low {
		if k == 20 {
			a.report.Notes = append(a.report.Notes, fmt.Sprintf("%d more value(s) with headroom under %.1f bits are not listed", len(low)-20, th.HeadroomBits))
			break
		}
		ref := a.passes["fp32"].Stats[w.v]
		a.nodeFinding(checkHeadroom, w.ni, w.v, "fp32", fmt.Sprintf("%q reaches fp32 max |x| %.4g: %.1f bits below fp16's 65504", w.v, ref.MaxAbs, w.bits))
	}
}

// fixStandardize re-runs the emulated pass with every float input
// standardized per channel (images) or column (tables).
func (a *audit) fixStandardize(ctx context.Context, before int64) (*Fix, error) {
	batches := a.batches
	fix := &Fix{Kind: FixStandardize, NonFiniteBefore: before}
	for i, ia := range a.inputs {
		if ia.kind == KindInteger || len(ia.chans) == 0 {
			continue
		}
		var err error
		if batches, err = standardize(batches, i, ia.kind, ia.chans); err != nil {
			return nil, err
		}
		ns := NormalizeStats{Input: a.specs[i].Name}
		scale := 1.0
		if ia.rawPixels {
			scale = 255
		}
		for c := range ia.chans {
			ns.Mean = append(ns.Mean, ia.chans[c].mean())
			ns.Std = append(ns.Std, ia.chans[c].std())
		}
		fm, fs := make([]float64, len(ns.Mean)), make([]float64, len(ns.Std))
		for c := range ns.Mean {
			fm[c], fs[c] = ns.Mean[c]/scale, ns.Std[c]/scale
		}
		ns.Fastai = fmt.Sprintf("Normalize.from_stats(%s, %s)", formatList(fm, 4), formatList(fs, 4))
		fix.Normalize = append(fix.Normalize, ns)
	}
	res, err := a.rerun(ctx, a.mainRun+"+standardized", Emulate(a.up, a.model.Proto.Graph, a.assign), batches)
	if err != nil {
		return nil, err
	}
	fix.NonFiniteAfter = a.nonFiniteTotal(res)
	fix.Works = fix.NonFiniteAfter == 0
	if fix.Works {
		fix.Summary = "standardized inputs remove every overflow; add " + fix.Normalize[0].Fastai + " to the DataLoaders' batch_tfms"
	} else {
		fix.Summary = fmt.Sprintf("standardized inputs do not remove the overflow: %d non-finite values remain", fix.NonFiniteAfter)
	}
	return fix, nil
}

// fixKeepFP32 searches the smallest set of nodes to keep in fp32: it forces
// the current origins to fp32, re-runs, and repeats with the new origins
// until the pass is clean or the iteration limit is reached.
func (a *audit) fixKeepFP32(ctx context.Context, origins []Origin, before int64) (*Fix, error) {
	g := a.model.Proto.Graph
	keep := map[int]bool{}
	fix := &Fix{Kind: FixKeepFP32, NonFiniteBefore: before, NonFiniteAfter: before}
	cur := origins
	for it := 1; it <= a.cfg.Thresholds.FixIterations && len(cur) > 0; it++ {
		for _, o := range cur {
			keep[o.Index] = true
		}
		asg := precision.AssignKeepFP32(a.policy, g, a.order, a.model.Index.ElemType, keep)
		res, err := a.rerun(ctx, fmt.Sprintf("%s+keep-fp32#%d", a.mainRun, it), Emulate(a.up, g, asg), a.batches)
		if err != nil {
			return nil, err
		}
		fix.Iterations = it
		fix.NonFiniteAfter = a.nonFiniteTotal(res)
		saved := a.assign
		a.assign = asg
		cur = a.origins(a.mainRun, res)
		a.assign = saved
	}
	var nodes []int
	for ni := range keep {
		nodes = append(nodes, ni)
	}
	sort.Ints(nodes)
	mods := map[string]bool{}
	for _, ni := range nodes {
		fix.Nodes = append(fix.Nodes, a.nodeName(ni))
		m := precision.ModulePath(g.Node[ni])
		if m == "" {
			m = a.nodeName(ni)
		}
		if !mods[m] {
			mods[m] = true
			fix.Modules = append(fix.Modules, m)
		}
	}
	fix.Works = fix.NonFiniteAfter == 0
	var casts []string
	for _, ni := range nodes {
		if a.halfCast[ni] {
			casts = append(casts, a.nodeName(ni))
		}
	}
	switch {
	case fix.Works && len(casts) > 0:
		fix.Summary = fmt.Sprintf("without the model's own half cast (%s: remove the .half()/.to(torch.float16) in forward, or scale before it) every overflow is gone",
			strings.Join(casts, ", "))
		if len(casts) < len(nodes) {
			fix.Summary += fmt.Sprintf("; also keep %s in fp32", strings.Join(fix.Modules, ", "))
		}
	case fix.Works:
		fix.Summary = fmt.Sprintf("keeping %s in fp32 removes every overflow (wrap in torch.autocast(device_type=\"cuda\", enabled=False) and cast its input with .float())",
			strings.Join(fix.Modules, ", "))
	default:
		fix.Summary = fmt.Sprintf("keeping %d node(s) in fp32 does not remove the overflow after %d rerun(s): %d non-finite values remain",
			len(fix.Nodes), fix.Iterations, fix.NonFiniteAfter)
	}
	return fix, nil
}

// nodeName is how reports name node ni: its ONNX name, or op_type#index
// when the model leaves it unnamed.
func (a *audit) nodeName(ni int) string {
	n := a.model.Proto.Graph.Node[ni]
	if n.Name != "" {
		return n.Name
	}
	return fmt.Sprintf("%s#%d", n.OpType, ni)
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
