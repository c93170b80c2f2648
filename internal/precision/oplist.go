package precision

// standardOps lists the operators of the default ONNX domain (ai.onnx, up to
// opset 24, deprecated ones included because old exports still use them).
// Every op here is "known": its precision behaviour is decided by the policy
// rather than guessed.
var standardOps = []string{
	"Abs", "Acos", "Acosh", "Add", "AffineGrid", "And", "ArgMax", "ArgMin",
	"Asin", "Asinh", "Atan", "Atanh", "Attention", "AveragePool",
	"BatchNormalization", "Bernoulli", "BitCast", "BitShift", "BitwiseAnd",
	"BitwiseNot", "BitwiseOr", "BitwiseXor", "BlackmanWindow",
	"Cast", "CastLike", "Ceil", "Celu", "CenterCropPad", "Clip", "Col2Im",
	"Compress", "Concat", "ConcatFromSequence", "Constant", "ConstantOfShape",
	"Conv", "ConvInteger", "ConvTranspose", "Cos", "Cosh", "CumProd", "CumSum",
	"DFT", "DeformConv", "DepthToSpace", "DequantizeLinear", "Det", "Div",
	"Dropout", "DynamicQuantizeLinear",
	"Einsum", "Elu", "Equal", "Erf", "Exp", "Expand", "EyeLike",
	"Flatten", "Floor",
	"GRU", "Gather", "GatherElements", "GatherND", "Gelu", "Gemm",
	"GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "Greater",
	"GreaterOrEqual", "GridSample", "GroupNormalization",
	"HammingWindow", "HannWindow", "HardSigmoid", "HardSwish", "Hardmax",
	"Identity", "If", "ImageDecoder", "InstanceNormalization", "IsInf", "IsNaN",
	"LRN", "LSTM", "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual",
	"Log", "LogSoftmax", "Loop", "LpNormalization", "LpPool",
	"MatMul", "MatMulInteger", "Max", "MaxPool", "MaxRoiPool", "MaxUnpool",
	"Mean", "MeanVarianceNormalization", "MelWeightMatrix", "Min", "Mish",
	"Mod", "Mul", "Multinomial",
	"Neg", "NegativeLogLikelihoodLoss", "NonMaxSuppression", "NonZero", "Not",
	"OneHot", "Optional", "OptionalGetElement", "OptionalHasElement", "Or",
	"PRelu", "Pad", "Pow",
	"QLinearConv", "QLinearMatMul", "QuantizeLinear",
	"RMSNormalization", "RNN", "RandomNormal", "RandomNormalLike",
	"RandomUniform", "RandomUniformLike", "Range", "Reciprocal", "ReduceL1",
	"ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
	"ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare", "RegexFullMatch",
	"Relu", "Reshape", "Resize", "ReverseSequence", "RoiAlign",
	"RotaryEmbedding", "Round",
	"STFT", "Scan", "Scatter", "ScatterElements", "ScatterND", "Selu",
	"SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase",
	"SequenceInsert", "SequenceLength", "SequenceMap", "Shape", "Shrink",
	"Sigmoid", "Sign", "Sin", "Sinh", "Size", "Slice", "Softmax",
	"SoftmaxCrossEntropyLoss", "Softplus", "Softsign", "SpaceToDepth", "Split",
	"SplitToSequence", "Sqrt", "Squeeze", "StringConcat", "StringNormalizer",
	"StringSplit", "Sub", "Sum", "Swish",
	"Tan", "Tanh", "TensorScatter", "TfIdfVectorizer", "ThresholdedRelu",
	"Tile", "TopK", "Transpose", "Trilu",
	"Unique", "Unsqueeze", "Upsample",
	"Where", "Xor",
}

// mlOps lists the operators of the ai.onnx.ml domain. None of them exists in
// PyTorch, so they all follow their inputs.
var mlOps = []string{
	"ArrayFeatureExtractor", "Binarizer", "CastMap", "CategoryMapper",
	"DictVectorizer", "FeatureVectorizer", "Imputer", "LabelEncoder",
	"LinearClassifier", "LinearRegressor", "Normalizer", "OneHotEncoder",
	"SVMClassifier", "SVMRegressor", "Scaler", "TreeEnsemble",
	"TreeEnsembleClassifier", "TreeEnsembleRegressor", "ZipMap",
}

// autocastLists maps ONNX ops to the CUDA autocast lists of PyTorch 2.x
// (aten/src/ATen/autocast_mode.h), as DESIGN.md translates them. Ops not
// listed follow their inputs.
var autocastLists = map[string]Category{
	// lower_precision_fp: conv*, conv_transpose*, prelu, matmul, mm, bmm,
	// addmm, linear, einsum, rnn cells, scaled_dot_product_attention.
	"Conv":          LowerPrecision,
	"ConvTranspose": LowerPrecision,
	"MatMul":        LowerPrecision,
	"Gemm":          LowerPrecision,
	"Einsum":        LowerPrecision,
	"PRelu":         LowerPrecision,
	"LSTM":          LowerPrecision,
	"GRU":           LowerPrecision,
	"RNN":           LowerPrecision,
	"Attention":     LowerPrecision,

	// fp32: exp, log, pow, reciprocal, softplus, the inverse and hyperbolic
	// trig functions on the list, layer_norm, group_norm, norms, sum, prod,
	// logsumexp, cumsum, cumprod, softmax, log_softmax, upsample and the
	// losses.
	"Exp":                       AlwaysFP32,
	"Log":                       AlwaysFP32,
	"Pow":                       AlwaysFP32,
	"Reciprocal":                AlwaysFP32,
	"Softplus":                  AlwaysFP32,
	"Acos":                      AlwaysFP32,
	"Asin":                      AlwaysFP32,
	"Cosh":                      AlwaysFP32,
	"Sinh":                      AlwaysFP32,
	"Tan":                       AlwaysFP32,
	"LayerNormalization":        AlwaysFP32,
	"GroupNormalization":        AlwaysFP32,
	"LpNormalization":           AlwaysFP32,
	"ReduceSum":                 AlwaysFP32,
	"ReduceProd":                AlwaysFP32,
	"ReduceL1":                  AlwaysFP32,
	"ReduceL2":                  AlwaysFP32,
	"ReduceLogSumExp":           AlwaysFP32,
	"ReduceSumSquare":           AlwaysFP32,
	"CumSum":                    AlwaysFP32,
	"CumProd":                   AlwaysFP32,
	"Softmax":                   AlwaysFP32,
	"LogSoftmax":                AlwaysFP32,
	"Resize":                    AlwaysFP32,
	"Upsample":                  AlwaysFP32,
	"NegativeLogLikelihoodLoss": AlwaysFP32,
	"SoftmaxCrossEntropyLoss":   AlwaysFP32,

	// promote: cat and stack, index_put, scatter_add, grid_sampler; where
	// is not on the list but promotes the same way through type promotion.
	"Concat":          Promote,
	"ScatterND":       Promote,
	"ScatterElements": Promote,
	"GridSample":      Promote,
	"Where":           Promote,
}

var (
	standardSet = toSet(standardOps)
	mlSet       = toSet(mlOps)
)

func toSet(names []string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// isStandard reports whether an op belongs to the ONNX standard (ai.onnx or
// ai.onnx.ml), whose semantics fp16audit knows.
func isStandard(domain, opType string) bool {
	switch domain {
	case "", "ai.onnx":
		return standardSet[opType]
	case "ai.onnx.ml":
		return mlSet[opType]
	}
	return false
}
