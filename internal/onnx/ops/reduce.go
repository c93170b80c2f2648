package ops

// reduceOps reduce over axes (the sums, means, norms and extrema) or
// accumulate along one (CumSum, CumProd).
var reduceOps = []Op{
	{Name: "CumProd", Autocast: FP32},
	{Name: "CumSum", Autocast: FP32, Type: TypeInput, Shape: "unary", NonFinite: NonFiniteAsTorch},
	{Name: "ReduceL1", Autocast: FP32, Type: TypeInput, Shape: "reduce"},
	{Name: "ReduceL2", Autocast: FP32, Type: TypeInput, Shape: "reduce", Grad: "reduce", ParamInputs: []int{1}, NonFinite: NonFiniteAsTorch},
	{Name: "ReduceLogSum", Type: TypeInput, Shape: "reduce"},
	{Name: "ReduceLogSumExp", Autocast: FP32, Type: TypeInput, Shape: "reduce", NonFinite: NonFiniteAsTorch},
	{Name: "ReduceMax", Type: TypeInput, Shape: "reduce", Grad: "reduce", ParamInputs: []int{1}, NonFinite: NonFiniteSkipsNaN},
	{Name: "ReduceMean", Type: TypeInput, Shape: "reduce", Grad: "reduce", ParamInputs: []int{1}, NonFinite: NonFiniteAsTorch},
	{Name: "ReduceMin", Type: TypeInput, Shape: "reduce", Grad: "reduce", ParamInputs: []int{1}, NonFinite: NonFiniteSkipsNaN},
	{Name: "ReduceProd", Autocast: FP32, Type: TypeInput, Shape: "reduce", Role: ShapeMove, NonFinite: NonFiniteAsTorch},
	{Name: "ReduceSum", Autocast: FP32, Type: TypeInput, Shape: "reduce", Grad: "reduce", ParamInputs: []int{1}, NonFinite: NonFiniteAsTorch},
	{Name: "ReduceSumSquare", Autocast: FP32, Type: TypeInput, Shape: "reduce", Grad: "reduce", ParamInputs: []int{1}},
}
