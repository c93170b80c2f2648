package evidence

import (
	"fmt"
	"math"
	"strings"

	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
	"fp16audit/report"
)

// The forward outcome is judged by the graph outputs: NaN/Inf that reach
// them, or outputs that stay finite but differ from fp32's beyond what the
// format's rounding explains. An overflow that an op absorbs (rsqrt(inf)
// = 0, x / inf) leaves no NaN/Inf anywhere near the outputs and still
// corrupts them; a -inf mask that softmax absorbs changes nothing. The
// tolerance judges the worst sample's relative L2 error.

// Tolerance returns the largest worst-sample relative L2 error of the
// graph outputs that a pass in precision p may show against fp32 and
// still agree with it.
func (t Thresholds) Tolerance(p precision.Precision) float64 {
	if p == precision.BF16 {
		return t.OutputTolBF16
	}
	return t.OutputTolFP16
}

// PassFormat is the reduced precision a pass emulates: the bf16 pass's,
// or the policy's for its pass and the fix reruns of it ("fp16+...").
func (f *Facts) PassFormat(pass string) precision.Precision {
	if pass == report.PassBF16 || strings.HasPrefix(pass, report.PassBF16+"+") {
		return precision.BF16
	}
	return precision.FP16
}

// Tolerance is the output tolerance of a pass.
func (f *Facts) Tolerance(pass string) float64 {
	return f.Thresholds.Tolerance(f.PassFormat(pass))
}

// OutputOutcome is an output's outcome against fp32 under tolerance tol.
func OutputOutcome(d *observe.OutputDiff, tol float64) string {
	switch {
	case d.Role == observe.RoleChosen:
		return report.OutputChosen
	case d.NonFinite > d.RefNonFinite:
		return report.OutputNonFinite
	case d.Worst.RelErr > tol:
		return report.OutputWrong
	}
	return report.OutputAgrees
}

// wrongOutputs lists the graph outputs of a pass that are finite but
// beyond its tolerance.
func (f *Facts) wrongOutputs(res *observe.PassResult) map[string]bool {
	out := map[string]bool{}
	tol := f.Tolerance(res.Name)
	for _, d := range res.Outputs {
		if OutputOutcome(d, tol) == report.OutputWrong {
			out[d.Name] = true
		}
	}
	return out
}

// OutputsAgree reports whether every graph output of a pass agrees with
// fp32's (finite and within tolerance), what a selection chose aside; a
// pass whose outputs were not compared agrees vacuously.
func (f *Facts) OutputsAgree(res *observe.PassResult) bool {
	tol := f.Tolerance(res.Name)
	for _, d := range res.Outputs {
		if o := OutputOutcome(d, tol); o != report.OutputAgrees && o != report.OutputChosen {
			return false
		}
	}
	return true
}

// agreement is what the report says about a pass's outputs.
func (f *Facts) agreement(res *observe.PassResult) []report.OutputAgreement {
	tol := f.Tolerance(res.Name)
	out := make([]report.OutputAgreement, 0, len(res.Outputs))
	for _, d := range res.Outputs {
		a := report.OutputAgreement{Pass: res.Name, Output: d.Name, Outcome: OutputOutcome(d, tol),
			Elements: d.Count, NonFinite: max(0, d.NonFinite-d.RefNonFinite), MaxAbsErr: d.MaxAbsErr, MaxRelErr: d.MaxRelErr(),
			Samples: d.Samples, WorstBatch: d.Worst.Batch, WorstSample: d.Worst.Index, Tolerance: tol}
		if e := d.RelErr(); !math.IsNaN(e) {
			a.RelErr = &e
		}
		if d.Worst.RelErr >= 0 {
			w := d.Worst.RelErr
			a.WorstRelErr = &w
		}
		if t, ok := d.Top1Agreement(); ok {
			a.Top1Agreement, a.Rows = &t, d.Rows
		}
		if d.Role != observe.RoleOutput {
			a.Role = d.Role.String()
		}
		if d.Role == observe.RoleChosen {
			a.KeptItems, a.CommonItems = d.Kept, d.Common
			a.RelErr, a.WorstRelErr, a.MaxAbsErr, a.MaxRelErr = nil, nil, 0, 0
		}
		out = append(out, a)
	}
	return out
}

