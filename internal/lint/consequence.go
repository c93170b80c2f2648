package lint

import (
	"fmt"

	"fp16audit/internal/onnx"
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

// FillAt returns how node n uses the constant it reads in input slot:
// masked_fill exports as Where(mask, value, self), index_put_ and scatter
// as ScatterND / ScatterElements with the value as updates, torch.full as
// ConstantOfShape (its fill value is an attribute: slot -1).
func FillAt(n *onnx.NodeProto, slot int) Fill {
	if !onnx.IsDefaultDomain(n.GetDomain()) {
		return Fill{}
	}
	switch op := n.GetOpType(); {
	case op == "Where" && (slot == 1 || slot == 2):
		return Fill{Op: "masked_fill", Raises: true}
	case (op == "ScatterND" || op == "ScatterElements") && slot == 2:
		return Fill{Op: "index_put_", Raises: true}
	case op == "ConstantOfShape":
		return Fill{Op: "torch.full", Raises: true}
	}
	return Fill{}
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
