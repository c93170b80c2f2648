// Package precision knows how PyTorch mixed precision treats each ONNX operator:
// which precision an op computes in under a policy (autocast fp16 or bf16,
// model.half(), plain fp32), how precision flows through an fp32 graph, and
// which PyTorch module a node came from.
//
// The rules in this package are fp16audit's emulation contract: the fp16 and
// bf16 passes round exactly the values that Assign holds in half precision,
// so a wrong rule here is a wrong verdict downstream.
package precision

import (
	"fmt"
	"strings"

	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
)

// Precision is the floating-point format a value is held in or an op
// computes in. The zero value, NotFloat, marks integer, boolean and string
// values, which rounding never touches.
type Precision int

// Precisions. DOUBLE values count as FP32: fp16audit only asks whether a
// value is held in a 16-bit format.
const (
	NotFloat Precision = iota
	FP32
	FP16
	BF16
)

// String returns "fp32", "fp16", "bf16" or "-" for NotFloat.
func (p Precision) String() string {
	switch p {
	case FP32:
		return "fp32"
	case FP16:
		return "fp16"
	case BF16:
		return "bf16"
	case NotFloat:
		return "-"
	}
	return fmt.Sprintf("Precision(%d)", int(p))
}

// ElemType returns the ONNX TensorProto data type that holds p (FLOAT,
// FLOAT16 or BFLOAT16), or 0 (UNDEFINED) for NotFloat. The rewriting passes
// use it as the "to" of their rounding Casts.
func (p Precision) ElemType() int32 {
	switch p {
	case FP32:
		return int32(onnx.TensorProto_FLOAT)
	case FP16:
		return int32(onnx.TensorProto_FLOAT16)
	case BF16:
		return int32(onnx.TensorProto_BFLOAT16)
	}
	return int32(onnx.TensorProto_UNDEFINED)
}

// PrecisionOf maps an ONNX TensorProto data type to a precision: FLOAT and
// DOUBLE are FP32, FLOAT16 is FP16, BFLOAT16 is BF16, and everything else,
// the 8- and 4-bit float formats included, is NotFloat (they only appear in
// quantized graphs, where values are not autocast).
func PrecisionOf(elemType int32) Precision {
	switch onnx.TensorProto_DataType(elemType) {
	case onnx.TensorProto_FLOAT, onnx.TensorProto_DOUBLE:
		return FP32
	case onnx.TensorProto_FLOAT16:
		return FP16
	case onnx.TensorProto_BFLOAT16:
		return BF16
	}
	return NotFloat
}

// widest is PyTorch's promote_types restricted to fp32, fp16 and bf16: equal
// types stay, anything with fp32 is fp32, and fp16 with bf16 is fp32 because
// neither holds the other. NotFloat is the identity.
func widest(a, b Precision) Precision {
	switch {
	case a == NotFloat:
		return b
	case b == NotFloat, a == b:
		return a
	}
	return FP32
}

// Category is how a policy treats an op: the list autocast puts it on.
type Category int

// Categories, named after autocast's cast policies.
const (
	// LowerPrecision ops cast every float input to the policy's lower
	// precision and produce it (autocast's lower_precision_fp list).
	LowerPrecision Category = iota
	// AlwaysFP32 ops cast every float input to fp32 and produce fp32
	// (autocast's fp32 list).
	AlwaysFP32
	// Promote ops cast their inputs to the widest float input type
	// (autocast's promote list).
	Promote
	// FollowInputs ops are untouched by the policy and run in the type
	// PyTorch's type promotion gives their inputs.
	FollowInputs
)

// String returns "lower", "fp32", "promote" or "follow".
func (c Category) String() string {
	switch c {
	case LowerPrecision:
		return "lower"
	case AlwaysFP32:
		return "fp32"
	case Promote:
		return "promote"
	case FollowInputs:
		return "follow"
	}
	return fmt.Sprintf("Category(%d)", int(c))
}

type policyKind int

const (
	kindAutocast policyKind = iota
	kindHalf
	kindFP32
)

