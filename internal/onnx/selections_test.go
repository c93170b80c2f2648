package onnx

import (
	"slices"
	"strings"
	"testing"
)

// selNode builds a node from space-separated input and output names.
func selNode(op, name, inputs, outputs string) *NodeProto {
	return Node(op, name, strings.Fields(inputs), strings.Fields(outputs))
}

// detectorGraph is a detector's post-processing as torchvision's export
// writes it: scores thresholded (Greater, NonZero), gathered (GatherND),
// ranked by TopK, boxes gathered at the kept indices, NMS over them and
// the final Gathers; plus a classifier head beside it that no selection
// reads.
func detectorGraph() *GraphProto {
	f := func(name string) *ValueInfoProto { return TensorValueInfo(name, TensorProto_FLOAT) }
	return &GraphProto{
		Input: []*ValueInfoProto{f("x")},
		Initializer: []*TensorProto{
			FloatTensor("W", []int64{4, 4}, make([]float32, 16)),
			FloatTensor("thr", nil, []float32{0.01}),
			Int64Tensor("k", []int64{1}, []int64{2}),
		},
		Node: []*NodeProto{
			selNode("MatMul", "head", "x W", "logits"),
			selNode("Softmax", "softmax", "logits", "scores"),
			selNode("Relu", "box_head", "x", "boxes"),
			selNode("Greater", "gt", "scores thr", "keep"),
			selNode("NonZero", "nz", "keep", "idx"),
			selNode("Transpose", "tr", "idx", "idxT"),
			selNode("GatherND", "gnd", "scores idxT", "kept"),
			selNode("TopK", "topk", "kept k", "top top_i"),
			selNode("Gather", "gbox", "boxes top_i", "top_boxes"),
			selNode("NonMaxSuppression", "nms", "top_boxes top", "sel"),
			selNode("Gather", "final", "top_boxes sel", "out_boxes"),
			selNode("Identity", "cls", "logits", "class_scores"),
		},
		Output: []*ValueInfoProto{f("out_boxes"), f("class_scores")},
	}
}

// TestFindSelections: everything computed from a choice is chosen; what
// the choices rank or gather from, and is not chosen itself, is ranked,
// weights and constants aside; a value beside the selections is neither.
func TestFindSelections(t *testing.T) {
	ix, err := NewIndex(detectorGraph())
	if err != nil {
		t.Fatal(err)
	}
	s := FindSelections(ix)
	for _, v := range []string{"idx", "idxT", "kept", "top", "top_i", "top_boxes", "sel", "out_boxes"} {
		if !s.Chosen[v] {
			t.Errorf("%s is not chosen", v)
		}
	}
	for _, v := range []string{"logits", "scores", "boxes", "keep", "class_scores"} {
		if s.Chosen[v] {
			t.Errorf("%s is chosen, but no choice made it", v)
		}
	}
	// The Greater condition ranks scores; the GatherND gathers scores;
	// the box Gather gathers boxes. kept and top_boxes are chosen
	// already, so TopK's and NMS's inputs add nothing.
	if want := []string{"scores", "boxes"}; !slices.Equal(s.Ranked, want) {
		t.Errorf("ranked %v, want %v", s.Ranked, want)
	}
	if !ClassScores(ix, s, "class_scores") {
		t.Error("class_scores (Identity of a MatMul) is not class scores")
	}
	if ClassScores(ix, s, "out_boxes") || ClassScores(ix, s, "boxes") {
		t.Error("boxes count as class scores")
	}
}

// TestFindSelectionsNone: a model without a choice has no chosen values
// and nothing ranked.
func TestFindSelectionsNone(t *testing.T) {
	g := &GraphProto{
		Input:       []*ValueInfoProto{TensorValueInfo("x", TensorProto_FLOAT)},
		Initializer: []*TensorProto{FloatTensor("W", []int64{2, 2}, make([]float32, 4))},
		Node:        []*NodeProto{selNode("MatMul", "mm", "x W", "y"), selNode("Softmax", "sm", "y", "p")},
		Output:      []*ValueInfoProto{TensorValueInfo("p", TensorProto_FLOAT)},
	}
	ix, err := NewIndex(g)
	if err != nil {
		t.Fatal(err)
	}
	s := FindSelections(ix)
	if len(s.Chosen) != 0 || len(s.Ranked) != 0 {
		t.Errorf("chosen %v, ranked %v; want none", s.Chosen, s.Ranked)
	}
	if !ClassScores(ix, s, "p") {
		t.Error("a softmax output is not class scores")
	}
}

// TestFindSelectionsLoop: a Loop whose body chooses (a beam search) is a
// choice as a whole.
func TestFindSelectionsLoop(t *testing.T) {
	body := &GraphProto{Node: []*NodeProto{selNode("ArgMax", "am", "h", "best")}}
	loop := selNode("Loop", "beam", "n cond x", "seq")
	loop.Attribute = []*AttributeProto{{Name: "body", Type: AttributeProto_GRAPH, G: body}}
	g := &GraphProto{
		Input:  []*ValueInfoProto{TensorValueInfo("x", TensorProto_FLOAT), TensorValueInfo("n", TensorProto_INT64), TensorValueInfo("cond", TensorProto_BOOL)},
		Node:   []*NodeProto{loop, selNode("Relu", "r", "seq", "y")},
		Output: []*ValueInfoProto{TensorValueInfo("y", TensorProto_FLOAT)},
	}
	ix, err := NewIndex(g)
	if err != nil {
		t.Fatal(err)
	}
	if s := FindSelections(ix); !s.Chosen["seq"] || !s.Chosen["y"] {
		t.Errorf("chosen %v, want the loop's output and what follows", s.Chosen)
	}
}
