// Package diagnose turns what the passes observed into findings, origins,
// verified fixes and a verdict: the diagnosis stage of an audit. Every
// dynamic check is an Analyzer over one evidence.Facts value (the static
// facts of the model, the input analysis and the pass results), run by a
// driver like the static lint's; the verdict is computed from the
// findings the analyzers returned and from the fixes a rerun verified,
// never inside an analyzer. The checks are declared in checks.go and run
// in analyzers.go, what an origin is for its finding is classify.go's,
// the verdict tree is verdict.go's (Run), and the samples of an fp32
// origin are located in samples.go. What they read is package
// evidence's (origins, deliberate infinities, output agreement), what an
// input holds package inputs', and the fixes are package fix's.
package diagnose

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/batch"
	"fp16audit/internal/diagnose/evidence"
	"fp16audit/internal/diagnose/fix"
	"fp16audit/internal/diagnose/inputs"
	"fp16audit/internal/lint"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/report"
)

// Options choose what a diagnosis does.
type Options struct {
	// Checks selects the analyzers; a check switched off does not run and
	// cannot decide the verdict. The zero value selects all.
	Checks checks.Selection
	// NoFixes skips every rerun: the fixes (standardized inputs,
	// keep-fp32, removed casts, constants in range) and locating the
	// samples of an fp32 origin.
	NoFixes bool
}

// Diagnosis is what the diagnosis stage adds to a report.
type Diagnosis struct {
	Verdict     string
	VerdictText string
	Origins     []report.Origin
	Fixes       []report.Fix
	Findings    []checks.Finding
	// OutputAgreement compares the graph outputs of the emulated passes
	// and of the reruns the fixes were judged by with fp32's.
	OutputAgreement []report.OutputAgreement
	// Notes are facts about the diagnosis a reader must know.
	Notes []string
}

