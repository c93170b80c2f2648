package audit

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"fp16audit/checks"
	"fp16audit/report"
)

// This file holds the wording the audit renderers share, so that text,
// Markdown and HTML say the same thing about an origin, a precision or a
// value without finite elements. Everything is read from the report.

// shownNode reports whether a node table lists n by default: every node
// but those computing only from weights and constants, which are kept when
// they hold NaN/Inf or are an origin (a mask constant that overflows is
// exactly such a node).
func shownNode(r *report.Report, n report.NodeReport, constantNodes bool) bool {
	return constantNodes || !n.Constant || n.Flagged || isOrigin(r, n.Index)
}

func isOrigin(r *report.Report, index int) bool {
	return slices.ContainsFunc(r.Origins, func(o report.Origin) bool { return o.Index >= 0 && o.Index == index })
}

// hiddenConstants counts the rows a node table leaves out by default.
func hiddenConstants(r *report.Report) int {
	n := 0
	for _, nd := range r.Nodes {
		if !shownNode(r, nd, false) {
			n++
		}
	}
	return n
}

// hiddenNote says what the default node table leaves out, or "".
func hiddenNote(hidden int) string {
	if hidden == 0 {
		return ""
	}
	return fmt.Sprintf("not listed: %d node(s) that compute only from weights and constants, such as the exporter's copies of shared weights", hidden)
}

// provenanceText says why a value is held in reduced precision when the
// reason is the model's own doing (an explicit cast, half weights), which a
// reader could not guess from the policy; "" otherwise. With full, the
// casts are named (at most three).
func provenanceText(p *report.Provenance, full bool) string {
	if p == nil {
		return ""
	}
	var parts []string
	if slices.Contains(p.Reasons, report.ReasonExplicitCast) {
		s := "explicit cast"
		switch {
		case !full || len(p.Casts) == 0:
		case len(p.Casts) <= 3:
			s += " " + strings.Join(p.Casts, ", ")
		default:
			s += fmt.Sprintf(" %s and %d more", strings.Join(p.Casts[:3], ", "), len(p.Casts)-3)
		}
		parts = append(parts, s)
	}
	if slices.Contains(p.Reasons, report.ReasonHalfModel) {
		parts = append(parts, "half model")
	}
	return strings.Join(parts, "; ")
}

// precisionLabel is a node's precision with the model-made reason for it:
// "fp16 (explicit cast /Cast)".
func precisionLabel(prec string, p *report.Provenance, full bool) string {
	if why := provenanceText(p, full); why != "" {
		return prec + " (" + why + ")"
	}
	return prec
}

// originValueStats finds the fp32 statistics of an origin's value: the
// node output it names, or the poisoned input.
func originValueStats(r *report.Report, o report.Origin) (report.StatsReport, bool) {
	if o.Input != "" {
		for _, in := range r.Inputs {
			if in.Name == o.Input {
				s, ok := in.Stats[report.PassFP32]
				return s, ok
			}
		}
		return report.StatsReport{}, false
	}
	for _, n := range r.Nodes {
		if n.Index != o.Index {
			continue
		}
		for _, v := range n.Outputs {
			if v.Name == o.Value {
				s, ok := v.Stats[report.PassFP32]
				return s, ok
			}
		}
	}
	return report.StatsReport{}, false
}

// originMagnitude is the fp32 max |x| of an origin's value, "none" when the
// value has no finite element in fp32 (the origin's number is then a
// placeholder, not a magnitude).
func originMagnitude(r *report.Report, o report.Origin) string {
	if s, ok := originValueStats(r, o); ok && s.MaxAbs == nil {
		return "none (no finite element)"
	}
	return formatMag(o.FP32MaxAbs)
}

// originCause is one of the report.Cause constants; reports written
// before causes existed ("") name an overflow, or the fp32 reference when
// the origin is in the fp32 pass.
func originCause(o report.Origin) string {
	switch {
	case o.Cause != "":
		return o.Cause
	case o.Input != "":
		return report.CauseInput
	case o.Pass == report.PassFP32:
		return report.CauseFP32
	}
	return report.CauseOverflow
}

