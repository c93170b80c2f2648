package training

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/grad"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
	"fp16audit/report"
)

func onnx2name(f *Facts, i int) string { return onnx.NodeName(f.Model.Proto.Graph, i) }

func modulePath(n *onnx.NodeProto) string { return onnx.ModulePath(n) }

// batchNorms describes every BatchNormalization node: the statistics it
// ran with, what its running statistics look like and, from the fp32
// pass, the RMS of its input against the RMS they expect.
func (f *Facts) batchNorms() []report.BatchNormReport {
	g := f.Model.Proto.Graph
	ix := f.Model.Index
	var out []report.BatchNormReport
	// An earlier BatchNorm with untrained statistics leaves the inputs of
	// those after it, in this eval-mode pass, unlike what the export saw:
	// their own data cannot be held against the one-step story.
	earlier := false
	for _, i := range ix.Order() {
		n := g.Node[i]
		if n.OpType != "BatchNormalization" || !onnx.IsDefaultDomain(n.Domain) || len(n.Input) < 5 {
			continue
		}
		bn := report.BatchNormReport{Node: onnx.NodeName(g, i), Module: onnx.ModulePath(n), Statistics: "running",
			Switched: slices.Contains(f.Changes.Switched, i)}
		if (onnx.IntAttr(n, "training_mode", 0) != 0) || len(n.Output) > 1 {
			bn.Statistics = "batch"
		}
		if f.FP32 != nil {
			if st, ok := f.FP32.Stats[n.Input[0]]; ok && st.Finite > 0 {
				bn.InputRMS = math.Sqrt(st.SumSq / float64(st.Finite))
			}
		}
		mean, errM := rewrite.ConstantThroughIdentity(ix, n.Input[3])
		vr, errV := rewrite.ConstantThroughIdentity(ix, n.Input[4])
		if errM == nil && errV == nil {
			m, _ := mean.Float32s()
			v, _ := vr.Float32s()
			if len(m) == len(v) && len(m) > 0 {
				momentum := float64(onnx.FloatAttr(n, "momentum", 0.9))
				defaults := true
				var ms float64
				for c := range m {
					defaults = defaults && math.Abs(float64(m[c])) <= 1e-6 && math.Abs(float64(v[c])-1) <= 1e-6
					ms += float64(v[c]) + float64(m[c])*float64(m[c])
				}
				switch {
				case defaults:
					bn.RunningStats = "defaults"
				case oneStep(m, v, momentum, bn.InputRMS, earlier):
					bn.RunningStats = "one-step"
				default:
					bn.RunningStats = "trained"
				}
				bn.RunningRMS = math.Sqrt(ms / float64(len(m)))
				earlier = earlier || bn.RunningStats != "trained"
			}
		}
		out = append(out, bn)
	}
	return out
}

// oneStep reports whether running statistics mean and variance are one
// update away from the defaults (mean 0, variance 1) by a batch like the
// audited one, what a training-mode export of an untrained model stores
// (the export runs the model once in train mode). ONNX's momentum m is
// PyTorch's 1 - p: one update leaves mean_c = p·μ_c and variance_c =
// m + p·σ²_c, so every variance is at least m, and the mean square of the
// batch that made them, which the audited batch's (inputRMS) should
// resemble, is mean(variance_c - m) + mean(mean_c²)/p over p. A trained
// BatchNorm whose variances all pass m (a stem fed pixel-scale data) fails
// that unless its batch happens to fit, and with PyTorch's momentum 0 (ONNX
// 1, a frozen or pretrained BatchNorm) no update moves the defaults at all.
// After an earlier untrained BatchNorm (earlier) the input this pass gives
// is not the export's, and the variances alone decide.
func oneStep(mean, variance []float32, momentum, inputRMS float64, earlier bool) bool {
	p := 1 - momentum
	if p <= 1e-6 || (inputRMS <= 0 && !earlier) {
		return false
	}
	var excess, sq float64
	for c := range variance {
		if float64(variance[c]) < momentum-1e-6 {
			return false
		}
		excess += float64(variance[c]) - momentum
		sq += float64(mean[c]) * float64(mean[c])
	}
	if earlier {
		return true
	}
	n := float64(len(variance))
	implied := (excess/n + sq/n/p) / p
	if implied <= 0 {
		return false
	}
	// within a factor of 2 of the audited batch's mean square: the batch
	// the export ran need not be this one, but one of its kind
	r := inputRMS * inputRMS / implied
	return r >= 0.5 && r <= 2
}

