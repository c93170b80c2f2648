package ops

// opset23Ops are the transformer ops opset 23 added, which torch 2.x's
// dynamo exporter writes at opset_version=23: Attention for
// scaled_dot_product_attention, RMSNormalization for an RMSNorm, and
// RotaryEmbedding for RoPE where the positions are an input (onnxscript's
// opset-23 fusions; fixtures/torch/cases_hf: hf_llama*_opset23,
// hf_llama_rotary*_opset23).
var opset23Ops = []Op{
	{Name: "Attention", Autocast: Lower, Type: TypeInput, Grad: "attention"},
	{Name: "RMSNormalization", DataInputs: 1, Type: TypeInput, Shape: "unary", Grad: "rmsNorm", Epsilon: true, HalfWeights: true},
	{Name: "RotaryEmbedding", Type: TypeInput, Shape: "unary", Grad: "rotary", HalfWeights: true},
}
