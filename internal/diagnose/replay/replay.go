// Package replay diagnoses a captured training step from the training
// audit of that step: what happened (the data, the fp32 model, a forward
// overflow, a gradient overflow at the captured loss scale, underflow at
// a pinned scale, or nothing the capture holds), where, since when (the
// run's log), and which fixes hold — verified by the step's own reruns
// and, for the fixes that need steps, by the continuations the Python
// package ran from the captured state. It computes on results: the audit
// that produced them is internal/audit's (Replay).
package replay

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"fp16audit/internal/capture"
	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
	"fp16audit/report"
)

// fp16Max is the largest finite fp16.
const fp16Max = 65504

// Input is what one replay found.
type Input struct {
	// Capture is the capture replayed; Path how the user named it.
	Capture *capture.Capture
	Path    string
	// Audit is the training audit of the failing batch at the captured
	// scale; Previous the forward audit of the previous batch at the
	// same weights (nil when it did not run).
	Audit    *report.Report
	Previous *report.Report
	// Failing holds the failing batch's arrays (the per-sample facts of
	// the data verdicts).
	Failing []*tensor.Tensor
	// Log is the run's log up to the capture (nil: none).
	Log *capture.Log
	// ScaleExp is the captured scale's exponent (nil: no GradScaler);
	// ScaleNote says how a scale that is no power of two was read.
	ScaleExp  *int
	ScaleNote string
	// State holds the model's parameters and buffers with their shapes
	// (the capture's state, named as model.state_dict() names them):
	// where a weight culprit is among them, the report names it so.
	State map[string][]int64
	// Model is the captured model the audit ran: the shape of the
	// initializer a weight culprit is in the graph.
	Model *onnx.Index
}

// Diagnose classifies the captured step and proposes the fixes, verified
// where one step shows them.
func Diagnose(in Input) *report.ReplayReport {
	m := in.Capture.Manifest
	r := &report.ReplayReport{
		Schema:  report.ReplaySchema,
		Capture: captureInfo(in),
		Audit:   in.Audit,
		Fixes:   []report.ReplayFix{},
		Notes:   []string{},
	}
	if in.Audit != nil {
		r.Tool = in.Audit.Tool
	}
	r.Timeline = timeline(in.Log, m.Trigger.Step)
	d := &diag{in: in, r: r, words: phrasesFor(m.Trainer, m.Precision.AutocastDevice, m.Precision.Policy)}
	r.Capture.TrainerLabel = d.words.label()
	d.classify()
	d.clipNorm()
	d.proposeStepFixes()
	if r.Culprit != nil && r.Timeline != nil {
		r.Timeline.Culprit = d.culpritSeries()
	}
	if m.StepApplied {
		r.Notes = append(r.Notes, "the trigger came after the optimizer applied the step: the captured weights are one update later than the failing step's forward and backward (call the recorder's before_step to capture before the update)")
	}
	if m.Loss.Name == nil || *m.Loss.Name == "" {
		fn := "the run's loss"
		if m.Loss.Function != nil {
			fn = *m.Loss.Function
		}
		r.Notes = append(r.Notes, fmt.Sprintf("%s has no fp16audit counterpart (cross-entropy, bce, mse, l1, output): the backward was not replayed, only the forward", fn))
	}
	r.Notes = append(r.Notes, in.Capture.Notes...)
	return r
}

type diag struct {
	in    Input
	r     *report.ReplayReport
	words phrases
}

func (d *diag) backward() *report.BackwardReport {
	if a := d.in.Audit; a != nil && a.Training != nil {
		return a.Training.Backward
	}
	return nil
}

func (d *diag) step() int { return d.in.Capture.Manifest.Trigger.Step }

// mainPass is the pass of the run's policy ("" under fp32).
func (d *diag) mainPass() string {
	if a := d.in.Audit; a != nil {
		for _, p := range a.Passes {
			if p != report.PassFP32 && p != report.PassBF16 && p != report.PassAsWritten {
				return p
			}
		}
		if slices.Contains(a.Passes, report.PassBF16) && d.in.Capture.Manifest.Precision.Policy == "autocast-bf16" {
			return report.PassBF16
		}
	}
	return ""
}

