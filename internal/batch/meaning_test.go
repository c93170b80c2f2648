package batch

import (
	"encoding/binary"
	"path/filepath"
	"testing"

	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

// TestMeaningOfTorchExports: what the inputs of real exported language
// models hold, decided from their names and from the tables they index.
func TestMeaningOfTorchExports(t *testing.T) {
	for _, c := range []struct {
		file string
		want map[string]Meaning
		rows map[string]int64
	}{
		{"bert_additive_mask.onnx",
			map[string]Meaning{"input_ids": MeaningTokens, "attention_mask": MeaningAttentionMask, "token_type_ids": MeaningTokenTypes},
			map[string]int64{"input_ids": 40, "attention_mask": 0, "token_type_ids": 2}},
		{"llama_inputs.onnx",
			map[string]Meaning{"input_ids": MeaningTokens, "attention_mask": MeaningAttentionMask, "position_ids": MeaningPositions},
			map[string]int64{"input_ids": 64, "attention_mask": 0, "position_ids": 128}},
	} {
		m, err := onnx.Load(filepath.Join("..", "..", "fixtures", "torch", "synthetic", c.file))
		if err != nil {
			t.Fatal(err)
		}
		specs := Specs(m.Proto.Graph, m.Index)
		if len(specs) != len(c.want) {
			t.Fatalf("%s: %d inputs, want %d", c.file, len(specs), len(c.want))
		}
		for _, s := range specs {
			if s.Meaning != c.want[s.Name] || s.Rows != c.rows[s.Name] {
				t.Errorf("%s: input %s is %s with %d rows, want %s with %d", c.file, s.Name, s.Meaning, s.Rows, c.want[s.Name], c.rows[s.Name])
			}
		}
	}
}

// TestMeaningByUse: names decide masks, types and positions; use decides
// token ids (a rank-2 float table gathered on axis 0) and the bound of
// any index (the smallest table it reads, through casts and reshapes).
func TestMeaningByUse(t *testing.T) {
	i64 := onnx.TensorProto_INT64
	g := &onnx.GraphProto{
		Input: []*onnx.ValueInfoProto{
			onnx.TensorValueInfo("ids", i64, "N", 8),
			onnx.TensorValueInfo("cats", i64, "N", 2),
			onnx.TensorValueInfo("key_padding_mask", onnx.TensorProto_BOOL, "N", 8),
			onnx.TensorValueInfo("input_mask", onnx.TensorProto_FLOAT, "N", 8),
			onnx.TensorValueInfo("segment_ids", i64, "N", 8),
			onnx.TensorValueInfo("steps", i64, "N"),
			onnx.TensorValueInfo("features", onnx.TensorProto_FLOAT, "N", 8),
		},
		Initializer: []*onnx.TensorProto{
			onnx.FloatTensor("E", []int64{500, 4}, make([]float32, 2000)),
			onnx.FloatTensor("C", []int64{3, 4}, make([]float32, 12)),
			onnx.Int64Tensor("shape", []int64{2}, []int64{-1, 8}),
		},
		Node: []*onnx.NodeProto{
			onnx.Node("Reshape", "flat", []string{"ids", "shape"}, []string{"ids2"}),
			onnx.Node("Identity", "shared", []string{"E"}, []string{"E2"}),
			onnx.Node("Gather", "embed", []string{"E2", "ids2"}, []string{"h"}),
			onnx.Node("Cast", "c", []string{"cats"}, []string{"cats32"}, onnx.AttrInt("to", int64(onnx.TensorProto_INT32))),
			onnx.Node("Gather", "cat_embed", []string{"C", "cats32"}, []string{"hc"}),
		},
	}
	ix, err := onnx.NewIndex(g)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		m    Meaning
		rows int64
	}{
		"ids": {MeaningTokens, 500}, "cats": {MeaningTokens, 3}, "key_padding_mask": {MeaningPaddingMask, 0},
		"input_mask": {MeaningAttentionMask, 0}, "segment_ids": {MeaningTokenTypes, 0}, "steps": {MeaningData, 0},
		"features": {MeaningData, 0},
	}
	for _, s := range Specs(g, ix) {
		if w := want[s.Name]; s.Meaning != w.m || s.Rows != w.rows {
			t.Errorf("%s: %s with %d rows, want %s with %d", s.Name, s.Meaning, s.Rows, w.m, w.rows)
		}
	}
}

