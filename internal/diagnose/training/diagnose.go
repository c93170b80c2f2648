package training

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/grad"
	"fp16audit/internal/onnx"
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
	for i, n := range g.Node {
		if n.OpType != "BatchNormalization" || !onnx.IsDefaultDomain(n.Domain) || len(n.Input) < 5 {
			continue
		}
		bn := report.BatchNormReport{Node: onnx.NodeName(g, i), Module: onnx.ModulePath(n), Statistics: "running",
			Switched: slices.Contains(f.Changes.Switched, i)}
		if (onnx.IntAttr(n, "training_mode", 0) != 0) || len(n.Output) > 1 {
			bn.Statistics = "batch"
		}
		mean, errM := rewrite.ConstantThroughIdentity(ix, n.Input[3])
		vr, errV := rewrite.ConstantThroughIdentity(ix, n.Input[4])
		if errM == nil && errV == nil {
			m, _ := mean.Float32s()
			v, _ := vr.Float32s()
			if len(m) == len(v) && len(m) > 0 {
				momentum := float64(onnx.FloatAttr(n, "momentum", 0.9))
				defaults, oneStep := true, true
				var ms float64
				for c := range m {
					defaults = defaults && math.Abs(float64(m[c])) <= 1e-6 && math.Abs(float64(v[c])-1) <= 1e-6
					oneStep = oneStep && float64(v[c]) >= momentum-1e-6
					ms += float64(v[c]) + float64(m[c])*float64(m[c])
				}
				switch {
				case defaults:
					bn.RunningStats = "defaults"
				case oneStep:
					bn.RunningStats = "one-step"
				default:
					bn.RunningStats = "trained"
				}
				bn.RunningRMS = math.Sqrt(ms / float64(len(m)))
			}
		}
		if f.FP32 != nil {
			if st, ok := f.FP32.Stats[n.Input[0]]; ok && st.Finite > 0 {
				bn.InputRMS = math.Sqrt(st.SumSq / float64(st.Finite))
			}
		}
		out = append(out, bn)
	}
	return out
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
	tr := &report.TrainingReport{Mode: f.Mode, BatchNorms: f.batchNorms(), Dropouts: len(f.Changes.Dropouts), Notes: []string{}}
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
		notes = append(notes, fmt.Sprintf("%d Conv node(s) carry a BatchNorm folded in by an eval-mode export: this eval-mode audit normalizes with its running statistics (the identity for an untrained model), training with each batch's; to audit training, export with training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False and run --mode train", len(convs)))
	}
	if f.Mode == rewrite.ModeTrain && len(f.Changes.Dropouts) > 0 {
		notes = append(notes, fmt.Sprintf("%d Dropout node(s) drop as in training, with ONNX Runtime's generator seeded %d (not PyTorch's masks)", len(f.Changes.Dropouts), f.Seed))
	}
	return notes
}

