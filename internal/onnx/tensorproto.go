package onnx

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strconv"

	"fp16audit/internal/tensor"
)

// DataTypeName returns the ONNX name of an element type, such as "FLOAT16",
// or "data_type 99" for numbers the schema does not know.
func DataTypeName(dt int32) string {
	if s, ok := TensorProto_DataType_name[dt]; ok {
		return s
	}
	return fmt.Sprintf("data_type %d", dt)
}

// supportedDType maps the ONNX element types fp16audit decodes to tensor
// dtypes. Strings, complex numbers, the float8 family and the 4-bit types are
// absent: nothing in the audit computes on them.
var supportedDType = map[TensorProto_DataType]tensor.DType{
	TensorProto_FLOAT:    tensor.Float32,
	TensorProto_UINT8:    tensor.Uint8,
	TensorProto_INT8:     tensor.Int8,
	TensorProto_UINT16:   tensor.Uint16,
	TensorProto_INT16:    tensor.Int16,
	TensorProto_INT32:    tensor.Int32,
	TensorProto_INT64:    tensor.Int64,
	TensorProto_BOOL:     tensor.Bool,
	TensorProto_FLOAT16:  tensor.Float16,
	TensorProto_DOUBLE:   tensor.Float64,
	TensorProto_UINT32:   tensor.Uint32,
	TensorProto_UINT64:   tensor.Uint64,
	TensorProto_BFLOAT16: tensor.BFloat16,
}

// tensorLabel names a tensor in messages; initializers inside Constant
// attributes are often unnamed.
func tensorLabel(t *TensorProto) string {
	if t.GetName() == "" {
		return "tensor (unnamed)"
	}
	return fmt.Sprintf("tensor %q", t.GetName())
}

// elementCount multiplies dims, refusing negative dims and overflow so that a
// corrupt header cannot make the decoder allocate absurd amounts of memory.
func elementCount(t *TensorProto) (int64, error) {
	n := int64(1)
	for i, d := range t.GetDims() {
		if d < 0 {
			return 0, fmt.Errorf("%s: dim %d is %d, want a non-negative size", tensorLabel(t), i, d)
		}
		if d != 0 && n > math.MaxInt64/d {
			return 0, fmt.Errorf("%s: shape %v has more elements than fit in int64", tensorLabel(t), t.GetDims())
		}
		n *= d
	}
	return n, nil
}

// DecodeTensor returns the dense contents of t. The elements come from
// raw_data, from the typed field the ONNX IR assigns to t's data_type, or from
// an external data file resolved against baseDir with ResolveExternal. The
// element count must match dims exactly. Element types without a fixed-size
// numeric layout (string, complex, float8, 4-bit) are refused.
func DecodeTensor(t *TensorProto, baseDir string) (*tensor.Tensor, error) {
	if t == nil {
		return nil, fmt.Errorf("decode tensor: nil TensorProto")
	}
	dt := TensorProto_DataType(t.GetDataType())
	dtype, ok := supportedDType[dt]
	if !ok {
		return nil, fmt.Errorf("%s: element type %s is not supported (fp16audit decodes bool, integer and float tensors)", tensorLabel(t), DataTypeName(t.GetDataType()))
	}
	if t.GetSegment() != nil {
		return nil, fmt.Errorf("%s: segmented tensors are not supported; re-export the model without segments", tensorLabel(t))
	}
	n, err := elementCount(t)
	if err != nil {
		return nil, err
	}
	size := int64(dtype.Size())
	if n > math.MaxInt64/size {
		return nil, fmt.Errorf("%s: shape %v is too large", tensorLabel(t), t.GetDims())
	}
	want := n * size
	out := &tensor.Tensor{Name: t.GetName(), DType: dtype, Shape: append([]int64{}, t.GetDims()...)}

	if t.GetDataLocation() == TensorProto_EXTERNAL {
		if stored := TensorProto_DataType(StoredAs(t)); stored != dt {
			// a FloatView: the file holds the 16-bit elements
			sd, ok := supportedDType[stored]
			if !ok {
				return nil, fmt.Errorf("%s: stored as %s, which fp16audit does not decode", tensorLabel(t), DataTypeName(int32(stored)))
			}
			raw, err := readExternal(t, baseDir, n*int64(sd.Size()))
			if err != nil {
				return nil, err
			}
			vals, err := (&tensor.Tensor{Name: t.GetName(), DType: sd, Shape: out.Shape, Data: raw}).Float32s()
			if err != nil {
				return nil, err
			}
			return tensor.FromFloat32s(t.GetName(), out.Shape, vals), nil
		}
		out.Data, err = readExternal(t, baseDir, want)
		if err != nil {
			return nil, err
		}
		return out, nil
	}
	if len(t.GetRawData()) > 0 || (n == 0 && typedFieldLen(t) == 0) {
		if int64(len(t.GetRawData())) != want {
			return nil, fmt.Errorf("%s: raw_data holds %d bytes, want %d (%d elements of %s, shape %v)",
				tensorLabel(t), len(t.GetRawData()), want, n, DataTypeName(t.GetDataType()), t.GetDims())
		}
		out.Data = append([]byte(nil), t.GetRawData()...)
		return out, nil
	}
	out.Data, err = decodeTyped(t, dt, n, int(size))
	if err != nil {
		return nil, err
	}
	return out, nil
}

