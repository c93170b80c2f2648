package ops

// activationOps are the activations, elementwise nonlinearities with no
// weights but PRelu's slope, and softmax over an axis.
var activationOps = []Op{
	{Name: "Celu", Type: TypeInput, Shape: "unary", NonFinite: NonFiniteAsTorch},
	{Name: "Elu", Type: TypeInput, Shape: "unary", Grad: "unary", Role: KeepsScores, NonFinite: NonFiniteAsTorch},
	{Name: "Gelu", Type: TypeInput, Shape: "unary", Grad: "unary", Role: Tail | KeepsScores, NonFinite: NonFiniteAsTorch},
	{Name: "HardSigmoid", Type: TypeInput, Shape: "unary", Grad: "unary", NonFinite: NonFiniteAsTorch},
	{Name: "HardSwish", Type: TypeInput, Shape: "unary", Grad: "unary", NonFinite: NonFiniteAsTorch},
	{Name: "Hardmax", Type: TypeInput, Shape: "unary"},
	{Name: "LeakyRelu", Type: TypeInput, Shape: "unary", Grad: "unary", Role: Tail | KeepsScores, NonFinite: NonFiniteAsTorch},
	{Name: "LogSoftmax", Autocast: FP32, Type: TypeInput, Shape: "unary", Grad: "softmax", Role: Tail | Scores, NonFinite: NonFiniteAsTorch},
	{Name: "Mish", Type: TypeInput, Shape: "unary", NonFinite: NonFiniteAsTorch},
	{Name: "PRelu", Autocast: Lower, Type: TypeInput, Shape: "broadcast", NonFinite: NonFiniteAsTorch},
	{Name: "Relu", Type: TypeInput, Shape: "unary", Grad: "unary", Role: Tail | KeepsScores, NonFinite: NonFiniteAsTorch},
	{Name: "Selu", Type: TypeInput, Shape: "unary", Role: KeepsScores, NonFinite: NonFiniteAsTorch},
	{Name: "Shrink", Type: TypeInput, Shape: "unary"},
	{Name: "Sigmoid", Type: TypeInput, Shape: "unary", Grad: "unary", Role: Tail | KeepsScores, NonFinite: NonFiniteAsTorch},
	{Name: "Softmax", Autocast: FP32, Type: TypeInput, Shape: "unary", Grad: "softmax", Role: Tail | Scores, NonFinite: NonFiniteAsTorch},
	{Name: "Softplus", Autocast: FP32, Type: TypeInput, Shape: "unary", Grad: "unary", NonFinite: NonFiniteAsTorch},
	{Name: "Softsign", Type: TypeInput, Shape: "unary", Grad: "unary"},
	{Name: "Swish", Type: TypeInput, Shape: "unary"},
	{Name: "Tanh", Type: TypeInput, Shape: "unary", Grad: "unary", Role: Tail | KeepsScores, NonFinite: NonFiniteAsTorch},
	{Name: "ThresholdedRelu", Type: TypeInput, Shape: "unary"},
}
