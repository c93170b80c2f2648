package onnx

import (
	"bytes"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// tinyModel is Y = Relu(X + B).
func tinyModel() *ModelProto {
	g := &GraphProto{
		Name: "tiny",
		Node: []*NodeProto{
			Node("Add", "add", []string{"X", "B"}, []string{"s"}),
			Node("Relu", "relu", []string{"s"}, []string{"Y"}),
		},
		Initializer: []*TensorProto{FloatTensor("B", []int64{2}, []float32{1, -1})},
		Input:       []*ValueInfoProto{TensorValueInfo("X", TensorProto_FLOAT, "batch", 2)},
		Output:      []*ValueInfoProto{TensorValueInfo("Y", TensorProto_FLOAT, "batch", 2)},
	}
	return NewModel(g, 17)
}

// richModel uses every part of the IR fp16audit must carry through a load
// and save unchanged. The external tensor's file is written into dir.
func richModel(t *testing.T, dir string) *ModelProto {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "weights.bin"), le32(1, 2, 3, 4, 5, 6), 0o644); err != nil {
		t.Fatal(err)
	}
	meta := []*StringStringEntryProto{{Key: "pkg.torch.onnx.name_scopes", Value: "['', 'fc']"}}
	sparse := &SparseTensorProto{
		Values:  FloatTensor("S", []int64{2}, []float32{5, 7}),
		Indices: Int64Tensor("S_idx", []int64{2}, []int64{0, 3}),
		Dims:    []int64{2, 2},
	}
	thenG := &GraphProto{
		Name:   "then",
		Node:   []*NodeProto{Node("Mul", "then_mul", []string{"X", "W"}, []string{"t_out"})},
		Output: []*ValueInfoProto{TensorValueInfo("t_out", TensorProto_FLOAT, "batch", 2)},
	}
	elseG := &GraphProto{
		Name: "else",
		Node: []*NodeProto{
			Node("Constant", "else_c", nil, []string{"k"}, AttrTensor("value",
				ExternalTensor("k_ext", TensorProto_FLOAT, []int64{2}, "weights.bin", 8, 8))),
			Node("Add", "else_add", []string{"X", "k"}, []string{"e_out"}),
		},
		Output: []*ValueInfoProto{TensorValueInfo("e_out", TensorProto_FLOAT, "batch", 2)},
	}
	body := &GraphProto{
		Name: "body",
		Node: []*NodeProto{
			Node("Identity", "cond_id", []string{"cond_in"}, []string{"cond_out"}),
			Node("Add", "acc_add", []string{"acc_in", "B"}, []string{"acc_out"}),
		},
		Input: []*ValueInfoProto{
			TensorValueInfo("iter", TensorProto_INT64),
			TensorValueInfo("cond_in", TensorProto_BOOL),
			TensorValueInfo("acc_in", TensorProto_FLOAT, "batch", 2),
		},
		Output: []*ValueInfoProto{
			TensorValueInfo("cond_out", TensorProto_BOOL),
			TensorValueInfo("acc_out", TensorProto_FLOAT, "batch", 2),
		},
	}
	everyAttr := Node("CustomOp", "custom", []string{"Y"}, []string{"Z"},
		AttrFloat("f", 1.5),
		AttrInt("i", -3),
		AttrString("s", "hello"),
		AttrTensor("t", FloatTensor("t", []int64{1}, []float32{2})),
		AttrGraph("g", &GraphProto{Name: "g_attr", Node: []*NodeProto{Node("Identity", "", []string{"a"}, []string{"b"})}}),
		&AttributeProto{Name: "floats", Type: AttributeProto_FLOATS, Floats: []float32{1, float32(math.Inf(-1))}},
		AttrInts("ints", 1, -2, 3),
		&AttributeProto{Name: "strings", Type: AttributeProto_STRINGS, Strings: [][]byte{[]byte("a"), []byte("b")}},
		&AttributeProto{Name: "tensors", Type: AttributeProto_TENSORS, Tensors: []*TensorProto{Int64Tensor("ti", []int64{1}, []int64{9})}},
		&AttributeProto{Name: "graphs", Type: AttributeProto_GRAPHS, Graphs: []*GraphProto{{Name: "gs0"}}},
		&AttributeProto{Name: "sparse", Type: AttributeProto_SPARSE_TENSOR, SparseTensor: sparse},
		&AttributeProto{Name: "sparses", Type: AttributeProto_SPARSE_TENSORS, SparseTensors: []*SparseTensorProto{sparse}},
		&AttributeProto{Name: "tp", Type: AttributeProto_TYPE_PROTO, Tp: TensorValueInfo("", TensorProto_FLOAT16, 3).GetType()},
		&AttributeProto{Name: "tps", Type: AttributeProto_TYPE_PROTOS, TypeProtos: []*TypeProto{TensorValueInfo("", TensorProto_BFLOAT16).GetType()}},
		&AttributeProto{Name: "ref", Type: AttributeProto_FLOAT, RefAttrName: "alpha", DocString: "doc"},
	)
	everyAttr.Domain = "com.example"
	everyAttr.MetadataProps = meta
	g := &GraphProto{
		Name:      "main",
		DocString: "the main graph",
		Node: []*NodeProto{
			Node("Constant", "cond_c", nil, []string{"cond"}, AttrTensor("value",
				&TensorProto{DataType: int32(TensorProto_BOOL), Int32Data: []int32{1}})),
			Node("If", "branch", []string{"cond"}, []string{"Y0"}, AttrGraph("then_branch", thenG), AttrGraph("else_branch", elseG)),
			Node("Loop", "loop", []string{"", "cond", "Y0"}, []string{"Y"}, AttrGraph("body", body)),
			everyAttr,
			Node("Cast", "half", []string{"Z"}, []string{"Zh"}, AttrInt("to", int64(TensorProto_FLOAT16))),
			Node("LocalFn", "fn_call", []string{"Zh"}, []string{"out"}),
		},
		Initializer: []*TensorProto{
			ExternalTensor("W", TensorProto_FLOAT, []int64{2}, "weights.bin", 0, 8),
			FloatTensor("B", []int64{2}, []float32{0.5, -0.5}),
			{Name: "H", Dims: []int64{2}, DataType: int32(TensorProto_FLOAT16), Int32Data: []int32{0x3c00, 0x7bff}},
			{Name: "D", Dims: []int64{1}, DataType: int32(TensorProto_DOUBLE), DoubleData: []float64{math.Pi}},
		},
		SparseInitializer: []*SparseTensorProto{sparse},
		Input:             []*ValueInfoProto{TensorValueInfo("X", TensorProto_FLOAT, "batch", 2), TensorValueInfo("B", TensorProto_FLOAT, 2)},
		Output:            []*ValueInfoProto{TensorValueInfo("out", TensorProto_FLOAT16, "batch", 2)},
		ValueInfo:         []*ValueInfoProto{TensorValueInfo("Y", TensorProto_FLOAT, "batch", 2)},
		QuantizationAnnotation: []*TensorAnnotation{{TensorName: "Y",
			QuantParameterTensorNames: []*StringStringEntryProto{{Key: "SCALE_TENSOR", Value: "B"}}}},
		MetadataProps: meta,
	}
	m := NewModel(g, 17)
	m.OpsetImport = append(m.OpsetImport, &OperatorSetIdProto{Domain: "com.example", Version: 1})
	m.ProducerVersion = "2.5.0"
	m.DocString = "rich test model"
	m.ModelVersion = 3
	m.MetadataProps = []*StringStringEntryProto{{Key: "author", Value: "tests"}, {Key: "license", Value: "none"}}
	m.TrainingInfo = []*TrainingInfoProto{{
		Initialization: &GraphProto{Name: "init", Node: []*NodeProto{Node("Constant", "", nil, []string{"B"},
			AttrTensor("value", FloatTensor("", []int64{2}, []float32{0, 0})))}},
		Algorithm:             &GraphProto{Name: "algo", Node: []*NodeProto{Node("Identity", "", []string{"B"}, []string{"B_new"})}},
		InitializationBinding: []*StringStringEntryProto{{Key: "B", Value: "B"}},
		UpdateBinding:         []*StringStringEntryProto{{Key: "B", Value: "B_new"}},
	}}
	m.Functions = []*FunctionProto{{
		Name:           "LocalFn",
		Domain:         "",
		Input:          []string{"x"},
		Output:         []string{"y"},
		Attribute:      []string{"alpha"},
		AttributeProto: []*AttributeProto{AttrFloat("beta", 0.1)},
		Node:           []*NodeProto{Node("Relu", "", []string{"x"}, []string{"y"})},
		OpsetImport:    []*OperatorSetIdProto{{Version: 17}},
		ValueInfo:      []*ValueInfoProto{TensorValueInfo("y", TensorProto_FLOAT16)},
		MetadataProps:  meta,
		DocString:      "a local function",
	}}
	return m
}