func origins(a *report.Report, pass string) []report.Origin {
	if a == nil {
		return nil
	}
	var out []report.Origin
	for _, o := range a.Origins {
		if o.Pass == pass && o.Cause != report.CausePrecision {
			out = append(out, o)
		}
	}
	return out
}

func fp32Origins(a *report.Report) []report.Origin {
	if a == nil {
		return nil
	}
	var out []report.Origin
	for _, o := range a.Origins {
		if o.Cause == report.CauseFP32 || (o.Pass == report.PassFP32 && o.Cause != report.CausePrecision) {
			out = append(out, o)
		}
	}
	return out
}

// classify decides the verdict, in the order of the Replay* constants.
func (d *diag) classify() {
	in := d.in
	samples := perSample(in.Failing)
	if s := firstNonFinite(samples); s != nil {
		d.dataNonFinite(s)
		return
	}
	if os := fp32Origins(in.Audit); len(os) > 0 {
		prevBroken := in.Previous != nil && len(fp32Origins(in.Previous)) > 0
		if in.Previous != nil && !prevBroken {
			d.dataInFP32(os[0])
			return
		}
		d.fp32Broken(os[0], in.Previous == nil)
		return
	}
	main := d.mainPass()
	if os := origins(in.Audit, main); main != "" && len(os) > 0 {
		if s := outOfRange(samples); s != nil {
			d.dataRange(s, os[0])
			return
		}
		d.forwardOverflow(os[0], main)
		return
	}
	b := d.backward()
	if b != nil && b.FirstOverflow != nil {
		d.gradientOverflow(b)
		return
	}
	if b != nil && len(b.Underflowing) > 0 && b.LostMass != nil && *b.LostMass > b.Tolerance {
		d.underflow(b)
		return
	}
	d.notReproduced(b)
}

// -- the data ----------------------------------------------------------------

// sampleFacts are one float input's per-sample facts in the failing batch.
type sampleFacts struct {
	input     string
	nonFinite []int64   // per sample
	maxAbs    []float64 // per sample, over finite elements
}

func perSample(ts []*tensor.Tensor) []sampleFacts {
	var out []sampleFacts
	for _, t := range ts {
		if !t.DType.IsFloat() || len(t.Shape) == 0 || t.Shape[0] <= 0 {
			continue
		}
		v, err := t.Float32s()
		if err != nil {
			continue
		}
		n := int(t.Shape[0])
		per := len(v) / n
		f := sampleFacts{input: t.Name, nonFinite: make([]int64, n), maxAbs: make([]float64, n)}
		for i := 0; i < n; i++ {
			for _, x := range v[i*per : (i+1)*per] {
				a := math.Abs(float64(x))
				switch {
				case math.IsNaN(a) || math.IsInf(a, 0):
					f.nonFinite[i]++
				case a > f.maxAbs[i]:
					f.maxAbs[i] = a
				}
			}
		}
		out = append(out, f)
	}
	return out
}

func firstNonFinite(fs []sampleFacts) *report.DataFinding {
	for _, f := range fs {
		var d *report.DataFinding
		for i, n := range f.nonFinite {
			if n > 0 {
				if d == nil {
					d = &report.DataFinding{Input: f.input}
				}
				d.Samples = append(d.Samples, int64(i))
				d.NonFinite += n
			}
		}
		if d != nil {
			d.MaxAbs = slices.Max(f.maxAbs)
			return d
		}
	}
	return nil
}

func outOfRange(fs []sampleFacts) *report.DataFinding {
	for _, f := range fs {
		var d *report.DataFinding
		for i, a := range f.maxAbs {
			if a >= 65520 { // what rounds to Inf in fp16
				if d == nil {
					d = &report.DataFinding{Input: f.input}
				}
				d.Samples = append(d.Samples, int64(i))
				d.MaxAbs = max(d.MaxAbs, a)
			}
		}
		if d != nil {
			return d
		}
	}
	return nil
}

