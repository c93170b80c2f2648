package report

// Block is one module block of the model with its nodes' statistics rolled
// up: an element of a repeated container (model.layers.3, encoder.layer.0,
// layer1.1), or one of the modules around the containers at the same depth
// (model.embed_tokens, model.norm, lm_head), or the model's own forward
// (""). A report of thousands of nodes reads block by block; the repeated
// blocks in order are the residual stream's path, whose growth layer by
// layer is where massive activations show. Added within v1.1: older
// reports lack Report.Blocks.
type Block struct {
	Module string `json:"module"`
	// Repeated marks an element of a repeated container: the blocks the
	// growth of the residual stream is followed through.
	Repeated bool `json:"repeated,omitempty"`
	// Nodes counts the block's nodes (NodeReport.Block names the block of
	// each); Flagged those with NaN/Inf in some pass.
	Nodes   int `json:"nodes"`
	Flagged int `json:"flagged"`
	// MaxAbs is the largest fp32 max |x| among the block's values held in
	// reduced precision under the policy, MaxAbsValue names that value and
	// HeadroomBits is log2(65504 / MaxAbs), the block's worst headroom as
	// the node table measures it. All three are left out when the block
	// holds no such value with a nonzero finite element: values held in
	// fp32 have no headroom to lose. Values whose NaN/Inf in the policy's
	// pass reach no output (a mask constant that is -Inf in fp16, absorbed
	// by softmax) do not count here, nor values that carry a mask (a fill
	// of torch.finfo(x.dtype).min: -3.4e38 in fp32, the format's limit in
	// the policy's pass).
	MaxAbs       *float64 `json:"max_abs,omitempty"`
	MaxAbsValue  string   `json:"max_abs_value,omitempty"`
	HeadroomBits *float64 `json:"headroom_bits,omitempty"`
	// FirstOverflow is the first node of the block, in topological order,
	// whose output holds NaN/Inf in the policy's emulated pass that reach
	// a graph output (an origin, or a node an origin reached); Origin marks
	// that node as an origin of the report.
	FirstOverflow string `json:"first_overflow,omitempty"`
	Origin        bool   `json:"origin,omitempty"`
	// Output is the block's last float value read outside it — after a
	// transformer layer, the residual stream — with its statistics in
	// each pass: its max |x| block after block is the growth plot.
	Output *ValueReport `json:"output,omitempty"`
}