// RecordAgreement keeps a pass's output agreement for the report.
func (f *Facts) RecordAgreement(res *observe.PassResult) {
	if res.Outputs == nil {
		return
	}
	if f.agreements == nil {
		f.agreements = map[string][]report.OutputAgreement{}
	}
	f.agreements[res.Name] = f.agreement(res)
}

// WrongText says how wrong a pass's finite outputs are, from the worst of
// them: "outputs finite but wrong (rel. error 97 %, top-1 agreement 3/8)";
// "" when they agree.
func (f *Facts) WrongText(res *observe.PassResult) string { return wrongTextOf(f.agreement(res)) }

// wrongTextOf is WrongText from a pass's output agreement.
func wrongTextOf(rows []report.OutputAgreement) string {
	var worst *report.OutputAgreement
	for i, a := range rows {
		if a.Outcome == report.OutputWrong && (worst == nil || *a.WorstRelErr > *worst.WorstRelErr) {
			worst = &rows[i]
		}
	}
	if worst == nil {
		return ""
	}
	txt := fmt.Sprintf("outputs finite but wrong (rel. error %s in the worst sample against a tolerance of %s", Percent(*worst.WorstRelErr), Percent(worst.Tolerance))
	if worst.Top1Agreement != nil {
		txt += fmt.Sprintf(", top-1 agreement %d/%d", int64(math.Round(*worst.Top1Agreement*float64(worst.Rows))), worst.Rows)
	}
	return txt + ")"
}

// AgreeText says how close a pass's outputs came to fp32's, for a healthy
// verdict; "" when they were not compared.
func (f *Facts) AgreeText(res *observe.PassResult) string {
	worst := -1.0
	for _, d := range res.Outputs {
		if d.Role != observe.RoleChosen {
			worst = max(worst, d.Worst.RelErr)
		}
	}
	if worst < 0 {
		return ""
	}
	return fmt.Sprintf("outputs within %s of fp32 (tolerance %s)", Percent(worst), Percent(f.Tolerance(res.Name)))
}

// Percent writes a relative error as a percentage with about three
// significant digits.
func Percent(x float64) string {
	if math.IsInf(x, 1) {
		return "∞ %"
	}
	return fmt.Sprintf("%.3g %%", 100*x)
}

// corrupted returns the wrong graph outputs an origin's effect reaches:
// from the origin's values and the NaN/Inf it made, through every value
// that differs from fp32 beyond tol (or is non-finite). A pass without
// per-value comparisons (a fix rerun) is followed through the graph alone.
func (f *Facts) corrupted(start []string, res *observe.PassResult, tol float64, wrong map[string]bool, byError bool) []string {
	g := f.Graph()
	idx := f.Static.Model.Index
	carries := func(v string) bool {
		if !byError || res.Diffs == nil {
			return true
		}
		if s, ok := res.Stats[v]; ok && s.NonFinite() > 0 {
			return true
		}
		d, ok := res.Diffs[v]
		if !ok {
			return false
		}
		e := d.RelErr()
		return math.IsNaN(e) || e > tol
	}
	var out []string
	seenV := map[string]bool{}
	seenN := map[int]bool{}
	queue := append([]string(nil), start...)
	for len(queue) > 0 {
		v := queue[0]
		queue = queue[1:]
		if seenV[v] {
			continue
		}
		seenV[v] = true
		if wrong[v] {
			out = append(out, v)
		}
		for _, c := range idx.Consumers(v) {
			if seenN[c] {
				continue
			}
			seenN[c] = true
			for _, o := range g.Node[c].Output {
				if o != "" && carries(o) {
					queue = append(queue, g.Node[c].Output...)
					break
				}
			}
		}
	}
	return out
}