func samplesText(s []int64) string {
	parts := make([]string, 0, min(len(s), 8))
	for i, x := range s {
		if i == 8 {
			parts = append(parts, fmt.Sprintf("and %d more", len(s)-8))
			break
		}
		parts = append(parts, fmt.Sprint(x))
	}
	word := "sample"
	if len(s) > 1 {
		word = "samples"
	}
	return word + " " + strings.Join(parts, ", ")
}

func (d *diag) previousText(clean bool) string {
	p := d.in.Capture.Manifest.Batches.Previous
	if p == nil || d.in.Previous == nil {
		return ""
	}
	step := ""
	if p.Step != nil {
		step = fmt.Sprintf(" (step %d)", *p.Step)
	}
	if clean {
		return fmt.Sprintf("; the previous batch%s passes at the same weights", step)
	}
	return fmt.Sprintf("; the previous batch%s fails at the same weights too", step)
}

func (d *diag) dataNonFinite(f *report.DataFinding) {
	r := d.r
	r.Verdict = report.ReplayDataNonFinite
	r.Data = f
	r.Culprit = &report.Culprit{Kind: report.CulpritInput, Value: f.Input, Batches: []string{"failing"}}
	r.VerdictText = fmt.Sprintf("the data at step %d: the failing batch's input %q already holds %d NaN/Inf element(s), in %s (batch index): not fp16's doing, fp32 fails on it too; fix or drop those samples%s",
		d.step(), f.Input, f.NonFinite, samplesText(f.Samples), d.previousText(d.previousClean()))
	d.dropBatch("the batch holds NaN/Inf; without it")
}

func (d *diag) dataInFP32(o report.Origin) {
	r := d.r
	var s []int64
	for _, x := range o.Samples {
		if x.Batch == 0 {
			s = append(s, x.Index)
		}
	}
	r.Verdict = report.ReplayDataNonFinite
	r.Data = &report.DataFinding{Input: "", Samples: s, InFP32: true}
	r.Culprit = &report.Culprit{Kind: report.CulpritActivation, Node: o.Node, OpType: o.OpType, Module: o.Module, Value: o.Value,
		FP32MaxAbs: finitePtr(o.FP32MaxAbs), Batches: []string{"failing"}}
	where := "some samples"
	if len(s) > 0 {
		where = samplesText(s)
	}
	r.VerdictText = fmt.Sprintf("the data at step %d: the batch is finite, but the fp32 forward goes NaN/Inf at %s (%s%s) on %s, while the previous batch passes at the same weights: a sample the model cannot take, not fp16's doing; inspect those samples",
		d.step(), o.Node, o.OpType, moduleText(o.Module), where)
	d.dropBatch("fp32 fails on this batch only; without it")
}

func (d *diag) dataRange(f *report.DataFinding, o report.Origin) {
	r := d.r
	r.Verdict = report.ReplayDataRange
	r.Data = f
	r.Culprit = &report.Culprit{Kind: report.CulpritInput, Node: o.Node, OpType: o.OpType, Module: o.Module, Value: f.Input,
		FP32MaxAbs: ptrF(f.MaxAbs), Batches: d.batchesFailing()}
	r.VerdictText = fmt.Sprintf("the data at step %d: input %q holds %s in %s, beyond fp16's 65504: finite in fp32, it is Inf once %s (%s%s) takes it in fp16; scale that input (normalize it) or drop those samples%s",
		d.step(), f.Input, mag(f.MaxAbs), samplesText(f.Samples), o.Node, o.OpType, moduleText(o.Module), d.previousText(d.previousClean()))
	d.auditFixes()
	d.dropBatch("the batch holds values beyond fp16's range; without it")
}