// withUnknownField appends a field this schema does not name, as a newer
// IR version would write.
func withUnknownField(m *ModelProto) *ModelProto {
	var b []byte
	b = protowire.AppendTag(b, 99, protowire.BytesType)
	b = protowire.AppendString(b, "future")
	m.Graph.ProtoReflect().SetUnknown(b)
	return m
}

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		model func(t *testing.T, dir string) *ModelProto
	}{
		{"tiny", func(*testing.T, string) *ModelProto { return tinyModel() }},
		{"rich", richModel},
		{"unknown fields", func(*testing.T, string) *ModelProto { return withUnknownField(tinyModel()) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			m := tc.model(t, dir)
			first, err := Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "model.onnx")
			if err := Save(m, path); err != nil {
				t.Fatal(err)
			}
			loaded, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(m, loaded.Proto) {
				t.Error("loaded model differs from the saved one")
			}
			second, err := Marshal(loaded.Proto)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(first, second) {
				t.Errorf("marshal after load is not byte-identical (%d vs %d bytes)", len(first), len(second))
			}
			onDisk, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(first, onDisk) {
				t.Error("saved file differs from Marshal")
			}
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if strings.Contains(e.Name(), ".tmp") {
					t.Errorf("temporary file %s left behind", e.Name())
				}
			}
		})
	}
}