// Policy is a way of running a model in mixed or half precision that
// fp16audit can emulate.
type Policy struct {
	// Name is the --policy value.
	Name string
	// Doc is a one-paragraph description for --help and reports.
	Doc string
	// Lower is the reduced precision the policy runs ops in: FP16 or BF16,
	// FP32 for the fp32 policy.
	Lower Precision
	// Params is the precision of the float graph inputs, initializers and
	// Constant outputs: FP32 under autocast (parameters and buffers stay
	// fp32 and the batch arrives in fp32), FP16 under half.
	Params Precision

	kind policyKind
}

// DefaultPolicy names the policy used when none is chosen: fastai's
// to_fp16() and plain torch.autocast.
const DefaultPolicy = "autocast-fp16"

var policies = []*Policy{
	{
		Name: "autocast-fp16",
		Doc: "torch.autocast with float16 (fastai's to_fp16(), torch.amp): " +
			"matmuls and convolutions run in fp16, the fp32-list ops in fp32, " +
			"everything else in the type of its inputs; parameters stay fp32.",
		Lower: FP16, Params: FP32, kind: kindAutocast,
	},
	{
		Name: "autocast-bf16",
		Doc: "torch.autocast with bfloat16 (fastai's to_bf16()): the autocast " +
			"lists of autocast-fp16 with bf16 as the lower precision.",
		Lower: BF16, Params: FP32, kind: kindAutocast,
	},
	{
		Name: "half",
		Doc: "model.half() with half inputs (fastai's non-native fp16): " +
			"parameters, inputs and every op in fp16, without autocast's fp32 " +
			"list; only BatchNormalization computes in fp32.",
		Lower: FP16, Params: FP16, kind: kindHalf,
	},
	{
		Name: "fp32",
		Doc: "plain fp32: nothing is lowered; only half casts written in the " +
			"model itself hold values in 16 bits.",
		Lower: FP32, Params: FP32, kind: kindFP32,
	},
}

// Policies returns the policies fp16audit emulates, the default first.
func Policies() []*Policy {
	return append([]*Policy(nil), policies...)
}

// PolicyByName returns the policy with the given name. The error for an
// unknown name lists the valid ones.
func PolicyByName(name string) (*Policy, error) {
	names := make([]string, len(policies))
	for i, p := range policies {
		if p.Name == name {
			return p, nil
		}
		names[i] = p.Name
	}
	return nil, fmt.Errorf("unknown policy %q: want one of %s", name, strings.Join(names, ", "))
}

// ModelHalf reports whether the policy is model.half()'s: parameters and
// inputs converted to fp16, no autocast.
func (p *Policy) ModelHalf() bool { return p.kind == kindHalf }

// IsLowerPrecisionOp reports whether autocast runs the op in its lower
// precision (Conv, MatMul, Gemm...): the kind of op a layer's weights live
// in, whatever the policy.
func IsLowerPrecisionOp(domain, opType string) bool {
	c, ok := autocastList(opType)
	return ok && onnx.IsDefaultDomain(domain) && c == LowerPrecision
}

// Category returns how the policy treats an op, and whether the op is a
// standard ONNX op (ai.onnx or ai.onnx.ml) whose behaviour fp16audit knows.
// Ops of other domains, and unknown op types, follow their inputs with
// known false.
//
// Under autocast-fp16 and autocast-bf16 the op lists of DESIGN.md apply and
// every other op follows its inputs. Under half every op follows its inputs,
// which are all fp16 there, except BatchNormalization (its entry's
// HalfFP32): fastai keeps BatchNorm layers in fp32, so it computes in
// fp32. Under fp32 every op
// follows its inputs. Assign refines these categories with the few
// per-node rules a category cannot express (Cast, Constant, BatchNorm
// outputs, Linear biases, rsqrt); see Assign.
func (p *Policy) Category(domain, opType string) (cat Category, known bool) {
	if !isStandard(domain, opType) {
		return FollowInputs, false
	}
	if domain == "ai.onnx.ml" {
		return FollowInputs, true
	}
	switch p.kind {
	case kindAutocast:
		if c, ok := autocastList(opType); ok {
			return c, true
		}
	case kindHalf:
		if o := ops.Lookup(ops.Default, opType); o != nil && o.HalfFP32 {
			return AlwaysFP32, true
		}
	}
	return FollowInputs, true
}
