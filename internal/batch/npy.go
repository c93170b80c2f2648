package batch

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"

	"fp16audit/internal/tensor"
)

// npyMagic starts every .npy file.
const npyMagic = "\x93NUMPY"

// maxNPYHeader bounds the header dict. numpy itself refuses headers over
// 10000 bytes by default; the slack covers very high-rank shapes.
const maxNPYHeader = 1 << 20

// readChunk is the largest single allocation made while reading array data
// whose length a reader of unknown size only claims; bigger arrays grow as the
// bytes actually arrive, so a lying header cannot make us allocate up front.
const readChunk = 64 << 20

// ReadNPY reads a .npy file. The tensor is named after the file without its
// extension. Errors start with path.
func ReadNPY(path string) (*tensor.Tensor, error) {
	f, size, err := openSized(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := DecodeNPY(bufio.NewReaderSize(f, 1<<16), size)
	if err != nil {
		return nil, &LoadError{Path: path, Err: err}
	}
	t.Name = stem(path)
	return t, nil
}

// DecodeNPY decodes one array in .npy format (versions 1.0, 2.0 and 3.0) from
// r, which holds size bytes; pass a negative size when it is unknown. Big-endian
// data is converted to little-endian and Fortran-ordered data to C order, so
// the result is in tensor's canonical layout. The header is checked against
// size before the data is allocated, and with a known size, bytes after the
// array are an error. The returned tensor has no name.
func DecodeNPY(r io.Reader, size int64) (*tensor.Tensor, error) {
	var pre [10]byte
	if size >= 0 && size < int64(len(pre)) {
		return nil, fmt.Errorf("not a .npy file: %d bytes is shorter than the npy preamble", size)
	}
	if _, err := io.ReadFull(r, pre[:8]); err != nil {
		return nil, fmt.Errorf("not a .npy file: %w", eofIsUnexpected(err))
	}
	if string(pre[:6]) != npyMagic {
		return nil, fmt.Errorf("not a .npy file: missing the \\x93NUMPY magic")
	}
	major, minor := pre[6], pre[7]
	var hlen int64
	pos := int64(8)
	switch {
	case major == 1 && minor == 0:
		if _, err := io.ReadFull(r, pre[8:10]); err != nil {
			return nil, fmt.Errorf("npy header: %w", eofIsUnexpected(err))
		}
		hlen = int64(binary.LittleEndian.Uint16(pre[8:10]))
		pos += 2
	case (major == 2 || major == 3) && minor == 0:
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return nil, fmt.Errorf("npy header: %w", eofIsUnexpected(err))
		}
		hlen = int64(binary.LittleEndian.Uint32(b[:]))
		pos += 4
	default:
		return nil, fmt.Errorf("npy format version %d.%d is not supported (want 1.0, 2.0 or 3.0)", major, minor)
	}
	if hlen > maxNPYHeader {
		return nil, fmt.Errorf("npy header: length %d exceeds the %d-byte limit", hlen, maxNPYHeader)
	}
	if size >= 0 && pos+hlen > size {
		return nil, fmt.Errorf("npy header: claims %d bytes but the file holds only %d after the preamble", hlen, size-pos)
	}
	hdr := make([]byte, hlen)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, fmt.Errorf("npy header: %w", eofIsUnexpected(err))
	}
	pos += hlen
	if major == 3 && !utf8.Valid(hdr) {
		return nil, fmt.Errorf("npy header: version 3.0 header is not valid UTF-8")
	}
	h, err := parseNPYHeader(hdr)
	if err != nil {
		return nil, fmt.Errorf("npy header: %w", err)
	}
	n, err := elementCount(h.shape)
	if err != nil {
		return nil, err
	}
	itemSize := int64(h.dtype.Size())
	if n > math.MaxInt64/itemSize {
		return nil, fmt.Errorf("npy shape %s is too large", tensor.ShapeString(h.shape))
	}
	want := n * itemSize
	if size >= 0 {
		if have := size - pos; want > have {
			return nil, fmt.Errorf("truncated npy data: shape %s of %s needs %d bytes, the file holds %d",
				tensor.ShapeString(h.shape), h.descr, want, have)
		} else if want < have {
			return nil, fmt.Errorf("npy data: %d unexpected bytes after the %s %s array",
				have-want, h.descr, tensor.ShapeString(h.shape))
		}
	}
	if want > math.MaxInt {
		return nil, fmt.Errorf("npy shape %s is too large for this machine", tensor.ShapeString(h.shape))
	}
	data, err := readExactly(r, int(want))
	if err != nil {
		return nil, fmt.Errorf("truncated npy data: shape %s of %s needs %d bytes: %w",
			tensor.ShapeString(h.shape), h.descr, want, eofIsUnexpected(err))
	}
	if h.bigEndian {
		swapBytes(data, int(itemSize))
	}
	if h.dtype == tensor.Bool {
		for i, b := range data {
			if b != 0 {
				data[i] = 1
			}
		}
	}
	if h.fortran && len(h.shape) > 1 {
		data = fortranToC(data, h.shape, int(itemSize))
	}
	return &tensor.Tensor{DType: h.dtype, Shape: h.shape, Data: data}, nil
}

