package ops

// quantOps are the quantized kernels and the conversions to and from
// integers.
var quantOps = []Op{
	{Name: "ConvInteger", NonFloat: true},
	{Name: "DequantizeLinear", Type: TypeSecond},
	{Name: "DynamicQuantizeLinear", IndexOutputs: []int{0, 2}},
	{Name: "MatMulInteger", NonFloat: true},
	{Name: "QLinearConv", NonFloat: true},
	{Name: "QLinearMatMul", NonFloat: true},
	{Name: "QuantizeLinear", NonFloat: true},
}
