package batch

import (
	"archive/zip"
	"bytes"
	"fmt"
	"io"
	"strings"

	"fp16audit/internal/tensor"
)

// maxDeflateRatio is the most deflate can expand data (about 1032:1 for a
// run of one byte); a member claiming more than this is lying about its size.
const maxDeflateRatio = 1032

// ReadNPZ reads an .npz archive (stored or deflated, as np.savez and
// np.savez_compressed write them). The tensors come in archive order, each
// named after its member without ".npy". Errors start with path.
func ReadNPZ(path string) ([]*tensor.Tensor, error) {
	f, size, err := openSized(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ts, err := DecodeNPZ(f, size)
	if err != nil {
		return nil, &LoadError{Path: path, Err: err}
	}
	return ts, nil
}

// DecodeNPZ decodes an .npz archive of size bytes read through r. Every
// member must be a .npy array. A member's npy header is checked against the
// uncompressed size its zip entry declares, and the declared size against
// what its compressed bytes can expand to, so a zip bomb is refused before
// its data is allocated.
func DecodeNPZ(r io.ReaderAt, size int64) ([]*tensor.Tensor, error) {
	zr, err := zip.NewReader(r, size)
	if err != nil {
		return nil, fmt.Errorf("not an .npz archive: %w", err)
	}
	var out []*tensor.Tensor
	seen := map[string]bool{}
	for _, f := range zr.File {
		if strings.HasSuffix(f.Name, "/") {
			continue
		}
		name, ok := strings.CutSuffix(f.Name, ".npy")
		if !ok || name == "" {
			return nil, fmt.Errorf("npz member %q is not a .npy array", f.Name)
		}
		if seen[name] {
			return nil, fmt.Errorf("npz member %q appears twice", f.Name)
		}
		seen[name] = true
		t, err := decodeMember(f, size)
		if err != nil {
			return nil, fmt.Errorf("npz member %q: %w", f.Name, err)
		}
		t.Name = name
		out = append(out, t)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("npz archive holds no arrays")
	}
	return out, nil
}

func decodeMember(f *zip.File, archiveSize int64) (*tensor.Tensor, error) {
	declared := f.UncompressedSize64
	packed := f.CompressedSize64
	if packed > uint64(archiveSize) {
		return nil, fmt.Errorf("declares %d compressed bytes in a %d-byte archive", packed, archiveSize)
	}
	switch f.Method {
	case zip.Store:
		if declared != packed {
			return nil, fmt.Errorf("stored member declares %d bytes but holds %d", declared, packed)
		}
	case zip.Deflate:
		if declared > packed*maxDeflateRatio+1024 {
			return nil, fmt.Errorf("declares %d uncompressed bytes, more than %d compressed bytes can hold", declared, packed)
		}
	default:
		return nil, fmt.Errorf("zip compression method %d is not supported (want stored or deflated)", f.Method)
	}
	rc, err := f.Open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	// archive/zip itself fails a member that inflates past its declared size;
	// the limit makes that independent of the library.
	lr := io.LimitReader(rc, int64(declared))
	t, err := DecodeNPY(lr, int64(declared))
	if err != nil {
		return nil, err
	}
	// Drain to EOF so the zip reader verifies the CRC.
	var one [1]byte
	if n, err := rc.Read(one[:]); n > 0 {
		return nil, fmt.Errorf("holds more than its declared %d bytes", declared)
	} else if err != nil && err != io.EOF {
		return nil, err
	}
	return t, nil
}

// EncodeNPZ returns ts as an .npz archive, deflated when compress is set (as
// np.savez_compressed) and stored otherwise (as np.savez). Members are named
// after the tensors; an unnamed tensor becomes arr_<i> as numpy names
// positional arrays.
func EncodeNPZ(ts []*tensor.Tensor, compress bool) ([]byte, error) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	method := zip.Store
	if compress {
		method = zip.Deflate
	}
	seen := map[string]bool{}
	for i, t := range ts {
		name := t.Name
		if name == "" {
			name = fmt.Sprintf("arr_%d", i)
		}
		if seen[name] {
			return nil, fmt.Errorf("encode npz: two tensors named %q", name)
		}
		seen[name] = true
		data, err := EncodeNPY(t)
		if err != nil {
			return nil, err
		}
		w, err := zw.CreateHeader(&zip.FileHeader{Name: name + ".npy", Method: method})
		if err != nil {
			return nil, err
		}
		if _, err := w.Write(data); err != nil {
			return nil, err
		}
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
