package diagnose

import (
	"fmt"
	"slices"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/diagnose/evidence"
	"fp16audit/internal/diagnose/inputs"
	"fp16audit/internal/lint"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
	"fp16audit/internal/tensor"
	"fp16audit/report"
)

// Analyzer is one dynamic check over the facts of one audit.
type Analyzer = checks.Analyzer[*evidence.Facts]

// Requirement is a fact a dynamic check needs, which the driver tests.
type Requirement = checks.Requirement[*evidence.Facts]

// The dynamic checks' requirements.
var (
	needFP32 = &Requirement{Name: "fp32 pass on finite inputs", Met: func(f *evidence.Facts) bool {
		return f.Passes[report.PassFP32] != nil && !f.Poisoned()
	}}
	needEmulated = &Requirement{Name: "emulated pass on finite inputs with a clean fp32 pass", Met: func(f *evidence.Facts) bool {
		return f.MainOrigins() != nil
	}}
	needClean = &Requirement{Name: "emulated pass whose outputs hold no NaN/Inf and agree with fp32's", Met: (*evidence.Facts).CleanMain}
)

// Analyzers returns every dynamic check in the order its findings are
// listed: the inputs first, then what the fp32 pass says, the origins of
// the emulated pass, the warnings of a clean pass and the static facts the
// emulation depends on.
func Analyzers() []*Analyzer {
	return []*Analyzer{
		{Check: checkPoisonedInput, Run: runPoisonedInput},
		{Check: checkInputRange, Run: runInputRange},
		{Check: checkRawPixels, Run: runRawPixels},
		{Check: checkUnscaledColumns, Run: runUnscaledColumns},
		{Check: checkUnscaledSignal, Run: runUnscaledSignal},
		{Check: checkConstantInput, Run: runConstantInput},
		{Check: checkFP32Broken, Requires: []*Requirement{needFP32}, Run: runFP32Broken},
		{Check: lint.CheckConstRange, Requires: []*Requirement{needEmulated}, Run: runConstantOrigins},
		{Check: checkHalfCast, Requires: []*Requirement{needEmulated}, Run: originAnalyzer(classHalfCast)},
		{Check: checkLogits, Requires: []*Requirement{needEmulated}, Run: originAnalyzer(classLogits)},
		{Check: checkOverflow, Requires: []*Requirement{needEmulated}, Run: originAnalyzer(classOverflow)},
		{Check: checkWrongOutputs, Requires: []*Requirement{needEmulated}, Run: runWrongOutputs},
		{Check: checkPrecisionLoss, Requires: []*Requirement{needEmulated}, Run: runPrecisionLoss},
		{Check: checkAbsorbed, Requires: []*Requirement{needFP32}, Run: runAbsorbed},
		{Check: checkHeadroom, Requires: []*Requirement{needClean}, Run: runHeadroom},
		{Check: checkUnderflow, Requires: []*Requirement{needClean}, Run: runUnderflow},
		static(lint.UnknownOpsAnalyzer),
		static(lint.DroppedEpsilonAnalyzer),
		static(lint.FoldedBatchNormAnalyzer),
		static(lint.HalfDtypeAnalyzer),
	}
}

// static runs a static lint analyzer on the audit's static facts: a check
// whose fact does not depend on running the model reports the same finding
// in both commands.
func static(a *lint.Analyzer) *Analyzer {
	return &Analyzer{Check: a.Check, Run: func(f *evidence.Facts) ([]checks.Finding, error) { return a.Run(f.Static) }}
}

// inputFinding returns a finding of c about a graph input.
func inputFinding(c *checks.Check, input, msg string) checks.Finding {
	fd := c.Finding(msg)
	fd.Value = input
	return fd
}

// nodeFinding returns a finding of c at node ni.
func nodeFinding(f *evidence.Facts, c *checks.Check, ni int, value, pass, msg string) checks.Finding {
	fd := c.Finding(msg)
	fd.Node, fd.Module, fd.Value, fd.Pass = f.NodeName(ni), onnx.ModulePath(f.Graph().Node[ni]), value, pass
	return fd
}

func runPoisonedInput(f *evidence.Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, in := range f.Inputs {
		if !in.Poisoned() {
			continue
		}
		s := in.Stats
		out = append(out, inputFinding(checkPoisonedInput, in.Spec.Name, fmt.Sprintf("input %q holds %d NaN, %d +Inf and %d -Inf values (of %d), in %s",
			in.Spec.Name, s.NaN, s.PosInf, s.NegInf, s.Count, describeSamples(in.Samples, s.NonFinite()))))
	}
	return out, nil
}

