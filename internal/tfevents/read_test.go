package tfevents_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"fp16audit/internal/testutil/eventfile"
	"fp16audit/internal/tfevents"
)

// docMask is the masking rule as the TFRecord documentation writes it,
// over CRC-32C (TestCRC32CCheckValue checks the standard library's CRC-32C
// against its definition bit by bit).
func docMask(data []byte) uint32 {
	crc := crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli))
	return ((crc >> 15) | (crc << 17)) + 0xa282ead8
}

// docRecord frames data the way the TFRecord documentation lays a record
// out.
func docRecord(data []byte) []byte {
	var b []byte
	b = binary.LittleEndian.AppendUint64(b, uint64(len(data)))
	b = binary.LittleEndian.AppendUint32(b, docMask(b[:8]))
	b = append(b, data...)
	return binary.LittleEndian.AppendUint32(b, docMask(data))
}

// simpleEvent is tfevents.Event{wall_time: 1.5, step: 7, summary {value {tag:
// "loss", simple_value: 0.25}}} assembled byte by byte from event.proto
// and summary.proto and the protobuf wire format: a tag byte is
// field_number<<3 | wire_type (0 varint, 1 fixed64, 2 length-delimited,
// 5 fixed32).
var simpleEvent = []byte{
	0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F, // field 1 wall_time, fixed64: 1.5 = 0x3FF8000000000000
	0x10, 0x07, // field 2 step, varint 7
	0x2A, 0x0D, // field 5 summary, 13 bytes
	0x0A, 0x0B, // Summary field 1 value, 11 bytes
	0x0A, 0x04, 'l', 'o', 's', 's', // tfevents.Value field 1 tag
	0x15, 0, 0, 0x80, 0x3E, // tfevents.Value field 2 simple_value, fixed32: 0.25 = 0x3E800000
}

// pytorchTensorEvent is what SummaryWriter.add_scalar(new_style=True) puts
// in a value: tfevents.Event{step: 3, summary {value {tag: "amp/scale", tensor
// {dtype: DT_FLOAT, float_val: [65536]}, metadata {plugin_data
// {plugin_name: "scalars"}}}}}, by hand from tensor.proto.
var pytorchTensorEvent = []byte{
	0x10, 0x03, // step 3
	0x2A, 0x24, // summary, 36 bytes
	0x0A, 0x22, // value, 34 bytes
	0x0A, 0x09, 'a', 'm', 'p', '/', 's', 'c', 'a', 'l', 'e', // tag (11 bytes)
	0x42, 0x08, // field 8 tensor, 8 bytes
	0x08, 0x01, // TensorProto field 1 dtype: DT_FLOAT
	0x2A, 0x04, 0, 0, 0x80, 0x47, // field 5 float_val packed: 65536 = 0x47800000
	0x4A, 0x0B, // field 9 metadata, 11 bytes
	0x0A, 0x09, // SummaryMetadata field 1 plugin_data, 9 bytes
	0x0A, 0x07, 's', 'c', 'a', 'l', 'a', 'r', 's', // PluginData field 1 plugin_name
}

// tf2TensorEvent is TensorFlow 2's tf.summary.scalar form: a rank-0 tensor
// (empty shape message) with tensor_content, plus data_class
// DATA_CLASS_SCALAR: tfevents.Event{step: 4, summary {value {tag: "loss", tensor
// {dtype: DT_FLOAT, tensor_shape {}, tensor_content: le32(-2.5)},
// metadata {plugin_data {plugin_name: "scalars"}, data_class: 1}}}}.
var tf2TensorEvent = []byte{
	0x10, 0x04, // step 4
	0x2A, 0x23, // summary, 35 bytes
	0x0A, 0x21, // value, 33 bytes
	0x0A, 0x04, 'l', 'o', 's', 's', // tag (6 bytes)
	0x42, 0x0A, // tensor, 10 bytes
	0x08, 0x01, // dtype DT_FLOAT
	0x12, 0x00, // tensor_shape {} (rank 0)
	0x22, 0x04, 0, 0, 0x20, 0xC0, // field 4 tensor_content: -2.5 = 0xC0200000
	0x4A, 0x0D, // metadata, 13 bytes
	0x0A, 0x09, 0x0A, 0x07, 's', 'c', 'a', 'l', 'a', 'r', 's', // plugin_data
	0x20, 0x01, // field 4 data_class: DATA_CLASS_SCALAR
}

