package diagnose

import (
	"fmt"
	"sort"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/lint"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/internal/tensor"
)

// Analyzer is one dynamic check over the facts of one audit.
type Analyzer = checks.Analyzer[*Facts]

// Analyzers returns every dynamic check in the order its findings are
// listed: the inputs first, then what the fp32 pass says, the origins of
// the emulated pass, the warnings of a clean pass and the static facts the
// emulation depends on.
func Analyzers() []*Analyzer {
	return []*Analyzer{
		{Check: checkPoisonedInput, Requires: "inputs", Run: runPoisonedInput},
		{Check: checkInputRange, Requires: "inputs", Run: runInputRange},
		{Check: checkRawPixels, Requires: "inputs", Run: runRawPixels},
		{Check: checkUnscaledColumns, Requires: "inputs", Run: runUnscaledColumns},
		{Check: checkFP32Broken, Requires: "fp32 pass", Run: runFP32Broken},
		{Check: checkHalfCast, Requires: "emulated pass", Run: originAnalyzer(classHalfCast)},
		{Check: checkLogits, Requires: "emulated pass", Run: originAnalyzer(classLogits)},
		{Check: checkOverflow, Requires: "emulated pass", Run: originAnalyzer(classOverflow)},
		{Check: checkHeadroom, Requires: "fp32 pass, clean emulated pass", Run: runHeadroom},
		{Check: checkUnderflow, Requires: "clean emulated pass", Run: runUnderflow},
		static(lint.UnknownOpsAnalyzer),
	}
}

// static runs a static lint analyzer on the audit's static facts: a check
// whose fact does not depend on running the model reports the same finding
// in both commands.
func static(a *lint.Analyzer) *Analyzer {
	return &Analyzer{Check: a.Check, Requires: "model", Run: func(f *Facts) ([]checks.Finding, error) { return a.Run(f.Static) }}
}

// inputFinding returns a finding of c about a graph input.
func inputFinding(c *checks.Check, input, msg string) checks.Finding {
	fd := c.Finding(msg)
	fd.Value = input
	return fd
}

// nodeFinding returns a finding of c at node ni.
func (f *Facts) nodeFinding(c *checks.Check, ni int, value, pass, msg string) checks.Finding {
	fd := c.Finding(msg)
	fd.Node, fd.Module, fd.Value, fd.Pass = f.nodeName(ni), onnx.ModulePath(f.graph().Node[ni]), value, pass
	return fd
}

func runPoisonedInput(f *Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, in := range f.Inputs {
		if s := in.Stats; s.NonFinite() > 0 {
			out = append(out, inputFinding(checkPoisonedInput, in.Spec.Name, fmt.Sprintf("input %q holds %d NaN, %d +Inf and %d -Inf values (of %d)",
				in.Spec.Name, s.NaN, s.PosInf, s.NegInf, s.Count)))
		}
	}
	return out, nil
}

func runInputRange(f *Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, in := range f.Inputs {
		if s := in.Stats; in.Kind != KindInteger && s.MaxAbs > tensor.FP16Max {
			out = append(out, inputFinding(checkInputRange, in.Spec.Name, fmt.Sprintf("input %q reaches |x| = %.4g, beyond fp16's 65504 (%d values): its fp16 cast is Inf",
				in.Spec.Name, s.MaxAbs, s.AboveFP16Max)))
		}
	}
	return out, nil
}

func runRawPixels(f *Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, in := range f.Inputs {
		if in.RawPixels {
			out = append(out, inputFinding(checkRawPixels, in.Spec.Name, fmt.Sprintf("input %q looks like raw pixels: integer values in [%g, %g], per-channel mean %s",
				in.Spec.Name, in.Min, in.Max, formatList(in.means(), 1))))
		}
	}
	return out, nil
}

func runUnscaledColumns(f *Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, in := range f.Inputs {
		if len(in.Columns) == 0 {
			continue
		}
		var cols []string
		for _, c := range in.Columns {
			cols = append(cols, fmt.Sprintf("%d (mean %.3g, std %.3g)", c, in.chans[c].mean(), in.chans[c].std()))
		}
		out = append(out, inputFinding(checkUnscaledColumns, in.Spec.Name, fmt.Sprintf("input %q has %d column(s) far from standardized: %s",
			in.Spec.Name, len(cols), strings.Join(limitList(cols, 8), ", "))))
	}
	return out, nil
}

func runFP32Broken(f *Facts) ([]checks.Finding, error) {
	var out []checks.Finding
	for _, o := range f.Origins(PassFP32) {
		out = append(out, f.nodeFinding(checkFP32Broken, o.Index, o.Value, PassFP32, fmt.Sprintf("%s %s produces %d NaN/Inf values in fp32 from finite inputs; %d downstream node(s) affected, graph outputs reached: %s",
			o.OpType, o.Node, o.NonFinite, len(o.Affected), listOrNone(o.AffectedOutputs))))
	}
	return out, nil
}