// describeSamples names where a poisoned input's NaN/Inf are.
func describeSamples(samples []report.Sample, total int64) string {
	var parts []string
	var listed int64
	for _, s := range samples {
		parts = append(parts, fmt.Sprintf("batch %d sample %d (%d)", s.Batch, s.Index, s.NonFinite))
		listed += s.NonFinite
	}
	txt := strings.Join(parts, ", ")
	if listed < total {
		txt += fmt.Sprintf(" and %d more elsewhere", total-listed)
	}
	return txt
}

func runInputRange(f *evidence.Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, in := range f.Inputs {
		s := in.Stats
		switch {
		case in.SavedHalfInf:
			out = append(out, inputFinding(checkInputRange, in.Spec.Name, fmt.Sprintf("input %q was saved as %s and holds %d ±Inf values (no NaN): values beyond its range became Inf when the batch was saved, so the data is not normalized (largest finite |x| %.4g); normalize it and save the batch in float32",
				in.Spec.Name, in.Saved, s.PosInf+s.NegInf, s.MaxAbs)))
		case in.Float() && s.MaxAbs > tensor.FP16Max && f.Static.Policy.Lower == precision.FP16:
			out = append(out, inputFinding(checkInputRange, in.Spec.Name, fmt.Sprintf("input %q reaches |x| = %.4g, beyond fp16's 65504 (%d values): its fp16 cast is Inf",
				in.Spec.Name, s.MaxAbs, s.AboveFP16Max)))
		}
	}
	return out, nil
}

func runConstantInput(f *evidence.Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, in := range f.Inputs {
		if in.Constant {
			out = append(out, inputFinding(checkConstantInput, in.Spec.Name, fmt.Sprintf("input %q holds %g in all of its %d elements: the audit sees nothing of what real batches do; pass real samples",
				in.Spec.Name, in.Min, in.Stats.Count)))
		}
	}
	return out, nil
}

func runUnscaledSignal(f *evidence.Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, in := range f.Inputs {
		if len(in.Columns) == 0 || in.Kind == report.KindTabular || in.Kind == report.KindImage {
			continue
		}
		c := in.Columns[0]
		out = append(out, inputFinding(checkUnscaledSignal, in.Spec.Name, fmt.Sprintf("%s input %q is far from standardized: mean %.4g, std %.4g%s (values in [%.4g, %.4g])",
			in.Kind, in.Spec.Name, in.ChannelMean(c), in.ChannelStd(c), channelWord(in, c), in.Min, in.Max)))
	}
	return out, nil
}

// channelWord says which channel or feature statistics are about, when
// the input has several.
func channelWord(in *inputs.Input, c int) string {
	if in.Channels() <= 1 {
		return ""
	}
	what := "channel"
	if in.Kind == report.KindSequence {
		what = "feature"
	}
	return fmt.Sprintf(" in %s %d (%d of %d far off)", what, c, len(in.Columns), in.Channels())
}

func runRawPixels(f *evidence.Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, in := range f.Inputs {
		if in.RawPixels {
			what := "integer values"
			if !in.Integral {
				what = "floats spread over 0..255 (resized or augmented pixels)"
			}
			out = append(out, inputFinding(checkRawPixels, in.Spec.Name, fmt.Sprintf("input %q looks like raw pixels: %s in [%.4g, %.4g], per-channel mean %s",
				in.Spec.Name, what, in.Min, in.Max, inputs.FormatList(in.Means(), 1))))
		}
	}
	return out, nil
}

func runUnscaledColumns(f *evidence.Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, in := range f.Inputs {
		if len(in.Columns) == 0 || in.Kind != report.KindTabular {
			continue
		}
		var cols []string
		for _, c := range in.Columns {
			cols = append(cols, fmt.Sprintf("%d (mean %.3g, std %.3g)", c, in.ChannelMean(c), in.ChannelStd(c)))
		}
		out = append(out, inputFinding(checkUnscaledColumns, in.Spec.Name, fmt.Sprintf("input %q has %d column(s) far from standardized: %s",
			in.Spec.Name, len(cols), strings.Join(limitList(cols, 8), ", "))))
	}
	return out, nil
}

