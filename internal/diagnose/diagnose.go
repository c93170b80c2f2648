package diagnose

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/batch"
	"fp16audit/internal/lint"
	"fp16audit/report"
)

// Options choose what a diagnosis does.
type Options struct {
	// Checks selects the analyzers; a check switched off does not run and
	// cannot decide the verdict. The zero value selects all.
	Checks checks.Selection
	// NoFixes skips the fix reruns (standardized inputs, keep-fp32, removed
	// casts, constants in range).
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

// Run runs the analyzers over f, verifies the fixes the findings call for
// (reruns through run, over batches) and walks the verdict tree:
//
//  1. poisoned-input: a batch holds NaN/Inf (FP1001).
//  2. fp32-broken: the fp32 pass makes NaN/Inf that reach an output (FP2002).
//  3. explicit-half-cast: the overflowing value is in reduced precision
//     because of the model's own cast (FP4001).
//  4. unnormalized-input: the inputs are far from standardized and a rerun
//     with standardized inputs is clean (or the batch was saved in fp16
//     beyond its range).
//  5. oversized-logits: every overflow starts in the final layer (FP2003).
//  6. overflowing-op: an op overflows (FP2001), or a constant beyond the
//     format's range written into a reduced-precision value makes NaN/Inf
//     that reach an output (FP4004), or the outputs are finite but wrong
//     although nothing overflows (FP2006 with a precision origin).
//  7. healthy: nothing reaches the outputs and they agree with fp32's
//     within the tolerance. Warnings may remain, and an error: a fill
//     PyTorch refuses (FP4004), whose -Inf the emulation's softmax absorbs.
//
// An origin reaches the outputs with its NaN/Inf or, absorbed on the way,
// by leaving them finite but wrong (FP2006): the verdict classes 3–6 are
// the same for both, and so are the fixes.
func Run(ctx context.Context, f *Facts, run Runner, batches []batch.Batch, opt Options) (*Diagnosis, error) {
	f.consts = constantValues(f.graph(), f.Static.Order)
	findings, err := checks.RunAnalyzers(Analyzers(), f, opt.Checks, f.Static.Policy.Name)
	if err != nil {
		return nil, err
	}
	d := &Diagnosis{Findings: findings, Origins: []report.Origin{}, Fixes: []report.Fix{}}
	has := func(c *checks.Check, sev checks.Severity) bool {
		return slices.ContainsFunc(findings, func(x checks.Finding) bool { return x.Check == c.ID && x.Severity >= sev })
	}
	switch {
	case has(checkPoisonedInput, checks.SevError):
		d.Verdict = report.VerdictPoisoned
		o := f.deciding(f.Origins(PassFP32))
		d.VerdictText = fmt.Sprintf("the batch already holds NaN/Inf (%s): clean the data before looking at precision", inputList(o))
		d.Origins = o
	case f.savedHalfOrigins() != nil:
		d.Verdict = report.VerdictUnnormalized
		d.Origins = f.savedHalfOrigins()
		d.VerdictText = fmt.Sprintf("%s was saved in float16 and holds Inf where its values passed 65504: the inputs are not normalized; standardize them and save the batch in float32", inputList(d.Origins))
	case has(checkFP32Broken, checks.SevError):
		o := f.deciding(f.Origins(PassFP32))
		d.Verdict = report.VerdictFP32Broken
		d.VerdictText = fmt.Sprintf("the model produces NaN/Inf even in fp32, first at %s (%s): fix the model or data first", o[0].Node, o[0].OpType)
		d.Origins = o
	case f.Main == "":
		d.Verdict, d.VerdictText = report.VerdictHealthy, "the fp32 pass is clean (policy fp32: no emulated pass)"
	case len(f.deciding(f.mainOrigins())) > 0 && (has(lint.CheckConstRange, checks.SevError) || has(checkHalfCast, checks.SevError) ||
		has(checkLogits, checks.SevError) || has(checkOverflow, checks.SevError) || has(checkWrongOutputs, checks.SevError)):
		if err := f.overflowVerdict(ctx, d, run, batches, opt, has); err != nil {
			return nil, err
		}
	default:
		d.Verdict = report.VerdictHealthy
		d.VerdictText = f.healthyText(opt)
	}
	d.Notes = f.notes
	d.OutputAgreement = f.outputAgreement(d.Fixes)
	return d, nil
}

// outputAgreement lists the output agreement of the emulated passes, then
// of the passes the fixes were judged by, once each.
func (f *Facts) outputAgreement(fixes []report.Fix) []report.OutputAgreement {
	out := []report.OutputAgreement{}
	seen := map[string]bool{}
	add := func(pass string) {
		if seen[pass] {
			return
		}
		seen[pass] = true
		if res, ok := f.Passes[pass]; ok {
			f.recordAgreement(res)
		}
		out = append(out, f.agreements[pass]...)
	}
	add(f.Main)
	add(PassBF16)
	for _, fx := range fixes {
		add(fx.Pass)
	}
	return out
}

// savedHalfOrigins returns the input origins of data saved in half
// precision beyond its range, when they reach an output.
func (f *Facts) savedHalfOrigins() []report.Origin {
	var out []report.Origin
	for _, o := range f.deciding(f.Origins(PassFP32)) {
		if in := f.input(o.Input); o.Cause == report.CauseInput && in != nil && in.SavedHalfInf {
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

// healthyText says what a clean emulated pass showed.
func (f *Facts) healthyText(opt Options) string {
	txt := fmt.Sprintf("nothing non-finite reaches the outputs of the %s pass", f.Main)
	if len(f.Origins(f.Main)) == 0 {
		txt = fmt.Sprintf("no NaN/Inf in the %s pass", f.Main)
	}
	if res, ok := f.Passes[f.Main]; ok {
		if a := f.agreeText(res); a != "" {
			txt += "; " + a
		}
	}
	if bits, _, limit, ok := f.MinHeadroom(); ok {
		txt += fmt.Sprintf("; smallest headroom %.1f bits below %.4g", bits, limit)
	}
	if n := len(f.deciding(f.Origins(f.Main))); n > 0 && f.mainOrigins() != nil {
		txt += fmt.Sprintf("; %d overflow(s) went unreported because --checks %s switched their checks off", n, opt.Checks)
	}
	for _, o := range f.mainOrigins() {
		if f.Raises(o) {
			txt += fmt.Sprintf("; but %s", f.consequence(o))
			break
		}
	}
	return txt
}

// overflowVerdict verifies the fixes of an emulated pass whose NaN/Inf
// decide the outcome and picks the verdict.
func (f *Facts) overflowVerdict(ctx context.Context, d *Diagnosis, run Runner, batches []batch.Batch, opt Options, has func(*checks.Check, checks.Severity) bool) error {
	origins := f.deciding(f.mainOrigins())
	d.Origins = origins
	before := f.Passes[f.Main].NonFinite(f.Values)
	addFix := func(fix *report.Fix, err error) (*report.Fix, error) {
		if err != nil || fix == nil {
			return nil, err
		}
		d.Fixes = append(d.Fixes, *fix)
		return fix, nil
	}
	cast := has(checkHalfCast, checks.SevError)
	constant := !cast && slices.ContainsFunc(origins, func(o report.Origin) bool { return o.Cause == report.CauseConstant })
	var std *report.Fix
	if !opt.NoFixes {
		var err error
		switch {
		case constant:
			_, err = addFix(f.fixConstant(ctx, run, batches, origins, before))
		case cast:
			_, err = addFix(f.fixRemoveCast(ctx, run, batches, origins, before))
		case slices.ContainsFunc(f.Inputs, func(in *Input) bool { return in.Flagged && in.chans != nil && !in.SavedHalfInf }):
			std, err = addFix(f.fixStandardize(ctx, run, batches, before))
		}
		if err != nil {
			return err
		}
	}
	if fix, ok := f.fixBF16(before); ok {
		d.Fixes = append(d.Fixes, *fix)
	}
	if !opt.NoFixes && !constant && !cast && (std == nil || !std.Works) {
		if _, err := addFix(f.fixKeepFP32(ctx, run, batches, origins, before)); err != nil {
			return err
		}
	}
	first := origins[0]
	switch {
	case allPrecision(f, origins):
		d.Verdict = report.VerdictOverflow
		how := fmt.Sprintf("rounding to %s loses too much", f.Main)
		if df := f.Passes[f.Main].Diffs[first.Value]; df != nil && df.FlushedFraction() > f.Thresholds.UnderflowFraction {
			how = fmt.Sprintf("%.0f%% of its nonzero values flush to zero in %s (underflow)", 100*df.FlushedFraction(), f.Main)
		}
		d.VerdictText = fmt.Sprintf("nothing overflows in the %s pass, but at %s (%s) %s: keep it in fp32",
			f.Main, moduleOr(first.Module, first.Node), first.OpType, how)
	case cast:
		d.Verdict = report.VerdictHalfCast
		o := firstClass(f, origins, classHalfCast)
		casts := "its own half cast"
		if o.Provenance != nil && len(o.Provenance.Casts) > 0 {
			casts = strings.Join(o.Provenance.Casts, ", ")
		}
		d.VerdictText = fmt.Sprintf("the model casts to half itself (%s) and %s (%s) overflows there; autocast cannot protect an explicit cast: remove or move the cast",
			casts, moduleOr(o.Module, o.Node), o.OpType)
	case std != nil && std.Works:
		d.Verdict = report.VerdictUnnormalized
		d.VerdictText = fmt.Sprintf("the input %s is not normalized; with it standardized the %s pass is clean", strings.Join(quoted(std.Inputs), ", "), f.Main)
	case constant:
		o := firstOf(origins, report.CauseConstant)
		d.Verdict = report.VerdictOverflow
		d.VerdictText = fmt.Sprintf("%s (%s) writes the constant %s = %s into a %s value, and the %s reaches %s: use torch.finfo(x.dtype).min instead of a fixed value",
			moduleOr(o.Module, o.Node), o.OpType, o.Constant, fmtConst(*o.ConstantValue), o.Precision, infWord(*o.ConstantValue), strings.Join(o.AffectedOutputs, ", "))
	case !has(checkOverflow, checks.SevError):
		d.Verdict = report.VerdictLogits
		d.VerdictText = fmt.Sprintf("the final layer %s outputs values beyond %s's range (fp32 max |x| %.4g)", moduleOr(first.Module, first.Node), first.Precision, first.FP32MaxAbs)
	default:
		o := firstClass(f, origins, classOverflow)
		d.Verdict = report.VerdictOverflow
		d.VerdictText = fmt.Sprintf("%s (%s) overflows %s%s (fp32 max |x| %.4g)", moduleOr(o.Module, o.Node), o.OpType, o.Precision, f.inputsWording(), o.FP32MaxAbs)
	}
	if w := f.wrongText(f.Passes[f.Main]); w != "" && !slices.ContainsFunc(origins, func(o report.Origin) bool { return len(o.AffectedOutputs) > 0 }) {
		// Nothing non-finite reaches the outputs: say what does.
		d.VerdictText += "; " + w
	}
	return nil
}

// allPrecision reports whether every origin is a precision one: nothing
// overflows, the outputs are wrong from rounding alone.
func allPrecision(f *Facts, os []report.Origin) bool {
	for _, o := range os {
		if f.classify(o) != classPrecision {
			return false
		}
	}
	return true
}

// inputsWording says what the inputs were, for an overflow verdict: "on
// normalized inputs" only where the float inputs look standardized.
func (f *Facts) inputsWording() string {
	floats := 0
	for _, in := range f.Inputs {
		if in.chans == nil {
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
func (f *Facts) consequence(o report.Origin) string {
	n := f.graph().Node[o.Index]
	return lint.FillAt(n, inputSlot(n, o.Constant)).Consequence(f.Static.Assign.Node[o.Index], *o.ConstantValue) +
		fmt.Sprintf(" (%s, %s writes %s = %s)", moduleOr(o.Module, "model"), o.Node, o.Constant, fmtConst(*o.ConstantValue))
}

func firstOf(os []report.Origin, cause string) report.Origin {
	for _, o := range os {
		if o.Cause == cause {
			return o
		}
	}
	return os[0]
}

func firstClass(f *Facts, os []report.Origin, c originClass) report.Origin {
	for _, o := range os {
		if f.classify(o) == c {
			return o
		}
	}
	return os[0]
}

func quoted(s []string) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = fmt.Sprintf("%q", x)
	}
	return out
}