func (d *diag) fp32Broken(o report.Origin, unknownPrev bool) {
	r := d.r
	r.Verdict = report.ReplayFP32Broken
	r.Culprit = &report.Culprit{Kind: report.CulpritActivation, Node: o.Node, OpType: o.OpType, Module: o.Module, Value: o.Value,
		FP32MaxAbs: finitePtr(o.FP32MaxAbs), Batches: []string{"failing"}}
	if !unknownPrev {
		r.Culprit.Batches = append(r.Culprit.Batches, "previous")
	}
	what := "on the previous batch too"
	if unknownPrev {
		what = "(the capture holds no previous batch to tell the data from the model)"
	}
	r.VerdictText = fmt.Sprintf("not fp16: at step %d the fp32 forward goes NaN/Inf at %s (%s%s) %s: the model's state is broken (its weights may already hold NaN/Inf from an earlier update) or the model computes NaN; fp32 training would fail here too",
		d.step(), o.Node, o.OpType, moduleText(o.Module), what)
}

func (d *diag) previousClean() bool {
	p := d.in.Previous
	if p == nil {
		return false
	}
	return len(fp32Origins(p)) == 0 && len(origins(p, d.mainPass())) == 0
}

func (d *diag) batchesFailing() []string {
	b := []string{"failing"}
	if p := d.in.Previous; p != nil && len(origins(p, d.mainPass())) > 0 {
		b = append(b, "previous")
	}
	return b
}

// -- the forward ---------------------------------------------------------------

func (d *diag) forwardOverflow(o report.Origin, pass string) {
	r := d.r
	r.Verdict = report.ReplayForwardOverflow
	c := &report.Culprit{Kind: report.CulpritActivation, Node: o.Node, OpType: o.OpType, Module: o.Module, Value: o.Value,
		FP32MaxAbs: finitePtr(o.FP32MaxAbs), Batches: d.batchesFailing()}
	if o.Cause == report.CauseConstant && o.Weight != "" {
		// a weight by the graph's rule (the audit's origin says so:
		// onnx.Index.Weight), named as the state names it where it can
		c.Kind, c.Weight = report.CulpritWeight, o.Weight
		if p := d.parameter(o); p != "" && p != o.Weight {
			c.Weight, c.Initializer = p, o.Weight
		}
		if o.ConstantValue != nil {
			c.WeightMaxAbs = ptrF(math.Abs(*o.ConstantValue))
		}
	}
	c.Earlier = d.earlier(c)
	r.Culprit = c
	var what string
	if c.Kind == report.CulpritWeight {
		held := ""
		if c.Initializer != "" {
			held = fmt.Sprintf(" (in the graph %s, the exporter's copy of it)", c.Initializer)
		}
		what = fmt.Sprintf("the weight %s%s holds %s, past fp16's 65504: autocast casts the fp32 master weight to %s for %s (%s%s), where it is Inf although every activation before it is finite",
			c.Weight, held, mag(deref(c.WeightMaxAbs)), pass, o.Node, o.OpType, moduleText(o.Module))
	} else {
		what = fmt.Sprintf("%s (%s%s) computes in %s and its output reaches %s in fp32 at the captured weights, past fp16's 65504",
			o.Node, o.OpType, moduleText(o.Module), pass, mag(o.FP32MaxAbs))
	}
	grew := ""
	if len(c.Earlier) > 0 {
		e := c.Earlier[0]
		grew = fmt.Sprintf("; it was %s at step %d (the log's telemetry): it grew with training", mag(e.MaxAbs), e.Step)
	}
	where := "on the failing batch"
	switch {
	case slices.Contains(c.Batches, "previous"):
		where = "on the previous batch too: the weights have grown, not one batch"
	case d.in.Previous != nil:
		where = "on the failing batch only (the previous batch passes at the same weights)"
	}
	r.VerdictText = fmt.Sprintf("forward overflow at step %d: %s%s; %s", d.step(), what, grew, where)
	d.auditFixes()
	if d.in.Previous != nil && !slices.Contains(c.Batches, "previous") {
		prev, ok := valueMax(d.in.Previous, o.Value)
		if ok && prev > fp16Max/2 {
			works := false
			d.addFix(report.ReplayFix{Kind: report.FixDropBatch, Verified: report.VerifiedOneStep, Works: &works,
				Summary: fmt.Sprintf("dropping the batch only postpones it: at the same weights the previous batch takes %s to %s in fp32, less than a power of two below 65504", o.Value, mag(prev))}, nil)
			return
		}
		d.dropBatch("the overflow needs this batch; without it")
	}
}