// typedFieldLen returns the number of values in all typed data fields.
func typedFieldLen(t *TensorProto) int {
	return len(t.GetFloatData()) + len(t.GetInt32Data()) + len(t.GetInt64Data()) +
		len(t.GetDoubleData()) + len(t.GetUint64Data()) + len(t.GetStringData())
}

// typedField names the field the ONNX IR stores each element type in.
func typedField(dt TensorProto_DataType) string {
	switch dt {
	case TensorProto_FLOAT:
		return "float_data"
	case TensorProto_INT64:
		return "int64_data"
	case TensorProto_DOUBLE:
		return "double_data"
	case TensorProto_UINT32, TensorProto_UINT64:
		return "uint64_data"
	}
	return "int32_data"
}

func decodeTyped(t *TensorProto, dt TensorProto_DataType, n int64, size int) ([]byte, error) {
	field := typedField(dt)
	var have int
	switch field {
	case "float_data":
		have = len(t.GetFloatData())
	case "int64_data":
		have = len(t.GetInt64Data())
	case "double_data":
		have = len(t.GetDoubleData())
	case "uint64_data":
		have = len(t.GetUint64Data())
	default:
		have = len(t.GetInt32Data())
	}
	if have == 0 && typedFieldLen(t) > 0 {
		return nil, fmt.Errorf("%s: %s data is stored in the wrong field; want raw_data or %s", tensorLabel(t), DataTypeName(int32(dt)), field)
	}
	if int64(have) != n {
		return nil, fmt.Errorf("%s: %s holds %d values, want %d (shape %v)", tensorLabel(t), field, have, n, t.GetDims())
	}
	buf := make([]byte, int(n)*size)
	le := binary.LittleEndian
	switch dt {
	case TensorProto_FLOAT:
		for i, v := range t.GetFloatData() {
			le.PutUint32(buf[4*i:], math.Float32bits(v))
		}
	case TensorProto_DOUBLE:
		for i, v := range t.GetDoubleData() {
			le.PutUint64(buf[8*i:], math.Float64bits(v))
		}
	case TensorProto_INT64:
		for i, v := range t.GetInt64Data() {
			le.PutUint64(buf[8*i:], uint64(v))
		}
	case TensorProto_UINT64:
		for i, v := range t.GetUint64Data() {
			le.PutUint64(buf[8*i:], v)
		}
	case TensorProto_UINT32:
		for i, v := range t.GetUint64Data() {
			if v > math.MaxUint32 {
				return nil, fmt.Errorf("%s: uint64_data[%d] = %d does not fit in UINT32", tensorLabel(t), i, v)
			}
			le.PutUint32(buf[4*i:], uint32(v))
		}
	case TensorProto_INT32:
		for i, v := range t.GetInt32Data() {
			le.PutUint32(buf[4*i:], uint32(v))
		}
	case TensorProto_BOOL:
		for i, v := range t.GetInt32Data() {
			if v != 0 {
				buf[i] = 1
			}
		}
	default:
		// INT8, UINT8, INT16, UINT16 values and FLOAT16/BFLOAT16 bit patterns,
		// each widened to one int32.
		lo, hi := intRange(dt)
		for i, v := range t.GetInt32Data() {
			if int64(v) < lo || int64(v) > hi {
				return nil, fmt.Errorf("%s: int32_data[%d] = %d is outside the %s range [%d, %d]", tensorLabel(t), i, v, DataTypeName(int32(dt)), lo, hi)
			}
			if size == 1 {
				buf[i] = byte(v)
			} else {
				le.PutUint16(buf[2*i:], uint16(v))
			}
		}
	}
	return buf, nil
}

// intRange returns the values int32_data may hold for the narrow types. Bit
// patterns of 16-bit floats are accepted sign-extended too, as some producers
// write them through a signed int16.
func intRange(dt TensorProto_DataType) (int64, int64) {
	switch dt {
	case TensorProto_INT8:
		return math.MinInt8, math.MaxInt8
	case TensorProto_UINT8:
		return 0, math.MaxUint8
	case TensorProto_INT16:
		return math.MinInt16, math.MaxInt16
	case TensorProto_UINT16:
		return 0, math.MaxUint16
	}
	return math.MinInt16, math.MaxUint16
}

// EncodeTensor returns a TensorProto holding t in raw_data. The proto shares
// t.Data rather than copying it; the shape is copied.
func EncodeTensor(t *tensor.Tensor) *TensorProto {
	return &TensorProto{
		Name:     t.Name,
		Dims:     append([]int64{}, t.Shape...),
		DataType: int32(t.DType),
		RawData:  t.Data,
	}
}

