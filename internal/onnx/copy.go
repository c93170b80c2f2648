package onnx

import "fp16audit/internal/tensor"

// Graph copies and declarations for the rewriting passes. A rewritten graph
// gets new node and value slices, and only the nodes and tensors it changes
// are copied: initializers it leaves alone are shared with the loaded
// model, which is never mutated.

// ShallowCopy copies the model and graph structs and their node and value
// lists, sharing everything else.
func ShallowCopy(m *ModelProto) *ModelProto {
	g := m.Graph
	ng := &GraphProto{
		Node:                   append([]*NodeProto(nil), g.Node...),
		Name:                   g.Name,
		Initializer:            append([]*TensorProto(nil), g.Initializer...),
		SparseInitializer:      g.SparseInitializer,
		DocString:              g.DocString,
		Input:                  append([]*ValueInfoProto(nil), g.Input...),
		Output:                 append([]*ValueInfoProto(nil), g.Output...),
		ValueInfo:              append([]*ValueInfoProto(nil), g.ValueInfo...),
		QuantizationAnnotation: g.QuantizationAnnotation,
		MetadataProps:          g.MetadataProps,
	}
	return &ModelProto{
		IrVersion:       m.IrVersion,
		OpsetImport:     m.OpsetImport,
		ProducerName:    m.ProducerName,
		ProducerVersion: m.ProducerVersion,
		Domain:          m.Domain,
		ModelVersion:    m.ModelVersion,
		DocString:       m.DocString,
		Graph:           ng,
		MetadataProps:   m.MetadataProps,
		Functions:       m.Functions,
	}
}

// CloneNode copies n's struct and its input, output and attribute lists.
func CloneNode(n *NodeProto) *NodeProto {
	return &NodeProto{
		Input:         append([]string(nil), n.Input...),
		Output:        append([]string(nil), n.Output...),
		Name:          n.Name,
		OpType:        n.OpType,
		Domain:        n.Domain,
		Overload:      n.Overload,
		Attribute:     append([]*AttributeProto(nil), n.Attribute...),
		DocString:     n.DocString,
		MetadataProps: n.MetadataProps,
	}
}

// WithElemType returns vi declared with element type elem, keeping its
// shape; vi itself is not changed.
func WithElemType(vi *ValueInfoProto, elem int32) *ValueInfoProto {
	tt := vi.GetType().GetTensorType()
	if tt == nil {
		return vi
	}
	return &ValueInfoProto{Name: vi.Name, DocString: vi.DocString, MetadataProps: vi.MetadataProps,
		Type: &TypeProto{Denotation: vi.Type.Denotation, Value: &TypeProto_TensorType{
			TensorType: &TypeProto_Tensor{ElemType: elem, Shape: tt.Shape}}}}
}

// TypedValue declares a tensor value of element type elem without a shape:
// a declared empty shape would mean rank 0 and contradict the value's real
// shape, which changes with the batch.
func TypedValue(name string, elem int32) *ValueInfoProto {
	return &ValueInfoProto{Name: name, Type: &TypeProto{Value: &TypeProto_TensorType{
		TensorType: &TypeProto_Tensor{ElemType: elem}}}}
}

// InternalName names a value fp16audit invents from the value base it
// derives from and a tag ("up", "raw", "fp16"...). The suffix "::fp16audit"
// keeps it from ever colliding with a name of the model.
func InternalName(base, tag string) string { return base + "::" + tag + "::fp16audit" }

// IsHalfType reports whether an element type is FLOAT16 or BFLOAT16.
func IsHalfType(t int32) bool {
	return t == int32(TensorProto_FLOAT16) || t == int32(TensorProto_BFLOAT16)
}

// IsFloatType reports whether an element type is FLOAT, DOUBLE, FLOAT16 or
// BFLOAT16: the types a mixed-precision audit observes.
func IsFloatType(t int32) bool {
	return t == int32(TensorProto_FLOAT) || t == int32(TensorProto_DOUBLE) || IsHalfType(t)
}

// TensorBytes is the size of t's values in memory, decoded: the product of
// its dimensions times the size of its element type.
func TensorBytes(t *TensorProto) int64 {
	n := int64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n * int64(tensor.DType(t.DataType).Size())
}
