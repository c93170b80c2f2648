package onnx

import (
	"encoding/binary"
	"math"
	"strconv"
)

// Helpers for building graphs in code: the fixture generator, tests and the
// rewriting passes use them instead of spelling out protobuf literals.

// Node returns a node of the default domain.
func Node(opType, name string, inputs, outputs []string, attrs ...*AttributeProto) *NodeProto {
	return &NodeProto{OpType: opType, Name: name, Input: inputs, Output: outputs, Attribute: attrs}
}

// AttrInt returns an INT attribute.
func AttrInt(name string, v int64) *AttributeProto {
	return &AttributeProto{Name: name, Type: AttributeProto_INT, I: v}
}

// AttrFloat returns a FLOAT attribute.
func AttrFloat(name string, v float32) *AttributeProto {
	return &AttributeProto{Name: name, Type: AttributeProto_FLOAT, F: v}
}

// AttrInts returns an INTS attribute.
func AttrInts(name string, v ...int64) *AttributeProto {
	return &AttributeProto{Name: name, Type: AttributeProto_INTS, Ints: v}
}

// AttrString returns a STRING attribute.
func AttrString(name, v string) *AttributeProto {
	return &AttributeProto{Name: name, Type: AttributeProto_STRING, S: []byte(v)}
}

// AttrTensor returns a TENSOR attribute.
func AttrTensor(name string, t *TensorProto) *AttributeProto {
	return &AttributeProto{Name: name, Type: AttributeProto_TENSOR, T: t}
}

// AttrGraph returns a GRAPH attribute.
func AttrGraph(name string, g *GraphProto) *AttributeProto {
	return &AttributeProto{Name: name, Type: AttributeProto_GRAPH, G: g}
}

// FloatTensor returns a FLOAT initializer holding values in raw_data.
func FloatTensor(name string, dims []int64, values []float32) *TensorProto {
	raw := make([]byte, 4*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	return &TensorProto{Name: name, Dims: dims, DataType: int32(TensorProto_FLOAT), RawData: raw}
}

// Int64Tensor returns an INT64 initializer holding values in raw_data.
func Int64Tensor(name string, dims []int64, values []int64) *TensorProto {
	raw := make([]byte, 8*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint64(raw[8*i:], uint64(v))
	}
	return &TensorProto{Name: name, Dims: dims, DataType: int32(TensorProto_INT64), RawData: raw}
}

// TensorValueInfo describes a tensor value. Each dim is an int (fixed size),
// an int64, or a string (a symbolic dimension such as "batch").
func TensorValueInfo(name string, elemType TensorProto_DataType, dims ...any) *ValueInfoProto {
	shape := &TensorShapeProto{}
	for _, d := range dims {
		dim := &TensorShapeProto_Dimension{}
		switch v := d.(type) {
		case int:
			dim.Value = &TensorShapeProto_Dimension_DimValue{DimValue: int64(v)}
		case int64:
			dim.Value = &TensorShapeProto_Dimension_DimValue{DimValue: v}
		case string:
			dim.Value = &TensorShapeProto_Dimension_DimParam{DimParam: v}
		default:
			panic("onnx.TensorValueInfo: dim must be int, int64 or string")
		}
		shape.Dim = append(shape.Dim, dim)
	}
	return &ValueInfoProto{Name: name, Type: &TypeProto{Value: &TypeProto_TensorType{
		TensorType: &TypeProto_Tensor{ElemType: int32(elemType), Shape: shape}}}}
}

// NewModel wraps a graph in a model with IR version 8 and the given default
// domain opset, as the PyTorch exporters write.
func NewModel(g *GraphProto, opset int64) *ModelProto {
	return &ModelProto{
		IrVersion:    8,
		ProducerName: "fp16audit",
		OpsetImport:  []*OperatorSetIdProto{{Domain: "", Version: opset}},
		Graph:        g,
	}
}

// ExternalTensor returns a tensor whose elements live in the file location,
// relative to the model's folder, at offset. A negative length leaves the
// length key out (the data then runs to what dims imply).
func ExternalTensor(name string, dataType TensorProto_DataType, dims []int64, location string, offset, length int64) *TensorProto {
	ext := []*StringStringEntryProto{{Key: "location", Value: location}}
	if offset != 0 {
		ext = append(ext, &StringStringEntryProto{Key: "offset", Value: strconv.FormatInt(offset, 10)})
	}
	if length >= 0 {
		ext = append(ext, &StringStringEntryProto{Key: "length", Value: strconv.FormatInt(length, 10)})
	}
	return &TensorProto{Name: name, Dims: dims, DataType: int32(dataType),
		DataLocation: TensorProto_EXTERNAL, ExternalData: ext}
}