const testdataRoot = "/usr/share/libonnx-testdata/data"

// TestRoundTripRealModels loads the ONNX project's own test models (Debian's
// libonnx-testdata: node tests, converted PyTorch modules and real networks)
// and checks that one save makes them byte-stable.
func TestRoundTripRealModels(t *testing.T) {
	var paths []string
	filepath.WalkDir(testdataRoot, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "model.onnx" {
			paths = append(paths, p)
		}
		return nil
	})
	if len(paths) == 0 {
		t.Skipf("no models under %s (install libonnx-testdata)", testdataRoot)
	}
	if testing.Short() {
		paths = paths[:min(len(paths), 40)]
	}
	loaded, empty := 0, 0
	for _, p := range paths {
		m, err := Load(p)
		if errors.Is(err, ErrEmptyGraph) {
			empty++
			continue
		}
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		loaded++
		once, err := Marshal(m.Proto)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		again, err := LoadBytes(once, p)
		if err != nil {
			t.Errorf("%s: reload after save: %v", p, err)
			continue
		}
		if !proto.Equal(m.Proto, again.Proto) {
			t.Errorf("%s: model changed by a save", p)
		}
		twice, err := Marshal(again.Proto)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if !bytes.Equal(once, twice) {
			t.Errorf("%s: not byte-stable after one save", p)
		}
	}
	t.Logf("%d models round-tripped, %d with empty graphs skipped", loaded, empty)
	if loaded < len(paths)/2 {
		t.Errorf("only %d of %d models loaded", loaded, len(paths))
	}
}