// Run derives the shared facts, runs the analyzers over them, verifies
// the fixes the findings call for (reruns through run, over batches) and
// walks the verdict tree. Every verdict but healthy follows from a
// finding, so a check that --checks switches off cannot decide one:
//
//  0. dtype-mismatch (policy half): an op reads a float32 value the model
//     cast itself beside its half weights, where PyTorch raises (FP4010):
//     nothing numeric applies when the model cannot run.
//  1. poisoned-input: a batch holds NaN/Inf (FP1001).
//  2. unnormalized-input: a batch saved in fp16 holds ±Inf where its
//     values passed 65504 (FP1002 on that input), and they reach an
//     output.
//  3. fp32-broken: the fp32 pass makes NaN/Inf that reach an output
//     (FP2002); the origin names the samples that hold them.
//  4. explicit-half-cast: the overflowing value is in reduced precision
//     because of the model's own cast, and it overflows in the run
//     without mixed precision too (FP4001).
//  5. unnormalized-input: an input finding (FP1002, FP1003, FP1004,
//     FP1006) flags an input and a rerun with it standardized is clean.
//  6. overflowing-op: a constant beyond the format's range is written
//     into a reduced-precision value and its NaN/Inf reach an output
//     (FP4004 at error).
//  7. overflowing-op: an op overflows (FP2001), even when the final layer
//     overflows too.
//  8. oversized-logits: every overflow starts in the final layer (FP2003).
//  9. forward-underflow: nothing overflows, the outputs are finite but
//     wrong (FP2006) and the values where the error starts fall below the
//     format's range (smaller than its smallest normal, or flushed to
//     zero beyond --underflow-fraction).
//  10. precision-loss: nothing overflows, the outputs are finite but
//     wrong (FP2006) and where the error starts the values stay in range
//     and lose significant digits (FP3002).
//  11. healthy: nothing reaches the outputs and they agree with fp32's
//     within the tolerance. Warnings may remain, and an error: a fill
//     PyTorch refuses (FP4004), whose -Inf the emulation's softmax absorbs.
//
// An origin reaches the outputs with its NaN/Inf or, absorbed on the way,
// by leaving them finite but wrong (FP2006): the verdicts 4 to 8 are the
// same for both, and so are the fixes. Verdicts 9 and 10 need no
// overflow at all: an origin of cause precision, the first value beyond
// the tolerance whose inputs agree; their fixes are the standardized
// inputs (where an input is flagged), to_bf16() and keeping that value's
// region in fp32, each only where its rerun agrees with fp32.
func Run(ctx context.Context, f *evidence.Facts, run fix.Runner, batches []batch.Batch, opt Options) (*Diagnosis, error) {
	f.Prepare()
	findings, err := checks.RunAnalyzers(Analyzers(), f, opt.Checks, f.Static.Policy.Name)
	if err != nil {
		return nil, err
	}
	d := &Diagnosis{Findings: findings, Origins: []report.Origin{}, Fixes: []report.Fix{}}
	if n := len(f.LowHeadroom()) - maxHeadroomFindings; n > 0 && has(findings, checkHeadroom, checks.SevWarning) {
		d.Notes = append(d.Notes, fmt.Sprintf("%d more value(s) with headroom under %.1f bits are not listed", n, f.Thresholds.HeadroomBits))
	}
	switch {
	case has(findings, lint.CheckHalfDtype, checks.SevError):
		d.Verdict = report.VerdictDtypeMismatch
		d.Origins = dtypeOrigins(f, findings)
		d.VerdictText = "model.half() cannot run this model: " + lint.HalfDtypeMessage(f.Graph(), f.Static.HalfDtypes()[0])
		if n := len(d.Origins); n > 1 {
			d.VerdictText += fmt.Sprintf(" (and %d more such layer(s))", n-1)
		}
	case has(findings, checkPoisonedInput, checks.SevError):
		d.Verdict = report.VerdictPoisoned
		o := f.Deciding(f.Origins(report.PassFP32))
		d.VerdictText = fmt.Sprintf("the batch already holds NaN/Inf (%s): clean the data before looking at precision", inputList(o))
		d.Origins = o
	case savedHalfOrigins(f, findings) != nil:
		d.Verdict = report.VerdictUnnormalized
		d.Origins = savedHalfOrigins(f, findings)
		d.VerdictText = fmt.Sprintf("%s was saved in float16 and holds Inf where its values passed 65504: the inputs are not normalized; standardize them and save the batch in float32", inputList(d.Origins))
	case has(findings, checkFP32Broken, checks.SevError):
		o := f.Deciding(f.Origins(report.PassFP32))
		if !opt.NoFixes {
			note, err := locateSamples(ctx, f, run, batches, o)
			if err != nil {
				return nil, err
			}
			if note != "" {
				d.Notes = append(d.Notes, note)
			}
		}
		d.Verdict = report.VerdictFP32Broken
		d.VerdictText = fmt.Sprintf("the model produces NaN/Inf even in fp32, first at %s (%s)%s: fix the model or data first", o[0].Node, o[0].OpType, samplesWording(o[0].Samples))
		if !opt.NoFixes {
			fx, err := fix.Epsilon(ctx, f, run, batches, o)
			if err != nil {
				return nil, err
			}
			if fx != nil {
				d.Fixes = append(d.Fixes, *fx)
				if fx.Works {
					d.VerdictText += fmt.Sprintf("; %s divides by a square root with no epsilon, and with one no NaN/Inf of the fp32 pass reaches an output (rerun)", o[0].Node)
				}
			}
		}
		d.Origins = o
	case f.Main == "":
		d.Verdict, d.VerdictText = report.VerdictHealthy, "the fp32 pass is clean (policy fp32: no emulated pass)"
	default:
		decided, err := overflowVerdict(ctx, f, d, run, batches, opt, findings)
		if err != nil {
			return nil, err
		}
		if !decided {
			d.Verdict = report.VerdictHealthy
			d.VerdictText = healthyText(f, opt)
		}
	}
	d.OutputAgreement = outputAgreement(f, d.Fixes)
	return d, nil
}

// dtypeOrigins are the layers model.half() raises at that FP4010
// reports.
func dtypeOrigins(f *evidence.Facts, findings []checks.Finding) []report.Origin {
	var out []report.Origin
	g := f.Graph()
	for _, h := range f.Static.HalfDtypes() {
		n := g.Node[h.Node]
		if !slices.ContainsFunc(findings, func(x checks.Finding) bool { return x.Check == lint.CheckHalfDtype.ID && x.Node == f.NodeName(h.Node) }) {
			continue
		}
		out = append(out, report.Origin{Pass: f.Main, Cause: report.CauseDtype, Node: f.NodeName(h.Node), Index: h.Node, OpType: n.OpType,
			Module: onnx.ModulePath(n), Precision: f.Static.Assign.Node[h.Node].String(), Value: n.Input[0],
			Affected: []string{}, AffectedOutputs: []string{}})
	}
	return out
}

