// Package tfevents reads TensorBoard event files
// (events.out.tfevents.*), where most PyTorch training loops log their loss
// and loss scale through torch.utils.tensorboard.SummaryWriter.
//
// An event file is a TFRecord file: a sequence of records, each
//
//	uint64 length             (little endian)
//	uint32 masked_crc32c(length bytes)
//	byte   data[length]
//	uint32 masked_crc32c(data)
//
// where masked_crc = ((crc >> 15) | (crc << 17)) + 0xa282ead8 over
// CRC-32C (Castagnoli). Each record's data is a serialized tensorboard
// Event protobuf; the first one carries file_version "brain.Event:2".
// Scalars come as Summary.Value either with simple_value or, from
// SummaryWriter.add_scalar(new_style=True) and TensorFlow 2, as a rank-0
// DT_FLOAT TensorProto with plugin "scalars". The protobufs are decoded by
// hand with protowire using the field numbers of TensorBoard's .proto files
// (tensorboard/compat/proto: event.proto, summary.proto, tensor.proto,
// tensor_shape.proto, types.proto).
package tfevents

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

const crcMaskDelta = 0xa282ead8

// maskedCRC is the TFRecord checksum of b: CRC-32C rotated right by 15 bits
// plus a constant, so that a CRC stored inside data that is itself
// checksummed does not weaken the outer checksum.
func maskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return ((c >> 15) | (c << 17)) + crcMaskDelta
}

// headerLen is the length field plus its checksum; footerLen the data
// checksum.
const (
	headerLen = 12
	footerLen = 4
)

// maxRecordLen bounds the length field before allocating: a damaged or
// foreign file could claim exabytes. TensorBoard events are kilobytes;
// graph and image events stay far below this.
const maxRecordLen = 1 << 30

// Error kinds, to test with errors.Is.
var (
	// ErrTruncated: the file ends inside a record (a writer still
	// running, or killed mid-write).
	ErrTruncated = errors.New("truncated record")
	// ErrCorrupt: a checksum does not match, or a record's data is not a
	// well-formed Event.
	ErrCorrupt = errors.New("corrupt record")
	// ErrNotEventFile: the file does not start like a TFRecord file of
	// Events (empty, another format, a foreign TFRecord).
	ErrNotEventFile = errors.New("not a tensorboard event file")
)

// FormatError is a damaged or foreign event file. Offset is the byte offset
// of the record's start; Kind is ErrTruncated, ErrCorrupt or ErrNotEventFile.
type FormatError struct {
	Path   string
	Offset int64
	Kind   error
	Msg    string
}

// Error reads "<path>: record at byte <offset>: <kind>: <detail>".
func (e *FormatError) Error() string {
	return fmt.Sprintf("%s: record at byte %d: %v: %s", e.Path, e.Offset, e.Kind, e.Msg)
}

// Unwrap returns Kind, for errors.Is.
func (e *FormatError) Unwrap() error { return e.Kind }

// Reader reads the records of a TFRecord stream and checks both checksums
// of each.
type Reader struct {
	r    *bufio.Reader
	path string
	off  int64
	n    int // records read
}

// NewReader reads records from r; path names the stream in errors.
func NewReader(r io.Reader, path string) *Reader {
	return &Reader{r: bufio.NewReaderSize(r, 64<<10), path: path}
}

// Offset is the byte offset of the next record.
func (r *Reader) Offset() int64 { return r.off }

func (r *Reader) fail(kind error, format string, args ...any) error {
	// A first record that does not frame is not a damaged event file but
	// some other file.
	if r.n == 0 && kind != ErrNotEventFile {
		format = "want TFRecord framing (uint64 length, masked crc32c of it, data, masked crc32c of it): " + format
		kind = ErrNotEventFile
	}
	return &FormatError{Path: r.path, Offset: r.off, Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// Next returns the data of the next record, io.EOF after the last one, or
// a *FormatError.
func (r *Reader) Next() ([]byte, error) {
	var hdr [headerLen]byte
	n, err := io.ReadFull(r.r, hdr[:])
	switch {
	case err == io.EOF:
		if r.n == 0 {
			return nil, &FormatError{Path: r.path, Offset: 0, Kind: ErrNotEventFile, Msg: "empty file"}
		}
		return nil, io.EOF
	case err == io.ErrUnexpectedEOF:
		return nil, r.fail(ErrTruncated, "the file ends %d bytes into the %d-byte record header", n, headerLen)
	case err != nil:
		return nil, fmt.Errorf("%s: %w", r.path, err)
	}
	length := binary.LittleEndian.Uint64(hdr[:8])
	if got, want := binary.LittleEndian.Uint32(hdr[8:]), maskedCRC(hdr[:8]); got != want {
		return nil, r.fail(ErrCorrupt, "length crc mismatch: stored %#08x, computed %#08x", got, want)
	}
	if length > maxRecordLen {
		return nil, r.fail(ErrCorrupt, "record length %d is beyond %d bytes", length, maxRecordLen)
	}
	buf := make([]byte, int(length)+footerLen)
	n, err = io.ReadFull(r.r, buf)
	switch {
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		return nil, r.fail(ErrTruncated, "the file ends %d bytes into the %d bytes of data and checksum", n, len(buf))
	case err != nil:
		return nil, fmt.Errorf("%s: %w", r.path, err)
	}
	data := buf[:length]
	if got, want := binary.LittleEndian.Uint32(buf[length:]), maskedCRC(data); got != want {
		return nil, r.fail(ErrCorrupt, "data crc mismatch: stored %#08x, computed %#08x", got, want)
	}
	r.off += headerLen + int64(length) + footerLen
	r.n++
	return data, nil
}