// Run runs the training analyzers that sel enables, verifies the bf16 fix
// through run when the verdict calls for it (ctx ending stops that run), and returns the training
// report and its findings. The report is nil when it has nothing to say:
// an eval-mode audit without a loss of a model with no BatchNormalization
// or Dropout node and no note.
func Run(ctx context.Context, f *Facts, run Runner, sel checks.Selection) (*report.TrainingReport, []checks.Finding, error) {
	findings, err := checks.RunAnalyzers(Analyzers(), f, sel, f.Policy.Name)
	if err != nil {
		return nil, nil, err
	}
	tr := &report.TrainingReport{Schema: report.TrainingSchema, Mode: f.Mode, BatchNorms: f.batchNorms(), Dropouts: len(f.Changes.Dropouts), Notes: []string{}}
	if tr.BatchNorms == nil {
		tr.BatchNorms = []report.BatchNormReport{}
	}
	if f.Mode == rewrite.ModeTrain {
		tr.DropoutSeed = f.Seed
	}
	tr.Notes = f.modeNotes()
	if f.Backward != nil {
		br, err := f.backwardReport(ctx, findings, run)
		if err != nil {
			return nil, nil, err
		}
		tr.Backward = br
	}
	if tr.Mode == rewrite.ModeEval && len(tr.BatchNorms) == 0 && tr.Dropouts == 0 && len(tr.Notes) == 0 && tr.Backward == nil {
		return nil, findings, nil
	}
	return tr, findings, nil
}

// modeNotes says what the mode rewrite could not do.
func (f *Facts) modeNotes() []string {
	notes := []string{}
	g := f.Model.Proto.Graph
	var kept []string
	for _, i := range f.Changes.Kept {
		kept = append(kept, fmt.Sprintf("%s (%s)", onnx.NodeName(g, i), g.Node[i].OpType))
	}
	if len(kept) > 0 {
		notes = append(notes, fmt.Sprintf("%d node(s) could not be switched to %s mode and run as exported: %s (a Dropout before opset 12 has no training mode; a BatchNormalization whose updated statistics the graph reads stays a training step)",
			len(kept), f.Mode, strings.Join(limit(kept, 6), ", ")))
	}
	if convs := f.foldedConvs(); len(convs) > 0 && f.Mode == rewrite.ModeEval {
		how := "export with training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False"
		if onnx.FromDynamo(g) {
			// torch 2.9.1's dynamo exporter folds them whatever the mode
			how = "export with dynamo=False, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False (the dynamo exporter folds BatchNorm even in train() mode)"
		}
		notes = append(notes, fmt.Sprintf("%d %s node(s) carry a BatchNorm folded in by an eval-mode export: this eval-mode audit normalizes with its running statistics (the identity for an untrained model), training with each batch's; to audit training, %s and run --mode train", len(convs), layerOps(g, convs), how))
	}
	if f.Mode == rewrite.ModeTrain && len(f.Changes.Dropouts) > 0 {
		notes = append(notes, fmt.Sprintf("%d Dropout node(s) drop as in training: the forward passes with ONNX Runtime's generator seeded %d, the backward's runs with one mask per node drawn once for all of them (not PyTorch's masks)", len(f.Changes.Dropouts), f.Seed))
	}
	return notes
}