func runFP32Broken(f *evidence.Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, o := range f.Deciding(f.Origins(report.PassFP32)) {
		if o.Cause == report.CauseInput {
			continue
		}
		out = append(out, nodeFinding(f, checkFP32Broken, o.Index, o.Value, report.PassFP32, fmt.Sprintf("%s %s produces %d NaN/Inf values in fp32 from finite inputs; %d downstream node(s) affected, graph outputs reached: %s%s",
			o.OpType, o.Node, o.NonFinite, len(o.Affected), listOrNone(o.AffectedOutputs), epsilonHint(f, o.Index))))
	}
	return out, nil
}

// epsilonHint is what the fp32-broken finding adds when its node divides
// by a root without epsilon. On a dynamo export it adds what was measured
// with torch 2.9.1 (onnxscript 0.7.2): the exporter's optimizer folds away
// an Add of a constant of 1e-8 or less, so BERT's sqrt(var + 1e-12) is
// exported as sqrt(var). "" when the node is not such a division.
func epsilonHint(f *evidence.Facts, ni int) string {
	r, ok := f.MissingEpsilon(ni)
	if !ok {
		return ""
	}
	hint := fmt.Sprintf("; %s divides by the square root of a mean or sum with no epsilon added, so a row whose values are all equal (a zero pad embedding) divides by zero", f.NodeName(r.Node))
	if onnx.FromDynamo(f.Graph()) {
		hint += ". " + dynamoEpsilon
	}
	return hint
}

// dynamoEpsilon says what the dynamo exporter does to a small epsilon.
const dynamoEpsilon = "If the PyTorch code adds an epsilon of 1e-8 or less inside the root (BERT's 1e-12), torch.onnx.export's optimizer removed it (measured with torch 2.9.1): export again with optimize=False, or use torch.nn.LayerNorm or torch.nn.RMSNorm, whose epsilon is exported as an attribute"

// originAnalyzer reports the origins of the emulated pass of one class.
func originAnalyzer(class originClass) func(*evidence.Facts) ([]checks.Finding, error) {
	return func(f *evidence.Facts) ([]checks.Finding, error) {
		var out []checks.Finding
		for _, o := range f.Deciding(f.MainOrigins()) {
			if classify(f, o) != class {
				continue
			}
			var c *checks.Check
			var msg string
			switch class {
			case classHalfCast:
				c, msg = checkHalfCast, halfCastMessage(f, o)
			case classLogits:
				c, msg = checkLogits, fmt.Sprintf("final layer %s (%s) outputs fp32 max |x| %.4g > 65504: Inf in %s, reaching %s",
					moduleOr(o.Module, o.Node), o.OpType, o.FP32MaxAbs, f.Main, strings.Join(o.AffectedOutputs, ", "))
			default:
				c, msg = checkOverflow, fmt.Sprintf("%s (%s, %s) overflows in %s: fp32 max |x| %.4g > 65504; %d downstream node(s) non-finite",
					moduleOr(o.Module, o.Node), o.OpType, o.Node, f.Main, o.FP32MaxAbs, len(o.Affected))
			}
			if o.Index < 0 {
				fd := inputFinding(c, o.Input, fmt.Sprintf("the %s policy holds input %q in %s, where its values up to %.4g are Inf (%d values above 65504)",
					f.Static.Policy.Name, o.Input, o.Precision, o.FP32MaxAbs, o.NonFinite))
				fd.Pass = f.Main
				out = append(out, fd)
				continue
			}
			out = append(out, nodeFinding(f, c, o.Index, o.Value, f.Main, msg))
		}
		return out, nil
	}
}

// halfCastMessage says which of the model's casts make the value overflow
// and where.
func halfCastMessage(f *evidence.Facts, o report.Origin) string {
	casts := "its own half cast"
	if o.Provenance != nil && len(o.Provenance.Casts) > 0 {
		casts = strings.Join(o.Provenance.Casts, ", ")
	}
	if f.HalfCasts[o.Index] {
		return fmt.Sprintf("the model's own Cast to half %s (%s) overflows: fp32 max |x| %.4g > 65504", o.Node, moduleOr(o.Module, "model"), o.FP32MaxAbs)
	}
	why := "autocast would keep it in fp32"
	if f.HeldWithoutCasts(o) {
		why = f.Static.Policy.Name + " holds it there too, and without mixed precision the cast alone does"
	}
	return fmt.Sprintf("%s (%s, %s) overflows in %s because the model's own cast %s put its input there (%s): fp32 max |x| %.4g > 65504",
		moduleOr(o.Module, o.Node), o.OpType, o.Node, o.Precision, casts, why, o.FP32MaxAbs)
}

