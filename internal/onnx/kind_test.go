package onnx

import (
	"slices"
	"testing"
)

// seqGraph is a chunk and a split as the dynamo exporter writes them
// without its optimizer, an Identity and an Optional of the sequence, a
// SequenceConstruct of two tensors, and an If whose branches return a
// sequence.
func seqGraph() *GraphProto {
	seqOut := &GraphProto{Name: "then", Output: []*ValueInfoProto{{Name: "s", Type: &TypeProto{Value: &TypeProto_SequenceType{
		SequenceType: &TypeProto_Sequence{ElemType: &TypeProto{Value: &TypeProto_TensorType{TensorType: &TypeProto_Tensor{ElemType: int32(TensorProto_FLOAT)}}}}}}}}}
	return &GraphProto{
		Name:        "seq",
		Input:       []*ValueInfoProto{TensorValueInfo("x", TensorProto_FLOAT, 2, 6), TensorValueInfo("c", TensorProto_BOOL)},
		Initializer: []*TensorProto{Int64Tensor("two", nil, []int64{2}), Int64Tensor("one", nil, []int64{1})},
		Node: []*NodeProto{
			Node("SplitToSequence", "split", []string{"x", "two"}, []string{"seq"}, AttrInt("axis", 1)),
			Node("SequenceAt", "at", []string{"seq", "one"}, []string{"piece"}),
			Node("Identity", "id", []string{"seq"}, []string{"seq2"}),
			Node("Optional", "opt", []string{"seq2"}, []string{"maybe"}),
			Node("OptionalGetElement", "get", []string{"maybe"}, []string{"seq3"}),
			Node("Relu", "relu", []string{"piece"}, []string{"r"}),
			Node("SequenceConstruct", "make", []string{"r", "piece"}, []string{"pair"}),
			Node("SequenceLength", "len", []string{"pair"}, []string{"n"}),
			Node("If", "if", []string{"c"}, []string{"branch"}, &AttributeProto{Name: "then_branch", Type: AttributeProto_GRAPH, G: seqOut},
				&AttributeProto{Name: "else_branch", Type: AttributeProto_GRAPH, G: seqOut}),
		},
		Output: []*ValueInfoProto{TensorValueInfo("r", TensorProto_FLOAT)},
	}
}

// TestKinds: which values are sequences or optionals, from the registry's
// entries and what a subgraph declares; the tensors among them, with the
// element type a container holds.
func TestKinds(t *testing.T) {
	ix, err := NewIndex(seqGraph())
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]Kind{"x": KindTensor, "seq": KindSequence, "piece": KindTensor, "seq2": KindSequence,
		"maybe": KindOptionalSequence, "seq3": KindSequence, "r": KindTensor, "pair": KindSequence, "n": KindTensor,
		"branch": KindSequence, "nowhere": KindTensor} {
		if got := ix.Kind(name); got != want {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
		if ix.Tensor(name) != (want == KindTensor) {
			t.Errorf("%s: Tensor %v", name, ix.Tensor(name))
		}
	}
	for _, name := range []string{"seq", "piece", "pair"} {
		if ix.ElemType(name) != int32(TensorProto_FLOAT) {
			t.Errorf("%s holds element type %d, want FLOAT", name, ix.ElemType(name))
		}
	}
	if ix.ElemType("n") != int32(TensorProto_INT64) {
		t.Errorf("SequenceLength's output is %d, want INT64", ix.ElemType("n"))
	}
}

// TestContents: the tensors each container holds, through the containers
// made from it; the split sizes are no content.
func TestContents(t *testing.T) {
	ix, err := NewIndex(seqGraph())
	if err != nil {
		t.Fatal(err)
	}
	got := ix.Contents()
	for name, want := range map[string][]string{"seq": {"x"}, "seq2": {"x"}, "maybe": {"x"}, "seq3": {"x"}, "pair": {"r", "piece"}, "branch": nil} {
		if !slices.Equal(got[name], want) {
			t.Errorf("%s holds %v, want %v", name, got[name], want)
		}
	}
	if _, ok := got["piece"]; ok {
		t.Error("a tensor has contents")
	}
}

// TestSplitPieces: the pieces of torch.chunk (one size, a shorter last
// piece), torch.split by sizes and unbind's keepdims 0, and what does not
// cut the tensor.
func TestSplitPieces(t *testing.T) {
	chunk := Node("SplitToSequence", "s", []string{"x", "n"}, []string{"seq"}, AttrInt("axis", -1))
	unbind := Node("SplitToSequence", "s", []string{"x"}, []string{"seq"}, AttrInt("axis", 0), AttrInt("keepdims", 0))
	for _, c := range []struct {
		name            string
		n               *NodeProto
		x, split        []int64
		has, scalar, ok bool
		sizes           []int64
		squeeze         bool
	}{
		{"chunk", chunk, []int64{2, 7}, []int64{3}, true, true, true, []int64{3, 3, 1}, false},
		{"sizes", chunk, []int64{2, 7}, []int64{2, 5}, true, false, true, []int64{2, 5}, false},
		{"sizes that do not add up", chunk, []int64{2, 7}, []int64{2, 4}, true, false, false, nil, false},
		{"unbind", unbind, []int64{3, 4}, nil, false, false, true, []int64{1, 1, 1}, true},
		{"axis out of range", Node("SplitToSequence", "s", []string{"x"}, []string{"seq"}, AttrInt("axis", 2)), []int64{3, 4}, nil, false, false, false, nil, false},
	} {
		p, ok := SplitPieces(c.n, c.x, c.split, c.has, c.scalar)
		if ok != c.ok || ok && (!slices.Equal(p.Sizes, c.sizes) || p.Squeeze != c.squeeze) {
			t.Errorf("%s: %+v %v, want sizes %v squeeze %v ok %v", c.name, p, ok, c.sizes, c.squeeze, c.ok)
		}
	}
	p, _ := SplitPieces(chunk, []int64{2, 7}, []int64{3}, true, true)
	if p.Offset(2) != 6 || !slices.Equal(p.PieceShape([]int64{2, 7}, 2), []int64{2, 1}) {
		t.Errorf("third piece at %d, shape %v", p.Offset(2), p.PieceShape([]int64{2, 7}, 2))
	}
	if k, ok := p.Index(-1); !ok || k != 2 {
		t.Errorf("position -1 is piece %d (%v)", k, ok)
	}
	if _, ok := p.Index(3); ok {
		t.Error("position 3 of 3 pieces read one")
	}
	u, _ := SplitPieces(unbind, []int64{3, 4}, nil, false, false)
	if !slices.Equal(u.PieceShape([]int64{3, 4}, 1), []int64{4}) {
		t.Errorf("unbind's piece %v, want [4]", u.PieceShape([]int64{3, 4}, 1))
	}
}