// TestSynthesizeByMeaning: synthetic batches hold what a tokenizer gives.
func TestSynthesizeByMeaning(t *testing.T) {
	specs := []InputSpec{
		{Name: "input_ids", DType: tensor.Int64, Dims: []int64{3, 12}, Meaning: MeaningTokens, Rows: 300},
		{Name: "attention_mask", DType: tensor.Int64, Dims: []int64{3, 12}, Meaning: MeaningAttentionMask},
		{Name: "key_padding_mask", DType: tensor.Bool, Dims: []int64{3, 12}, Meaning: MeaningPaddingMask},
		{Name: "token_type_ids", DType: tensor.Int32, Dims: []int64{3, 12}, Meaning: MeaningTokenTypes, Rows: 2},
		{Name: "position_ids", DType: tensor.Int64, Dims: []int64{3, 12}, Meaning: MeaningPositions, Rows: 512},
		{Name: "cats", DType: tensor.Int64, Dims: []int64{3, 40}, Rows: 3},
		{Name: "float_mask", DType: tensor.Float32, Dims: []int64{1, 12}, Meaning: MeaningAttentionMask},
	}
	b, notes, err := Synthesize(specs, Options{Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	ints := func(x *tensor.Tensor) []int64 {
		size := x.DType.Size()
		out := make([]int64, len(x.Data)/size)
		for i := range out {
			switch size {
			case 8:
				out[i] = int64(binary.LittleEndian.Uint64(x.Data[8*i:]))
			case 4:
				out[i] = int64(int32(binary.LittleEndian.Uint32(x.Data[4*i:])))
			default:
				out[i] = int64(x.Data[i])
			}
		}
		return out
	}
	in := b[0].Inputs
	var above255, largest int64
	for _, v := range ints(in[0]) {
		if v < 0 || v >= 300 {
			t.Fatalf("token id %d outside [0,300)", v)
		}
		largest = max(largest, v)
		if v > 255 {
			above255++
		}
	}
	if above255 == 0 {
		t.Errorf("no token id above 255 among 36 drawn from [0,300) (largest %d): the high bytes are lost", largest)
	}
	padded := func(i int) bool { return i >= 24 && i%12 >= 9 } // last sample, final quarter
	for i, v := range ints(in[1]) {
		if want := map[bool]int64{false: 1, true: 0}[padded(i)]; v != want {
			t.Errorf("attention_mask[%d] = %d, want %d", i, v, want)
		}
	}
	for i, v := range ints(in[2]) {
		if want := map[bool]int64{false: 0, true: 1}[padded(i)]; v != want {
			t.Errorf("key_padding_mask[%d] = %d, want %d", i, v, want)
		}
	}
	for i, v := range ints(in[3]) {
		if v != 0 {
			t.Errorf("token_type_ids[%d] = %d, want 0", i, v)
		}
	}
	for i, v := range ints(in[4]) {
		if v != int64(i%12) {
			t.Errorf("position_ids[%d] = %d, want %d", i, v, i%12)
		}
	}
	seen := map[int64]bool{}
	for _, v := range ints(in[5]) {
		if v < 0 || v >= 3 {
			t.Fatalf("cats value %d outside its table's 3 rows", v)
		}
		seen[v] = true
	}
	if len(seen) != 3 {
		t.Errorf("cats takes the values %v of 120 draws, want all of 0, 1, 2", seen)
	}
	for i, v := range floats(t, in[6]) {
		if v != 1 {
			t.Errorf("float_mask[%d] = %g, want 1", i, v)
		}
	}
	wantNotes := map[string]string{
		"input_ids":      "synthetic int64 [3,12], token ids uniform in [0,300) (the rows of the embedding table that reads them)",
		"attention_mask": "synthetic int64 [3,12], attention mask: ones, as a tokenizer gives them, but the last of the 3 samples padded over the final quarter of its positions",
		"token_type_ids": "synthetic int32 [3,12], token type ids: zeros (one segment)",
		"position_ids":   "synthetic int64 [3,12], position ids 0..S-1 along the last axis",
		"cats":           "synthetic int64 [3,40], uniform integers in [0,3) (the rows of the table it indexes)",
		"float_mask":     "synthetic float32 [1,12], attention mask: ones, as a tokenizer gives them",
	}
	for _, n := range notes {
		if w, ok := wantNotes[n.Input]; ok && n.Text != w {
			t.Errorf("note for %s: %q, want %q", n.Input, n.Text, w)
		}
	}
}
