package ops

// contribOps are the ONNX Runtime contrib ops exporters write, whose
// semantics are not the standard's.
var contribOps = []Op{
	{Name: "QuickGelu", Domain: Microsoft, Shape: "unary"},
}