// valueMax is max |x| of a value in a report's fp32 pass.
func valueMax(a *report.Report, value string) (float64, bool) {
	for _, n := range a.Nodes {
		for _, o := range n.Outputs {
			if o.Name != value {
				continue
			}
			if s, ok := o.Stats[report.PassFP32]; ok && s.MaxAbs != nil {
				return *s.MaxAbs, true
			}
		}
	}
	return 0, false
}

// parameter returns the name the capture's state gives the weight of
// origin o: the initializer's own where the exporter kept the
// parameter's name, else the one tensor of the origin's module whose
// shape is the initializer's, or its reverse (a Linear's weight the
// exporter transposed for MatMul into an initializer of its own, the
// dynamo exporter's val_N); "" where the state holds none.
func (d *diag) parameter(o report.Origin) string {
	if _, ok := d.in.State[o.Weight]; ok {
		return o.Weight
	}
	if d.in.Model == nil || o.Module == "" {
		return ""
	}
	t := d.in.Model.Initializer(o.Weight)
	if t == nil {
		return ""
	}
	rev := slices.Clone(t.Dims)
	slices.Reverse(rev)
	var found []string
	for name, shape := range d.in.State {
		if strings.HasPrefix(name, o.Module+".") && !strings.Contains(name[len(o.Module)+1:], ".") &&
			(slices.Equal(shape, t.Dims) || slices.Equal(shape, rev)) {
			found = append(found, name)
		}
	}
	if len(found) != 1 {
		return ""
	}
	return found[0]
}

// auditFixes takes the audit's one-step forward fixes (bf16, the modules
// kept in fp32), verified by its reruns of the captured step.
func (d *diag) auditFixes() {
	a := d.in.Audit
	if a == nil {
		return
	}
	for _, f := range a.Fixes {
		switch f.Kind {
		case report.FixBF16:
			d.addFix(report.ReplayFix{Kind: report.FixBF16, Verified: report.VerifiedOneStep, Works: ptrB(f.Works),
				Summary: "one step in bf16: " + f.Summary}, nil)
		case report.FixKeepFP32:
			d.addFix(report.ReplayFix{Kind: report.FixKeepFP32, Verified: report.VerifiedOneStep, Works: ptrB(f.Works),
				Summary: f.Summary, Modules: f.Modules}, f.Modules)
		}
	}
}

func (d *diag) dropBatch(why string) {
	p := d.in.Previous
	if p == nil {
		return
	}
	clean := d.previousClean()
	sum := fmt.Sprintf("%s the step passes: the previous batch is clean at the same weights in fp32 and in fp16 (one-step replay)", why)
	if !clean {
		sum = "dropping the batch does not help: the previous batch fails at the same weights too (one-step replay)"
	}
	d.addFix(report.ReplayFix{Kind: report.FixDropBatch, Verified: report.VerifiedOneStep, Works: ptrB(clean), Summary: sum}, nil)
}

// -- the backward ----------------------------------------------------------------