// External data as the ONNX IR describes it: key/value pairs on the tensor.
type externalRef struct {
	location  string
	offset    int64
	length    int64
	hasLength bool
}

func parseExternal(t *TensorProto) (externalRef, error) {
	var ref externalRef
	for _, kv := range t.GetExternalData() {
		switch kv.GetKey() {
		case "location":
			ref.location = kv.GetValue()
		case "offset", "length":
			v, err := strconv.ParseInt(kv.GetValue(), 10, 64)
			if err != nil || v < 0 {
				return ref, fmt.Errorf("%s: external data %s is %q, want a non-negative integer", tensorLabel(t), kv.GetKey(), kv.GetValue())
			}
			if kv.GetKey() == "offset" {
				ref.offset = v
			} else {
				ref.length, ref.hasLength = v, true
			}
		}
	}
	if ref.location == "" {
		return ref, fmt.Errorf("%s: data_location is EXTERNAL but external_data has no location key", tensorLabel(t))
	}
	return ref, nil
}

// checkExternal resolves t's external file and checks that the byte range
// lies inside it. want is the byte length the dims imply, or -1 when the
// element type has no fixed size. It returns the resolved path and range.
func checkExternal(t *TensorProto, baseDir string, want int64) (string, externalRef, error) {
	ref, err := parseExternal(t)
	if err != nil {
		return "", ref, err
	}
	path, err := ResolveExternal(baseDir, ref.location)
	if err != nil {
		return "", ref, fmt.Errorf("%s: %w", tensorLabel(t), err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", ref, fmt.Errorf("%s: %w", tensorLabel(t), err)
	}
	if !ref.hasLength {
		if want >= 0 {
			ref.length = want
		} else {
			ref.length = fi.Size() - ref.offset
		}
	}
	if want >= 0 && ref.length != want {
		return "", ref, fmt.Errorf("%s: external data length is %d bytes, want %d (%s, shape %v)",
			tensorLabel(t), ref.length, want, DataTypeName(t.GetDataType()), t.GetDims())
	}
	if ref.offset > fi.Size() || ref.length > fi.Size()-ref.offset {
		return "", ref, fmt.Errorf("%s: external data range [%d, %d) lies beyond the end of %q (%d bytes); the data file is truncated or belongs to another export",
			tensorLabel(t), ref.offset, ref.offset+ref.length, ref.location, fi.Size())
	}
	return path, ref, nil
}

func readExternal(t *TensorProto, baseDir string, want int64) ([]byte, error) {
	path, ref, err := checkExternal(t, baseDir, want)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", tensorLabel(t), err)
	}
	defer f.Close()
	buf := make([]byte, ref.length)
	if _, err := f.ReadAt(buf, ref.offset); err != nil {
		return nil, fmt.Errorf("%s: read external data %q: %w", tensorLabel(t), ref.location, err)
	}
	return buf, nil
}

// externalChunk is the piece of an external tensor ScanExternal reads at a
// time: large enough for the file system, small enough that scanning a
// multi-GB weight file holds almost nothing.
const externalChunk = 4 << 20

// ScanExternal passes the bytes of t, a tensor stored as external data,
// to fn in consecutive pieces of whole elements, read through one buffer
// of a few MiB: a scan over every weight of a model holds none of them, where
// DecodeTensor would hold each in turn (and the page cache, not the process,
// keeps what was read). The file and range are checked as DecodeTensor
// checks them.
func ScanExternal(t *TensorProto, baseDir string, fn func([]byte)) error {
	if StoredAs(t) != t.GetDataType() {
		return fmt.Errorf("%s: a float32 view of %s data; scan the model's own tensor", tensorLabel(t), DataTypeName(StoredAs(t)))
	}
	dtype, ok := supportedDType[TensorProto_DataType(t.GetDataType())]
	if !ok {
		return fmt.Errorf("%s: element type %s is not supported (fp16audit decodes bool, integer and float tensors)", tensorLabel(t), DataTypeName(t.GetDataType()))
	}
	n, err := elementCount(t)
	if err != nil {
		return err
	}
	size := int64(dtype.Size())
	if n > math.MaxInt64/size {
		return fmt.Errorf("%s: shape %v is too large", tensorLabel(t), t.GetDims())
	}
	path, ref, err := checkExternal(t, baseDir, n*size)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", tensorLabel(t), err)
	}
	defer f.Close()
	buf := make([]byte, min(ref.length, externalChunk/size*size))
	for off := int64(0); off < ref.length; {
		k := min(int64(len(buf)), ref.length-off)
		if _, err := f.ReadAt(buf[:k], ref.offset+off); err != nil {
			return fmt.Errorf("%s: read external data %q: %w", tensorLabel(t), ref.location, err)
		}
		fn(buf[:k])
		off += k
	}
	return nil
}