func TestLoadErrors(t *testing.T) {
	good, err := Marshal(tinyModel())
	if err != nil {
		t.Fatal(err)
	}
	noNodes := tinyModel()
	noNodes.Graph.Node = nil
	emptyGraph, _ := Marshal(noNodes)
	noGraph := tinyModel()
	noGraph.Graph = nil
	noGraphBytes, _ := Marshal(noGraph)
	noIR := tinyModel()
	noIR.IrVersion = 0
	noIRBytes, _ := Marshal(noIR)
	otherProto, _ := proto.Marshal(&TensorProto{Dims: []int64{3}, DataType: 1, FloatData: []float32{1, 2, 3}})

	tests := []struct {
		name   string
		data   []byte // nil: no file at all
		is     error
		wants  []string
		noFile bool
	}{
		{name: "missing", noFile: true, is: fs.ErrNotExist, wants: []string{"file does not exist", "check the path"}},
		{name: "empty", data: []byte{}, is: ErrEmptyFile, wants: []string{"file is empty (0 bytes)", "export the model again"}},
		{name: "npy", data: []byte("\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"),
			is: ErrNotModel, wants: []string{"not an ONNX model: found a NumPy .npy array"}},
		{name: "npz", data: []byte("PK\x03\x04\x14\x00\x00\x00"), is: ErrNotModel, wants: []string{"zip archive"}},
		{name: "pickle", data: []byte("\x80\x04\x95\x10\x00\x00"), is: ErrNotModel, wants: []string{"Python pickle"}},
		{name: "json", data: []byte(`  {"inputs": [1, 2, 3]}`), is: ErrNotModel, wants: []string{"found JSON text", "binary protobuf"}},
		{name: "text", data: []byte("ir_version: 8\ngraph {\n}\n"), is: ErrNotModel, wants: []string{"found a text file"}},
		{name: "onnx text", data: []byte("<ir_version: 8, opset_import: [\"\" : 17]>\nagraph (float[N] X) => (float[N] Y) {\n Y = Relu(X)\n}\n"),
			is: ErrNotModel, wants: []string{"ONNX text format"}},
		{name: "garbage", data: []byte{0xff, 0xff, 0xff, 0xff, 0x00, 0x01, 0x02}, is: ErrNotModel,
			wants: []string{"not an ONNX model: protobuf decoding failed", "want a binary ModelProto"}},
		{name: "other protobuf", data: otherProto, is: ErrNotModel, wants: []string{"not an ONNX model"}},
		{name: "truncated", data: good[:len(good)-9], is: ErrTruncated,
			wants: []string{"model file is truncated", "ends in the middle of a field", "copy the model again"}},
		{name: "no graph", data: noGraphBytes, is: ErrNotModel, wants: []string{"has no graph"}},
		{name: "no ir_version", data: noIRBytes, is: ErrNotModel, wants: []string{"has no ir_version"}},
		{name: "empty graph", data: emptyGraph, is: ErrEmptyGraph, wants: []string{`graph has no nodes: graph "tiny" is empty`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "model.onnx")
			if !tc.noFile {
				if err := os.WriteFile(path, tc.data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, err := Load(path)
			var le *LoadError
			if !errors.As(err, &le) {
				t.Fatalf("error %v (%T), want *LoadError", err, err)
			}
			if le.Path != path || !strings.HasPrefix(err.Error(), "load model "+path+": ") {
				t.Errorf("error %q does not name the file", err)
			}
			if !errors.Is(err, tc.is) {
				t.Errorf("error %q does not wrap %v", err, tc.is)
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

func TestLoadDirectory(t *testing.T) {
	_, err := Load(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("error = %v, want a directory error", err)
	}
}

func TestExternalDataChecks(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret.bin"), make([]byte, 64), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		location string
		offset   int64
		length   int64
		where    func(m *ModelProto, t *TensorProto)
		want     string
	}{
		{name: "absolute", location: filepath.Join(outside, "secret.bin"), length: 8,
			want: "is absolute; want a path relative to the model folder"},
		{name: "dotdot", location: "../secret.bin", length: 8, want: `"../secret.bin" escapes the model folder`},
		{name: "dotdot inside", location: "sub/../../secret.bin", length: 8, want: "escapes the model folder"},
		{name: "symlink", location: "link.bin", length: 8, want: "resolves through a symlink"},
		{name: "symlinked dir", location: "linkdir/secret.bin", length: 8, want: "resolves through a symlink"},
		{name: "missing", location: "nope.bin", length: 8, want: `external data file "nope.bin" not found`},
		{name: "beyond end", location: "w.bin", offset: 12, length: 8, want: "range [12, 20) lies beyond the end"},
		{name: "length mismatch", location: "w.bin", length: 4, want: "external data length is 4 bytes, want 8"},
		{name: "directory", location: "sub", length: 8, want: "is not a regular file"},
		{name: "in constant", location: "../secret.bin", length: 8,
			where: func(m *ModelProto, t *TensorProto) {
				m.Graph.Node = append(m.Graph.Node, Node("Constant", "c", nil, []string{"cv"}, AttrTensor("value", t)))
			},
			want: `node "c" attribute "value": tensor "ext"`},
		{name: "in subgraph", location: "/etc/passwd", length: 8,
			where: func(m *ModelProto, t *TensorProto) {
				sub := &GraphProto{Name: "then", Initializer: []*TensorProto{t}}
				m.Graph.Node = append(m.Graph.Node, Node("If", "if", []string{"c"}, []string{"o"}, AttrGraph("then_branch", sub)))
			},
			want: `node "if" attribute "then_branch" > graph "then" initializer "ext"`},
		{name: "in function", location: "../secret.bin", length: 8,
			where: func(m *ModelProto, t *TensorProto) {
				m.Functions = []*FunctionProto{{Name: "F", Node: []*NodeProto{Node("Constant", "", nil, []string{"k"}, AttrTensor("value", t))}}}
			},
			want: `function "F" > node Constant#0`},
		{name: "in training graph", location: "../secret.bin", length: 8,
			where: func(m *ModelProto, t *TensorProto) {
				m.TrainingInfo = []*TrainingInfoProto{{Algorithm: &GraphProto{Name: "algo", Initializer: []*TensorProto{t}}}}
			},
			want: `training_info[0] algorithm graph "algo"`},
		{name: "ok", location: "w.bin", offset: 8, length: 8},
		{name: "ok in subfolder", location: "sub/w.bin", length: 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			must := func(err error) {
				if err != nil {
					t.Fatal(err)
				}
			}
			must(os.WriteFile(filepath.Join(dir, "w.bin"), make([]byte, 16), 0o644))
			must(os.Mkdir(filepath.Join(dir, "sub"), 0o755))
			must(os.WriteFile(filepath.Join(dir, "sub", "w.bin"), make([]byte, 8), 0o644))
			must(os.Symlink(filepath.Join(outside, "secret.bin"), filepath.Join(dir, "link.bin")))
			must(os.Symlink(outside, filepath.Join(dir, "linkdir")))
			m := tinyModel()
			ext := ExternalTensor("ext", TensorProto_FLOAT, []int64{2}, tc.location, tc.offset, tc.length)
			if tc.where != nil {
				tc.where(m, ext)
			} else {
				m.Graph.Initializer = append(m.Graph.Initializer, ext)
			}
			path := filepath.Join(dir, "model.onnx")
			must(Save(m, path))
			_, err := Load(path)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("loaded, want an error containing %q", tc.want)
			}
			if !errors.Is(err, ErrExternalData) {
				t.Errorf("error %q does not wrap ErrExternalData", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestResolveExternal(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.bin"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ResolveExternal(dir, "./a.bin")
	if err != nil {
		t.Fatal(err)
	}
	real, _ := filepath.EvalSymlinks(filepath.Join(dir, "a.bin"))
	if got != real {
		t.Errorf("ResolveExternal = %q, want %q", got, real)
	}
	for _, bad := range []string{"", "/a.bin", "..", "../a.bin", `\a.bin`} {
		if _, err := ResolveExternal(dir, bad); err == nil {
			t.Errorf("ResolveExternal(%q) succeeded, want an error", bad)
		}
	}
}

func TestLoadedModelConstants(t *testing.T) {
	dir := t.TempDir()
	m := richModel(t, dir)
	path := filepath.Join(dir, "model.onnx")
	if err := Save(m, path); err != nil {
		t.Fatal(err)
	}
	lm, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if lm.Dir != dir || lm.Index == nil {
		t.Fatalf("Dir %q, Index %v", lm.Dir, lm.Index)
	}
	w, err := lm.Index.ConstantValue("W")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(w.Data, le32(1, 2)) {
		t.Errorf("external W = % x", w.Data)
	}
	s, err := lm.Index.ConstantValue("S")
	if err != nil {
		t.Fatal(err)
	}
	vals, _ := s.Float32s()
	if want := []float32{5, 0, 0, 7}; len(vals) != 4 || vals[0] != want[0] || vals[3] != want[3] || vals[1] != 0 {
		t.Errorf("sparse S = %v, want %v", vals, want)
	}
}

func TestLoadTruncatedAnywhere(t *testing.T) {
	dir := t.TempDir()
	full, err := Marshal(richModel(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, frac := range []float64{0.02, 0.1, 0.5, 0.9, 0.999} {
		cut := int(float64(len(full)) * frac)
		_, err := LoadBytes(full[:cut], filepath.Join(dir, "model.onnx"))
		if !errors.Is(err, ErrTruncated) {
			t.Errorf("cut at %d of %d bytes: error %v, want ErrTruncated", cut, len(full), err)
		}
	}
}

func TestExternalSymlinkInsideFolder(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data", "w.bin"), make([]byte, 8), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("data", "w.bin"), filepath.Join(dir, "w.bin")); err != nil {
		t.Fatal(err)
	}
	m := tinyModel()
	m.Graph.Initializer = append(m.Graph.Initializer, ExternalTensor("ext", TensorProto_FLOAT, []int64{2}, "w.bin", 0, -1))
	path := filepath.Join(dir, "model.onnx")
	if err := Save(m, path); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err != nil {
		t.Errorf("symlink within the model folder refused: %v", err)
	}
}