// backwardReport assembles the backward audit from the facts and the
// findings: the verdict follows the findings, so a check switched off
// cannot decide it.
func (f *Facts) backwardReport(ctx context.Context, findings []checks.Finding, run Runner) (*report.BackwardReport, error) {
	b := f.Backward
	t := f.gradients()
	br := &report.BackwardReport{
		Loss: string(b.Loss), Output: b.Output, Target: b.Target, Batch: b.Batch,
		InitScale: math.Ldexp(1, b.InitExp), InitExp: b.InitExp, MinExp: b.MinExp, MaxExp: b.MaxExp,
		Tolerance: b.Tolerance, OutputPrecision: precOf(f.Assign.Value[b.Output]),
		Underflowing: []string{}, Scales: []report.ScaleReport{}, Modules: []report.ModuleGradientReport{},
		Parameters: []report.ParameterReport{}, Gradients: []report.GradientReport{}, FP32NonFinite: []string{},
		Unsupported: []report.UnsupportedOp{}, Fixes: []report.Fix{}, Runs: b.Count, ElapsedSecs: b.Elapsed,
	}
	if ce := b.Res.CrossEntropy; ce != nil {
		br.CrossEntropy = &report.CrossEntropyReport{ClassAxis: ce.ClassAxis, Classes: ce.Classes, IgnoreIndex: ce.IgnoreIndex,
			LMShift: ce.Shift, Scored: b.Scored, Targets: b.Targets}
	}
	for _, u := range b.Res.Unsupported {
		br.Unsupported = append(br.Unsupported, report.UnsupportedOp{Node: u.Name, OpType: u.OpType, Reason: u.Reason})
	}
	if b.FP32 == nil {
		f.verdict(br, findings)
		return br, nil
	}
	br.LossValue = finite(b.FP32.Loss)
	for _, e := range t.entries {
		if !e.site && e.value == b.Output {
			if m := e.mass(b.FP32); m != nil && m.NonFinite == 0 {
				br.SeedMaxAbs = ptr(m.Max)
			}
		}
	}
	if f.fp32Broken() {
		for _, v := range f.fp32NonFinite() {
			br.FP32NonFinite = append(br.FP32NonFinite, v.value)
		}
	}
	s := f.scales()
	br.MaxCleanExp, br.SettledExp, br.CleanFromExp = s.maxClean, s.settled, s.cleanFrom
	if s.cleanFrom != nil {
		br.Window = &report.ScaleWindow{From: *s.cleanFrom, To: *s.maxClean}
	}
	settled := b.InitExp
	if s.settled != nil {
		settled = *s.settled
		br.SkippedSteps = b.InitExp - settled
		l, k := f.worst(settled)
		if k >= 0 {
			br.LostMass, br.WorstParameter = ptr(l), t.params[k].name()
		}
		idx, lost := f.losing(settled)
		_, br.Underflowing = f.lossText(idx, lost)
		if br.Underflowing == nil {
			br.Underflowing = []string{}
		}
	}
	if f.ready() {
		br.Scales = f.scaleRows(s)
	}
	if over, k := f.overflow(b.InitExp); f.ready() && over && k >= 0 {
		gr := f.gradientReport(t.entries[k], settled)
		br.FirstOverflow = &gr
	}
	mods := map[string]int{}
	module := func(label string) *report.ModuleGradientReport {
		k, ok := mods[label]
		if !ok {
			k = len(br.Modules)
			mods[label] = k
			br.Modules = append(br.Modules, report.ModuleGradientReport{Module: label})
		}
		return &br.Modules[k]
	}
	held := map[string]*grad.Mass{}
	formats := map[string]grad.Format{}
	for _, e := range t.entries {
		gr := f.gradientReport(e, settled)
		br.Gradients = append(br.Gradients, gr)
		m := module(e.label())
		m.Gradients++
		if gr.MaxCleanExp != nil && (m.MaxCleanExp == nil || *gr.MaxCleanExp < *m.MaxCleanExp) {
			m.MaxCleanExp = gr.MaxCleanExp
		}
		if x := e.mass(b.FP32); x != nil {
			if held[e.label()] == nil {
				held[e.label()] = &grad.Mass{}
				formats[e.label()] = e.format
			}
			held[e.label()].Add(x)
		}
	}
	for k, p := range t.params {
		pr := report.ParameterReport{Name: p.value, Module: p.module}
		if g, ok := b.FP32.Params[p.value]; ok {
			var ss float64
			for _, v := range g {
				ss += float64(v) * float64(v)
			}
			pr.Norm = math.Sqrt(ss)
		}
		pr.Noise = f.noise(k)
		if s.settled != nil {
			l, measured := f.lost(k, settled)
			pr.LostMass, pr.Measured = finite(l), measured
		}
		br.Parameters = append(br.Parameters, pr)
		m := module(p.label())
		m.Parameters++
		if pr.LostMass != nil && !pr.Noise && (m.LostMass == nil || *pr.LostMass > *m.LostMass) {
			m.LostMass = pr.LostMass
		}
	}
	for i := range br.Modules {
		m := &br.Modules[i]
		if x := held[m.Module]; x != nil {
			if lo, hi, ok := x.Range(); ok {
				m.Log2Min, m.Log2Max = ptr(lo), ptr(hi)
			}
			m.HeldLost = x.Lost(settled, formats[m.Module])
		}
	}
	f.verdict(br, findings)
	initBad := br.FirstOverflow != nil || (br.LostMass != nil && *br.LostMass > b.Tolerance)
	if (br.Verdict == report.BackwardUnderflow || br.Verdict == report.BackwardOverflowEveryScale || (b.VerifyFixes && initBad)) && run != nil {
		fix, err := f.bf16Fix(ctx, run, br)
		if err != nil {
			return nil, err
		}
		br.Fixes = append(br.Fixes, fix)
		if !fix.Works {
			// The advice follows the verification: bf16 loses too much as
			// well, so only fp32 remains.
			br.VerdictText = strings.Replace(br.VerdictText, "use "+f.bf16()+" or keep", f.bf16()+" does not keep them either (verified): keep", 1)
		}
	}
	if b.VerifyFixes && initBad && run != nil {
		fix, err := f.keepFix(ctx, run, br)
		if err != nil {
			return nil, err
		}
		if fix != nil {
			br.Fixes = append(br.Fixes, *fix)
		}
	}
	return br, nil
}