// outputAgreement lists the output agreement of the emulated passes, then
// of the passes the fixes were judged by, once each.
func outputAgreement(f *evidence.Facts, fixes []report.Fix) []report.OutputAgreement {
	out := []report.OutputAgreement{}
	seen := map[string]bool{}
	add := func(pass string) {
		if seen[pass] {
			return
		}
		seen[pass] = true
		if res, ok := f.Passes[pass]; ok {
			f.RecordAgreement(res)
		}
		out = append(out, f.Agreement(pass)...)
	}
	add(f.Main)
	add(report.PassBF16)
	add(report.PassAsWritten)
	for _, fx := range fixes {
		add(fx.Pass)
	}
	return out
}

// has reports whether findings hold one of check c at severity sev or
// above.
func has(findings []checks.Finding, c *checks.Check, sev checks.Severity) bool {
	return slices.ContainsFunc(findings, func(x checks.Finding) bool { return x.Check == c.ID && x.Severity >= sev })
}

// reported returns the origins some error finding of check c names (by
// node, or by input for an origin at a graph input).
func reported(findings []checks.Finding, c *checks.Check, origins []report.Origin, f *evidence.Facts) []report.Origin {
	var out []report.Origin
	for _, o := range origins {
		if slices.ContainsFunc(findings, func(x checks.Finding) bool {
			if x.Check != c.ID || x.Severity < checks.SevError {
				return false
			}
			if o.Index < 0 {
				return x.Value == o.Input
			}
			return x.Node == f.NodeName(o.Index)
		}) {
			out = append(out, o)
		}
	}
	return out
}

// savedHalfOrigins returns the input origins of data saved in half
// precision beyond its range, when they reach an output and FP1002 says
// so.
func savedHalfOrigins(f *evidence.Facts, findings []checks.Finding) []report.Origin {
	var out []report.Origin
	for _, o := range f.Deciding(f.Origins(report.PassFP32)) {
		in := f.Input(o.Input)
		if o.Cause != report.CauseInput || in == nil || !in.SavedHalfInf {
			continue
		}
		if slices.ContainsFunc(findings, func(x checks.Finding) bool { return x.Check == checkInputRange.ID && x.Value == o.Input }) {
			out = append(out, o)
		}
	}
	return out
}

// inputList names the inputs of input origins.
func inputList(os []report.Origin) string {
	var names []string
	for _, o := range os {
		if o.Cause == report.CauseInput {
			names = append(names, fmt.Sprintf("input %q", o.Input))
		}
	}
	if len(names) == 0 {
		return "an input"
	}
	return strings.Join(names, ", ")
}

// samplesWording says where an origin's NaN/Inf are, for the verdict.
func samplesWording(samples []report.Sample) string {
	if len(samples) == 0 {
		return ""
	}
	var parts []string
	for _, s := range limitSamples(samples, 5) {
		parts = append(parts, fmt.Sprintf("batch %d sample %d", s.Batch, s.Index))
	}
	txt := " in " + strings.Join(parts, ", ")
	if len(samples) > 5 {
		txt += fmt.Sprintf(" and %d more sample(s)", len(samples)-5)
	}
	return txt
}