// attributeWrong names, for each origin of a pass whose outputs are
// finite but wrong, the outputs its effect corrupted: by the errors it
// left on the way, else (no origin's errors lead there) the first
// overflow connected to them at all. When nothing overflows, the origin
// is where the error starts: the first value beyond the tolerance whose
// inputs are within it (cause precision).
func (f *Facts) attributeWrong(os []report.Origin, starts [][]string, res *observe.PassResult, asg *precision.Assignment) []report.Origin {
	wrong := f.wrongOutputs(res)
	if len(wrong) == 0 {
		return os
	}
	tol := f.Tolerance(res.Name)
	claimed := false
	for _, byError := range []bool{true, false} {
		for k := range os {
			if os[k].Cause == report.CauseInput || os[k].Cause == report.CauseConstant {
				continue
			}
			if w := f.corrupted(starts[k], res, tol, wrong, byError); len(w) > 0 {
				os[k].WrongOutputs = w
				claimed = true
				if !byError {
					return os
				}
			}
		}
		if claimed {
			return os
		}
	}
	if o, ok := f.precisionOrigin(res, asg, tol, wrong); ok {
		os = append(os, o)
	}
	return os
}

// precisionOrigin is the first node, in topological order, with an output
// beyond tol (and finite) while every value it reads is within tol, from
// which a wrong output can be reached.
func (f *Facts) precisionOrigin(res *observe.PassResult, asg *precision.Assignment, tol float64, wrong map[string]bool) (report.Origin, bool) {
	if res.Diffs == nil {
		return report.Origin{}, false
	}
	beyond := func(v string) bool {
		d, ok := res.Diffs[v]
		if !ok {
			return false
		}
		e := d.RelErr()
		return !math.IsNaN(e) && e > tol && d.NewNonFinite == 0
	}
	g := f.Graph()
	// A number torch.finfo(dtype) wrote is the format's limit in this pass
	// and ±3.4e38 in fp32's: the values that carry it differ on purpose,
	// and count as agreeing where an op reads them.
	limits := f.finfoCarriers(rewrite.FinfoFills(g, asg))
	idx := f.Static.Model.Index
	for _, ni := range f.Static.Order {
		if limits[ni] {
			continue
		}
		n := g.Node[ni]
		inputsAgree := true
		for _, in := range n.Input {
			if in != "" && !f.consts[in] && !limits[idx.Producer(in)] && beyond(in) {
				inputsAgree = false
				break
			}
		}
		if !inputsAgree {
			continue
		}
		for _, v := range n.Output {
			if v == "" || !beyond(v) {
				continue
			}
			w := f.corrupted([]string{v}, res, tol, wrong, false)
			if len(w) == 0 {
				continue
			}
			o := report.Origin{Pass: res.Name, Cause: report.CausePrecision, Node: f.NodeName(ni), Index: ni, OpType: n.OpType,
				Module: onnx.ModulePath(n), Precision: asg.Node[ni].String(), Value: v,
				Affected: []string{}, AffectedOutputs: []string{}, WrongOutputs: w}
			if ref, ok := f.Passes[report.PassFP32].Stats[v]; ok && ref.Finite > 0 {
				o.FP32MaxAbs = float64(ref.MaxAbs)
			}
			if why := asg.Why[v]; why != 0 {
				o.Provenance = &report.Provenance{Reasons: why.Names()}
				for _, c := range asg.Casts[v] {
					o.Provenance.Casts = append(o.Provenance.Casts, f.NodeName(c))
				}
				o.ExplicitCast = asg.Explicit(v)
			}
			return o, true
		}
	}
	return report.Origin{}, false
}

// RecordedWrongText is WrongText from the output agreement recorded for a
// pass (a fix rerun's); "" when it agrees or none was recorded.
func (f *Facts) RecordedWrongText(pass string) string { return wrongTextOf(f.agreements[pass]) }