// runConstantOrigins reports the constants beyond a format's range that
// the emulated pass writes into reduced-precision values: an error where
// PyTorch raises or the Inf reaches an output, a warning where it is
// absorbed; and, as warnings, the mask fills of float32's extreme: the
// numbers torch.finfo(dtype) wrote, which the pass writes as the format's
// limit, and tensors of that value, which are -Inf on purpose there. Code
// that hard-codes torch.finfo(torch.float32).min writes the same number,
// which PyTorch refuses.
func runConstantOrigins(f *evidence.Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, o := range f.MainOrigins() {
		if o.Cause != report.CauseConstant {
			continue
		}
		fd := constantFinding(f, o.Index, o.Constant, *o.ConstantValue, reachText(f, o))
		if !f.Reaches(o) && !f.Raises(o) {
			fd.Severity = checks.SevWarning
		}
		out = append(out, fd)
	}
	for _, w := range f.Fills(f.Main) {
		fd := constantFinding(f, w.Node, w.Constant, w.Value, "it is a mask, carried as -Inf on purpose")
		fd.Severity = checks.SevWarning
		out = append(out, fd)
	}
	for _, w := range f.Finfo() {
		carried := slices.ContainsFunc(f.Fills(f.Main), func(c evidence.Fill) bool { return c.Node == w.Node && c.Constant == w.Constant })
		if w.Reduced() && !carried {
			out = append(out, finfoFinding(f, w))
		}
	}
	return out, nil
}

// finfoFinding is FP4004 where the emulated pass reads a number
// torch.finfo(dtype) wrote as its format's limit: a warning, since the
// graph cannot tell it from a hard-coded torch.finfo(torch.float32), and
// information where the reader's line of Python asks the dtype.
func finfoFinding(f *evidence.Facts, w rewrite.FinfoFill) checks.Finding {
	n := f.Graph().Node[w.Node]
	if w.Asked {
		fd := nodeFinding(f, lint.CheckConstRange, w.Node, w.Constant, f.Main, fmt.Sprintf("%s (%s, %s) writes %s = %s into a value held in %s, and its line asks the dtype (%s): %s's own limit %.6g at run time, which the %s pass writes too",
			moduleOr(onnx.ModulePath(n), f.NodeName(w.Node)), n.OpType, f.NodeName(w.Node), w.Constant, fmtConst(w.Value), w.Precision,
			onnx.SourceLine(n), w.Precision, w.Limit(), f.Main))
		fd.Severity = checks.SevInfo
		return fd
	}
	fd := nodeFinding(f, lint.CheckConstRange, w.Node, w.Constant, f.Main, fmt.Sprintf("%s (%s, %s) writes %s = %s into a value held in %s: %s; the %s pass writes that limit too. Use torch.finfo(x.dtype).min (or .max) instead of a fixed constant",
		moduleOr(onnx.ModulePath(n), f.NodeName(w.Node)), n.OpType, f.NodeName(w.Node), w.Constant, fmtConst(w.Value), w.Precision,
		lint.FillAt(n, w.Slot).DtypeAware(w.Precision, w.Value, w.Limit()), f.Main))
	fd.Severity = checks.SevWarning
	return fd
}

// constantFinding is FP4004 at node ni, which writes constant c (most
// extreme element v) into a reduced-precision value; reach says what
// became of it.
func constantFinding(f *evidence.Facts, ni int, c string, v float64, reach string) checks.Finding {
	n := f.Graph().Node[ni]
	p := f.Static.Assign.Node[ni]
	consequence := lint.FillAt(n, inputSlot(n, c)).Consequence(p, v)
	if evidence.DtypeAwareLimit(v) {
		consequence = "that is torch.finfo(x.dtype).min/max as an fp32 export writes it: code that asks the dtype writes " + p.String() + "'s limit under autocast instead and is fine; a hard-coded torch.finfo(torch.float32).min is not (" + consequence + ")"
	}
	if w, ok := f.WeightConstant(report.Origin{Index: ni, Cause: report.CauseConstant, Constant: c}); ok {
		return nodeFinding(f, lint.CheckConstRange, ni, c, f.Main, weightFindingText(moduleOr(onnx.ModulePath(n), f.NodeName(ni)), n.OpType, f.NodeName(ni), w, v, p.String(), reach))
	}
	return nodeFinding(f, lint.CheckConstRange, ni, c, f.Main, fmt.Sprintf("%s (%s, %s) writes %s = %s into a value held in %s, where it is %s; %s; %s. Use torch.finfo(x.dtype).min (or .max) instead of a fixed constant",
		moduleOr(onnx.ModulePath(n), f.NodeName(ni)), n.OpType, f.NodeName(ni), c, fmtConst(v), p, infWord(v), consequence, reach))
}