// atInput reports whether an origin of an emulated pass is a graph input
// the policy holds in reduced precision (model.half() casts the batch to
// fp16, where values beyond 65504 are Inf): it has an input, no node.
func atInput(o report.Origin) bool {
	return o.Node == "" && o.Input != "" && originCause(o) != report.CauseInput
}

// originFacts is the sentence under an origin's name that says why the
// NaN/Inf start there.
func originFacts(r *report.Report, o report.Origin) string {
	switch originCause(o) {
	case report.CauseInput:
		return fmt.Sprintf("the batch already holds NaN/Inf: %d non-finite element(s)%s", o.NonFinite, samplesText(r, o, plainName))
	case report.CauseConstant:
		c := "a constant"
		if o.Constant != "" {
			c = fmt.Sprintf("constant %q", o.Constant)
		}
		if o.ConstantValue != nil {
			c += fmt.Sprintf(" (%s)", formatMag(*o.ConstantValue))
		}
		return fmt.Sprintf("%s is beyond %s's range and is written into %q, held in %s: %d non-finite", c, o.Precision, o.Value, o.Precision, o.NonFinite)
	case report.CauseFP32:
		return fmt.Sprintf("value %q is NaN/Inf in the fp32 reference itself (%d non-finite; fp32 max |x| %s): not an fp16 problem",
			o.Value, o.NonFinite, originMagnitude(r, o))
	case report.CauseDtype:
		return fmt.Sprintf("reads %q in float32, cast by the model itself, beside its half weights: PyTorch raises here under model.half()", o.Value)
	}
	return fmt.Sprintf("value %q: fp32 max |x| %s vs fp16 max 65504 (headroom %s), %d non-finite",
		o.Value, originMagnitude(r, o), headroomText(o.HeadroomBits), o.NonFinite)
}

// originCauseShort is an origin's cause in a table cell: what the columns
// beside it (the value's magnitude, headroom and count) do not say. Names
// are written by name (Markdown sets them as code).
func originCauseShort(r *report.Report, o report.Origin, name func(string) string) string {
	switch originCause(o) {
	case report.CauseInput:
		return "NaN/Inf already in the batch" + samplesText(r, o, name)
	case report.CauseConstant:
		c := "a constant"
		if o.Constant != "" {
			c = "constant " + name(o.Constant)
		}
		if o.ConstantValue != nil {
			c += fmt.Sprintf(" (%s)", formatMag(*o.ConstantValue))
		}
		return fmt.Sprintf("%s beyond %s's range, written into %s", c, o.Precision, name(o.Value))
	case report.CauseFP32:
		return "NaN/Inf in the fp32 reference itself"
	case report.CauseDtype:
		return "float32 input beside half weights: PyTorch raises"
	}
	return "overflow"
}

// originWhy says that the model itself holds the value in reduced
// precision, or "".
func originWhy(o report.Origin) string {
	why := provenanceText(o.Provenance, true)
	if why == "" && o.ExplicitCast {
		why = "explicit cast"
	}
	if why == "" {
		return ""
	}
	return fmt.Sprintf("held in %s because of the model's own %s", o.Precision, why)
}

// samplesText lists where a poisoned input's NaN/Inf are, per batch, with
// the count in each sample: ", in x.npy: sample 0 ×1, sample 2 ×3".
func samplesText(r *report.Report, o report.Origin, name func(string) string) string {
	var b strings.Builder
	listed := int64(0)
	for i, s := range o.Samples {
		if i == 0 || s.Batch != o.Samples[i-1].Batch {
			src := fmt.Sprintf("batch %d", s.Batch+1)
			if s.Batch >= 0 && s.Batch < len(r.Batches) {
				src = name(r.Batches[s.Batch].Source)
			}
			sep := ","
			if i > 0 {
				sep = ";"
			}
			fmt.Fprintf(&b, "%s in %s: ", sep, src)
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "sample %d ×%d", s.Index, s.NonFinite)
		listed += s.NonFinite
	}
	if len(o.Samples) > 0 && listed < o.NonFinite {
		b.WriteString(", and more")
	}
	return b.String()
}

