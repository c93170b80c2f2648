package audit

import (
	"fmt"
	"slices"
	"strings"

	"fp16audit/internal/diagnose/evidence"
	"fp16audit/internal/execute"
	"fp16audit/internal/observe"
	"fp16audit/internal/precision"
	"fp16audit/report"
)

// --passes values besides the names of the what-if passes.
const (
	// PassesAuto runs each what-if pass when its condition holds.
	PassesAuto = "auto"
	// PassesAll runs every what-if pass that applies, beside the main
	// passes.
	PassesAll = "all"
	// PassesNone runs only the fp32 reference and the policy's pass.
	PassesNone = "none"
)

// whatIf is a pass beyond the two every audit needs (the fp32 reference
// and the policy's emulated pass): what the same batches would give under
// another precision, which a healthy audit does not need. A what-if pass
// runs beside the main passes when --passes names it (or all), never under
// --passes none, and otherwise after them, in a session of its own, when
// wanted holds on their results. A pass that should run on a condition
// known before running (the model's own casts, say) is asked for by its
// condition instead of by name: add it to the main passes in
// runMainPasses.
type whatIf struct {
	name string
	// applies returns "" when the pass means something for this audit,
	// else why it does not (noted when it was asked for, and under
	// autocast-fp16 unless quiet).
	applies func(a *audit) string
	quiet   bool
	// wanted is the condition on the main passes' results, and because
	// says it in the report's note.
	wanted  func(a *audit) bool
	because string
	// pass builds the pass, compared with the pass named ref ("" when it
	// runs without the fp32 pass beside it).
	pass func(a *audit, ref string) execute.Pass
}

// whatIfPasses lists the what-if passes in the order they run.
var whatIfPasses = []whatIf{{
	// bf16: would learn.to_bf16() remove the fp16 pass's overflow? The fix
	// diagnose reports from it is wanted only when the fp16 pass fails.
	name: report.PassBF16,
	applies: func(a *audit) string {
		switch {
		case a.main != report.PassFP16:
			return fmt.Sprintf("policy %s emulates no fp16 for bf16 to be the alternative to", a.policy.Name)
		case !castsToBF16(a.up):
			return fmt.Sprintf("the model imports ONNX opset %d, and Cast to bfloat16 needs opset 13", defaultOpset(a.up))
		}
		return ""
	},
	wanted:  (*audit).mainFails,
	because: "the fp16 pass's outputs hold NaN/Inf or are finite but wrong, and the bf16 fix (learn.to_bf16()) is verified on it",
	pass: func(a *audit, ref string) execute.Pass {
		bp, _ := precision.PolicyByName("autocast-bf16")
		ba := precision.Assign(bp, a.model.Proto.Graph, a.static.Order, a.model.Index.ElemType)
		return execute.Pass{Name: report.PassBF16, Model: a.emulate(a.fwd, ba), Ref: ref}
	},
}, {
	// as-written: the model without mixed precision, its own half casts
	// kept (plain fp32 inference). Does an overflow happen with to_fp16()
	// off too? Only then is the model's own cast to blame
	// (explicit-half-cast); it matters only where the model casts to half
	// itself and the policy's pass fails.
	name: report.PassAsWritten,
	applies: func(a *audit) string {
		switch {
		case a.main == "":
			return fmt.Sprintf("policy %s runs no emulated pass", a.policy.Name)
		case len(a.halfCast) == 0:
			return "the model casts nothing to half itself"
		}
		return ""
	},
	quiet:   true,
	wanted:  (*audit).mainFails,
	because: "the model casts to half itself and the policy's pass fails: does it fail without mixed precision too (explicit-half-cast)?",
	pass: func(a *audit, ref string) execute.Pass {
		return execute.Pass{Name: report.PassAsWritten, Model: a.emulate(a.fwd, evidence.AsWrittenAssignment(a.static)), Ref: ref}
	},
}}

// WhatIfPasses names the passes --passes can ask for.
func WhatIfPasses() []string {
	names := make([]string, len(whatIfPasses))
	for i, w := range whatIfPasses {
		names[i] = w.name
	}
	return names
}

// CheckPasses checks the values of --passes: auto, all or none alone, or
// names of what-if passes.
func CheckPasses(values []string) error {
	for _, v := range values {
		switch {
		case v == PassesAuto || v == PassesAll || v == PassesNone:
			if len(values) > 1 {
				return fmt.Errorf("--passes %s: %q stands alone; give it, or pass names (%s)", strings.Join(values, ","), v, strings.Join(WhatIfPasses(), ", "))
			}
		case !slices.Contains(WhatIfPasses(), v):
			return fmt.Errorf("--passes: unknown pass %q; want auto, all, none or a list of %s", v, strings.Join(WhatIfPasses(), ", "))
		}
	}
	return nil
}

// How --passes treats one what-if pass.
const (
	passAuto = iota
	passAsked
	passNever
)

func passMode(values []string, name string) int {
	switch {
	case len(values) == 0 || slices.Equal(values, []string{PassesAuto}):
		return passAuto
	case slices.Equal(values, []string{PassesAll}) || slices.Contains(values, name):
		return passAsked
	}
	return passNever
}

// mainFails reports whether the policy's pass fails where the fp32 pass
// does not: a graph output holds NaN/Inf in the one and not in the other,
// or is finite but beyond the output tolerance of fp32's. (Poisoned
// batches and fp32-broken models fail in fp32 already; no what-if
// precision can fix them.)
func (a *audit) mainFails() bool {
	main, ref := a.passes[a.main], a.passes[report.PassFP32]
	if main == nil || ref == nil {
		return false
	}
	failed := false
	for _, o := range a.model.Proto.Graph.Output {
		if st, ok := ref.Stats[o.Name]; ok && st.NonFinite() > 0 {
			return false
		}
		if st, ok := main.Stats[o.Name]; ok && st.NonFinite() > 0 {
			failed = true
		}
	}
	tol := a.cfg.Thresholds.Tolerance(a.policy.Lower)
	for _, d := range main.Outputs {
		// A value a selection ranks fails like an output; what the
		// selection chose is information only.
		failed = failed || (d.Role != observe.RoleChosen && (d.Worst.RelErr > tol || (d.Role == observe.RoleRanked && d.NonFinite > d.RefNonFinite)))
	}
	return failed
}
