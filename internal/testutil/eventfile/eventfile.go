// Package eventfile writes TensorBoard event files, as PyTorch's
// SummaryWriter and TensorFlow's summary writers do, for the tests of the
// readers (internal/tfevents, the training-log readers). Only tests import
// it. It encodes by hand with protowire from the field numbers of
// TensorBoard's .proto files (tensorboard/compat/proto), the same facts
// package tfevents decodes with; tfevents' tests check its output against
// records assembled byte by byte.
package eventfile

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"fp16audit/internal/tfevents"
)

// Field numbers from TensorBoard's .proto files (tensorboard/compat/proto).
const (
	// Event (event.proto).
	fEventWallTime    = 1 // double
	fEventStep        = 2 // int64
	fEventFileVersion = 3 // string, oneof what
	fEventSummary     = 5 // Summary, oneof what

	// Summary (summary.proto).
	fSummaryValue = 1 // repeated Value

	// Summary.Value.
	fValueTag         = 1 // string
	fValueSimpleValue = 2 // float, oneof value
	fValueTensor      = 8 // TensorProto, oneof value
	fValueMetadata    = 9 // SummaryMetadata

	// SummaryMetadata.
	fMetaPluginData = 1 // PluginData
	fMetaDataClass  = 4 // DataClass enum
	// SummaryMetadata.PluginData.
	fPluginName = 1 // string

	// TensorProto (tensor.proto).
	fTensorDType   = 1  // DataType enum
	fTensorShape   = 2  // TensorShapeProto
	fTensorContent = 4  // bytes
	fTensorFloat   = 5  // repeated float, packed
	fTensorDouble  = 6  // repeated double, packed
	fTensorHalf    = 13 // repeated int32, packed: fp16/bf16 bits

	// TensorShapeProto (tensor_shape.proto).
	fShapeDim         = 2 // repeated Dim
	fShapeUnknownRank = 3 // bool
	// TensorShapeProto.Dim.
	fDimSize = 1 // int64
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// maskedCRC is the TFRecord checksum of b: CRC-32C rotated right by 15 bits
// plus 0xa282ead8.
func maskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return ((c >> 15) | (c << 17)) + 0xa282ead8
}

// appendRecord appends data framed as one TFRecord to b: its length, the
// length's checksum, the data and the data's checksum.
func appendRecord(b, data []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(len(data)))
	b = binary.LittleEndian.AppendUint32(b, maskedCRC(b[len(b)-8:]))
	b = append(b, data...)
	return binary.LittleEndian.AppendUint32(b, maskedCRC(data))
}

// ScalarEncoding chooses how Writer.AddScalar stores a number: the three
// forms found in the wild.
type ScalarEncoding int

const (
	// SimpleValue is Summary.Value.simple_value: PyTorch's
	// SummaryWriter.add_scalar by default, TensorFlow 1, tensorboardX.
	SimpleValue ScalarEncoding = iota
	// TensorFloatVal is a DT_FLOAT TensorProto holding float_val, with
	// plugin "scalars" metadata and no shape: add_scalar(new_style=True).
	TensorFloatVal
	// TensorContent is a rank-0 DT_FLOAT TensorProto holding
	// tensor_content, with plugin "scalars" metadata and data_class
	// DATA_CLASS_SCALAR: TensorFlow 2's tf.summary.scalar.
	TensorContent
)

// MarshalEvent serializes e as an Event protobuf. Values with a Tensor are
// written with the tensor's fields; values with HasSimple as simple_value;
// Other values cannot be written.
func MarshalEvent(e tfevents.Event) ([]byte, error) {
	var b []byte
	if e.WallTime != 0 {
		b = protowire.AppendTag(b, fEventWallTime, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(e.WallTime))
	}
	if e.Step != 0 {
		b = protowire.AppendTag(b, fEventStep, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(e.Step))
	}
	if e.FileVersion != "" {
		b = protowire.AppendTag(b, fEventFileVersion, protowire.BytesType)
		b = protowire.AppendString(b, e.FileVersion)
	}
	if e.Values != nil {
		var sum []byte
		for _, v := range e.Values {
			vb, err := marshalValue(v)
			if err != nil {
				return nil, err
			}
			sum = protowire.AppendTag(sum, fSummaryValue, protowire.BytesType)
			sum = protowire.AppendBytes(sum, vb)
		}
		b = protowire.AppendTag(b, fEventSummary, protowire.BytesType)
		b = protowire.AppendBytes(b, sum)
	}
	return b, nil
}

func marshalValue(v tfevents.Value) ([]byte, error) {
	var b []byte
	if v.Tag != "" {
		b = protowire.AppendTag(b, fValueTag, protowire.BytesType)
		b = protowire.AppendString(b, v.Tag)
	}
	switch {
	case v.Other:
		return nil, fmt.Errorf("tag %q: cannot write an image, histogram or audio value", v.Tag)
	case v.Tensor != nil:
		b = protowire.AppendTag(b, fValueTensor, protowire.BytesType)
		b = protowire.AppendBytes(b, marshalTensor(v.Tensor))
	case v.HasSimple:
		b = protowire.AppendTag(b, fValueSimpleValue, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, math.Float32bits(v.Simple))
	}
	if v.Plugin != "" || v.DataClass != 0 {
		var meta []byte
		if v.Plugin != "" {
			var pd []byte
			pd = protowire.AppendTag(pd, fPluginName, protowire.BytesType)
			pd = protowire.AppendString(pd, v.Plugin)
			meta = protowire.AppendTag(meta, fMetaPluginData, protowire.BytesType)
			meta = protowire.AppendBytes(meta, pd)
		}
		if v.DataClass != 0 {
			meta = protowire.AppendTag(meta, fMetaDataClass, protowire.VarintType)
			meta = protowire.AppendVarint(meta, uint64(v.DataClass))
		}
		b = protowire.AppendTag(b, fValueMetadata, protowire.BytesType)
		b = protowire.AppendBytes(b, meta)
	}
	return b, nil
}