// keepFix verifies keeping in fp32 the modules whose gradients fail at
// the initial scale (those that overflow there, or else those that lose
// more than the tolerance): the backward at that scale with their nodes
// computing in fp32, forward and backward, must keep every parameter
// gradient finite and lose at most the tolerance of its norm. nil when no
// module is named.
func (f *Facts) keepFix(ctx context.Context, run Runner, br *report.BackwardReport) (*report.Fix, error) {
	b := f.Backward
	t := f.gradients()
	var mods []string
	seen := map[string]bool{}
	addMod := func(m string) {
		if m != "" && !seen[m] {
			seen[m] = true
			mods = append(mods, m)
		}
	}
	if br.FirstOverflow != nil {
		for i := len(t.entries) - 1; i >= 0; i-- {
			e := t.entries[i]
			if m := e.mass(b.FP32); m != nil && m.Overflows(b.InitExp, e.format) {
				addMod(e.module)
			}
		}
	} else {
		for _, m := range br.Underflowing {
			addMod(m)
		}
	}
	keep := f.moduleNodes(mods)
	if len(keep) == 0 || f.coversHalf(keep) {
		// nothing named, or every module the policy computes in reduced
		// precision: that is fp32 training, which one step does not need
		// to rerun (the fp32 continuation verifies it over steps)
		return nil, nil
	}
	r, ref, err := run.KeepFP32(ctx, keep, b.InitExp)
	if err != nil {
		return nil, fmt.Errorf("keep-fp32 backward: %w", err)
	}
	names := make([]string, len(t.params))
	for i, p := range t.params {
		names[i] = p.value
	}
	lost, finite := lostMasses(r, f.reference(ref), names, r.Exp)
	bad, over := 0, 0
	worst, name := 0.0, ""
	for i, p := range t.params {
		switch {
		case !finite[i]:
			bad++
			continue
		case p.noise:
			continue
		case lost[i] > b.Tolerance:
			over++
		}
		if lost[i] > worst {
			worst, name = lost[i], p.name()
		}
	}
	fix := &report.Fix{Kind: report.FixKeepFP32, Works: bad == 0 && over == 0, Modules: mods}
	list := strings.Join(mods, ", ")
	if fix.Works {
		fix.Summary = fmt.Sprintf("keeping %s in fp32 (forward and backward), the backward at the scale 2^%d is finite and loses at most %.2f%% of any parameter gradient's norm", list, b.InitExp, 100*worst)
		if name != "" {
			fix.Summary += " (" + name + ")"
		}
	} else {
		fix.Summary = fmt.Sprintf("keeping %s in fp32 does not fix it: at the scale 2^%d %d parameter gradient(s) are still NaN/Inf and %d lose more than %.1f%% of their norm%s", list, b.InitExp, bad, over, 100*b.Tolerance, worstOf(worst, name))
	}
	return fix, nil
}

// coversHalf reports whether keeping the nodes keep in fp32 leaves no node
// the policy computes in fp16 or bf16 (the ops that follow their inputs'
// type follow the kept ones into fp32).
func (f *Facts) coversHalf(keep map[int]bool) bool {
	m := f.Model
	asg := precision.AssignKeepFP32(f.Policy, m.Proto.Graph, m.Index.Order(), m.Index.ElemType, keep)
	for _, p := range asg.Node {
		if p == precision.FP16 || p == precision.BF16 {
			return false
		}
	}
	return true
}