// originAnalyzer reports the origins of the emulated pass of one class.
func originAnalyzer(class originClass) func(*Facts) ([]checks.Finding, error) {
	return func(f *Facts) ([]checks.Finding, error) {
		var out []checks.Finding
		for _, o := range f.mainOrigins() {
			if f.classify(o) != class {
				continue
			}
			var c *checks.Check
			var msg string
			switch class {
			case classHalfCast:
				c, msg = checkHalfCast, fmt.Sprintf("the model's own Cast to half at %s overflows: fp32 max |x| %.4g > 65504", moduleOr(o.Module, o.Node), o.FP32MaxAbs)
			case classLogits:
				c, msg = checkLogits, fmt.Sprintf("final layer %s (%s) outputs fp32 max |x| %.4g > 65504: Inf in %s, reaching %s",
					moduleOr(o.Module, o.Node), o.OpType, o.FP32MaxAbs, f.Main, strings.Join(o.AffectedOutputs, ", "))
			default:
				c, msg = checkOverflow, fmt.Sprintf("%s (%s, %s) overflows in %s: fp32 max |x| %.4g > 65504; %d downstream node(s) non-finite",
					moduleOr(o.Module, o.Node), o.OpType, o.Node, f.Main, o.FP32MaxAbs, len(o.Affected))
			}
			out = append(out, f.nodeFinding(c, o.Index, o.Value, f.Main, msg))
		}
		return out, nil
	}
}

// cleanMain reports whether the emulated pass ran on finite inputs, the fp32
// pass is clean and the emulated pass has no origin: the case for the
// warnings about how close it came.
func (f *Facts) cleanMain() bool {
	return f.Main != "" && !f.poisoned() && len(f.Origins(PassFP32)) == 0 && len(f.Origins(f.Main)) == 0
}

// maxHeadroomFindings bounds the FP2004 findings; a note counts the rest.
const maxHeadroomFindings = 20

func runHeadroom(f *Facts) ([]checks.Finding, error) {
	if !f.cleanMain() {
		return nil, nil
	}
	type warn struct {
		ni   int
		v    string
		bits float64
	}
	var low []warn
	g := f.graph()
	for _, ni := range f.Static.Order {
		for _, v := range g.Node[ni].Output {
			if f.Static.Assign.Value[v] != precision.FP16 {
				continue
			}
			ref, ok := f.Passes[PassFP32].Stats[v]
			if !ok {
				continue
			}
			if h := ref.HeadroomBits(); h < f.Thresholds.HeadroomBits {
				low = append(low, warn{ni, v, h})
			}
		}
	}
	sort.SliceStable(low, func(i, j int) bool { return low[i].bits < low[j].bits })
	var out []checks.Finding
	for k, w := range low {
		if k == maxHeadroomFindings {
			f.note(fmt.Sprintf("%d more value(s) with headroom under %.1f bits are not listed", len(low)-maxHeadroomFindings, f.Thresholds.HeadroomBits))
			break
		}
		ref := f.Passes[PassFP32].Stats[w.v]
		out = append(out, f.nodeFinding(checkHeadroom, w.ni, w.v, PassFP32, fmt.Sprintf("%q reaches fp32 max |x| %.4g: %.1f bits below fp16's 65504", w.v, ref.MaxAbs, w.bits)))
	}
	return out, nil
}

func runUnderflow(f *Facts) ([]checks.Finding, error) {
	if !f.cleanMain() {
		return nil, nil
	}
	main := f.Passes[f.Main]
	g := f.graph()
	var out []checks.Finding
	for _, ni := range f.Static.Order {
		for _, v := range g.Node[ni].Output {
			if p := f.Static.Assign.Value[v]; p != precision.FP16 && p != precision.BF16 {
				continue
			}
			ref, ok := f.Passes[PassFP32].Stats[v]
			if !ok {
				continue
			}
			if d := main.Diffs[v]; d != nil && d.NonzeroRef >= 16 && d.FlushedFraction() > f.Thresholds.UnderflowFraction {
				out = append(out, f.nodeFinding(checkUnderflow, ni, v, f.Main, fmt.Sprintf("%.0f%% of the nonzero values of %q become 0 in %s (smallest nonzero |x| %.3g)",
					100*d.FlushedFraction(), v, f.Main, ref.MinNonzero)))
			}
		}
	}
	return out, nil
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

func formatList(xs []float64, prec int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.*f", prec, x)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}
