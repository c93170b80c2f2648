package batch

import (
	"fmt"
	"regexp"

	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/tensor"
)

// Meaning is what a graph input holds, as far as its name and its use in
// the graph tell. Synthetic batches fill an input with what a tokenizer or
// a data loader would give it: an additive attention mask built from
// uniform integers would turn (1 − mask) · −10000 into +90 000, and token
// ids beyond the embedding table are not a model's input at all.
type Meaning int

// Meanings of graph inputs.
const (
	// MeaningData is any other input: N(0,1) floats, integers within
	// the rows of the tables they index (Rows) or in [0, 10).
	MeaningData Meaning = iota
	// MeaningTokens are ids read by an embedding table: uniform over its
	// Rows.
	MeaningTokens
	// MeaningAttentionMask marks the positions to attend to with 1
	// (attention_mask, input_mask): ones, as a tokenizer gives for
	// sequences without padding.
	MeaningAttentionMask
	// MeaningPaddingMask marks padded positions with 1/true
	// (key_padding_mask): zeros, nothing padded.
	MeaningPaddingMask
	// MeaningTokenTypes are segment ids (token_type_ids): zeros, one
	// segment.
	MeaningTokenTypes
	// MeaningPositions are position ids: 0, 1, …, S−1 along the last axis.
	MeaningPositions
)

// String names the meaning as the notes and tests write it.
func (m Meaning) String() string {
	switch m {
	case MeaningTokens:
		return "token ids"
	case MeaningAttentionMask:
		return "attention mask"
	case MeaningPaddingMask:
		return "padding mask"
	case MeaningTokenTypes:
		return "token type ids"
	case MeaningPositions:
		return "position ids"
	}
	return "data"
}

// Input names people and exporters give these inputs (Hugging Face, BERT
// in TensorFlow, fairseq, torch.nn.MultiheadAttention).
var (
	paddingMaskName = regexp.MustCompile(`(?i)pad(ding)?_?mask`)
	maskName        = regexp.MustCompile(`(?i)(^|_)mask($|_)|attention_?mask|input_?mask`)
	typeName        = regexp.MustCompile(`(?i)token_?type|segment|type_?ids`)
	positionName    = regexp.MustCompile(`(?i)position|(^|_)pos(_|$)`)
)

// meaningOf decides what the graph input called name holds: by name for
// masks, token types and positions, by use for ids an embedding reads.
// rows is the number of rows of the smallest table an index input reads
// (0 when it reads none): the bound of its synthetic values.
func meaningOf(name string, integer bool, ix *onnx.Index) (m Meaning, rows int64) {
	rows = tableRows(name, ix)
	switch {
	case paddingMaskName.MatchString(name):
		return MeaningPaddingMask, rows
	case maskName.MatchString(name):
		return MeaningAttentionMask, rows
	case !integer:
		return MeaningData, rows
	case typeName.MatchString(name):
		return MeaningTokenTypes, rows
	case positionName.MatchString(name):
		return MeaningPositions, rows
	case rows > 0 && embeds(name, ix):
		return MeaningTokens, rows
	}
	return MeaningData, rows
}

// gathers returns the Gather nodes that read name as their indices,
// directly or through ops that pass an index value on unchanged
// (ops.PassThrough: casts and reshapes), with the table each reads.
func gathers(name string, ix *onnx.Index) map[int]*onnx.TensorProto {
	out := map[int]*onnx.TensorProto{}
	seen := map[string]bool{}
	var walk func(v string)
	walk = func(v string) {
		if seen[v] {
			return
		}
		seen[v] = true
		for _, ni := range ix.Consumers(v) {
			n := ix.Graph().GetNode()[ni]
			if !onnx.IsDefaultDomain(n.GetDomain()) {
				continue
			}
			switch {
			case n.GetOpType() == "Gather" && len(n.GetInput()) > 1 && n.GetInput()[1] == v:
				out[ni] = table(n.GetInput()[0], ix)
			case ops.Lookup(ops.Default, n.GetOpType()).Is(ops.PassThrough) && len(n.GetInput()) > 0 && n.GetInput()[0] == v:
				for _, o := range n.GetOutput() {
					walk(o)
				}
			}
		}
	}
	walk(name)
	return out
}

// table returns the tensor a Gather's data input is: an initializer or a
// Constant (a buffer the exporter folded), directly or through the
// exporter's Identity of a shared weight; nil for a computed value.
func table(name string, ix *onnx.Index) *onnx.TensorProto {
	for range 8 {
		if t := ix.Initializer(name); t != nil {
			return t
		}
		p := ix.Producer(name)
		if p < 0 {
			return nil
		}
		n := ix.Graph().GetNode()[p]
		switch {
		case !onnx.IsDefaultDomain(n.GetDomain()):
			return nil
		case n.GetOpType() == "Constant":
			return onnx.FindAttr(n, "value").GetT()
		case n.GetOpType() != "Identity" || len(n.GetInput()) != 1:
			return nil
		}
		name = n.GetInput()[0]
	}
	return nil
}

// tableRows is the smallest size, along the gathered axis, of the tables
// name indexes (0 when it indexes none): a valid index is below it.
func tableRows(name string, ix *onnx.Index) int64 {
	var rows int64
	for ni, t := range gathers(name, ix) {
		if t == nil {
			continue
		}
		axis := onnx.FindAttr(ix.Graph().GetNode()[ni], "axis").GetI()
		dims := t.GetDims()
		if axis < 0 {
			axis += int64(len(dims))
		}
		if axis < 0 || axis >= int64(len(dims)) {
			continue
		}
		if d := dims[axis]; d > 0 && (rows == 0 || d < rows) {
			rows = d
		}
	}
	return rows
}

// embeds reports whether name is read by an embedding: a Gather along axis
// 0 of a float table of rank 2.
func embeds(name string, ix *onnx.Index) bool {
	for ni, t := range gathers(name, ix) {
		if t != nil && len(t.GetDims()) == 2 && onnx.IsFloatType(t.GetDataType()) &&
			onnx.FindAttr(ix.Graph().GetNode()[ni], "axis").GetI() == 0 {
			return true
		}
	}
	return false
}

// synthDescription says how a synthetic input of spec s and shape is
// filled.
func synthDescription(s InputSpec, shape []int64) string {
	padded := ""
	if len(shape) >= 2 && shape[0] > 1 {
		padded = fmt.Sprintf(", but the last of the %d samples padded over the final quarter of its positions", shape[0])
	}
	switch s.Meaning {
	case MeaningTokens:
		return fmt.Sprintf("token ids uniform in [0,%d) (the rows of the embedding table that reads them)", s.Rows)
	case MeaningAttentionMask:
		return "attention mask: ones, as a tokenizer gives them" + padded
	case MeaningPaddingMask:
		return "padding mask: nothing padded" + padded
	case MeaningTokenTypes:
		return "token type ids: zeros (one segment)"
	case MeaningPositions:
		return "position ids 0..S-1 along the last axis"
	}
	switch {
	case s.DType.IsFloat():
		return "N(0,1)"
	case s.DType == tensor.Bool:
		return "random true/false"
	case s.Rows > 0 && s.Rows < 10:
		return fmt.Sprintf("uniform integers in [0,%d) (the rows of the table it indexes)", s.Rows)
	}
	return "uniform integers in [0,10)"
}