// fileVersionEvent is tfevents.Event{wall_time: 1.5, file_version: "brain.Event:2"}.
var fileVersionEvent = append([]byte{0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F, 0x1A, 0x0D}, "brain.Event:2"...)

func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestHandAssembledRecordsMatchTheWriter(t *testing.T) {
	var doc []byte
	for _, ev := range [][]byte{fileVersionEvent, simpleEvent} {
		doc = append(doc, docRecord(ev)...)
	}
	var buf bytes.Buffer
	w, err := eventfile.NewWriter(&buf, 1.5)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddScalar("loss", 7, 1.5, 0.25, eventfile.SimpleValue); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), doc) {
		t.Fatalf("writer bytes differ from the documented layout:\n got %x\nwant %x", buf.Bytes(), doc)
	}
	// The record framing of the documentation: 26 data bytes, length first.
	if n := binary.LittleEndian.Uint64(doc[len(docRecord(fileVersionEvent)):]); n != 26 {
		t.Fatalf("length field %d, want 26", n)
	}
}

func TestHandAssembledScalarsDecode(t *testing.T) {
	var file []byte
	for _, ev := range [][]byte{fileVersionEvent, simpleEvent, pytorchTensorEvent, tf2TensorEvent} {
		file = append(file, docRecord(ev)...)
	}
	got, err := tfevents.ReadScalars(writeFile(t, "events.out.tfevents.1.host", file))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]tfevents.Point{
		"loss":      {{Step: 7, WallTime: 1.5, Value: 0.25}, {Step: 4, Value: -2.5}},
		"amp/scale": {{Step: 3, Value: 65536}},
	}
	if !equalScalars(got, want) {
		t.Fatalf("ReadScalars = %v, want %v", got, want)
	}
	// The same events written by the Writer decode to the same values.
	for _, tc := range []struct {
		hand []byte
		enc  eventfile.ScalarEncoding
		tag  string
		val  float32
		step int64
	}{
		{pytorchTensorEvent, eventfile.TensorFloatVal, "amp/scale", 65536, 3},
		{tf2TensorEvent, eventfile.TensorContent, "loss", -2.5, 4},
	} {
		v, err := eventfile.ScalarValue(tc.tag, tc.val, tc.enc)
		if err != nil {
			t.Fatal(err)
		}
		b, err := eventfile.MarshalEvent(tfevents.Event{Step: tc.step, Values: []tfevents.Value{v}})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, tc.hand) {
			t.Errorf("encoding %d:\n got %x\nwant %x", tc.enc, b, tc.hand)
		}
	}
}

func equalScalars(a, b map[string][]tfevents.Point) bool {
	if len(a) != len(b) {
		return false
	}
	for tag, pa := range a {
		pb, ok := b[tag]
		if !ok || len(pa) != len(pb) {
			return false
		}
		for i := range pa {
			x, y := pa[i], pb[i]
			same := x.Value == y.Value || (math.IsNaN(x.Value) && math.IsNaN(y.Value))
			if x.Step != y.Step || x.WallTime != y.WallTime || !same {
				return false
			}
		}
	}
	return true
}