// plainName writes a name in prose as it is.
func plainName(s string) string { return s }

// statsFinite says how many elements of a value are finite when some are
// not: "125 of 128 finite"; "" when all are.
func statsFinite(s report.StatsReport) string {
	if s.Finite >= s.Count {
		return ""
	}
	return fmt.Sprintf("%d of %d finite", s.Finite, s.Count)
}

// headroomSummary is the report's smallest headroom among values held in
// reduced precision, with the limit it is measured against.
func headroomSummary(s report.Summary) string {
	if s.MinHeadroomBits == nil {
		return ""
	}
	limit := s.HeadroomLimit
	if limit == 0 {
		limit = 65504 // reports before v1.1 measured against fp16's limit
	}
	name := fmt.Sprintf("%.3g", limit)
	switch {
	case limit == 65504:
		name = "fp16's 65504"
	case limit > 3e38:
		name = "bf16's " + name
	}
	return fmt.Sprintf("smallest headroom of a value held in reduced precision: %.1f bits at %q (fp32 max |x| against %s)",
		*s.MinHeadroomBits, s.MinHeadroomValue, name)
}

// originTitle heads an origin by its cause.
func originTitle(o report.Origin) string {
	switch originCause(o) {
	case report.CauseInput:
		return "Origin: NaN/Inf already in the batch"
	case report.CauseConstant:
		return "Origin: a constant beyond " + o.Precision + "'s range"
	case report.CauseFP32:
		return "Origin: NaN/Inf in the fp32 reference"
	}
	return "Origin: overflow in " + o.Precision
}

// optional formats x with f, or says "none" when the value had no finite
// element to measure.
func optional(x *float64, f func(float64) string) string {
	if x == nil {
		return "none"
	}
	return f(*x)
}

// verdictMood is how a report's forward verdict looks: "ok" for a healthy
// verdict, "fail" for any other, and "caution" for a healthy verdict
// beside an error-level finding of the forward audit (a masked_fill
// PyTorch would refuse whose -Inf the softmax absorbs), which fails
// --fail-on error though nothing reaches the outputs. The training audit's
// findings (FP6xxx) belong to the backward outcome.
func verdictMood(r *report.Report) string {
	switch {
	case r.Verdict != report.VerdictHealthy:
		return "fail"
	case maxSeverity(r, false) >= checks.SevError:
		return "caution"
	}
	return "ok"
}

// agreement is one row of the output agreement as the renderers show it:
// the outcome word, the worst sample's relative error with where it is
// and the tolerance, the error over all samples, max |error| / max |fp32|
// and the top-1 agreement ("" for outputs without classes).
type agreement struct {
	Pass, Output, Outcome, Worst, Where, Overall, MaxRel, Top1, NonFinite string
	Bad                                                                   bool
	// Chosen marks an output a selection chose: Worst says what it kept.
	Chosen bool
}