func (d *diag) gradientOverflow(b *report.BackwardReport) {
	r := d.r
	fo := b.FirstOverflow
	g := &report.GradientFinding{Module: fo.Module, Value: fo.Value, Node: fo.Node, ScaleExp: b.InitExp, MaxCleanExp: b.MaxCleanExp,
		Window: b.Window, Tolerance: b.Tolerance}
	run, _ := d.skippedRun()
	g.Chronic = run >= 2
	r.Gradient = g
	c := &report.Culprit{Kind: report.CulpritGradient, Node: fo.Node, OpType: fo.OpType, Module: fo.Module, Value: fo.Value,
		FP32MaxAbs: fo.FP32MaxAbs, Batches: []string{"failing"}}
	c.Earlier = d.earlier(c)
	r.Culprit = c
	r.Verdict = report.ReplayGradientOverflow
	scaled := ""
	if fo.FP32MaxAbs != nil {
		scaled = fmt.Sprintf(" reaches %s × 2^%d = %s, past fp16's 65504", mag(*fo.FP32MaxAbs), b.InitExp, mag(math.Ldexp(*fo.FP32MaxAbs, b.InitExp)))
	} else {
		scaled = " is NaN/Inf"
	}
	pass := "no fp16 scale avoids the overflow"
	if b.MaxCleanExp != nil {
		pass = fmt.Sprintf("the largest scale that passes is 2^%d", *b.MaxCleanExp)
	}
	window := fmt.Sprintf("; no fp16 scale avoids both the overflow and losing more than %.0f%% of a gradient's norm: train in bf16 or fp32", 100*b.Tolerance)
	if b.Window != nil {
		window = fmt.Sprintf("; the scales 2^%d to 2^%d avoid both the overflow and losing more than %.0f%% of a gradient's norm", b.Window.From, b.Window.To, 100*b.Tolerance)
	}
	chronic := ""
	if g.Chronic {
		chronic = fmt.Sprintf("; the log shows %d skipped steps in a row up to here: the scale is collapsing because the gradients keep growing, and a lower scale only postpones the NaN: clip the gradients or lower the learning rate", run)
	}
	r.VerdictText = fmt.Sprintf("gradient overflow at step %d: at the captured loss scale 2^%d the gradient of %s (%s, %s)%s; %s%s%s",
		d.step(), b.InitExp, moduleOr(fo.Module, fo.Value), fo.Value, fo.Kind, scaled, pass, window, chronic)
	d.backwardFixes(b)
	if run >= 1 && d.in.Capture.Manifest.Batches.Previous != nil {
		works := false
		d.addFix(report.ReplayFix{Kind: report.FixDropBatch, Verified: report.VerifiedLog, Works: &works,
			Summary: fmt.Sprintf("dropping the batch does not help: the log shows the %d step(s) before it skipped too", run)}, nil)
	}
}

func (d *diag) underflow(b *report.BackwardReport) {
	r := d.r
	r.Verdict = report.ReplayUnderflow
	worst := map[string]report.ModuleLoss{}
	for _, p := range b.Parameters {
		if p.LostMass == nil || p.Noise || *p.LostMass <= b.Tolerance {
			continue
		}
		if w, ok := worst[p.Module]; !ok || *p.LostMass > w.LostMass {
			worst[p.Module] = report.ModuleLoss{Module: p.Module, Parameter: p.Name, LostMass: *p.LostMass}
		}
	}
	var mods []report.ModuleLoss
	for _, name := range b.Underflowing {
		if w, ok := worst[name]; ok {
			mods = append(mods, w)
		}
	}
	sort.SliceStable(mods, func(i, j int) bool { return mods[i].LostMass > mods[j].LostMass })
	exp := b.InitExp
	if b.SettledExp != nil {
		exp = *b.SettledExp
	}
	u := &report.UnderflowFinding{ScaleExp: exp, Tolerance: b.Tolerance, Modules: mods, Window: b.Window, MaxClean: b.MaxCleanExp, Pinned: d.pinned()}
	r.Underflow = u
	if len(mods) > 0 {
		m := mods[0]
		r.Culprit = &report.Culprit{Kind: report.CulpritGradient, Module: m.Module, Value: m.Parameter}
		r.Culprit.Earlier = d.earlier(r.Culprit)
	}
	var parts []string
	for _, m := range limitMods(mods, 4) {
		parts = append(parts, fmt.Sprintf("%s: %.1f%%", m.Module, 100*m.LostMass))
	}
	scale := fmt.Sprintf("2^%d", exp)
	if u.Pinned != nil {
		scale += fmt.Sprintf(", where the scale has not grown for %d steps (%d backoffs)", u.Pinned.Steps, u.Pinned.Backoffs)
	}
	window := "; no fp16 scale without overflow keeps them"
	if b.Window != nil {
		window = fmt.Sprintf("; the scales 2^%d to 2^%d would keep them", b.Window.From, b.Window.To)
	}
	r.VerdictText = fmt.Sprintf("underflow at step %d: at the captured scale %s fp16 loses more than %.0f%% of these modules' gradient norm (module: share lost) %s: they barely train, and the loss stays above fp32's%s",
		d.step(), scale, 100*b.Tolerance, strings.Join(parts, ", "), window)
	d.backwardFixes(b)
	if w := b.Window; w != nil {
		// the backward measured these scales clean: GradScaler's own
		// default 2^16 where it lies in the window, else the window's end
		// nearest to it
		e := min(max(16, w.From), w.To)
		s := math.Ldexp(1, e)
		works := true
		d.addFix(report.ReplayFix{Kind: report.FixInitScale, Verified: report.VerifiedOneStep, Works: &works, Scale: &s,
			Summary: fmt.Sprintf("at the scales 2^%d to 2^%d the captured step loses at most %.0f%% of any gradient's norm and nothing overflows: start the GradScaler at 2^%d instead of the captured 2^%d", w.From, w.To, 100*b.Tolerance, e, exp)}, nil)
	}
	if !slices.ContainsFunc(b.Fixes, func(f report.Fix) bool { return f.Kind == report.FixKeepFP32 }) {
		var names []string
		for _, m := range mods {
			names = append(names, m.Module)
		}
		if len(names) > 0 {
			d.addFix(report.ReplayFix{Kind: report.FixKeepFP32, Summary: "keep the modules that lose their gradients in fp32 (not verified: the replay's backward did not rerun them)", Modules: names}, names)
		}
	}
}