func marshalTensor(t *tfevents.Tensor) []byte {
	var b []byte
	if t.DType != 0 {
		b = protowire.AppendTag(b, fTensorDType, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(t.DType))
	}
	if t.Shape != nil || t.UnknownRank {
		var sh []byte
		for _, d := range t.Shape {
			var dim []byte
			if d != 0 {
				dim = protowire.AppendTag(dim, fDimSize, protowire.VarintType)
				dim = protowire.AppendVarint(dim, uint64(d))
			}
			sh = protowire.AppendTag(sh, fShapeDim, protowire.BytesType)
			sh = protowire.AppendBytes(sh, dim)
		}
		if t.UnknownRank {
			sh = protowire.AppendTag(sh, fShapeUnknownRank, protowire.VarintType)
			sh = protowire.AppendVarint(sh, 1)
		}
		b = protowire.AppendTag(b, fTensorShape, protowire.BytesType)
		b = protowire.AppendBytes(b, sh)
	}
	if len(t.Content) > 0 {
		b = protowire.AppendTag(b, fTensorContent, protowire.BytesType)
		b = protowire.AppendBytes(b, t.Content)
	}
	if len(t.FloatVal) > 0 {
		var run []byte
		for _, f := range t.FloatVal {
			run = protowire.AppendFixed32(run, math.Float32bits(f))
		}
		b = protowire.AppendTag(b, fTensorFloat, protowire.BytesType)
		b = protowire.AppendBytes(b, run)
	}
	if len(t.DoubleVal) > 0 {
		var run []byte
		for _, f := range t.DoubleVal {
			run = protowire.AppendFixed64(run, math.Float64bits(f))
		}
		b = protowire.AppendTag(b, fTensorDouble, protowire.BytesType)
		b = protowire.AppendBytes(b, run)
	}
	if len(t.HalfVal) > 0 {
		var run []byte
		for _, h := range t.HalfVal {
			run = protowire.AppendVarint(run, uint64(h))
		}
		b = protowire.AppendTag(b, fTensorHalf, protowire.BytesType)
		b = protowire.AppendBytes(b, run)
	}
	return b
}

// ScalarValue builds the Summary.Value that stores value under tag in the
// given encoding.
func ScalarValue(tag string, value float32, enc ScalarEncoding) (tfevents.Value, error) {
	switch enc {
	case SimpleValue:
		return tfevents.Value{Tag: tag, HasSimple: true, Simple: value}, nil
	case TensorFloatVal:
		return tfevents.Value{Tag: tag, Plugin: "scalars", Tensor: &tfevents.Tensor{DType: tfevents.DTFloat, FloatVal: []float32{value}}}, nil
	case TensorContent:
		content := binary.LittleEndian.AppendUint32(nil, math.Float32bits(value))
		return tfevents.Value{Tag: tag, Plugin: "scalars", DataClass: tfevents.DataClassScalar,
			Tensor: &tfevents.Tensor{DType: tfevents.DTFloat, Shape: []int64{}, Content: content}}, nil
	}
	return tfevents.Value{}, fmt.Errorf("unknown scalar encoding %d", enc)
}

// Writer writes an event file: TFRecord-framed Events, starting with the
// file_version event every TensorBoard reader expects.
type Writer struct {
	w    io.Writer
	path string
	buf  []byte
}

// NewWriter writes the file_version event (at wallTime) to w and returns a
// Writer for the events that follow.
func NewWriter(w io.Writer, wallTime float64) (*Writer, error) {
	ew := &Writer{w: w}
	if err := ew.WriteEvent(tfevents.Event{WallTime: wallTime, FileVersion: tfevents.FileVersion}); err != nil {
		return nil, err
	}
	return ew, nil
}

// FileName is the name TensorBoard writers give an event file created at t
// on host: events.out.tfevents.<unix seconds>.<host>.
func FileName(t time.Time, host string) string {
	return fmt.Sprintf("events.out.tfevents.%d.%s", t.Unix(), host)
}

// Create creates dir/FileName(t, host), writes its file_version event and
// returns a Writer to Close when done.
func Create(dir string, t time.Time, host string) (*Writer, error) {
	path := filepath.Join(dir, FileName(t, host))
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w, err := NewWriter(f, float64(t.UnixNano())/1e9)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	w.path = path
	return w, nil
}

// Path is the file Create made, "" for a Writer from NewWriter.
func (w *Writer) Path() string { return w.path }

// Close closes the underlying writer when it is an io.Closer.
func (w *Writer) Close() error {
	if c, ok := w.w.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// WriteRecord writes data as one TFRecord.
func (w *Writer) WriteRecord(data []byte) error {
	w.buf = appendRecord(w.buf[:0], data)
	_, err := w.w.Write(w.buf)
	return err
}

// WriteEvent serializes e and writes it as one record.
func (w *Writer) WriteEvent(e tfevents.Event) error {
	data, err := MarshalEvent(e)
	if err != nil {
		return err
	}
	return w.WriteRecord(data)
}

// AddScalar writes one event holding one scalar, as SummaryWriter.add_scalar
// does.
func (w *Writer) AddScalar(tag string, step int64, wallTime float64, value float32, enc ScalarEncoding) error {
	v, err := ScalarValue(tag, value, enc)
	if err != nil {
		return err
	}
	return w.WriteEvent(tfevents.Event{WallTime: wallTime, Step: step, Values: []tfevents.Value{v}})
}