// backwardReport assembles the backward audit from the table and the
// findings: the verdict follows the findings, so a check switched off
// cannot decide it.
func (f *Facts) backwardReport(ctx context.Context, findings []checks.Finding, run Runner) (*report.BackwardReport, error) {
	b := f.Backward
	t := f.gradients()
	br := &report.BackwardReport{
		Loss: string(b.Loss), Output: b.Output, Target: b.Target, Batch: b.Batch,
		InitScale: math.Ldexp(1, b.InitExp), InitExp: b.InitExp, MinExp: b.MinExp, MaxExp: b.MaxExp,
		UnderflowFraction: b.UnderflowFraction, OutputPrecision: precOf(f.Assign.Value[b.Output]),
		Underflowing: []string{}, Scales: []report.ScaleReport{}, Modules: []report.ModuleGradientReport{},
		Gradients: []report.GradientReport{}, FP32NonFinite: []string{}, Unsupported: []report.UnsupportedOp{},
		Fixes: []report.Fix{}, Runs: b.Runs, ElapsedSecs: b.Elapsed,
	}
	if ce := b.Res.CrossEntropy; ce != nil {
		br.CrossEntropy = &report.CrossEntropyReport{ClassAxis: ce.ClassAxis, Classes: ce.Classes, IgnoreIndex: ce.IgnoreIndex,
			LMShift: ce.Shift, Scored: b.Scored, Targets: b.Targets}
	}
	if b.FP32 != nil {
		br.LossValue = finite(b.FP32.Loss)
		br.SeedMaxAbs = finite(b.FP32.Grads[b.Output].MaxAbs)
		for _, g := range b.Res.Grads {
			if overflowed(b.FP32.Grads[g.Value]) {
				br.FP32NonFinite = append(br.FP32NonFinite, g.Value)
			}
		}
	}
	for _, u := range b.Res.Unsupported {
		br.Unsupported = append(br.Unsupported, report.UnsupportedOp{Node: u.Name, OpType: u.OpType, Reason: u.Reason})
	}
	maxClean, flushFree, under := t.window()
	br.MaxCleanExp, br.FlushFreeExp = maxClean, flushFree
	if under != nil {
		br.Underflowing = under
	}
	if maxClean != nil && flushFree != nil && *flushFree <= *maxClean {
		br.Window = &report.ScaleWindow{From: *flushFree, To: *maxClean}
	}
	init := b.Scans[b.InitExp]
	for _, x := range t.exps {
		s := b.Scans[x]
		sr := report.ScaleReport{Exp: x, Flushing: []string{}}
		if k := t.firstOverflow(s); k >= 0 {
			sr.Overflow, sr.FirstOverflow = true, t.entries[k].label()
		}
		seen := map[string]bool{}
		for _, e := range t.entries {
			if r, ok := e.reading(s); ok && e.flushes(r, b.UnderflowFraction) && !seen[e.label()] {
				seen[e.label()] = true
				sr.Flushing = append(sr.Flushing, e.label())
			}
		}
		br.Scales = append(br.Scales, sr)
	}
	mods := map[string]int{}
	for i, e := range t.entries {
		gr := report.GradientReport{Value: e.value, OpType: e.op, Module: e.module, Kind: e.kind, Precision: e.prec,
			MaxCleanExp: t.maxClean[i], FlushFreeExp: t.flushFree[i], Partial: e.partial}
		if e.node >= 0 {
			gr.Node = onnx2name(f, e.node)
		}
		if b.FP32 != nil {
			if r, ok := e.reading(b.FP32); ok {
				gr.FP32MaxAbs = finite(r.MaxAbs)
			}
		}
		if init != nil {
			r, _ := e.reading(init)
			gr.MaxAbsAtInit, gr.OverflowAtInit, gr.FlushedAtInit = finite(r.MaxAbs), overflowed(r), e.lost(r)
		}
		br.Gradients = append(br.Gradients, gr)
		k, ok := mods[e.label()]
		if !ok {
			k = len(br.Modules)
			mods[e.label()] = k
			br.Modules = append(br.Modules, report.ModuleGradientReport{Module: e.label(), MaxCleanExp: gr.MaxCleanExp, FlushFreeExp: gr.FlushFreeExp})
		}
		m := &br.Modules[k]
		m.Gradients++
		m.MaxCleanExp = minPtr(m.MaxCleanExp, gr.MaxCleanExp)
		if gr.FlushFreeExp == nil || m.FlushFreeExp == nil {
			m.FlushFreeExp = nil
		} else if *gr.FlushFreeExp > *m.FlushFreeExp {
			m.FlushFreeExp = gr.FlushFreeExp
		}
		if gr.MaxAbsAtInit == nil {
			m.MaxAbsAtInit = nil
		} else if m.Gradients == 1 || (m.MaxAbsAtInit != nil && *gr.MaxAbsAtInit > *m.MaxAbsAtInit) {
			m.MaxAbsAtInit = gr.MaxAbsAtInit
		}
		m.OverflowAtInit = m.OverflowAtInit || gr.OverflowAtInit
		m.FlushedAtInit = math.Max(m.FlushedAtInit, gr.FlushedAtInit)
	}
	if init != nil {
		if k := t.firstOverflow(init); k >= 0 {
			br.FirstOverflow = &br.Gradients[k]
		}
	}
	f.verdict(br, findings)
	if (br.Verdict == report.BackwardUnderflow || br.Verdict == report.BackwardOverflowEveryScale) && run != nil {
		fix, err := f.bf16Fix(ctx, run, br)
		if err != nil {
			return nil, err
		}
		br.Fixes = append(br.Fixes, fix)
	}
	return br, nil
}

func minPtr(a, b *int) *int {
	if a == nil || b == nil {
		return nil
	}
	if *b < *a {
		return b
	}
	return a
}

