package onnx

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ResolveExternal returns the path of the external data file that location
// names, relative to the model folder baseDir. A model is untrusted input:
// the location must be a relative path that stays inside baseDir, also after
// following symlinks, and must name an existing regular file. ONNX Runtime
// refuses absolute and escaping locations too; checking here first gives the
// user a message that names the tensor and the file.
func ResolveExternal(baseDir, location string) (string, error) {
	if location == "" {
		return "", errors.New("external data location is empty; the model names no data file")
	}
	if filepath.IsAbs(location) || strings.HasPrefix(location, "/") || strings.HasPrefix(location, `\`) {
		return "", fmt.Errorf("external data location %q is absolute; want a path relative to the model folder (re-save the model with relative external data)", location)
	}
	local := filepath.FromSlash(location)
	if !filepath.IsLocal(local) {
		return "", fmt.Errorf("external data location %q escapes the model folder; want a file inside %q", location, baseDir)
	}
	if baseDir == "" {
		baseDir = "."
	}
	path := filepath.Join(baseDir, local)
	realBase, err := filepath.EvalSymlinks(baseDir)
	if err != nil {
		return "", fmt.Errorf("external data location %q: model folder: %w", location, err)
	}
	realPath, err := filepath.EvalSymlinks(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("external data file %q not found in %q; copy the data file next to the model", location, baseDir)
		}
		return "", fmt.Errorf("external data location %q: %w", location, err)
	}
	realBase, err = filepath.Abs(realBase)
	if err != nil {
		return "", err
	}
	realPath, err = filepath.Abs(realPath)
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(realBase, realPath)
	if err != nil || !filepath.IsLocal(rel) {
		return "", fmt.Errorf("external data location %q resolves through a symlink to %q, outside the model folder %q; copy the data file into the folder", location, realPath, realBase)
	}
	fi, err := os.Stat(realPath)
	if err != nil {
		return "", fmt.Errorf("external data location %q: %w", location, err)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("external data location %q is not a regular file", location)
	}
	return realPath, nil
}

// CheckExternalData checks every tensor of m stored as external data: graph
// initializers, sparse initializers, tensors in node attributes (Constant
// values), subgraphs of If/Loop/Scan at any depth, training graphs and
// functions. Each location must resolve inside baseDir (see ResolveExternal)
// and the file must hold the tensor's byte range. The error names the tensor
// and where it sits in the model, and wraps ErrExternalData.
func CheckExternalData(m *ModelProto, baseDir string) error {
	return WalkTensors(m, func(where string, t *TensorProto) error {
		if t.GetDataLocation() != TensorProto_EXTERNAL {
			return nil
		}
		want := int64(-1)
		if size := storedSize(t); size > 0 {
			n, err := elementCount(t)
			if err != nil {
				return fmt.Errorf("%w: %s: %w", ErrExternalData, where, err)
			}
			want = n * size
		}
		if _, _, err := checkExternal(t, baseDir, want); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrExternalData, where, err)
		}
		return nil
	})
}

// WalkTensors calls fn for every TensorProto in m, wherever it sits, with a
// description of its place such as `graph "main" > node "If_0" attribute
// "then_branch" > graph "then" > node "c" attribute "value"`. It stops at the
// first error fn returns.
func WalkTensors(m *ModelProto, fn func(where string, t *TensorProto) error) error {
	w := tensorWalker{fn: fn}
	if err := w.graph("", m.GetGraph()); err != nil {
		return err
	}
	for i, ti := range m.GetTrainingInfo() {
		p := fmt.Sprintf("training_info[%d] ", i)
		if err := w.graph(p+"initialization ", ti.GetInitialization()); err != nil {
			return err
		}
		if err := w.graph(p+"algorithm ", ti.GetAlgorithm()); err != nil {
			return err
		}
	}
	for _, f := range m.GetFunctions() {
		p := fmt.Sprintf("function %q", f.GetName())
		for _, a := range f.GetAttributeProto() {
			if err := w.attr(p+fmt.Sprintf(" default attribute %q", a.GetName()), a); err != nil {
				return err
			}
		}
		for i, n := range f.GetNode() {
			if err := w.node(p+" > ", i, n); err != nil {
				return err
			}
		}
	}
	return nil
}

type tensorWalker struct {
	fn func(where string, t *TensorProto) error
}

func (w tensorWalker) graph(prefix string, g *GraphProto) error {
	if g == nil {
		return nil
	}
	p := prefix + fmt.Sprintf("graph %q", g.GetName())
	for _, t := range g.GetInitializer() {
		if err := w.fn(p+fmt.Sprintf(" initializer %q", t.GetName()), t); err != nil {
			return err
		}
	}
	for i, s := range g.GetSparseInitializer() {
		if err := w.sparse(p+fmt.Sprintf(" sparse_initializer[%d]", i), s); err != nil {
			return err
		}
	}
	for i, n := range g.GetNode() {
		if err := w.node(p+" > ", i, n); err != nil {
			return err
		}
	}
	return nil
}

func (w tensorWalker) sparse(where string, s *SparseTensorProto) error {
	if s.GetValues() != nil {
		if err := w.fn(where+" values", s.GetValues()); err != nil {
			return err
		}
	}
	if s.GetIndices() != nil {
		return w.fn(where+" indices", s.GetIndices())
	}
	return nil
}

func (w tensorWalker) node(prefix string, i int, n *NodeProto) error {
	p := prefix + "node " + nodeLabel(n, i)
	for _, a := range n.GetAttribute() {
		if err := w.attr(p+fmt.Sprintf(" attribute %q", a.GetName()), a); err != nil {
			return err
		}
	}
	return nil
}

func (w tensorWalker) attr(p string, a *AttributeProto) error {
	if a.GetT() != nil {
		if err := w.fn(p, a.GetT()); err != nil {
			return err
		}
	}
	for i, t := range a.GetTensors() {
		if err := w.fn(p+fmt.Sprintf("[%d]", i), t); err != nil {
			return err
		}
	}
	if a.GetSparseTensor() != nil {
		if err := w.sparse(p, a.GetSparseTensor()); err != nil {
			return err
		}
	}
	for i, s := range a.GetSparseTensors() {
		if err := w.sparse(p+fmt.Sprintf("[%d]", i), s); err != nil {
			return err
		}
	}
	if err := w.graph(p+" > ", a.GetG()); err != nil {
		return err
	}
	for i, g := range a.GetGraphs() {
		if err := w.graph(p+fmt.Sprintf("[%d] > ", i), g); err != nil {
			return err
		}
	}
	return nil
}

// nodeLabel names node n at position i in messages: its quoted name, or
// op_type#i when the exporter left it unnamed.
func nodeLabel(n *NodeProto, i int) string {
	if n.GetName() != "" {
		return strconv.Quote(n.GetName())
	}
	return nodeName(n, i)
}

// ExternalRange returns the file, offset and length of the bytes of t, a
// tensor stored as external data of a model in folder baseDir, checked as
// CheckExternalData checks them.
func ExternalRange(t *TensorProto, baseDir string) (path string, offset, length int64, err error) {
	want := int64(-1)
	if size := storedSize(t); size > 0 {
		n, err := elementCount(t)
		if err != nil {
			return "", 0, 0, err
		}
		want = n * size
	}
	path, ref, err := checkExternal(t, baseDir, want)
	if err != nil {
		return "", 0, 0, err
	}
	return path, ref.offset, ref.length, nil
}

// storedAsKey marks, among a tensor's external_data entries, the element
// type its external bytes are stored in when that is not the tensor's
// own: the FLOAT view of a 16-bit weight in an external data file
// (FloatView), whose bytes are read, and converted, only where they are
// used.
const storedAsKey = "fp16audit.stored_as"

// StoredAs returns the element type the bytes of t are stored in: its own
// data type, or for a FloatView the 16-bit type of its external file.
func StoredAs(t *TensorProto) int32 {
	for _, e := range t.GetExternalData() {
		if e.GetKey() == storedAsKey {
			if v, err := strconv.ParseInt(e.GetValue(), 10, 32); err == nil {
				return int32(v)
			}
		}
	}
	return t.GetDataType()
}

// FloatView returns the FLOAT tensor whose elements are those of t, a
// FLOAT16 or BFLOAT16 tensor in an external data file, over the same bytes
// of the same file: nothing is read until something decodes it
// (DecodeTensor converts), so an upcast of a model stored in 16 bits holds
// none of its weights (the audit's sessions convert each weight as a
// block needs it). t itself is not changed.
func FloatView(t *TensorProto) *TensorProto {
	v := &TensorProto{Name: t.GetName(), DataType: int32(TensorProto_FLOAT), Dims: t.GetDims(), DocString: t.GetDocString(),
		DataLocation: TensorProto_EXTERNAL}
	for _, e := range t.GetExternalData() {
		if e.GetKey() != storedAsKey {
			v.ExternalData = append(v.ExternalData, &StringStringEntryProto{Key: e.GetKey(), Value: e.GetValue()})
		}
	}
	v.ExternalData = append(v.ExternalData, &StringStringEntryProto{Key: storedAsKey, Value: strconv.Itoa(int(t.GetDataType()))})
	return v
}

// storedSize is the size in bytes of one element of t as its bytes are
// stored (StoredAs); 0 for a type fp16audit does not decode.
func storedSize(t *TensorProto) int64 {
	dt, ok := supportedDType[TensorProto_DataType(StoredAs(t))]
	if !ok {
		return 0
	}
	return int64(dt.Size())
}