func limitMods(m []report.ModuleLoss, n int) []report.ModuleLoss {
	if len(m) <= n {
		return m
	}
	return m[:n]
}

// backwardFixes takes the backward's one-step fixes, verified by its
// reruns of the captured step: bf16, and the failing modules kept in fp32
// at the captured scale.
func (d *diag) backwardFixes(b *report.BackwardReport) {
	for _, f := range b.Fixes {
		switch f.Kind {
		case report.FixBF16:
			d.addFix(report.ReplayFix{Kind: report.FixBF16, Verified: report.VerifiedOneStep, Works: ptrB(f.Works), Summary: "one step in bf16: " + f.Summary}, nil)
		case report.FixKeepFP32:
			d.addFix(report.ReplayFix{Kind: report.FixKeepFP32, Verified: report.VerifiedOneStep, Works: ptrB(f.Works), Summary: "one step: " + f.Summary,
				Modules: f.Modules}, f.Modules)
		}
	}
}

func (d *diag) notReproduced(b *report.BackwardReport) {
	r := d.r
	r.Verdict = report.ReplayNotReproduced
	m := d.in.Capture.Manifest
	var clean []string
	clean = append(clean, "fp32")
	if p := d.mainPass(); p != "" {
		clean = append(clean, p+" under "+m.Precision.Policy+" (emulated)")
	}
	if a := d.in.Audit; a != nil && slices.Contains(a.Passes, report.PassBF16) && d.mainPass() != report.PassBF16 {
		clean = append(clean, "bf16")
	}
	back := ""
	if b != nil {
		back = fmt.Sprintf("; at the captured scale 2^%d no gradient overflows", b.InitExp)
		if b.LostMass != nil {
			back += fmt.Sprintf(" and fp16 loses at most %.2f%% of a gradient's norm", 100**b.LostMass)
		}
	}
	loss := ""
	if b != nil && b.LossValue != nil {
		loss = fmt.Sprintf("; the replayed fp32 loss is %.4g", *b.LossValue)
		if v := m.LossValue(); !math.IsNaN(v) || m.Loss.Value != nil {
			loss += fmt.Sprintf(" (the run logged %s)", mag(v))
		}
	}
	why := "the failure depends on something the capture does not hold: nondeterminism (a kernel, a data-loader worker), the hardware, or a batch other than these"
	if m.Trigger.Kind == capture.TriggerLossSpike && b != nil && b.LossValue != nil {
		why = "the loss spike is in fp32 too: it comes from the model or the data, not from fp16"
	}
	r.VerdictText = fmt.Sprintf("not reproduced: the captured step %d (%s) is clean in %s%s%s; %s",
		d.step(), m.Trigger.Kind, strings.Join(clean, ", "), back, loss, why)
}

