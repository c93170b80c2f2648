package ops

// activationOps are the activations, elementwise nonlinearities with no
// weights but PRelu's slope, and softmax over an axis.
var activationOps = []Op{
	{Name: "Celu", Type: TypeInput, Shape: "unary"},
	{Name: "Elu", Type: TypeInput, Shape: "unary", Grad: "unary", Role: KeepsScores},
	{Name: "Gelu", Type: TypeInput, Shape: "unary", Grad: "unary", Role: Tail | KeepsScores},
	{Name: "HardSigmoid", Type: TypeInput, Shape: "unary", Grad: "unary"},
	{Name: "HardSwish", Type: TypeInput, Shape: "unary", Grad: "unary"},
	{Name: "Hardmax", Type: TypeInput, Shape: "unary"},
	{Name: "LeakyRelu", Type: TypeInput, Shape: "unary", Grad: "unary", Role: Tail | KeepsScores},
	{Name: "LogSoftmax", Autocast: FP32, Type: TypeInput, Shape: "unary", Grad: "softmax", Role: Tail | Scores},
	{Name: "Mish", Type: TypeInput, Shape: "unary"},
	{Name: "PRelu", Autocast: Lower, Type: TypeInput, Shape: "broadcast"},
	{Name: "Relu", Type: TypeInput, Shape: "unary", Grad: "unary", Role: Tail | KeepsScores},
	{Name: "Selu", Type: TypeInput, Shape: "unary", Role: KeepsScores},
	{Name: "Shrink", Type: TypeInput, Shape: "unary"},
	{Name: "Sigmoid", Type: TypeInput, Shape: "unary", Grad: "unary", Role: Tail | KeepsScores},
	{Name: "Softmax", Autocast: FP32, Type: TypeInput, Shape: "unary", Grad: "softmax", Role: Tail | Scores},
	{Name: "Softplus", Autocast: FP32, Type: TypeInput, Shape: "unary", Grad: "unary"},
	{Name: "Softsign", Type: TypeInput, Shape: "unary", Grad: "unary"},
	{Name: "Swish", Type: TypeInput, Shape: "unary"},
	{Name: "Tanh", Type: TypeInput, Shape: "unary", Grad: "unary", Role: Tail | KeepsScores},
	{Name: "ThresholdedRelu", Type: TypeInput, Shape: "unary"},
}
