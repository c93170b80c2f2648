// Package fix verifies the fixes a diagnosis proposes, each by a rerun
// through the Runner the audit hands it: standardized inputs, the model's
// own half casts removed, constants in range (fix.go), the smallest set
// of nodes kept in fp32 (keep.go), an epsilon put back inside a root
// (epsilon.go), and bf16, read off the bf16 pass that ran beside the
// fp16 one. The texts use the words of the user's trainer
// (evidence.Facts.Words). A rerun is judged as the audit's passes are
// (evidence.Facts.PassOrigins, the output agreement).
package fix

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"fp16audit/internal/batch"
	"fp16audit/internal/diagnose/evidence"
	"fp16audit/internal/diagnose/inputs"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
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
func verify(ctx context.Context, f *evidence.Facts, run Runner, r Rerun, fix *report.Fix) ([]report.Origin, error) {
	if r.Assign == nil {
		r.Assign = f.Static.Assign
	}
	res, err := run.Rerun(ctx, r)
	if err != nil {
		return nil, err
	}
	origins, deliberate, _ := f.PassOrigins(f.Main, res, r.Assign)
	fix.Pass = r.Name
	fix.NonFiniteAfter = f.CountNonFinite(res, deliberate)
	deciding := f.Deciding(origins)
	fix.Works = len(deciding) == 0 && f.OutputsAgree(res)
	f.RecordAgreement(res)
	return deciding, nil
}

// remains says what is left after a fix that does not work: the NaN/Inf,
// or outputs that stay finite but wrong (from the agreement recorded for
// the pass the fix was judged by).
func remains(f *evidence.Facts, fix *report.Fix) string {
	if fix.NonFiniteAfter > 0 {
		return fmt.Sprintf("%d non-finite values remain", fix.NonFiniteAfter)
	}
	if w := f.RecordedWrongText(fix.Pass); w != "" {
		return "the " + w
	}
	return "an overflow still reaches the outputs"
}

// Standardize re-runs the emulated pass with standardized inputs: each
// flagged input alone first, so that the fix names the input at fault,
// then all of them together.
func Standardize(ctx context.Context, f *evidence.Facts, run Runner, batches []batch.Batch, flagged []*inputs.Input, before int64) (*report.Fix, error) {
	tries := [][]*inputs.Input{}
	for _, in := range flagged {
		tries = append(tries, []*inputs.Input{in})
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
			if bs, err = in.Standardize(bs); err != nil {
				return nil, err
			}
			fix.Normalize = append(fix.Normalize, in.NormalizeAdvice())
			fix.Inputs = append(fix.Inputs, in.Spec.Name)
			names = append(names, fmt.Sprintf("%q", in.Spec.Name))
		}
		if _, err := verify(ctx, f, run, Rerun{Name: f.Main + "+standardized", Batches: bs}, fix); err != nil {
			return nil, err
		}
		what := "standardizing input " + names[0]
		if len(names) > 1 {
			what = "standardizing the inputs " + strings.Join(names, ", ")
		} else if len(f.Inputs) > 1 {
			what += " alone"
		}
		if fix.Works {
			fix.Summary = what + " removes every overflow; " + adviceText(f, try)
			return fix, nil
		}
		fix.Summary = fmt.Sprintf("%s does not remove the overflow: %s", what, remains(f, fix))
	}
	return fix, nil
}

// adviceText is how to standardize the inputs, in the user's API for
// their kind and in their trainer's words.
func adviceText(f *evidence.Facts, inputs []*inputs.Input) string {
	var parts []string
	for _, in := range inputs {
		ns := in.NormalizeAdvice()
		parts = append(parts, f.Words().Normalize(in.Spec.Name, in.Kind == report.KindImage, ns.Fastai, ns.Torch))
	}
	return strings.Join(parts, "; ")
}

// BF16 reads the bf16 pass, which ran beside the fp16 one: would
// training in bf16 (learn.to_bf16(), bf16=True, ...) remove the overflow?
func BF16(f *evidence.Facts, before int64) (*report.Fix, bool) {
	bf, ok := f.Passes[report.PassBF16]
	if !ok || f.Main == report.PassBF16 {
		return nil, false
	}
	after := f.NonFinite(bf, report.PassBF16)
	fix := &report.Fix{Kind: report.FixBF16, Pass: report.PassBF16, NonFiniteBefore: before, NonFiniteAfter: after,
		Works: len(f.Deciding(f.Origins(report.PassBF16))) == 0 && f.OutputsAgree(bf)}
	f.RecordAgreement(bf)
	precise := !slices.ContainsFunc(f.Deciding(f.MainOrigins()), func(o report.Origin) bool { return o.Cause != report.CausePrecision })
	if fix.Works {
		fix.Summary = f.Words().BF16For(f.AutocastDevice) + " removes every overflow (needs an Ampere or newer GPU)"
		if precise {
			fix.Summary = "under " + f.Words().BF16For(f.AutocastDevice) + " the outputs agree with fp32's (needs an Ampere or newer GPU)"
		}
		if a := f.AgreeText(bf); a != "" {
			fix.Summary += "; its " + a
		}
	} else {
		fix.Summary = fmt.Sprintf("%s does not remove the overflow: %s in the bf16 pass", f.Words().BF16For(f.AutocastDevice), remains(f, fix))
		if precise {
			fix.Summary = fmt.Sprintf("%s does not bring the outputs back: %s in the bf16 pass", f.Words().BF16For(f.AutocastDevice), remains(f, fix))
		}
	}
	return fix, true
}