func limitSamples(s []report.Sample, n int) []report.Sample {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// healthyText says what a clean emulated pass showed.
func healthyText(f *evidence.Facts, opt Options) string {
	if n := len(f.Deciding(f.Origins(report.PassFP32))); n > 0 {
		return fmt.Sprintf("undecided: NaN/Inf of %d origin(s) reach the outputs of the fp32 pass, but --checks %s switched off the checks that report them", n, opt.Checks)
	}
	txt := fmt.Sprintf("nothing non-finite reaches the outputs of the %s pass", f.Main)
	if len(f.Origins(f.Main)) == 0 {
		txt = fmt.Sprintf("no NaN/Inf in the %s pass", f.Main)
	}
	if res, ok := f.Passes[f.Main]; ok {
		if a := f.AgreeText(res); a != "" {
			txt += "; " + a
		}
	}
	if bits, _, limit, ok := f.MinHeadroom(); ok {
		txt += fmt.Sprintf("; smallest headroom %.1f bits below %.4g", bits, limit)
	}
	if n := len(f.Deciding(f.MainOrigins())); n > 0 {
		txt += fmt.Sprintf("; %d overflow(s) went unreported because --checks %s switched their checks off", n, opt.Checks)
	}
	for _, o := range f.MainOrigins() {
		if f.Raises(o) {
			txt += fmt.Sprintf("; but %s", consequence(f, o))
			break
		}
	}
	return txt
}

// overflowVerdict verifies the fixes of an emulated pass whose NaN/Inf
// reach an output and picks the verdict; decided is false when no error
// finding names a deciding origin (their checks are switched off, or
// nothing reaches an output).
func overflowVerdict(ctx context.Context, f *evidence.Facts, d *Diagnosis, run fix.Runner, batches []batch.Batch, opt Options, findings []checks.Finding) (decided bool, err error) {
	origins := f.Deciding(f.MainOrigins())
	castOrigins := reported(findings, checkHalfCast, origins, f)
	constOrigins := reported(findings, lint.CheckConstRange, origins, f)
	overflows := reported(findings, checkOverflow, origins, f)
	logits := reported(findings, checkLogits, origins, f)
	precise := wrongReported(findings, origins, f)
	if len(castOrigins)+len(constOrigins)+len(overflows)+len(logits)+len(precise) == 0 {
		return false, nil
	}
	d.Origins = origins
	before := f.NonFinite(f.Passes[f.Main], f.Main)
	addFix := func(fx *report.Fix, err error) (*report.Fix, error) {
		if err != nil || fx == nil {
			return nil, err
		}
		d.Fixes = append(d.Fixes, *fx)
		return fx, nil
	}
	cast, constant := len(castOrigins) > 0, len(castOrigins) == 0 && len(constOrigins) > 0
	flagged := flaggedInputs(f, findings)
	var std *report.Fix
	if !opt.NoFixes {
		switch {
		case constant:
			_, err = addFix(fix.Constant(ctx, f, run, batches, origins, before))
		case cast:
			_, err = addFix(fix.RemoveCast(ctx, f, run, batches, castOrigins, before))
		case len(flagged) > 0:
			std, err = addFix(fix.Standardize(ctx, f, run, batches, flagged, before))
		}
		if err != nil {
			return false, err
		}
	}
	if fx, ok := fix.BF16(f, before); ok {
		d.Fixes = append(d.Fixes, *fx)
	}
	onlyPrecise := len(castOrigins)+len(constOrigins)+len(overflows)+len(logits) == 0
	removed := false // the cast's removal was tried and did not work
	if !opt.NoFixes && !constant && (std == nil || !std.Works) {
		var fx *report.Fix
		switch {
		case onlyPrecise:
			fx, err = fix.KeepRegion(ctx, f, run, batches, precise[0], before, !underflows(f, precise[0]))
		case cast && !fixWorks(d.Fixes, report.FixRemoveCast):
			// Without the cast autocast may still hold the op in 16 bits
			// (a cast right after a Linear): keep it in fp32 as well.
			removed = true
			fx, err = fix.KeepFP32(ctx, f, run, batches, origins, before, f.CastsOf(castOrigins))
		case !cast:
			fx, err = fix.KeepFP32(ctx, f, run, batches, origins, before, nil)
		}
		if _, err := addFix(fx, err); err != nil {
			return false, err
		}
	}
	switch {
	case onlyPrecise:
		o := precise[0]
		if underflows(f, o) {
			d.Verdict = report.VerdictUnderflow
			how := fmt.Sprintf("its values fall below %s's range (fp32 max |x| %.3g against the smallest normal %.3g)", f.Main, o.FP32MaxAbs, smallestNormal(f.PassFormat(f.Main)))
			if df := f.Passes[f.Main].Diffs[o.Value]; df != nil && df.FlushedFraction() > 0 {
				how += fmt.Sprintf(", %.0f%% of its nonzero values flush to zero", 100*df.FlushedFraction())
			}
			d.VerdictText = fmt.Sprintf("nothing overflows in the %s pass, but the outputs are lost to underflow: from %s (%s) on, %s", f.Main, moduleOr(o.Module, o.Node), o.OpType, how)
			if note := untrainedNote(f); note != "" {
				d.Notes = append(d.Notes, note)
			}
			break
		}
		d.Verdict = report.VerdictPrecision
		d.VerdictText = precisionText(f, o, d.Fixes)
	case cast:
		d.Verdict = report.VerdictHalfCast
		o := castOrigins[0]
		casts := "its own half cast"
		if o.Provenance != nil && len(o.Provenance.Casts) > 0 {
			casts = strings.Join(o.Provenance.Casts, ", ")
		}
		d.VerdictText = fmt.Sprintf("the model casts to half itself (%s) and %s (%s) overflows there with mixed precision off too (the %s pass): %s will not help; remove the cast or move it after the op that overflows",
			casts, moduleOr(o.Module, o.Node), o.OpType, report.PassAsWritten, f.Words().MixedOff)
		if removed && f.HeldWithoutCasts(o) {
			d.VerdictText += fmt.Sprintf("; without the cast %s still holds it in 16 bits, so it must stay in fp32 as well", f.Static.Policy.Name)
		}
		if f.Passes[report.PassAsWritten] == nil {
			d.VerdictText = fmt.Sprintf("the model casts to half itself (%s) and %s (%s) overflows there; autocast cannot protect an explicit cast (without the %s pass it is not known whether it overflows with mixed precision off too): remove the cast or move it after the op that overflows",
				casts, moduleOr(o.Module, o.Node), o.OpType, report.PassAsWritten)
		}
	case std != nil && std.Works:
		d.Verdict = report.VerdictUnnormalized
		d.VerdictText = fmt.Sprintf("the input %s is not normalized; with it standardized the %s pass is clean", strings.Join(quoted(std.Inputs), ", "), f.Main)
	case constant:
		o := constOrigins[0]
		d.Verdict = report.VerdictOverflow
		d.VerdictText = fmt.Sprintf("%s (%s) writes the constant %s = %s into a %s value, and the %s reaches %s: use torch.finfo(x.dtype).min instead of a fixed value",
			moduleOr(o.Module, o.Node), o.OpType, o.Constant, fmtConst(*o.ConstantValue), o.Precision, infWord(*o.ConstantValue), strings.Join(o.AffectedOutputs, ", "))
		if o.Weight != "" {
			d.VerdictText = weightVerdictText(o)
		}
	case len(overflows) > 0:
		o := overflows[0]
		d.Verdict = report.VerdictOverflow
		d.VerdictText = fmt.Sprintf("%s (%s) overflows %s%s (fp32 max |x| %.4g)", moduleOr(o.Module, o.Node), o.OpType, o.Precision, inputsWording(f), o.FP32MaxAbs)
		if o.ExplicitCast && f.Passes[report.PassAsWritten] != nil {
			d.VerdictText += "; the model's own cast upstream does not overflow without mixed precision: autocast's lower precision does it"
		}
	default:
		o := logits[0]
		d.Verdict = report.VerdictLogits
		d.VerdictText = fmt.Sprintf("the final layer %s outputs values beyond %s's range (fp32 max |x| %.4g)", moduleOr(o.Module, o.Node), o.Precision, o.FP32MaxAbs)
	}
	if w := f.WrongText(f.Passes[f.Main]); w != "" && !slices.ContainsFunc(origins, func(o report.Origin) bool { return len(o.AffectedOutputs) > 0 }) {
		// Nothing non-finite reaches the outputs: say what does.
		d.VerdictText += "; " + w
	}
	return true, nil
}

// precisionText is the precision-loss verdict's text: where the error
// starts, how large it is, and which verified fix brings the outputs
// back.
func precisionText(f *evidence.Facts, o report.Origin, fixes []report.Fix) string {
	txt := fmt.Sprintf("nothing overflows or underflows in the %s pass, but rounding to %s loses the outputs: from %s (%s) on, the values stay in range and lose significant digits",
		f.Main, f.Main, moduleOr(o.Module, o.Node), o.OpType)
	if df := f.Passes[f.Main].Diffs[o.Value]; df != nil {
		txt += fmt.Sprintf(" (error %s there against fp32, fp32 max |x| %.4g)", evidence.Percent(df.RelErr()), o.FP32MaxAbs)
	}
	var works []string
	for _, fx := range fixes {
		if !fx.Works {
			continue
		}
		switch fx.Kind {
		case report.FixKeepFP32:
			works = append(works, fmt.Sprintf("keep %s in fp32", strings.Join(fx.Modules, ", ")))
		case report.FixStandardize:
			works = append(works, "standardize "+strings.Join(quoted(fx.Inputs), ", "))
		case report.FixBF16:
			works = append(works, "learn.to_bf16() (its outputs agree with fp32's)")
		}
	}
	if len(works) > 0 {
		txt += ": " + strings.Join(works, ", or ") + " (verified by a rerun)"
	}
	return txt
}

// fixWorks reports whether the fix of this kind among fixes works.
func fixWorks(fixes []report.Fix, kind string) bool {
	return slices.ContainsFunc(fixes, func(x report.Fix) bool { return x.Kind == kind && x.Works })
}

// wrongReported returns the precision origins (nothing overflows, the
// outputs are wrong) whose wrong outputs an error finding of FP2006 names
// and, but for an origin whose values underflow, that FP3002 reports.
func wrongReported(findings []checks.Finding, origins []report.Origin, f *evidence.Facts) []report.Origin {
	var out []report.Origin
	for _, o := range origins {
		if o.Cause != report.CausePrecision {
			continue
		}
		if !underflows(f, o) && len(reported(findings, checkPrecisionLoss, []report.Origin{o}, f)) == 0 {
			continue
		}
		if slices.ContainsFunc(findings, func(x checks.Finding) bool {
			return x.Check == checkWrongOutputs.ID && x.Severity >= checks.SevError && slices.Contains(o.WrongOutputs, x.Value)
		}) {
			out = append(out, o)
		}
	}
	return out
}

// inputChecks are the checks that flag an input whose scale can overflow.
var inputChecks = []*checks.Check{checkInputRange, checkRawPixels, checkUnscaledColumns, checkUnscaledSignal}

// flaggedInputs returns the float inputs an input finding flags, in input
// order (not data saved in half precision, which standardizing cannot
// repair).
func flaggedInputs(f *evidence.Facts, findings []checks.Finding) []*inputs.Input {
	var out []*inputs.Input
	for _, in := range f.Inputs {
		if !in.Float() || in.SavedHalfInf {
			continue
		}
		if slices.ContainsFunc(findings, func(x checks.Finding) bool {
			return x.Value == in.Spec.Name && slices.ContainsFunc(inputChecks, func(c *checks.Check) bool { return c.ID == x.Check })
		}) {
			out = append(out, in)
		}
	}
	return out
}

// inputsWording says what the inputs were, for an overflow verdict: "on
// normalized inputs" only where the float inputs look standardized.
func inputsWording(f *evidence.Facts) string {
	floats := 0
	for _, in := range f.Inputs {
		if !in.Float() {
			continue
		}
		floats++
		if in.Flagged {
			return " on these inputs"
		}
	}
	if floats == 0 {
		return ""
	}
	return " on normalized inputs"
}

// consequence is what PyTorch does at a constant origin, with where.
func consequence(f *evidence.Facts, o report.Origin) string {
	n := f.Graph().Node[o.Index]
	return lint.FillAt(n, inputSlot(n, o.Constant)).Consequence(f.Static.Assign.Node[o.Index], *o.ConstantValue) +
		fmt.Sprintf(" (%s, %s writes %s = %s)", moduleOr(o.Module, "model"), o.Node, o.Constant, fmtConst(*o.ConstantValue))
}

func quoted(s []string) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = fmt.Sprintf("%q", x)
	}
	return out
}

