package ops

// selectionOps choose by the values they read: which boxes
// NonMaxSuppression keeps, which entries TopK or ArgMax picks, where
// NonZero finds its condition true. A small change in a ranked score
// picks another candidate, so what they choose is judged where they
// choose (onnx.FindSelections: Chooses).
var selectionOps = []Op{
	{Name: "ArgMax", Type: TypeInt64, NonFloat: true, Grad: NoGrad, Chooses: []int{0}},
	{Name: "ArgMin", Type: TypeInt64, NonFloat: true, Grad: NoGrad, Chooses: []int{0}},
	{Name: "Compress", Type: TypeInput, DataShaped: true, Chooses: []int{0, 1}},
	{Name: "NonMaxSuppression", NonFloat: true, Chooses: []int{0, 1}},
	{Name: "NonZero", Type: TypeInt64, NonFloat: true, Grad: NoGrad, DataShaped: true, Chooses: []int{0}},
	{Name: "TopK", Type: TypeInput, IndexOutputs: []int{1}, IndexType: TypeInt64, Chooses: []int{0}, NonFinite: NonFiniteNaNOrder},
	{Name: "Unique", IndexOutputs: []int{1, 2, 3}, DataShaped: true, Chooses: []int{0}},
}