// verdict walks the backward's decision tree over the findings.
func (f *Facts) verdict(br *report.BackwardReport, findings []checks.Finding) {
	has := func(c *checks.Check) bool {
		return slices.ContainsFunc(findings, func(x checks.Finding) bool { return x.Check == c.ID })
	}
	b := f.Backward
	window := "no module's gradients flush beyond the threshold"
	if br.Window != nil {
		window = fmt.Sprintf("scales 2^%d to 2^%d keep every %s gradient finite with at most %.1f%% flushed", br.Window.From, br.Window.To, f.Policy.Lower, 100*b.UnderflowFraction)
	}
	switch {
	case has(checkFP32Backward):
		br.Verdict = report.BackwardFP32Broken
		br.VerdictText = "the backward produces NaN/Inf even in fp32: fix the model, the loss or the data before choosing a loss scale"
	case has(checkOverflowEveryScale):
		br.Verdict = report.BackwardOverflowEveryScale
		br.VerdictText = fmt.Sprintf("the fp16 backward overflows even at scale 2^%d, first at %s: no loss scale trains it in fp16; use learn.to_bf16() or keep that module in fp32",
			b.MinExp, labelOr(br.Scales[0].FirstOverflow))
	case has(checkUnderflowEveryScale):
		br.Verdict = report.BackwardUnderflow
		br.VerdictText = fmt.Sprintf("the gradients of %s underflow at every scale that avoids overflow (≤ 2^%d): fp16 cannot train them; use learn.to_bf16() or keep them in fp32",
			strings.Join(limit(br.Underflowing, 4), ", "), derefOr(br.MaxCleanExp, b.MinExp))
	case has(checkSeedOverflow) || has(checkBackwardOverflow):
		br.Verdict = report.BackwardInitOverflow
		k := *br.MaxCleanExp
		br.InitScaleAdvice = ptr(math.Ldexp(1, k))
		what := fmt.Sprintf("the first backward overflows at module %s at scale 2^%d", gradLabel(br.FirstOverflow), b.InitExp)
		if has(checkSeedOverflow) {
			what = fmt.Sprintf("the scaled loss gradient overflows at 2^%d", b.InitExp)
		}
		br.VerdictText = fmt.Sprintf("%s; any scale ≤ 2^%d is clean: pass learn.to_fp16(init_scale=2.**%d)", what, k, k)
		if br.Window != nil {
			br.VerdictText += fmt.Sprintf("; %s", window)
		}
	case has(checkUnderflowAtInit):
		br.Verdict = report.BackwardInitUnderflow
		br.InitScaleAdvice = ptr(math.Ldexp(1, br.Window.From))
		br.VerdictText = fmt.Sprintf("at the initial scale 2^%d gradients flush to zero (%s); %s: pass learn.to_fp16(init_scale=2.**%d)",
			b.InitExp, strings.Join(limit(br.Scales[indexOf(br.Scales, b.InitExp)].Flushing, 4), ", "), window, br.Window.From)
	default:
		br.Verdict = report.BackwardHealthy
		switch {
		case br.Window != nil:
			br.VerdictText = fmt.Sprintf("the initial scale 2^%d lies in the clean window: %s", b.InitExp, window)
		case len(f.gradients().entries) == 0:
			br.VerdictText = "no gradient is held in 16 bits under this policy: nothing can overflow or flush"
		default:
			br.VerdictText = fmt.Sprintf("the fp16 backward is clean at the initial scale 2^%d", b.InitExp)
		}
	}
}

// gradLabel names a reported gradient by its module, or its value.
func gradLabel(g *report.GradientReport) string { return labelOf(g.Module, g.Value) }

func labelOr(s string) string {
	if s == "" {
		return "an unnamed value"
	}
	return s
}

func derefOr(p *int, def int) int {
	if p == nil {
		return def
	}
	return *p
}

func indexOf(scales []report.ScaleReport, exp int) int {
	for i, s := range scales {
		if s.Exp == exp {
			return i
		}
	}
	return 0
}

// bf16Fix verifies learn.to_bf16(): the backward with the bf16 policy's
// rounding at scale 1 (fastai trains bf16 without a GradScaler) must be
// finite and flush at most the threshold in the modules fp16 fails.
func (f *Facts) bf16Fix(ctx context.Context, run Runner, br *report.BackwardReport) (report.Fix, error) {
	res, scan, err := run.BF16(ctx)
	if err != nil {
		return report.Fix{}, fmt.Errorf("bf16 backward: %w", err)
	}
	thr := f.Backward.UnderflowFraction
	bad, flushed := 0, 0
	worst := 0.0
	count := func(r grad.Reading, ref float64) {
		lost := lostFraction(r, ref)
		switch {
		case overflowed(r):
			bad++
		case lost > thr:
			flushed++
		}
		worst = math.Max(worst, lost)
	}
	for _, g := range res.Grads {
		var ref float64
		if f.Backward.FP32 != nil {
			ref = f.Backward.FP32.Grads[g.Value].NonZero
		}
		count(scan.Grads[g.Value], ref)
	}
	for _, s := range res.Sites {
		count(scan.Sites[s.Rounded], 0)
	}
	fix := report.Fix{Kind: report.FixBF16, Works: bad == 0 && flushed == 0, Modules: br.Underflowing}
	if fix.Works {
		fix.Summary = fmt.Sprintf("learn.to_bf16(): the backward with bf16 gradients (no loss scaling) is finite and flushes at most %.2f%% of any gradient", 100*worst)
	} else {
		fix.Summary = fmt.Sprintf("learn.to_bf16() does not fix it: with bf16 gradients %d gradient(s) are NaN/Inf and %d flush more than %.1f%%", bad, flushed, 100*thr)
	}
	return fix, nil
}
