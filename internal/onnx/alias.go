package onnx

import (
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Field numbers of the ONNX IR (onnx.proto) that the aliasing decoder
// handles itself.
const (
	modelGraphField       = 7 // ModelProto.graph
	graphInitializerField = 5 // GraphProto.initializer
	tensorRawDataField    = 9 // TensorProto.raw_data
)

// aliasMin is the smallest raw_data the decoder aliases instead of copying:
// below it the bookkeeping costs more than the copy.
const aliasMin = 1 << 12

// unmarshalAliased decodes a serialized ModelProto into mp like
// proto.Unmarshal, except that the raw_data of the main graph's large
// initializers points into data instead of being copied. A model's weights
// are almost all of its bytes, so the decoded model then costs little more
// than the file; data must not change while the model is in use.
//
// The decoder walks ModelProto and GraphProto with protowire and hands
// every other field to proto.Unmarshal unchanged and in order, so unknown
// fields and every other message decode exactly as proto.Unmarshal decodes
// them. An initializer is decoded without its large raw_data, which is then
// set to the last raw_data field's bytes (the last value of a singular
// field wins, as in proto.Unmarshal).
func unmarshalAliased(data []byte, mp *ModelProto) error {
	var rest []byte
	var graphs [][]byte
	err := eachField(data, func(num protowire.Number, typ protowire.Type, field, value []byte) {
		if num == modelGraphField && typ == protowire.BytesType {
			graphs = append(graphs, value)
			return
		}
		rest = append(rest, field...)
	})
	if err != nil {
		return err
	}
	if err := proto.Unmarshal(rest, mp); err != nil {
		return err
	}
	for _, gb := range graphs {
		g, err := unmarshalGraph(gb)
		if err != nil {
			return err
		}
		// A message field that appears twice merges, as in proto.Unmarshal.
		if mp.Graph == nil {
			mp.Graph = g
		} else {
			proto.Merge(mp.Graph, g)
		}
	}
	return nil
}

// unmarshalGraph decodes a GraphProto whose initializers keep their large
// raw_data in place.
func unmarshalGraph(b []byte) (*GraphProto, error) {
	var rest []byte
	var inits [][]byte
	err := eachField(b, func(num protowire.Number, typ protowire.Type, field, value []byte) {
		if num == graphInitializerField && typ == protowire.BytesType {
			inits = append(inits, value)
			return
		}
		rest = append(rest, field...)
	})
	if err != nil {
		return nil, err
	}
	g := &GraphProto{}
	if err := proto.Unmarshal(rest, g); err != nil {
		return nil, err
	}
	for _, v := range inits {
		t, err := unmarshalTensor(v)
		if err != nil {
			return nil, err
		}
		g.Initializer = append(g.Initializer, t)
	}
	return g, nil
}

// unmarshalTensor decodes a TensorProto, aliasing a large raw_data.
func unmarshalTensor(b []byte) (*TensorProto, error) {
	var raw []byte
	found := false
	err := eachField(b, func(num protowire.Number, typ protowire.Type, field, value []byte) {
		if num == tensorRawDataField && typ == protowire.BytesType {
			raw, found = value, true
		}
	})
	t := &TensorProto{}
	if err != nil || !found || len(raw) < aliasMin {
		return t, proto.Unmarshal(b, t)
	}
	var rest []byte
	eachField(b, func(num protowire.Number, typ protowire.Type, field, value []byte) {
		if num != tensorRawDataField || typ != protowire.BytesType {
			rest = append(rest, field...)
		}
	})
	if err := proto.Unmarshal(rest, t); err != nil {
		return nil, err
	}
	// The capacity ends with the field, so an append can never write into
	// the bytes that follow it.
	t.RawData = raw[:len(raw):len(raw)]
	return t, nil
}

// eachField calls fn with every field of a serialized message: its number,
// wire type, bytes (tag included) and, for length-delimited fields, the
// value's bytes.
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, field, value []byte)) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return protowire.ParseError(m)
		}
		var value []byte
		if typ == protowire.BytesType {
			value, _ = protowire.ConsumeBytes(b[n:])
		}
		fn(num, typ, b[:n+m], value)
		b = b[n+m:]
	}
	return nil
}
