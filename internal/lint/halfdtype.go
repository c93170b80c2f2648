package lint

import (
	"fmt"
	"regexp"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/precision"
)

// CheckHalfDtype is FP4010; the dynamic audit's verdict tree tests for
// its finding (dtype-mismatch).
var CheckHalfDtype = checks.Register(&checks.Check{ID: "FP4010", Title: "model.half() raises: an op gets float32 beside half weights", Severity: checks.SevError,
	Policies: []string{"half"}, Doc: `The model casts a value to float32 itself (x.float(), x.to(torch.float32))
and feeds it to a layer whose weights model.half() makes float16: a Conv,
a Linear, a matrix product, a LayerNorm. Autocast casts each such op's
inputs to its own precision, so under to_fp16() this is harmless; under
model.half() nothing casts, and PyTorch refuses operands of two dtypes:
"Input type (float) and bias type (c10::Half) should be the same" (a
Conv), "expected mat1 and mat2 to have the same dtype" (a Linear),
"expected scalar type Float but found Half" (a LayerNorm). The run stops
there, so no numeric verdict applies: fp16audit run says dtype-mismatch.

Told from the Cast(to=FLOAT) a TorchScript export keeps of a float32
value, and from the source line the dynamo exporter records (it drops a
cast that does nothing in float32: the layer's call reads an argument
ending in .float()). The TorchScript exporter writes x.to(self.fc.weight
.dtype) as the same Cast, which model.half() runs: a cast back to float32
right after the model's own .half() is taken for that and not reported. Fix: cast to the layer's dtype instead
(x.to(self.conv.weight.dtype)), or train with autocast
(learn.to_fp16(), torch.autocast), which casts per op.`})

// HalfDtypeAnalyzer reports the layers model.half() would feed a float32
// value the model cast itself.
var HalfDtypeAnalyzer = &Analyzer{Check: CheckHalfDtype, Run: runHalfDtype}