// -- helpers ---------------------------------------------------------------------

func (d *diag) addFix(f report.ReplayFix, modules []string) {
	d.words.set(&f, modules)
	d.r.Fixes = append(d.r.Fixes, f)
}

// skippedRun counts the skipped steps in a row up to the captured step,
// from the log, and returns the run's first step.
func (d *diag) skippedRun() (int, int) {
	l := d.in.Log
	if l == nil {
		return 0, -1
	}
	step := d.step()
	n, first := 0, -1
	for i := len(l.Steps) - 1; i >= 0; i-- {
		s := l.Steps[i]
		if s.Step > step {
			continue
		}
		if !s.Skipped {
			break
		}
		n++
		first = s.Step
	}
	return n, first
}

// pinned is the stretch before the capture in which the scale did not
// grow, from the log (nil: no log, or no scale).
func (d *diag) pinned() *report.PinnedStretch {
	l := d.in.Log
	if l == nil || len(l.Steps) == 0 {
		return nil
	}
	step := d.step()
	p := &report.PinnedStretch{}
	for i := len(l.Steps) - 1; i >= 0; i-- {
		s := l.Steps[i]
		if s.Step > step {
			continue
		}
		if s.Scale == nil || s.ScaleUsed == nil {
			return nil
		}
		if float64(*s.Scale) > float64(*s.ScaleUsed) {
			break
		}
		p.Steps++
		if s.Skipped {
			p.Backoffs++
		}
	}
	return p
}

func captureInfo(in Input) report.CaptureInfo {
	m := in.Capture.Manifest
	ci := report.CaptureInfo{
		Path: in.Path, Format: m.Version, Trigger: m.Trigger.Kind, Detail: m.Trigger.Detail, Step: m.Trigger.Step,
		Epoch: m.Trigger.Epoch, Created: m.Created, Trainer: m.Trainer, Policy: m.Precision.Policy,
		AutocastDevice: m.Precision.AutocastDevice, Device: m.Device.Type, DeviceName: m.Device.Name,
		StepApplied: m.StepApplied, ModelClass: m.Model.Class, Parameters: m.Model.Parameters, Exporter: m.Model.Exporter,
		ScaleExp: in.ScaleExp, ScaleNote: in.ScaleNote, Versions: map[string]string{},
	}
	if s, ok := m.Scale(); ok {
		ci.Scale = &s
	}
	if m.Loss.Value != nil {
		v := float64(*m.Loss.Value)
		ci.Loss = &v
	}
	if m.Loss.Function != nil {
		ci.LossFunction = *m.Loss.Function
	}
	if m.Loss.Name != nil {
		ci.LossName = *m.Loss.Name
	}
	if o := m.Optimizer; o != nil {
		ci.Optimizer = o.Class
		if o.LR != nil {
			v := float64(*o.LR)
			ci.LR = &v
		}
	}
	if p := m.Batches.Previous; p != nil {
		ci.PreviousStep = p.Step
	}
	for k, v := range m.Versions {
		if s, ok := v.(string); ok {
			ci.Versions[k] = s
		}
	}
	return ci
}

func moduleText(m string) string {
	if m == "" {
		return ""
	}
	return ", module " + m
}

func moduleOr(m, v string) string {
	if m != "" {
		return m
	}
	return v
}

// mag formats a magnitude as the audit's reports do.
func mag(x float64) string {
	switch {
	case math.IsNaN(x):
		return "NaN"
	case math.IsInf(x, 0):
		return "Inf"
	}
	return fmt.Sprintf("%.4g", x)
}

func ptrF(x float64) *float64 { return &x }

func ptrB(b bool) *bool { return &b }

func finitePtr(x float64) *float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return nil
	}
	return &x
}

func deref(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}