// underflows reports whether a precision origin's values are lost below
// the format's range rather than to its rounding: their fp32 magnitude
// stays under the smallest normal, or more of them than
// --underflow-fraction flush to zero and as many were below fp16's normal
// range in fp32. A value of the format's range that rounds to zero is the
// difference of two nearly equal numbers (h - mean(h) after rounding h),
// a loss of precision, not of range; bf16 has fp32's range, so its zeros
// always are.
func underflows(f *evidence.Facts, o report.Origin) bool {
	if o.FP32MaxAbs > 0 && o.FP32MaxAbs < smallestNormal(f.PassFormat(f.Main)) {
		return true
	}
	d := f.Passes[f.Main].Diffs[o.Value]
	if d == nil || d.FlushedFraction() <= f.Thresholds.UnderflowFraction || f.PassFormat(f.Main) == precision.BF16 {
		return false
	}
	ref, ok := f.Passes[report.PassFP32].Stats[o.Value]
	if !ok {
		return true
	}
	return float64(ref.FP16Flush+ref.FP16Subnormal) > f.Thresholds.UnderflowFraction*float64(d.NonzeroRef)
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
func untrainedNote(f *evidence.Facts) string {
	ref := f.Passes[report.PassFP32]
	largest := 0.0
	for _, vi := range f.Graph().Output {
		if s, ok := ref.Stats[vi.Name]; ok && s.Finite > 0 {
			largest = max(largest, float64(s.MaxAbs))
		}
	}
	if largest == 0 || largest >= smallestNormal(precision.FP16) {
		return ""
	}
	return fmt.Sprintf("the fp32 outputs themselves are tiny (max |x| %.3g, below fp16's smallest normal 6.1e-05): activations that shrink layer by layer like this are what an untrained network does (torchvision's models as constructed keep BatchNorm at its initial statistics); audit the trained weights, or calibrate BatchNorm on real batches, before changing the precision", largest)
}