// EncodeNPY returns t as a .npy file: format 1.0 (2.0 only when the header
// does not fit 1.0), little-endian, C order. bfloat16 and string tensors have
// no numpy dtype and are refused.
func EncodeNPY(t *tensor.Tensor) ([]byte, error) {
	descr, ok := npyDescr[t.DType]
	if !ok {
		return nil, fmt.Errorf("encode npy %q: %s has no numpy dtype; convert to float32", t.Name, t.DType)
	}
	n, err := elementCount(t.Shape)
	if err != nil {
		return nil, fmt.Errorf("encode npy %q: %w", t.Name, err)
	}
	if int64(len(t.Data)) != n*int64(t.DType.Size()) {
		return nil, fmt.Errorf("encode npy %q: %d bytes of data for shape %s of %s", t.Name, len(t.Data), tensor.ShapeString(t.Shape), t.DType)
	}
	var dict bytes.Buffer
	fmt.Fprintf(&dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr)
	for i, d := range t.Shape {
		if i > 0 {
			dict.WriteString(", ")
		}
		dict.WriteString(strconv.FormatInt(d, 10))
	}
	if len(t.Shape) == 1 {
		dict.WriteByte(',')
	}
	dict.WriteString("), }")

	// numpy pads the header with spaces and a final newline so the data
	// starts on a 64-byte boundary.
	pre, lenSize := 10, 2
	if dict.Len()+1+pre > math.MaxUint16 {
		pre, lenSize = 12, 4
	}
	hlen := dict.Len() + 1
	hlen += (64 - (pre+hlen)%64) % 64
	out := make([]byte, 0, pre+hlen+len(t.Data))
	out = append(out, npyMagic...)
	if lenSize == 2 {
		out = append(out, 1, 0)
		out = binary.LittleEndian.AppendUint16(out, uint16(hlen))
	} else {
		out = append(out, 2, 0)
		out = binary.LittleEndian.AppendUint32(out, uint32(hlen))
	}
	out = append(out, dict.Bytes()...)
	for len(out) < pre+hlen-1 {
		out = append(out, ' ')
	}
	out = append(out, '\n')
	return append(out, t.Data...), nil
}

var npyDescr = map[tensor.DType]string{
	tensor.Float16: "<f2", tensor.Float32: "<f4", tensor.Float64: "<f8",
	tensor.Int8: "|i1", tensor.Int16: "<i2", tensor.Int32: "<i4", tensor.Int64: "<i8",
	tensor.Uint8: "|u1", tensor.Uint16: "<u2", tensor.Uint32: "<u4", tensor.Uint64: "<u8",
	tensor.Bool: "|b1",
}

// npyHeader is the decoded header dict.
type npyHeader struct {
	descr     string
	dtype     tensor.DType
	bigEndian bool
	fortran   bool
	shape     []int64
}

func parseNPYHeader(b []byte) (*npyHeader, error) {
	p := &pyParser{s: b}
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.i != len(p.s) {
		return nil, fmt.Errorf("unexpected %q after the header dict", p.rest())
	}
	dict, ok := v.(pyDict)
	if !ok {
		return nil, fmt.Errorf("header is not a dict")
	}
	for _, k := range dict.keys {
		if k != "descr" && k != "fortran_order" && k != "shape" {
			return nil, fmt.Errorf("unexpected key %q (want descr, fortran_order and shape)", k)
		}
	}
	h := &npyHeader{}
	switch d := dict.vals["descr"].(type) {
	case nil:
		return nil, fmt.Errorf("missing key 'descr'")
	case string:
		h.descr = d
		if h.dtype, h.bigEndian, err = parseDescr(d); err != nil {
			return nil, err
		}
	case pyList:
		return nil, fmt.Errorf("structured (record) dtypes are not supported; save one plain numeric array per input")
	default:
		return nil, fmt.Errorf("'descr' is %s, want a string", pyTypeName(d))
	}
	switch f := dict.vals["fortran_order"].(type) {
	case nil:
		return nil, fmt.Errorf("missing key 'fortran_order'")
	case bool:
		h.fortran = f
	default:
		return nil, fmt.Errorf("'fortran_order' is %s, want True or False", pyTypeName(f))
	}
	switch s := dict.vals["shape"].(type) {
	case nil:
		return nil, fmt.Errorf("missing key 'shape'")
	case pyTuple:
		h.shape = make([]int64, len(s))
		for i, e := range s {
			d, ok := e.(int64)
			if !ok {
				return nil, fmt.Errorf("'shape' element %d is %s, want an int", i, pyTypeName(e))
			}
			if d < 0 {
				return nil, fmt.Errorf("'shape' has a negative dimension %d", d)
			}
			h.shape[i] = d
		}
	default:
		return nil, fmt.Errorf("'shape' is %s, want a tuple of ints", pyTypeName(s))
	}
	return h, nil
}