// moduleNodes returns the nodes of the modules mods (a node of module m,
// or of a module inside it).
func (f *Facts) moduleNodes(mods []string) map[int]bool {
	keep := map[int]bool{}
	if len(mods) == 0 {
		return keep
	}
	for i, n := range f.Model.Proto.Graph.Node {
		p := onnx.ModulePath(n)
		for _, m := range mods {
			if p == m || strings.HasPrefix(p, m+".") {
				keep[i] = true
				break
			}
		}
	}
	return keep
}

// gradientReport describes entry e, with its own rounding's loss at the
// exponent settled.
func (f *Facts) gradientReport(e *entry, settled int) report.GradientReport {
	gr := report.GradientReport{Value: e.value, OpType: e.op, Module: e.module, Kind: e.kind, Precision: e.prec, Partial: e.partial}
	if e.node >= 0 {
		gr.Node = onnx2name(f, e.node)
	}
	if m := e.mass(f.Backward.FP32); m != nil && m.NonFinite == 0 {
		gr.FP32MaxAbs = ptr(m.Max)
		if lo, _, ok := m.Range(); ok {
			gr.Log2Min = ptr(lo)
		}
		if c := m.MaxCleanExp(e.format); c < math.MaxInt32 {
			gr.MaxCleanExp = ptr(c)
		}
		gr.LostMass = m.Lost(settled, e.format)
	}
	return gr
}

// scaleRows describes the exponents that matter and their neighbours:
// the initial, settled and largest clean scale, the clean window's start,
// and every measured one.
func (f *Facts) scaleRows(s scales) []report.ScaleReport {
	b, t := f.Backward, f.gradients()
	keys := []int{b.InitExp}
	for _, x := range []*int{s.maxClean, s.settled, s.cleanFrom} {
		if x != nil {
			keys = append(keys, *x)
		}
	}
	for x := range b.Runs {
		keys = append(keys, x)
	}
	var exps []int
	for _, k := range keys {
		for x := k - 1; x <= k+1; x++ {
			if x >= b.MinExp && x <= b.MaxExp && !slices.Contains(exps, x) {
				exps = append(exps, x)
			}
		}
	}
	sort.Ints(exps)
	var rows []report.ScaleReport
	for _, x := range exps {
		_, measured := b.Runs[x]
		sr := report.ScaleReport{Exp: x, Measured: measured}
		over, k := f.overflow(x)
		if over {
			sr.Overflow = true
			if k >= 0 {
				sr.FirstOverflow = t.entries[k].label()
			}
		} else if l, p := f.worst(x); p >= 0 {
			sr.LostMass, sr.WorstModule = l, t.params[p].label()
		}
		rows = append(rows, sr)
	}
	return rows
}

