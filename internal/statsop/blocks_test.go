package statsop_test

import (
	"slices"
	"strings"
	"testing"

	"fp16audit/internal/onnx"
	"fp16audit/internal/statsop"
)

// sharedWeightPlan is the plan of one fp32 pass over x → MatMul(x, Wi) →
// Relu → MatMul(·, Wi) → y, where Wi = Identity(W) is a constant both
// MatMuls read, observing a, r and y.
func sharedWeightPlan(t *testing.T) *statsop.Plan {
	t.Helper()
	g := &onnx.GraphProto{
		Name: "shared",
		Node: []*onnx.NodeProto{
			onnx.Node("Identity", "/Identity", []string{"W"}, []string{"Wi"}),
			onnx.Node("MatMul", "/MatMul", []string{"x", "Wi"}, []string{"a"}),
			onnx.Node("Relu", "/Relu", []string{"a"}, []string{"r"}),
			onnx.Node("MatMul", "/MatMul_1", []string{"r", "Wi"}, []string{"y"}),
		},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("W", []int64{2, 2}, []float32{1, -1, 2, 0.5})},
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, "n", 2)},
		Output:      []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, "n", 2)},
	}
	elem := func(string) int32 { return int32(onnx.TensorProto_FLOAT) }
	plan, err := statsop.Combine([]statsop.Pass{{Name: "fp32", Model: onnx.NewModel(g, 17), Ref: -1}}, []string{"a", "r", "y"}, elem, 0)
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

// pins maps the plan's copies of model nodes to blocks by model node index.
func pins(p *statsop.Plan, block map[int]int) []int {
	out := make([]int, len(p.Origin))
	for i, o := range p.Origin {
		out[i] = -1
		if b, ok := block[o]; ok {
			out[i] = b
		}
	}
	return out
}

// TestSplitBlocks: each block holds its own nodes, the Observe nodes of the
// values it makes and a copy of every constant it reads (the Identity of
// the weight, never handed on); a value a later block reads is handed on
// and becomes that block's input; a node pinned before a value it reads is
// refused.
func TestSplitBlocks(t *testing.T) {
	p := sharedWeightPlan(t)
	blocks, err := statsop.Split(p, pins(p, map[int]int{0: 0, 1: 0, 2: 1, 3: 1}))
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 2 {
		t.Fatalf("%d blocks, want 2", len(blocks))
	}
	ops := func(b *statsop.Block) []string {
		var out []string
		for _, n := range b.Plan.Model.Graph.Node {
			if n.OpType != statsop.OpObserve {
				out = append(out, n.Name)
			}
		}
		return out
	}
	values := func(b *statsop.Block) []string {
		var out []string
		for _, o := range b.Plan.Outputs {
			out = append(out, o.Value)
		}
		return out
	}
	if got := ops(blocks[0]); !slices.Equal(got, []string{"/Identity", "/MatMul"}) {
		t.Errorf("block 0 nodes %v", got)
	}
	if got := ops(blocks[1]); !slices.Equal(got, []string{"/Identity", "/Relu", "/MatMul_1", "y::out::fp16audit"}) {
		t.Errorf("block 1 nodes %v", got)
	}
	if got := values(blocks[0]); !slices.Equal(got, []string{"a"}) {
		t.Errorf("block 0 observes %v", got)
	}
	if got := values(blocks[1]); !slices.Equal(got, []string{"r", "y"}) {
		t.Errorf("block 1 observes %v", got)
	}
	if !slices.Contains(blocks[0].Plan.Hand, "a") || slices.Contains(blocks[0].Plan.Hand, "Wi") || len(blocks[0].Plan.Hand) != 2 {
		t.Fatalf("block 0 hands on %v, want a and its last token", blocks[0].Plan.Hand)
	}
	token := blocks[0].Plan.Hand[slices.Index(blocks[0].Plan.Hand, "a")^1]
	if in := blocks[1].Inputs; len(in) != 2 || !slices.Contains(in, "a") || !slices.Contains(in, token) || !blocks[1].Handed["a"] || !blocks[1].Handed[token] {
		t.Errorf("block 1 inputs %v, handed %v; want a and the token %s", in, blocks[1].Handed, token)
	}
	want := []string{p.Token}
	for _, f := range p.Fetch {
		want = append(want, f.Name) // the graph outputs, made after the last Observe node
	}
	if !slices.Equal(blocks[1].Plan.Hand, want) || len(want) != 2 {
		t.Errorf("block 1 returns %v, want the plan's token and graph output %v", blocks[1].Plan.Hand, want)
	}
	for b, blk := range blocks {
		if init := blk.Plan.Model.Graph.Initializer; !slices.ContainsFunc(init, func(t *onnx.TensorProto) bool { return t.Name == "W" }) {
			t.Errorf("block %d lacks the weight W its Identity reads", b)
		}
	}
	typed := blocks[1].Typed(func(string) int32 { return int32(onnx.TensorProto_FLOAT) })
	if in := typed.Model.Graph.Input; len(in) != 2 || in[0].GetType().GetTensorType().GetElemType() != int32(onnx.TensorProto_FLOAT) || len(blocks[1].Plan.Model.Graph.Input) != 0 {
		t.Errorf("typed inputs %v (the block's own graph must stay as it is)", in)
	}

	_, err = statsop.Split(p, pins(p, map[int]int{0: 0, 1: 1, 2: 0, 3: 1}))
	if err == nil || !strings.Contains(err.Error(), `"/Relu"`) || !strings.Contains(err.Error(), "later block 1") {
		t.Errorf("Relu pinned before the MatMul it reads: %v", err)
	}
}
