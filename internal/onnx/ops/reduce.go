package ops

// reduceOps reduce over axes (the sums, means, norms and extrema) or
// accumulate along one (CumSum, CumProd).
var reduceOps = []Op{
	{Name: "CumProd", Autocast: FP32},
	{Name: "CumSum", Autocast: FP32, Type: TypeInput, Shape: "unary"},
	{Name: "ReduceL1", Autocast: FP32, Type: TypeInput, Shape: "reduce"},
	{Name: "ReduceL2", Autocast: FP32, Type: TypeInput, Shape: "reduce", Grad: "reduce", ParamInputs: []int{1}},
	{Name: "ReduceLogSum", Type: TypeInput, Shape: "reduce"},
	{Name: "ReduceLogSumExp", Autocast: FP32, Type: TypeInput, Shape: "reduce"},
	{Name: "ReduceMax", Type: TypeInput, Shape: "reduce", Grad: "reduce", ParamInputs: []int{1}},
	{Name: "ReduceMean", Type: TypeInput, Shape: "reduce", Grad: "reduce", ParamInputs: []int{1}},
	{Name: "ReduceMin", Type: TypeInput, Shape: "reduce", Grad: "reduce", ParamInputs: []int{1}},
	{Name: "ReduceProd", Autocast: FP32, Type: TypeInput, Shape: "reduce", Role: ShapeMove},
	{Name: "ReduceSum", Autocast: FP32, Type: TypeInput, Shape: "reduce", Grad: "reduce", ParamInputs: []int{1}},
	{Name: "ReduceSumSquare", Autocast: FP32, Type: TypeInput, Shape: "reduce", Grad: "reduce", ParamInputs: []int{1}},
}
