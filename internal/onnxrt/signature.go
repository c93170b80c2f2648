package onnxrt

import (
	"google.golang.org/protobuf/encoding/protowire"

	"fp16audit/internal/tensor"
)

// valueType is a graph input's or output's declared element type and shape,
// as far as the model declares them.
type valueType struct {
	dtype tensor.DType // Undefined when not declared
	known bool         // whether the model declares a shape at all
	dims  []dim
}

// dim is one declared dimension: a fixed size, a symbolic name, or neither.
type dim struct {
	value int64 // >= 0 when fixed, -1 otherwise
	param string
}

// readSignature returns the declared types of the graph's inputs and outputs
// by name. It walks the protobuf wire format (field numbers of onnx.proto)
// and skips everything else, so the initializers of a large model are neither
// decoded nor copied.
func readSignature(model []byte) (inputs, outputs map[string]valueType, err error) {
	inputs = map[string]valueType{}
	outputs = map[string]valueType{}
	err = fields(model, func(num protowire.Number, v []byte, _ uint64) error {
		if num != 7 { // ModelProto.graph
			return nil
		}
		return fields(v, func(num protowire.Number, v []byte, _ uint64) error {
			if num != 11 && num != 12 { // GraphProto.input, GraphProto.output
				return nil
			}
			name, vt, err := readValueInfo(v)
			if num == 11 {
				inputs[name] = vt
			} else {
				outputs[name] = vt
			}
			return err
		})
	})
	return inputs, outputs, err
}

// readValueInfo decodes a ValueInfoProto holding a tensor type.
func readValueInfo(b []byte) (string, valueType, error) {
	var name string
	var vt valueType
	err := fields(b, func(num protowire.Number, v []byte, _ uint64) error {
		switch num {
		case 1: // ValueInfoProto.name
			name = string(v)
		case 2: // ValueInfoProto.type
			return fields(v, func(num protowire.Number, v []byte, _ uint64) error {
				if num != 1 { // TypeProto.tensor_type
					return nil
				}
				return fields(v, func(num protowire.Number, v []byte, x uint64) error {
					switch num {
					case 1: // TypeProto.Tensor.elem_type
						vt.dtype = tensor.DType(x)
					case 2: // TypeProto.Tensor.shape
						vt.known = true
						return fields(v, func(num protowire.Number, v []byte, _ uint64) error {
							if num != 1 { // TensorShapeProto.dim
								return nil
							}
							d := dim{value: -1}
							err := fields(v, func(num protowire.Number, v []byte, x uint64) error {
								switch num {
								case 1: // Dimension.dim_value
									d.value = int64(x)
								case 2: // Dimension.dim_param
									d.param = string(v)
								}
								return nil
							})
							vt.dims = append(vt.dims, d)
							return err
						})
					}
					return nil
				})
			})
		}
		return nil
	})
	return name, vt, err
}

// fields calls fn for each field of the protobuf message b, with the bytes of
// a length-delimited field or the value of a varint field.
func fields(b []byte, fn func(num protowire.Number, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.BytesType && typ != protowire.VarintType {
			continue
		}
		if err := fn(num, v, x); err != nil {
			return err
		}
	}
	return nil
}

// bindParams records the size each symbolic input dimension takes in this
// run, such as "batch" = 8.
func bindParams(declared []valueType, inputs []*tensor.Tensor) map[string]int64 {
	params := map[string]int64{}
	for i, vt := range declared {
		if len(vt.dims) != len(inputs[i].Shape) {
			continue
		}
		for k, d := range vt.dims {
			if d.param != "" {
				params[d.param] = inputs[i].Shape[k]
			}
		}
	}
	return params
}

// resolve returns the concrete shape of vt under params, or false when a
// dimension is neither fixed nor bound by an input.
func (vt valueType) resolve(params map[string]int64) ([]int64, bool) {
	if !vt.known {
		return nil, false
	}
	shape := make([]int64, len(vt.dims))
	for i, d := range vt.dims {
		switch v, ok := params[d.param]; {
		case d.value >= 0:
			shape[i] = d.value
		case d.param != "" && ok:
			shape[i] = v
		default:
			return nil, false
		}
	}
	return shape, true
}