// verdict walks the backward's decision tree over the findings.
func (f *Facts) verdict(br *report.BackwardReport, findings []checks.Finding) {
	has := func(c *checks.Check) bool {
		return slices.ContainsFunc(findings, func(x checks.Finding) bool { return x.Check == c.ID })
	}
	b := f.Backward
	lost := func() string {
		if br.LostMass == nil {
			return "no parameter gradient"
		}
		return fmt.Sprintf("at most %.2f%% of any parameter gradient's norm (%s)", 100**br.LostMass, br.WorstParameter)
	}
	settle := func() string {
		if br.SkippedSteps == 0 {
			return fmt.Sprintf("the GradScaler stays at its initial scale 2^%d (no gradient overflows)", b.InitExp)
		}
		return fmt.Sprintf("from 2^%d the GradScaler skips %d step(s) and settles at 2^%d, the largest scale without overflow", b.InitExp, br.SkippedSteps, *br.SettledExp)
	}
	switch {
	case has(checkFP32Backward):
		br.Verdict = report.BackwardFP32Broken
		br.VerdictText = "the backward produces NaN/Inf even in fp32: fix the model, the loss or the data before choosing a loss scale"
	case has(checkOverflowEveryScale):
		br.Verdict = report.BackwardOverflowEveryScale
		first := "an unnamed value"
		if len(br.Scales) > 0 && br.Scales[0].FirstOverflow != "" {
			first = br.Scales[0].FirstOverflow
		}
		br.VerdictText = fmt.Sprintf("the fp16 backward overflows even at scale 2^%d, first at %s: no loss scale trains it in fp16; use %s or keep that module in fp32",
			b.MinExp, first, f.bf16())
		switch f.savedValues() {
		case forwardLoss:
			br.VerdictText = fmt.Sprintf("the fp16 backward is NaN/Inf even at scale 2^%d, where the fp32 backward is finite: the fp16 forward's loss is NaN/Inf already (see the forward verdict), whatever the scale; fix the forward, or use %s or keep that module in fp32",
				b.MinExp, f.bf16())
		case savedGradient:
			br.VerdictText = fmt.Sprintf("the fp16 backward is NaN/Inf even at scale 2^%d, first at %s, where the fp32 backward is finite: the values the fp16 forward saved make it non-finite whatever the scale; use %s or keep that module in fp32",
				b.MinExp, first, f.bf16())
		}
	case has(checkUnderflowEveryScale):
		br.Verdict = report.BackwardUnderflow
		br.VerdictText = fmt.Sprintf("%s, where fp16 loses %.1f%% of the gradient norm of %s (tolerance %.1f%%), and no scale without overflow keeps it: fp16 cannot train %s; use %s or keep them in fp32",
			settle(), 100*derefF(br.LostMass), br.WorstParameter, 100*b.Tolerance, strings.Join(limit(br.Underflowing, 4), ", "), f.bf16())
	case has(checkUnderflowAtInit):
		br.Verdict = report.BackwardInitUnderflow
		br.InitScaleAdvice = ptr(math.Ldexp(1, br.Window.From))
		br.VerdictText = fmt.Sprintf("at the initial scale 2^%d fp16 loses %.1f%% of the gradient norm of %s (tolerance %.1f%%); scales 2^%d to 2^%d keep every parameter gradient: use %s",
			b.InitExp, 100*derefF(br.LostMass), br.WorstParameter, 100*b.Tolerance, br.Window.From, br.Window.To, f.words().StartScale(br.Window.From))
	default:
		br.Verdict = report.BackwardHealthy
		switch {
		case len(f.gradients().entries) == 0:
			br.VerdictText = "no gradient is held in 16 bits under this policy: nothing can overflow or flush"
		case br.SettledExp != nil:
			br.VerdictText = fmt.Sprintf("%s; there fp16 loses %s", settle(), lost())
			if br.SkippedSteps > 0 {
				br.InitScaleAdvice = ptr(math.Ldexp(1, *br.SettledExp))
			}
		default:
			br.VerdictText = fmt.Sprintf("the fp16 backward is clean at the initial scale 2^%d", b.InitExp)
		}
	}
}

func derefF(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// bf16Fix verifies learn.to_bf16(): the backward with the bf16 policy's
// rounding at scale 1 (fastai trains bf16 without a GradScaler) must keep
// every parameter gradient finite and lose at most the tolerance of its
// norm, the measure the verdict used.
func (f *Facts) bf16Fix(ctx context.Context, run Runner, br *report.BackwardReport) (report.Fix, error) {
	r, ref, err := run.BF16(ctx)
	if err != nil {
		return report.Fix{}, fmt.Errorf("bf16 backward: %w", err)
	}
	b := f.Backward
	bad, over := 0, 0
	worst, name := 0.0, ""
	params := f.gradients().params
	names := make([]string, len(params))
	for i, p := range params {
		names[i] = p.value
	}
	lost, finite := lostMasses(r, f.reference(ref), names, r.Exp)
	for i, p := range params {
		l, ok := lost[i], finite[i]
		switch {
		case !ok:
			bad++
			continue
		case p.noise:
			// zero up to rounding in fp32 (a bias before a BatchNorm):
			// its relative loss measures nothing, as in the verdict
			continue
		case l > b.Tolerance:
			over++
		}
		if l > worst {
			worst, name = l, p.name()
		}
	}
	fix := report.Fix{Kind: report.FixBF16, Works: bad == 0 && over == 0, Modules: br.Underflowing}
	if fix.Works {
		fix.Summary = fmt.Sprintf("%s: the backward with bf16 gradients (no loss scaling) is finite and loses at most %.2f%% of any parameter gradient's norm", f.bf16(), 100*worst)
		if name != "" {
			fix.Summary += " (" + name + ")"
		}
	} else {
		fix.Summary = fmt.Sprintf("%s does not fix it: with bf16 gradients %d parameter gradient(s) are NaN/Inf and %d lose more than %.1f%% of their norm%s", f.bf16(), bad, over, 100*b.Tolerance, worstOf(worst, name))
	}
	return fix, nil
}

// worstOf names the finite parameter gradient that loses most, " (worst
// 4.8%, 0.bias)", or nothing when every one is NaN/Inf.
func worstOf(worst float64, name string) string {
	if name == "" {
		return ""
	}
	return fmt.Sprintf(" (worst %.1f%%, %s)", 100*worst, name)
}
