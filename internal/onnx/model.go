// Package onnx reads, checks and writes ONNX models: the generated protobuf
// types of the ONNX IR, a loader whose errors tell the user what to do, a
// guard for external data files, a decoder between TensorProto and dense
// tensors, and an index of a graph's producers, consumers, types and order.
package onnx

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Sentinel errors wrapped by a LoadError, for callers that branch on the
// kind of failure.
var (
	ErrEmptyFile    = errors.New("file is empty")
	ErrNotModel     = errors.New("not an ONNX model")
	ErrTruncated    = errors.New("model file is truncated")
	ErrEmptyGraph   = errors.New("graph has no nodes")
	ErrExternalData = errors.New("unsafe or broken external data")
)

// LoadError reports why a model file could not be loaded.
type LoadError struct {
	Path string
	Err  error
}

func (e *LoadError) Error() string { return fmt.Sprintf("load model %s: %v", e.Path, e.Err) }

// Unwrap returns the underlying error.
func (e *LoadError) Unwrap() error { return e.Err }

// Model is a loaded ONNX model.
type Model struct {
	// Path is the file the model was read from.
	Path string
	// Dir is the folder external data locations are relative to.
	Dir string
	// Size is the size of the serialized model in bytes.
	Size int64
	// Proto is the decoded model.
	Proto *ModelProto
	// Index indexes Proto's main graph as loaded; a pass that rewrites
	// Proto builds a new one.
	Index *Index
	// Inlined names the local functions whose calls Flatten expanded into
	// the main graph.
	Inlined []string
}

// Flatten expands the calls of m's local functions into its main graph
// (InlineFunctions) and indexes the result, for the stages that place,
// observe and differentiate ops one by one; Load leaves the model as the
// file holds it. Errors are *LoadError.
func (m *Model) Flatten() error {
	inlined, err := InlineFunctions(m.Proto)
	if err != nil {
		return &LoadError{m.Path, err}
	}
	if len(inlined) == 0 {
		return nil
	}
	ix, err := NewIndex(m.Proto.GetGraph())
	if err != nil {
		return &LoadError{m.Path, err}
	}
	if err := checkDefined(m.Proto.GetGraph(), ix); err != nil {
		return &LoadError{m.Path, err}
	}
	ix.BaseDir = m.Dir
	m.Index, m.Inlined = ix, inlined
	return nil
}

// Load reads and checks the ONNX model at path. Besides decoding, it checks
// that every external data reference anywhere in the model points to a file
// inside the model's folder that holds the referenced bytes, and that the
// main graph is acyclic. Errors are *LoadError.
func Load(path string) (*Model, error) {
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, &LoadError{path, fmt.Errorf("file does not exist (%w); want the path of an exported .onnx model, check the path", fs.ErrNotExist)}
		}
		return nil, &LoadError{path, err}
	}
	if fi.IsDir() {
		return nil, &LoadError{path, errors.New("is a directory; want the .onnx model file inside it")}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &LoadError{path, err}
	}
	return LoadBytes(data, path)
}

// LoadBytes decodes and checks a serialized model as Load does. path names
// the model in errors and fixes the folder external data is resolved in.
// The model's large initializers keep their data in data, which must not
// change afterwards.
func LoadBytes(data []byte, path string) (*Model, error) {
	m := &Model{Path: path, Dir: filepath.Dir(path), Size: int64(len(data))}
	if err := sniff(data); err != nil {
		return nil, &LoadError{path, err}
	}
	mp := &ModelProto{}
	if err := unmarshalAliased(data, mp); err != nil {
		if truncated(data) {
			return nil, &LoadError{path, fmt.Errorf("%w: the protobuf data ends in the middle of a field after %d bytes; the copy or export was cut short, export or copy the model again", ErrTruncated, len(data))}
		}
		return nil, &LoadError{path, fmt.Errorf("%w: protobuf decoding failed (%v); want a binary ModelProto as written by torch.onnx.export", ErrNotModel, err)}
	}
	if mp.GetIrVersion() == 0 && mp.GetGraph() == nil {
		return nil, &LoadError{path, fmt.Errorf("%w: the file decodes as protobuf but has neither ir_version nor graph; want a .onnx file written by torch.onnx.export", ErrNotModel)}
	}
	if mp.GetGraph() == nil {
		return nil, &LoadError{path, fmt.Errorf("%w: the model has no graph; the file may be truncated or another kind of protobuf, export the model again", ErrNotModel)}
	}
	if mp.GetIrVersion() == 0 {
		return nil, &LoadError{path, fmt.Errorf("%w: the model has no ir_version; want a model written by an ONNX exporter", ErrNotModel)}
	}
	if len(mp.GetGraph().GetNode()) == 0 {
		return nil, &LoadError{path, fmt.Errorf("%w: graph %q is empty; want an exported model with at least one operator, check that the export traced the model", ErrEmptyGraph, mp.GetGraph().GetName())}
	}
	if err := CheckExternalData(mp, m.Dir); err != nil {
		return nil, &LoadError{path, err}
	}
	ix, err := NewIndex(mp.GetGraph())
	if err != nil {
		return nil, &LoadError{path, err}
	}
	if err := checkDefined(mp.GetGraph(), ix); err != nil {
		return nil, &LoadError{path, err}
	}
	ix.BaseDir = m.Dir
	m.Proto, m.Index = mp, ix
	return m, nil
}