// reachText says whether an origin's NaN/Inf reach the outputs.
func reachText(f *evidence.Facts, o report.Origin) string {
	if len(o.AffectedOutputs) > 0 {
		return "the NaN/Inf reach " + strings.Join(o.AffectedOutputs, ", ")
	}
	return fmt.Sprintf("no graph output holds NaN/Inf (absorbed after %d node(s))", len(o.Affected))
}

// runWrongOutputs reports the graph outputs of the emulated pass that are
// finite but beyond the tolerance of fp32's, with the origin whose effect
// reached them.
func runWrongOutputs(f *evidence.Facts) ([]checks.Finding, error) {
	res := f.Passes[f.Main]
	tol := f.Tolerance(f.Main)
	var out []checks.Finding
	for _, d := range res.Outputs {
		if evidence.OutputOutcome(d, tol) != report.OutputWrong {
			continue
		}
		msg := fmt.Sprintf("graph output %q of the %s pass is finite but wrong: relative error %s in sample %d of batch %d (tolerance %s), %s over all samples, max |error| %.4g against max |fp32| %.4g",
			d.Name, f.Main, evidence.Percent(d.Worst.RelErr), d.Worst.Index, d.Worst.Batch, evidence.Percent(tol), evidence.Percent(d.RelErr()), d.MaxAbsErr, d.RefMaxAbs)
		if t, ok := d.Top1Agreement(); ok {
			msg += fmt.Sprintf("; top-1 class agrees with fp32 in %d of %d rows (%s)", d.Top1, d.Rows, evidence.Percent(t))
		}
		for _, o := range f.Origins(f.Main) {
			if !slices.Contains(o.WrongOutputs, d.Name) {
				continue
			}
			if o.Cause == report.CausePrecision {
				msg += fmt.Sprintf("; nothing overflows: the error first exceeds the tolerance at %s (%s, %s)", moduleOr(o.Module, o.Node), o.OpType, o.Node)
			} else {
				msg += fmt.Sprintf("; caused by %s (%s, %s), whose %d NaN/Inf were absorbed on the way", moduleOr(o.Module, o.Node), o.OpType, o.Node, o.NonFinite)
			}
			break
		}
		fd := checkWrongOutputs.Finding(msg)
		fd.Value, fd.Pass = d.Name, f.Main
		out = append(out, fd)
	}
	return out, nil
}

// runPrecisionLoss reports the precision origins of the emulated pass
// whose values stay in the format's range (an origin below it is forward
// underflow): nothing overflows, rounding alone makes the outputs wrong.
func runPrecisionLoss(f *evidence.Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	res := f.Passes[f.Main]
	for _, o := range f.Deciding(f.MainOrigins()) {
		if o.Cause != report.CausePrecision || underflows(f, o) {
			continue
		}
		msg := fmt.Sprintf("%s (%s, %s): nothing overflows or underflows in the %s pass, but from here on rounding to %s loses the outputs: this value's error against fp32 is %s while the values it reads agree (tolerance %s), and %s %s wrong",
			moduleOr(o.Module, o.Node), o.OpType, o.Node, f.Main, f.Main, evidence.Percent(res.Diffs[o.Value].RelErr()), evidence.Percent(f.Tolerance(f.Main)),
			strings.Join(quoted(o.WrongOutputs), ", "), plural(len(o.WrongOutputs), "is", "are"))
		out = append(out, nodeFinding(f, checkPrecisionLoss, o.Index, o.Value, f.Main, msg))
	}
	return out, nil
}