// floatArg matches a call of module <name> whose argument ends in a cast
// to float32 ("self.body(h.float())", "self.fc(x.to(torch.float32), ...)"):
// the cast is inside the call, so the layer reads the float32 value.
func floatArg(name string) *regexp.Regexp {
	return regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\((?:[^()]|\([^()]*\))*?\.(?:float\(\)|to\((?:dtype=)?torch\.float(?:32)?\)|type\(torch\.float(?:32)?\))\s*[,)]`)
}

// HalfDtype is one layer model.half() cannot run: the node, the
// model's cast that makes its input float32 (a node, or the source line
// of a dynamo export that dropped it).
type HalfDtype struct {
	Node int
	// Cast is the Cast node's name, or "" when the export dropped it.
	Cast string
	// Source is the line of Python that calls the layer (dynamo exports).
	Source string
}

// HalfDtypes returns the layers whose data input the policy holds in
// float32 because of the model's own cast while their weights are half:
// only under a policy that converts the parameters (half), where nothing
// casts an op's inputs.
func (f *Facts) HalfDtypes() []HalfDtype {
	if f.Policy.Params != precision.FP16 && f.Policy.Params != precision.BF16 {
		return nil
	}
	g := f.Model.Proto.GetGraph()
	ix := f.Model.Index
	fp32, _ := precision.PolicyByName("fp32")
	asWritten := precision.Assign(fp32, g, f.Order, ix.ElemType)
	var out []HalfDtype
	for _, i := range f.Order {
		n := g.Node[i]
		o := ops.Lookup(n.Domain, n.OpType)
		if o == nil || !(o.Is(ops.Linear) || o.HalfWeights) || len(n.Input) < 2 || !f.halfParam(n.Input[1]) {
			continue
		}
		if c := f.ownFloatCast(n.Input[0], asWritten); c >= 0 {
			out = append(out, HalfDtype{Node: i, Cast: onnx.NodeName(g, c)})
			continue
		}
		name := onnx.ModulePath(n)
		if k := strings.LastIndexByte(name, '.'); k >= 0 {
			name = name[k+1:]
		}
		if name == "" || ix.Producer(n.Input[0]) < 0 {
			continue
		}
		re := floatArg(name)
		for _, src := range onnx.SourceLines(n) {
			if re.MatchString(src) {
				out = append(out, HalfDtype{Node: i, Source: src})
				break
			}
		}
	}
	return out
}

// halfParam reports whether v is a parameter the policy holds in half
// (an initializer, or one read through an Identity).
func (f *Facts) halfParam(v string) bool {
	ix := f.Model.Index
	if p := ix.Producer(v); p >= 0 {
		n := f.Model.Proto.Graph.Node[p]
		if n.OpType != "Identity" || len(n.Input) == 0 {
			return false
		}
		v = n.Input[0]
	}
	p := f.Assign.Value[v]
	return ix.IsInitializer(v) && (p == precision.FP16 || p == precision.BF16)
}

// ownFloatCast returns the model's Cast to float32 of a value the policy
// holds in half that v comes from, through ops that keep its type
// (pass-through and elementwise ops of one input), or -1. A Cast that
// undoes the model's own half cast (its input is 16 bit in the model as
// written) is left out: code that casts back after its own .half() most
// often asks the layer's dtype (x.to(self.norm.weight.dtype)), which the
// fp32 export writes as the same Cast and model.half() runs. The one the
// export keeps of a float32 value (x.float() at the top of forward, h =
// h.float()) is a fixed float32.
func (f *Facts) ownFloatCast(v string, asWritten *precision.Assignment) int {
	g := f.Model.Proto.GetGraph()
	ix := f.Model.Index
	for range 64 {
		p := ix.Producer(v)
		if p < 0 {
			return -1
		}
		n := g.Node[p]
		if n.OpType == "Cast" && onnx.IsDefaultDomain(n.Domain) {
			to := onnx.IntAttr(n, "to", 0)
			if to != int64(onnx.TensorProto_FLOAT) && to != int64(onnx.TensorProto_DOUBLE) {
				return -1
			}
			q, w := f.Assign.Value[n.Input[0]], asWritten.Value[n.Input[0]]
			if (q == precision.FP16 || q == precision.BF16) && w != precision.FP16 && w != precision.BF16 {
				return p
			}
			return -1
		}
		o := ops.Lookup(n.Domain, n.OpType)
		if o == nil || len(n.Input) == 0 || !(o.Is(ops.PassThrough) || o.Shape == "unary") {
			return -1
		}
		v = n.Input[0]
	}
	return -1
}

func runHalfDtype(f *Facts) ([]checks.Finding, error) {
	g := f.Model.Proto.GetGraph()
	var out []checks.Finding
	for _, h := range f.HalfDtypes() {
		n := g.Node[h.Node]
		fd := CheckHalfDtype.Finding(HalfDtypeMessage(g, h))
		fd.Node, fd.Module, fd.Value = onnx.NodeName(g, h.Node), onnx.ModulePath(n), n.Input[0]
		out = append(out, fd)
	}
	return out, nil
}

// HalfDtypeMessage says where model.half() raises and why.
func HalfDtypeMessage(g *onnx.GraphProto, h HalfDtype) string {
	n := g.Node[h.Node]
	module := onnx.ModulePath(n)
	if module == "" {
		module = "the model"
	}
	cast := fmt.Sprintf("the model's own cast %s (x.float())", h.Cast)
	if h.Cast == "" {
		cast = fmt.Sprintf("the model's own cast in %q (the dynamo exporter drops a cast that does nothing in float32)", h.Source)
	}
	return fmt.Sprintf("under model.half() %s (%s, %s) reads a float32 value, made by %s, beside its half weights: PyTorch raises there (%s), so the model cannot run in half at all; cast to the layer's dtype instead (x.to(self.%s.weight.dtype)) or use autocast (learn.to_fp16(), torch.autocast), which casts per op",
		module, n.OpType, onnx.NodeName(g, h.Node), cast, torchError(n.OpType), lastSegment(module))
}

// torchError is the message PyTorch raises for operands of two dtypes at
// an op of this type.
func torchError(opType string) string {
	switch opType {
	case "Conv", "ConvTranspose":
		return `"Input type (float) and bias type (c10::Half) should be the same"`
	case "Gemm", "MatMul":
		return `"expected mat1 and mat2 to have the same dtype"`
	}
	return `"expected scalar type Float but found Half"`
}

func lastSegment(module string) string {
	if k := strings.LastIndexByte(module, '.'); k >= 0 {
		return module[k+1:]
	}
	return module
}