// sniff recognizes files that are certainly not ONNX models, so that the
// message names what the user passed instead of a protobuf parse error.
func sniff(data []byte) error {
	switch {
	case len(data) == 0:
		return fmt.Errorf("%w (0 bytes); want an ONNX model, the export probably failed, export the model again", ErrEmptyFile)
	case bytes.HasPrefix(data, []byte("\x93NUMPY")):
		return fmt.Errorf("%w: found a NumPy .npy array; pass the exported .onnx model here and the .npy file as a batch", ErrNotModel)
	case bytes.HasPrefix(data, []byte("PK\x03\x04")), bytes.HasPrefix(data, []byte("PK\x05\x06")):
		return fmt.Errorf("%w: found a zip archive (a .npz batch or a PyTorch checkpoint?); export the model with torch.onnx.export and pass the .onnx file", ErrNotModel)
	case len(data) >= 2 && data[0] == 0x80 && data[1] >= 2 && data[1] <= 5:
		return fmt.Errorf("%w: found a Python pickle (a .pt, .pth or fastai .pkl file?); export the model with torch.onnx.export and pass the .onnx file", ErrNotModel)
	case bytes.HasPrefix(data, []byte("\x89HDF")):
		return fmt.Errorf("%w: found an HDF5 file (a Keras model?); convert it to ONNX first", ErrNotModel)
	}
	if kind := textKind(data); kind != "" {
		return fmt.Errorf("%w: found %s; want the binary protobuf .onnx file torch.onnx.export writes", ErrNotModel, kind)
	}
	return nil
}

// textKind describes data if its start is printable text, or returns "".
// A serialized ModelProto starts with a field tag, a control byte, so no
// real model reads as text.
func textKind(data []byte) string {
	head := data[:min(len(data), 512)]
	for len(head) > 0 {
		r, n := utf8.DecodeRune(head)
		if r == utf8.RuneError && n == 1 {
			if len(head) < utf8.UTFMax && len(data) > 512 {
				break // a rune cut by the 512-byte window
			}
			return ""
		}
		if r < 0x20 && r != '\n' && r != '\r' && r != '\t' {
			return ""
		}
		head = head[n:]
	}
	trimmed := bytes.TrimLeft(data, " \t\r\n\ufeff")
	switch {
	case len(trimmed) == 0:
		return "only whitespace"
	case trimmed[0] == '{' || trimmed[0] == '[':
		return "JSON text"
	case trimmed[0] == '<':
		return "text (ONNX text format or XML?)"
	}
	return "a text file"
}

// truncated reports whether data looks like a ModelProto cut short: it
// starts with the tag of a ModelProto field (exporters write ir_version, tag
// 0x08, first) and its top-level fields parse until one runs past the end.
// Garbage rarely passes both tests; a cut file almost always does, since the
// graph field spans most of a model.
func truncated(data []byte) bool {
	switch data[0] {
	case 0x08, 0x12, 0x1a, 0x22, 0x28, 0x32, 0x3a, 0x42:
	default:
		return false
	}
	for len(data) > 0 {
		_, _, n := protowire.ConsumeField(data)
		if n < 0 {
			return errors.Is(protowire.ParseError(n), io.ErrUnexpectedEOF)
		}
		data = data[n:]
	}
	return false
}

// Marshal serializes m deterministically: the same model always gives the
// same bytes, so saved models diff and hash stably.
func Marshal(m *ModelProto) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(m)
}

// Save writes m to path atomically: the bytes go to a temporary file in the
// same folder, which is then renamed over path, so a reader never sees a
// partial model.
func Save(m *ModelProto, path string) error {
	data, err := Marshal(m)
	if err != nil {
		return fmt.Errorf("save model %s: %w", path, err)
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp*")
	if err != nil {
		return fmt.Errorf("save model %s: %w", path, err)
	}
	tmp := f.Name()
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("save model %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		return fail(err)
	}
	if err := f.Chmod(0o644); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("save model %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("save model %s: %w", path, err)
	}
	return nil
}