// agreements describes r's output agreement row by row.
func agreements(r *report.Report) []agreement {
	out := make([]agreement, 0, len(r.OutputAgreement))
	for _, a := range r.OutputAgreement {
		g := agreement{Pass: a.Pass, Output: a.Output, Outcome: a.Outcome, Bad: a.Outcome != report.OutputAgrees && a.Outcome != report.OutputChosen,
			Worst: percentOpt(a.WorstRelErr) + " (tolerance " + percent(a.Tolerance) + ")", Overall: percentOpt(a.RelErr),
			MaxRel: percent(a.MaxRelErr), NonFinite: fmt.Sprint(a.NonFinite)}
		if a.WorstRelErr != nil {
			g.Where = fmt.Sprintf("batch %d, sample %d", a.WorstBatch, a.WorstSample)
		}
		if a.RelErr == nil {
			g.MaxRel = "n/a" // no element finite in both passes
		}
		if a.Top1Agreement != nil {
			g.Top1 = fmt.Sprintf("%d/%d", int64(*a.Top1Agreement*float64(a.Rows)+0.5), a.Rows)
		}
		switch a.Role {
		case report.RoleRanked:
			g.Output += " (ranked by a selection)"
		case report.RoleChosen:
			// Element-wise errors of what a selection picked mean nothing:
			// say how many of fp32's picks this pass kept.
			g.Worst = fmt.Sprintf("%d of fp32's %d kept items kept too (information: chosen by a selection, judged where it ranks)", a.CommonItems, a.KeptItems)
			g.Where, g.Overall, g.MaxRel, g.Chosen = "", "n/a", "n/a", true
		}
		out = append(out, g)
	}
	return out
}

// percent writes a relative error as a percentage, about three digits.
func percent(x float64) string {
	switch {
	case math.IsNaN(x):
		return "n/a"
	case math.IsInf(x, 1):
		return "∞"
	}
	return fmt.Sprintf("%.3g %%", 100*x)
}

func percentOpt(x *float64) string {
	if x == nil {
		return "n/a"
	}
	return percent(*x)
}

// wrongOutputsText names the outputs an origin left finite but wrong, as
// a clause to append; "" when there are none.
func wrongOutputsText(o report.Origin) string {
	if len(o.WrongOutputs) == 0 {
		return ""
	}
	return "; finite but wrong: " + strings.Join(o.WrongOutputs, ", ")
}

// maxSeverity is the highest severity among the findings of the training
// audit (training) or of the forward audit (the others), -1 for none.
func maxSeverity(r *report.Report, training bool) checks.Severity {
	max := checks.Severity(-1)
	for _, f := range r.Findings {
		if strings.HasPrefix(f.Check, "FP6") == training && f.Severity > max {
			max = f.Severity
		}
	}
	return max
}

// outcome is one verdict a report's headline states: the forward audit's
// or the backward's.
type outcome struct {
	// Label is "verdict" when the forward verdict is the only one,
	// "forward" or "backward" when both are stated.
	Label, Verdict, Text string
	// Mood is ok, caution or fail (see verdictMood).
	Mood string
}

// Mark is the outcome's sign: ✓, ! or ✗.
func (o outcome) Mark() string {
	switch o.Mood {
	case "ok":
		return "✓"
	case "caution":
		return "!"
	}
	return "✗"
}

// headline lists the outcomes a report opens with: the forward verdict
// and, when the training audit ran the backward, the backward verdict,
// the one that fails the run (exit 1) first.
func headline(r *report.Report) []outcome {
	fwd := outcome{Label: "verdict", Verdict: r.Verdict, Text: r.VerdictText, Mood: verdictMood(r)}
	if r.Training == nil || r.Training.Backward == nil {
		return []outcome{fwd}
	}
	b := r.Training.Backward
	bwd := outcome{Label: "backward", Verdict: b.Verdict, Text: b.VerdictText, Mood: "ok"}
	switch {
	case b.Verdict != report.BackwardHealthy:
		bwd.Mood = "fail"
	case maxSeverity(r, true) >= checks.SevError:
		bwd.Mood = "caution"
	}
	fwd.Label = "forward"
	if moodRank[bwd.Mood] > moodRank[fwd.Mood] {
		return []outcome{bwd, fwd}
	}
	return []outcome{fwd, bwd}
}

// moodRank orders moods from ok to fail.
var moodRank = map[string]int{"ok": 0, "caution": 1, "fail": 2}

// overallMood is the worst mood of the headline's outcomes: the look of
// the whole report.
func overallMood(r *report.Report) string {
	mood := "ok"
	for _, o := range headline(r) {
		if moodRank[o.Mood] > moodRank[mood] {
			mood = o.Mood
		}
	}
	return mood
}
