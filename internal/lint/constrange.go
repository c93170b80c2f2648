package lint

import (
	"fmt"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
)

// CheckConstRange is FP4004. The dynamic audit reports it too, at the node
// where such a constant lands in a reduced-precision value, with what it
// does to the outputs.
var CheckConstRange = checks.Register(&checks.Check{ID: "FP4004", Title: "constant beyond the fp16 range", Severity: checks.SevError, Doc: `An initializer, a Constant or a ConstantOfShape fill value holds values
that fp16 cannot represent: |x| > 65504, such as the attention-mask
constants -1e9, -1e4*1e5 or torch.finfo(torch.float32).min (-3.4e38, which
is -Inf in bf16 as well), or NaN or ±Inf. Each consuming node is reported
with the precision it holds the constant in under the policy:

- error: the consumer holds it in fp16 (under half everything is fp16;
  under autocast a MatMul or Conv casts its inputs to fp16, and an
  elementwise op on an fp16 tensor keeps a 0-dim constant in fp16). The
  value is ±Inf there; a fully masked softmax row then gives NaN.
- info: the consumer computes in fp32 (under autocast an Add of an fp16
  score and an fp32 mask tensor promotes to fp32), so the policy
  neutralises it.

NaN is an error under every policy; ±Inf alone is information, since it
behaves the same in fp32. What PyTorch does depends on how the constant is
written: masked_fill, index_put_ and torch.full convert a Python scalar to
the tensor's dtype with an overflow check and raise "RuntimeError: value
cannot be converted to type at::Half without overflow"; arithmetic (an
additive mask) gives ±Inf, which a softmax may absorb. fp16audit run
reports the finding at the node where the constant lands, as an error when
PyTorch raises there or the Inf reaches a graph output and as a warning
when it is absorbed, and verifies the fix by a rerun with the constant in
range. Fix masks with torch.finfo(scores.dtype).min or a dtype-aware fill
(scores.masked_fill(mask, torch.finfo(scores.dtype).min)), and keep
weights in range (they should be far below 65504).

A 0-dim constant of exactly ±3.4028235e38 is how such dtype-aware code
looks in an fp32 export: a Python number that torch.finfo(dtype) makes the
limit of the dtype it is written into (-65504 in fp16, -3.3895e38 in
bf16). Where it is read in fp16 or bf16 the finding is a warning, and
fp16audit run's emulated passes write that limit there, as PyTorch does at
run time; where an op reads it in fp32 it is information. The graph cannot
tell it from a hard-coded torch.finfo(torch.float32).min, which PyTorch
refuses in masked_fill on a half tensor: fp16audit takes it for the
dtype-aware idiom. Where the dynamo exporter recorded the line of Python
the reader comes from (torch.onnx.export(dynamo=True) at its own opset)
and that line calls torch.finfo on a tensor's dtype, the idiom is told,
not taken, and the finding is information. A tensor of that value (a
mask buffer, which model.half() casts to -Inf) is judged like any other
constant.`})

var constRangeAnalyzer = &Analyzer{Check: CheckConstRange, Run: runConstRange}

func runConstRange(f *Facts) ([]checks.Finding, error) {
	consts, err := f.Constants()
	if err != nil {
		return nil, err
	}
	// The numbers torch.finfo(dtype) wrote, by reader and constant: read
	// as the limit of the precision they are read in, as at run time.
	type read struct {
		node     int
		constant string
	}
	finfo := map[read]rewrite.FinfoFill{}
	for _, w := range rewrite.FinfoFills(f.Model.Proto.GetGraph(), f.Assign) {
		finfo[read{w.Node, w.Constant}] = w
	}
	var out []checks.Finding
	for _, c := range consts {
		st := c.Stats
		if st.OverFP16 == 0 && st.NaN == 0 && st.PosInf == 0 && st.NegInf == 0 {
			continue
		}
		what := fmt.Sprintf("%s %q holds %s", c.Kind(), c.Name, describeRange(c))
		for _, i := range f.Model.Index.Consumers(c.Name) {
			held := f.HeldAt(c.Name, i)
			w, dtypeAware := finfo[read{i, c.Name}]
			var sev checks.Severity
			var why string
			switch {
			case st.NaN > 0:
				sev, why = checks.SevError, "NaN propagates in every precision"
			case dtypeAware && w.Reduced() && w.Asked:
				sev, why = checks.SevInfo, fmt.Sprintf("it is read in %s there under %s, and the line it comes from asks the dtype (%s): %s's own limit %.6g at run time",
					w.Precision, f.Policy.Name, onnx.SourceLine(f.node(i)), w.Precision, w.Limit())
			case dtypeAware && w.Reduced():
				sev, why = checks.SevWarning, fmt.Sprintf("it is read in %s there under %s: %s", w.Precision, f.Policy.Name,
					fillAt(f.node(i), c.Name).DtypeAware(w.Precision, w.Value, w.Limit()))
			case dtypeAware:
				sev, why = checks.SevInfo, fmt.Sprintf("the op computes in fp32 under %s, and a number takes the dtype of the op that reads it, so it stays finite", f.Policy.Name)
			case held == precision.FP16 && st.OverFP16 > 0, held == precision.BF16 && st.OverBF16 > 0:
				sev, why = checks.SevError, fmt.Sprintf("it is held in %s there under %s, where %s is %s; %s", held, f.Policy.Name, fmtVal(st.Extreme), infOf(st.Extreme),
					fillAt(f.node(i), c.Name).Consequence(held, st.Extreme))
			case st.OverFP16 > 0:
				sev, why = checks.SevInfo, fmt.Sprintf("it is held in %s there under %s, so it stays finite", held, f.Policy.Name)
			default:
				sev, why = checks.SevInfo, "±Inf is the same in fp32 and fp16"
			}
			out = append(out, f.finding(CheckConstRange, sev, i, c.Name, fmt.Sprintf("%s, read by %s: %s", what, f.where(i), why)))
		}
	}
	return out, nil
}

// describeRange summarizes what a constant holds outside fp16's range.
func describeRange(c *Constant) string {
	st := c.Stats
	var parts []string
	of := ""
	if !c.Fill {
		of = fmt.Sprintf(" (%d of %d elements)", st.OverFP16, st.Elements)
	}
	if st.OverFP16 > 0 {
		parts = append(parts, fmt.Sprintf("%s%s beyond fp16's ±65504", fmtVal(st.Extreme), of))
	}
	for _, k := range []struct {
		n    int64
		name string
	}{{st.NaN, "NaN"}, {st.PosInf, "+Inf"}, {st.NegInf, "-Inf"}} {
		if k.n == 0 {
			continue
		}
		if c.Fill {
			parts = append(parts, k.name)
		} else {
			parts = append(parts, fmt.Sprintf("%s (%d elements)", k.name, k.n))
		}
	}
	return strings.Join(parts, " and ")
}

func fmtVal(v float64) string { return fmt.Sprintf("%.4g", v) }

func infOf(v float64) string {
	if v < 0 {
		return "-Inf (a fully masked softmax row then gives NaN)"
	}
	return "+Inf"
}

// fillAt is how node n writes the constant called name (its first slot
// holding it; the fill value of a ConstantOfShape is the node itself).
func fillAt(n *onnx.NodeProto, name string) Fill {
	for j, in := range n.GetInput() {
		if in == name {
			return FillAt(n, j)
		}
	}
	return FillAt(n, -1)
}
