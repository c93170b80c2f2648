package diagnose

import (
	"context"
	"fmt"
	"slices"

	"fp16audit/checks"
	"fp16audit/internal/batch"
	"fp16audit/report"
)

// Options choose what a diagnosis does.
type Options struct {
	// Checks selects the analyzers; a check switched off does not run and
	// cannot decide the verdict. The zero value selects all.
	Checks checks.Selection
	// NoFixes skips the fix reruns (standardized inputs, keep-fp32).
	NoFixes bool
}

// Diagnosis is what the diagnosis stage adds to a report.
type Diagnosis struct {
	Verdict     string
	VerdictText string
	Origins     []report.Origin
	Fixes       []report.Fix
	Findings    []checks.Finding
	// Notes are facts about the diagnosis a reader must know.
	Notes []string
}

// Run runs the analyzers over f, verifies the fixes the findings call for
// (reruns through run, over batches) and walks the verdict tree.
func Run(ctx context.Context, f *Facts, run Runner, batches []batch.Batch, opt Options) (*Diagnosis, error) {
	findings, err := checks.RunAnalyzers(Analyzers(), f, opt.Checks, f.Static.Policy.Name)
	if err != nil {
		return nil, err
	}
	d := &Diagnosis{Findings: findings, Origins: []report.Origin{}, Fixes: []report.Fix{}}
	has := func(c *checks.Check) bool {
		return slices.ContainsFunc(findings, func(x checks.Finding) bool { return x.Check == c.ID })
	}
	switch {
	case has(checkPoisonedInput):
		d.Verdict = report.VerdictPoisoned
		d.VerdictText = "the batch already holds NaN/Inf: clean the data before looking at precision"
		d.Origins = f.Origins(PassFP32)
	case has(checkFP32Broken):
		o := f.Origins(PassFP32)
		d.Verdict = report.VerdictFP32Broken
		d.VerdictText = fmt.Sprintf("the model produces NaN/Inf even in fp32, first at %s (%s): fix the model or data first", o[0].Node, o[0].OpType)
		d.Origins = o
	case f.Main == "":
		d.Verdict, d.VerdictText = report.VerdictHealthy, "the fp32 pass is clean (policy fp32: no emulated pass)"
	case has(checkHalfCast) || has(checkLogits) || has(checkOverflow):
		if err := f.overflowVerdict(ctx, d, run, batches, opt, has); err != nil {
			return nil, err
		}
	default:
		d.Verdict = report.VerdictHealthy
		d.VerdictText = fmt.Sprintf("no NaN/Inf in the %s pass", f.Main)
		if bits, _, ok := f.minHeadroom(); ok {
			d.VerdictText += fmt.Sprintf("; smallest headroom %.1f bits", bits)
		}
		if o := f.Origins(f.Main); len(o) > 0 {
			d.Origins = o
		}
	}
	d.Notes = f.notes
	return d, nil
}

// overflowVerdict verifies the fixes of an emulated pass that overflows and
// decides between explicit-half-cast, unnormalized-input, oversized-logits
// and overflowing-op.
func (f *Facts) overflowVerdict(ctx context.Context, d *Diagnosis, run Runner, batches []batch.Batch, opt Options, has func(*checks.Check) bool) error {
	origins := f.Origins(f.Main)
	d.Origins = origins
	before := f.Passes[f.Main].NonFinite(f.Values)
	flagged := slices.ContainsFunc(f.Inputs, func(in *Input) bool { return in.Flagged })
	var std *report.Fix
	if !opt.NoFixes && flagged {
		fix, err := f.fixStandardize(ctx, run, batches, before)
		if err != nil {
			return err
		}
		std = fix
		d.Fixes = append(d.Fixes, *fix)
	}
	if fix, ok := f.fixBF16(before); ok {
		d.Fixes = append(d.Fixes, *fix)
	}
	if !opt.NoFixes {
		fix, err := f.fixKeepFP32(ctx, run, batches, origins, before)
		if err != nil {
			return err
		}
		d.Fixes = append(d.Fixes, *fix)
	}
	switch {
	case has(checkHalfCast):
		d.Verdict = report.VerdictHalfCast
		d.VerdictText = "the model casts to half precision itself and overflows there; autocast cannot protect an explicit cast"
	case std != nil && std.Works:
		d.Verdict = report.VerdictUnnormalized
		d.VerdictText = "the inputs are not normalized; with standardized inputs the fp16 pass is clean"
	case !has(checkOverflow):
		d.Verdict = report.VerdictLogits
		d.VerdictText = fmt.Sprintf("the final layer %s outputs values beyond fp16's range (fp32 max |x| %.4g)", moduleOr(origins[0].Module, origins[0].Node), origins[0].FP32MaxAbs)
	default:
		d.Verdict = report.VerdictOverflow
		d.VerdictText = fmt.Sprintf("%s (%s) overflows fp16 on normalized inputs (fp32 max |x| %.4g)", moduleOr(origins[0].Module, origins[0].Node), origins[0].OpType, origins[0].FP32MaxAbs)
	}
	return nil
}