// RemoveCast re-runs the emulated pass without the model's own half
// casts that the explicit-cast origins come from.
func RemoveCast(ctx context.Context, f *evidence.Facts, run Runner, batches []batch.Batch, origins []report.Origin, before int64) (*report.Fix, error) {
	casts := f.CastsOf(origins)
	fix := &report.Fix{Kind: report.FixRemoveCast, NonFiniteBefore: before}
	asg := precision.AssignKeepFP32(f.Static.Policy, f.Graph(), f.Static.Order, f.Static.Model.Index.ElemType, casts)
	if _, err := verify(ctx, f, run, Rerun{Name: f.Main + "+no-half-cast", Assign: asg, Batches: batches}, fix); err != nil {
		return nil, err
	}
	for _, c := range slices.Sorted(maps.Keys(casts)) {
		fix.Nodes = append(fix.Nodes, f.NodeName(c))
		if m := onnx.ModulePath(f.Graph().Node[c]); m != "" && !slices.Contains(fix.Modules, m) {
			fix.Modules = append(fix.Modules, m)
		}
	}
	list := strings.Join(fix.Nodes, ", ")
	if fix.Works {
		fix.Summary = fmt.Sprintf("without the model's own half cast (%s) every overflow is gone: remove the .half()/.to(torch.float16) in forward, or move it after the op that overflows, or scale before it", list)
	} else {
		fix.Summary = fmt.Sprintf("removing the model's own half cast (%s) does not remove the overflow: %s", list, remains(f, fix))
	}
	return fix, nil
}

// Constant re-runs the emulated pass with the out-of-range constants
// clamped to the format's range, as torch.finfo(x.dtype).min would write.
func Constant(ctx context.Context, f *evidence.Facts, run Runner, batches []batch.Batch, origins []report.Origin, before int64) (*report.Fix, error) {
	clamp := map[string]float64{}
	fix := &report.Fix{Kind: report.FixConstant, NonFiniteBefore: before}
	var readers []string
	for _, o := range origins {
		if o.Cause != report.CauseConstant {
			continue
		}
		limit := evidence.FormatMax(f.Static.Assign.Node[o.Index])
		if limit == 0 {
			limit = evidence.FormatMax(f.Static.Policy.Lower)
		}
		// The constant may be computed from a source constant (the
		// exporter's Identity of an initializer): clamp at the source.
		clamp[constantSource(f, o.Constant)] = limit
		readers = append(readers, o.Node)
		fix.Nodes = append(fix.Nodes, o.Node)
		if o.Module != "" {
			fix.Modules = append(fix.Modules, o.Module)
		}
	}
	if _, err := verify(ctx, f, run, Rerun{Name: f.Main + "+finfo", Batches: batches, Clamp: clamp}, fix); err != nil {
		return nil, err
	}
	weights := !slices.ContainsFunc(origins, func(o report.Origin) bool { return o.Cause == report.CauseConstant && o.Weight == "" })
	switch {
	case weights && fix.Works:
		fix.Summary = fmt.Sprintf("with the weights clamped to the format's range at %s (what keeping them in range in training does: weight decay, clipping, a lower learning rate) nothing non-finite reaches the outputs", strings.Join(readers, ", "))
	case weights:
		fix.Summary = fmt.Sprintf("the weights clamped to the format's range at %s do not make the step right: %s; keep them in range in training (weight decay, clipping, a lower learning rate) or train in bf16", strings.Join(readers, ", "), remains(f, fix))
	case fix.Works:
		fix.Summary = fmt.Sprintf("with the constants in range (torch.finfo(scores.dtype).min instead of the fixed value, at %s) nothing non-finite reaches the outputs and nothing raises", strings.Join(readers, ", "))
	default:
		fix.Summary = fmt.Sprintf("constants in range at %s do not remove the NaN/Inf: %s", strings.Join(readers, ", "), remains(f, fix))
	}
	return fix, nil
}

// constantSource follows pass-through nodes from a constant value back to
// the initializer or Constant output it comes from.
func constantSource(f *evidence.Facts, name string) string {
	for range 64 {
		p := f.Static.Model.Index.Producer(name)
		if p < 0 {
			return name
		}
		n := f.Graph().Node[p]
		if n.OpType == "Constant" || len(n.Input) == 0 || !ops.Lookup(ops.Default, n.OpType).Is(ops.PassThrough) {
			return name
		}
		name = n.Input[0]
	}
	return name
}

// listed joins the first n names of s with commas and says how many more
// there are.
func listed(s []string, n int) string {
	if len(s) <= n {
		return strings.Join(s, ", ")
	}
	return strings.Join(s[:n], ", ") + fmt.Sprintf(", and %d more", len(s)-n)
}