// writeRun writes a run with losses and scales in all three encodings,
// including NaN and Inf, and returns its path and what tfevents.ReadScalars must
// return.
func writeRun(t *testing.T) (string, map[string][]tfevents.Point) {
	t.Helper()
	dir := t.TempDir()
	start := time.Unix(1700000000, 0)
	w, err := eventfile.Create(dir, start, "host")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]tfevents.Point{}
	losses := []float32{2.5, 2.25, float32(math.NaN()), float32(math.Inf(1))}
	scales := []float32{65536, 32768, 16384, 8192}
	for i := range losses {
		wall := 1700000000 + float64(i)/4
		for _, s := range []struct {
			tag string
			v   float32
			enc eventfile.ScalarEncoding
		}{
			{"train/loss", losses[i], eventfile.SimpleValue},
			{"amp/scale", scales[i], eventfile.TensorFloatVal},
			{"amp/scale_tf2", scales[i], eventfile.TensorContent},
		} {
			if err := w.AddScalar(s.tag, int64(i), wall, s.v, s.enc); err != nil {
				t.Fatal(err)
			}
			want[s.tag] = append(want[s.tag], tfevents.Point{Step: int64(i), WallTime: wall, Value: float64(s.v)})
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return w.Path(), want
}

func TestRoundTrip(t *testing.T) {
	path, want := writeRun(t)
	if base := filepath.Base(path); base != "events.out.tfevents.1700000000.host" {
		t.Errorf("file name %q", base)
	}
	got, err := tfevents.ReadScalars(path)
	if err != nil {
		t.Fatal(err)
	}
	if !equalScalars(got, want) {
		t.Fatalf("ReadScalars = %v\nwant %v", got, want)
	}
	var first tfevents.Event
	n := 0
	if err := tfevents.ReadEvents(path, func(e tfevents.Event) error {
		if n == 0 {
			first = e
		}
		n++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if first.FileVersion != tfevents.FileVersion || first.Values != nil || n != 13 {
		t.Fatalf("first event %+v of %d, want the file_version event of 13", first, n)
	}
}

// recordOffsets returns the byte offset of every record of a file.
func recordOffsets(t *testing.T, data []byte) []int64 {
	t.Helper()
	var offs []int64
	for off := int64(0); off < int64(len(data)); {
		offs = append(offs, off)
		off += 12 + int64(binary.LittleEndian.Uint64(data[off:])) + 4
	}
	return offs
}

func TestCorruptionNamesFileAndOffset(t *testing.T) {
	path, _ := writeRun(t)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	offs := recordOffsets(t, data)
	rec := offs[5]
	for _, tc := range []struct {
		name, want string
		at         int64
	}{
		{"data byte", "data crc mismatch", rec + 12 + 3},
		{"length byte", "length crc mismatch", rec + 2},
		{"data crc", "data crc mismatch", offs[6] - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := bytes.Clone(data)
			bad[tc.at] ^= 0x40
			p := writeFile(t, "events.out.tfevents.bad", bad)
			_, err := tfevents.ReadScalars(p)
			var fe *tfevents.FormatError
			if !errors.As(err, &fe) || !errors.Is(err, tfevents.ErrCorrupt) {
				t.Fatalf("err = %v, want a corrupt-record FormatError", err)
			}
			msg := err.Error()
			if fe.Offset != rec || !strings.HasPrefix(msg, p+": record at byte ") || !strings.Contains(msg, tc.want) {
				t.Fatalf("err = %q (offset %d), want %s at byte %d of %s", msg, fe.Offset, tc.want, rec, p)
			}
			if rest := msg[len(p):]; rest != strings.ToLower(rest) {
				t.Errorf("error text not lowercase: %q", rest)
			}
		})
	}
}

func TestTruncatedRecordKeepsEarlierScalars(t *testing.T) {
	path, want := writeRun(t)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	offs := recordOffsets(t, data)
	// Cut inside the last record's data, then inside its header.
	last := offs[len(offs)-1]
	for _, cut := range []int64{last + 12 + 2, last + 5} {
		p := writeFile(t, "events.out.tfevents.cut", data[:cut])
		got, err := tfevents.ReadScalars(p)
		var fe *tfevents.FormatError
		if !errors.As(err, &fe) || !errors.Is(err, tfevents.ErrTruncated) || fe.Offset != last {
			t.Fatalf("cut at %d: err = %v, want truncated record at byte %d", cut, err, last)
		}
		if !strings.HasPrefix(err.Error(), p+": record at byte ") {
			t.Errorf("error does not start with the path: %q", err)
		}
		// The last record is the final amp/scale_tf2 point.
		w := map[string][]tfevents.Point{}
		for k, v := range want {
			w[k] = v
		}
		w["amp/scale_tf2"] = w["amp/scale_tf2"][:len(w["amp/scale_tf2"])-1]
		if !equalScalars(got, w) {
			t.Fatalf("cut at %d: got %v, want %v", cut, got, w)
		}
	}
}

func TestNotAnEventFile(t *testing.T) {
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"run.csv", []byte("step,loss,scale\n0,2.5,65536\n1,2.4,65536\n"), "length crc mismatch"},
		{"run.json", []byte(`{"losses": [2.5, 2.4]}`), "length crc mismatch"},
		{"short", []byte("abc"), "ends 3 bytes into the 12-byte record header"},
		{"empty", nil, "empty file"},
		// Valid framing around bytes that are not an tfevents.Event.
		{"foreign.tfrecord", docRecord([]byte{0x0A, 0x03, 'a', 'b', 'c'}), "field 1 has wire type 2, want 1"},
		{"other.tfevents", docRecord(append([]byte{0x1A, 0x09}, "other:1.0"...)), `file_version "other:1.0"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, tc.name, tc.data)
			_, err := tfevents.ReadScalars(p)
			if !errors.Is(err, tfevents.ErrNotEventFile) {
				t.Fatalf("err = %v, want ErrNotEventFile", err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, p+": ") || !strings.Contains(msg, "not a tensorboard event file") || !strings.Contains(msg, tc.want) {
				t.Fatalf("err = %q, want the path, %q and %q", msg, "not a tensorboard event file", tc.want)
			}
		})
	}
	if _, err := tfevents.ReadScalars(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: err = %v", err)
	}
}

func TestOnlyScalarsAreRead(t *testing.T) {
	var buf bytes.Buffer
	w, err := eventfile.NewWriter(&buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	events := []tfevents.Event{
		// A histogram-plugin tensor: a 2x3 DT_DOUBLE tensor; skipped by
		// plugin and by shape.
		{Step: 1, Values: []tfevents.Value{{Tag: "w/hist", Plugin: "histograms",
			Tensor: &tfevents.Tensor{DType: tfevents.DTDouble, Shape: []int64{2, 3}, DoubleVal: []float64{1, 2, 3, 4, 5, 6}}}}},
		// Later values of that tag carry no metadata: still skipped.
		{Step: 2, Values: []tfevents.Value{{Tag: "w/hist", Tensor: &tfevents.Tensor{DType: tfevents.DTDouble, DoubleVal: []float64{7}}}}},
		// A text tensor (DT_STRING = 7) and a one-element tensor of a
		// tag first seen with "scalars" metadata, later without.
		{Step: 3, Values: []tfevents.Value{
			{Tag: "notes", Plugin: "text", Tensor: &tfevents.Tensor{DType: 7}},
			{Tag: "lr", Plugin: "scalars", Tensor: &tfevents.Tensor{DType: tfevents.DTFloat, FloatVal: []float32{0.1}}},
		}},
		{Step: 4, Values: []tfevents.Value{{Tag: "lr", Tensor: &tfevents.Tensor{DType: tfevents.DTFloat, FloatVal: []float32{0.05}}}}},
		// fp16 and bf16 scalars in half_val (1.5 = 0x3E00; bf16 -2 = 0xC000) and a double.
		{Step: 5, Values: []tfevents.Value{
			{Tag: "h", Tensor: &tfevents.Tensor{DType: tfevents.DTHalf, HalfVal: []int32{0x3E00}}},
			{Tag: "bf", Tensor: &tfevents.Tensor{DType: tfevents.DTBFloat16, HalfVal: []int32{0xC000}}},
			{Tag: "d", Tensor: &tfevents.Tensor{DType: tfevents.DTDouble, Shape: []int64{1}, DoubleVal: []float64{1e300}}},
			{Tag: "vec", Tensor: &tfevents.Tensor{DType: tfevents.DTFloat, Shape: []int64{2}, FloatVal: []float32{1, 2}}},
			// One float_val filling a shape of two (tensor.proto, version 0): not a scalar.
			{Tag: "fill", Tensor: &tfevents.Tensor{DType: tfevents.DTFloat, Shape: []int64{2}, FloatVal: []float32{3}}},
		}},
	}
	for _, e := range events {
		if err := w.WriteEvent(e); err != nil {
			t.Fatal(err)
		}
	}
	got, err := tfevents.ReadScalars(writeFile(t, "events.out.tfevents.2.host", buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]tfevents.Point{
		"lr": {{Step: 3, Value: float64(float32(0.1))}, {Step: 4, Value: float64(float32(0.05))}},
		"h":  {{Step: 5, Value: 1.5}},
		"bf": {{Step: 5, Value: -2}},
		"d":  {{Step: 5, Value: 1e300}},
	}
	if !equalScalars(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func FuzzDecodeEvent(f *testing.F) {
	for _, seed := range [][]byte{simpleEvent, pytorchTensorEvent, tf2TensorEvent, fileVersionEvent, {0x2A, 0x80}} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := tfevents.DecodeEvent(b)
		if err != nil {
			return
		}
		for _, v := range e.Values {
			v.Scalar()
		}
		// What decodes must survive a re-encode and decode.
		if enc, err := eventfile.MarshalEvent(e); err == nil {
			if _, err := tfevents.DecodeEvent(enc); err != nil {
				t.Fatalf("re-decoding %x: %v", enc, err)
			}
		}
	})
}
