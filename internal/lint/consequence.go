package lint

import (
	"fmt"
	"slices"

	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/precision"
)

// Fill describes how PyTorch wrote a constant into a tensor, as far as the
// exported graph tells: a fill (masked_fill, index_put_, full) converts a
// Python scalar to the tensor's dtype with an overflow check and raises,
// arithmetic rounds it to ±Inf.
type Fill struct {
	// Op is the PyTorch call the node exports ("masked_fill"), "" for
	// arithmetic.
	Op string
	// Raises is set for the fills that raise on a value out of the
	// tensor's range.
	Raises bool
}

// FillAt returns how node n uses the constant it reads in input slot, by
// its entry's Fill in internal/onnx/ops: masked_fill exports as
// Where(mask, value, self), index_put_ and scatter as ScatterND /
// ScatterElements with the value as updates, torch.full as
// ConstantOfShape (its fill value is an attribute: any slot).
func FillAt(n *onnx.NodeProto, slot int) Fill {
	if !onnx.IsDefaultDomain(n.GetDomain()) {
		return Fill{}
	}
	o := ops.Lookup(ops.Default, n.GetOpType())
	if o == nil || o.Fill == "" || (o.FillInputs != nil && !slices.Contains(o.FillInputs, slot)) {
		return Fill{}
	}
	return Fill{Op: o.Fill, Raises: true}
}

// Consequence says, for a message, what PyTorch does with a constant out of
// the range of p written in the way f describes.
func (f Fill) Consequence(p precision.Precision, value float64) string {
	if f.Raises {
		t := "Half"
		if p == precision.BF16 {
			t = "BFloat16"
		}
		return fmt.Sprintf("PyTorch raises RuntimeError: value cannot be converted to type at::%s without overflow at %s (torch.where gives %s instead)", t, f.Op, infName(value))
	}
	return fmt.Sprintf("the %s result is %s", p, infName(value))
}

func infName(v float64) string {
	if v < 0 {
		return "-Inf"
	}
	return "+Inf"
}

// DtypeAware says, for a message, what becomes of a number that
// torch.finfo(dtype) wrote — exported from an fp32 trace as ±float32's
// largest value — where it is read in p: the limit of p, which fp16audit
// run writes too (rewrite.FinfoFills), and what a hard-coded
// torch.finfo(torch.float32) would do instead, which the graph cannot tell
// apart.
func (f Fill) DtypeAware(p precision.Precision, value, limit float64) string {
	field := "max"
	if value < 0 {
		field = "min"
	}
	return fmt.Sprintf("that is torch.finfo(x.dtype).%s as an fp32 export writes it, and such code writes %s's own limit %.6g there at run time; a hard-coded torch.finfo(torch.float32).%s is not the same (%s)",
		field, p, limit, field, f.Consequence(p, value))
}