// plural picks the verb for n things.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// runAbsorbed reports the origins whose NaN/Inf no graph output holds, in
// the fp32 and the emulated pass (constants have FP4004).
func runAbsorbed(f *evidence.Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	passes := []string{report.PassFP32}
	if f.MainOrigins() != nil {
		passes = append(passes, f.Main)
	}
	for _, p := range passes {
		for _, o := range f.Origins(p) {
			if f.Reaches(o) || o.Cause == report.CauseConstant || o.Index < 0 {
				continue
			}
			out = append(out, nodeFinding(f, checkAbsorbed, o.Index, o.Value, p, fmt.Sprintf("%s (%s, %s) produces %d NaN/Inf in the %s pass that never reach a graph output (absorbed after %d node(s))",
				moduleOr(o.Module, o.Node), o.OpType, o.Node, o.NonFinite, p, len(o.Affected))))
		}
	}
	return out, nil
}

func inputSlot(n *onnx.NodeProto, name string) int {
	for j, in := range n.Input {
		if in == name {
			return j
		}
	}
	return -1
}

func fmtConst(v float64) string { return fmt.Sprintf("%.4g", v) }

func infWord(v float64) string {
	if v < 0 {
		return "-Inf"
	}
	return "+Inf"
}

// maxHeadroomFindings bounds the FP2004 findings; a note counts the rest.
const maxHeadroomFindings = 20

func runHeadroom(f *evidence.Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, w := range f.LowHeadroom()[:min(len(f.LowHeadroom()), maxHeadroomFindings)] {
		ref := f.Passes[report.PassFP32].Stats[w.Value]
		p := f.Static.Assign.Value[w.Value]
		out = append(out, nodeFinding(f, checkHeadroom, w.Node, w.Value, report.PassFP32, fmt.Sprintf("%q reaches fp32 max |x| %.4g: %.1f bits below %s's %.4g", w.Value, ref.MaxAbs, w.Bits, p, evidence.FormatMax(p))))
	}
	return out, nil
}

func runUnderflow(f *evidence.Facts) ([]checks.Finding, error) {
	main := f.Passes[f.Main]
	g := f.Graph()
	flushes := func(v string) bool {
		p := f.Static.Assign.Value[v]
		d := main.Diffs[v]
		return (p == precision.FP16 || p == precision.BF16) && d != nil && d.NonzeroRef >= 16 && d.FlushedFraction() > f.Thresholds.UnderflowFraction
	}
	isOut := map[string]bool{}
	for _, o := range g.Output {
		isOut[o.Name] = true
	}
	// Underflow is reported where it starts: a value that flushes while
	// no value its node reads does. What follows from it is counted there.
	var out []checks.Finding
	started := map[string]bool{}
	for _, ni := range f.Static.Order {
		n := g.Node[ni]
		inherited := false
		for _, in := range n.Input {
			if in != "" && started[in] {
				inherited = true
			}
		}
		for _, v := range n.Output {
			if v == "" || !flushes(v) {
				continue
			}
			started[v] = true
			if inherited {
				continue
			}
			ref := f.Passes[report.PassFP32].Stats[v]
			d := main.Diffs[v]
			follow, outputs := underflowReach(f, v, flushes, isOut)
			msg := fmt.Sprintf("%.0f%% of the nonzero values of %q become 0 in %s (fp32 max |x| %.3g, smallest nonzero %.3g)",
				100*d.FlushedFraction(), v, f.Main, ref.MaxAbs, ref.MinNonzero)
			if follow > 0 {
				msg += fmt.Sprintf("; %d value(s) after it flush too", follow)
			}
			if len(outputs) > 0 {
				msg += "; in the outputs " + strings.Join(outputs, ", ")
			}
			out = append(out, nodeFinding(f, checkUnderflow, ni, v, f.Main, msg))
		}
	}
	return out, nil
}

// underflowReach counts the values downstream of v that flush as well and
// the graph outputs among them.
func underflowReach(f *evidence.Facts, v string, flushes func(string) bool, isOut map[string]bool) (int, []string) {
	g := f.Graph()
	seen := map[string]bool{v: true}
	queue := []string{v}
	count := 0
	var outputs []string
	for len(queue) > 0 {
		x := queue[0]
		queue = queue[1:]
		if isOut[x] {
			outputs = append(outputs, x)
		}
		for _, c := range f.Static.Model.Index.Consumers(x) {
			for _, o := range g.Node[c].Output {
				if o != "" && !seen[o] && flushes(o) {
					seen[o] = true
					count++
					queue = append(queue, o)
				}
			}
		}
	}
	return count, outputs
}

// moduleOr names a node by its module path, else by its node name.
func moduleOr(module, node string) string {
	if module != "" {
		return module
	}
	return node
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func limitList(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(append([]string(nil), s[:n]...), fmt.Sprintf("and %d more", len(s)-n))
}