// unsupportedKinds names numpy dtype kinds fp16audit cannot feed to a model,
// with what to do instead.
var unsupportedKinds = map[byte]string{
	'O': "object; object arrays need pickle, save a numeric array instead",
	'U': "unicode string; encode the text as token ids",
	'S': "bytes; encode the text as token ids",
	'a': "bytes; encode the text as token ids",
	'V': "void/raw; save a plain numeric array",
	'M': "datetime64; convert to a number",
	'm': "timedelta64; convert to a number",
}

// parseDescr maps a numpy dtype string such as "<f4" to an element type.
func parseDescr(d string) (tensor.DType, bool, error) {
	s := d
	order := byte('=')
	if len(s) > 0 && (s[0] == '<' || s[0] == '>' || s[0] == '=' || s[0] == '|') {
		order, s = s[0], s[1:]
	}
	if s == "?" {
		return tensor.Bool, false, nil
	}
	if len(s) < 1 {
		return 0, false, fmt.Errorf("dtype %q is not a numpy dtype", d)
	}
	kind := s[0]
	if hint, ok := unsupportedKinds[kind]; ok {
		return 0, false, fmt.Errorf("dtype '%s' (%s) is not supported", d, hint)
	}
	size, err := strconv.Atoi(s[1:])
	if s[1:] == "" {
		size, err = 0, nil
	}
	if err != nil || size < 0 {
		return 0, false, fmt.Errorf("dtype %q is not a numpy dtype", d)
	}
	var dt tensor.DType
	switch {
	case kind == 'f' && size == 2:
		dt = tensor.Float16
	case kind == 'f' && size == 4:
		dt = tensor.Float32
	case kind == 'f' && size == 8:
		dt = tensor.Float64
	case kind == 'i' && size == 1:
		dt = tensor.Int8
	case kind == 'i' && size == 2:
		dt = tensor.Int16
	case kind == 'i' && size == 4:
		dt = tensor.Int32
	case kind == 'i' && size == 8:
		dt = tensor.Int64
	case kind == 'u' && size == 1:
		dt = tensor.Uint8
	case kind == 'u' && size == 2:
		dt = tensor.Uint16
	case kind == 'u' && size == 4:
		dt = tensor.Uint32
	case kind == 'u' && size == 8:
		dt = tensor.Uint64
	case kind == 'b' && size == 1:
		dt = tensor.Bool
	case kind == 'f':
		return 0, false, fmt.Errorf("dtype '%s' (float%d) is not supported; convert to float32", d, 8*size)
	case kind == 'c':
		return 0, false, fmt.Errorf("dtype '%s' (complex%d) is not supported; convert to float32", d, 8*size)
	default:
		return 0, false, fmt.Errorf("dtype '%s' is not supported (want f2, f4, f8, i1-i8, u1-u8 or b1)", d)
	}
	return dt, order == '>' && size > 1, nil
}

// elementCount returns the product of shape, refusing overflow.
func elementCount(shape []int64) (int64, error) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("shape %s has a negative dimension", tensor.ShapeString(shape))
		}
		if d == 0 {
			return 0, nil
		}
	}
	for _, d := range shape {
		if n > math.MaxInt64/d {
			return 0, fmt.Errorf("shape %s has more elements than fit in 64 bits", tensor.ShapeString(shape))
		}
		n *= d
	}
	return n, nil
}

// readExactly reads n bytes, growing the buffer as data arrives beyond the
// first readChunk bytes.
func readExactly(r io.Reader, n int) ([]byte, error) {
	if n <= readChunk {
		buf := make([]byte, n)
		_, err := io.ReadFull(r, buf)
		return buf, err
	}
	buf := make([]byte, 0, readChunk)
	for len(buf) < n {
		step := min(n-len(buf), readChunk)
		buf = slices.Grow(buf, step)
		m, err := io.ReadFull(r, buf[len(buf):len(buf)+step])
		buf = buf[:len(buf)+m]
		if err != nil {
			return nil, err
		}
	}
	return buf, nil
}

func swapBytes(data []byte, size int) {
	for i := 0; i+size <= len(data); i += size {
		slices.Reverse(data[i : i+size])
	}
}

// fortranToC reorders column-major data to row-major. Column-major data is the
// row-major layout of the reversed shape, so walking the output in C order
// while keeping a column-major offset does the transpose in one pass.
func fortranToC(src []byte, shape []int64, size int) []byte {
	dst := make([]byte, len(src))
	if len(src) == 0 {
		return dst
	}
	rank := len(shape)
	fstride := make([]int, rank)
	s := size
	for k := range rank {
		fstride[k] = s
		s *= int(shape[k])
	}
	idx := make([]int64, rank)
	off := 0
	for o := 0; o < len(dst); o += size {
		copy(dst[o:o+size], src[off:off+size])
		for k := rank - 1; k >= 0; k-- {
			idx[k]++
			off += fstride[k]
			if idx[k] < shape[k] {
				break
			}
			off -= int(idx[k]) * fstride[k]
			idx[k] = 0
		}
	}
	return dst
}

func eofIsUnexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
