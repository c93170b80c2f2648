package onnx

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// TestAliasedDecodeEqualsUnmarshal: the aliasing decoder gives the same
// message as proto.Unmarshal on every fixture model and every model of the
// ONNX backend test data, and the large raw_data it returns lies inside
// the serialized bytes.
func TestAliasedDecodeEqualsUnmarshal(t *testing.T) {
	paths, _ := filepath.Glob(filepath.Join("..", "..", "fixtures", "models", "*.onnx"))
	more, _ := filepath.Glob(filepath.Join("..", "..", "fixtures", "torch", "cases", "*", "model.onnx"))
	paths = append(paths, more...)
	backend, _ := filepath.Glob(filepath.Join(testdataRoot, "*", "*", "model.onnx"))
	paths = append(paths, backend...)
	if len(paths) < 10 {
		t.Fatalf("only %d models found", len(paths))
	}
	aliased := 0
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		want := &ModelProto{}
		wantErr := proto.Unmarshal(data, want)
		got := &ModelProto{}
		gotErr := unmarshalAliased(data, got)
		if (wantErr == nil) != (gotErr == nil) {
			t.Fatalf("%s: proto.Unmarshal error %v, aliased decoder error %v", p, wantErr, gotErr)
		}
		if wantErr != nil {
			continue
		}
		if !proto.Equal(want, got) {
			t.Fatalf("%s: the aliased decode differs from proto.Unmarshal", p)
		}
		lo, hi := &data[0], &data[len(data)-1]
		for _, init := range got.GetGraph().GetInitializer() {
			if r := init.GetRawData(); len(r) >= aliasMin {
				if p0 := &r[0]; uintptrOf(p0) < uintptrOf(lo) || uintptrOf(p0) > uintptrOf(hi) {
					t.Fatalf("%s: initializer %q was copied, not aliased", p, init.GetName())
				}
				aliased++
			}
		}
	}
	if aliased == 0 {
		t.Error("no initializer was large enough to be aliased; the test shows nothing")
	}
}

// TestAliasedDecodeEdgeCases: repeated raw_data (the last wins), a graph
// field given twice (merged), unknown fields, and broken input.
func TestAliasedDecodeEdgeCases(t *testing.T) {
	big := make([]byte, 2*aliasMin)
	for i := range big {
		big[i] = byte(i)
	}
	t1 := &TensorProto{Name: "w", Dims: []int64{int64(len(big)) / 4}, DataType: int32(TensorProto_FLOAT), RawData: big}
	g1 := &GraphProto{Name: "g", Initializer: []*TensorProto{t1}, Node: []*NodeProto{Node("Relu", "r", []string{"x"}, []string{"y"})}}
	m := &ModelProto{IrVersion: 8, Graph: g1}
	data, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	// A second graph field merges: its node and initializer are appended.
	g2, _ := proto.Marshal(&GraphProto{Node: []*NodeProto{Node("Relu", "r2", []string{"y"}, []string{"z"})},
		Initializer: []*TensorProto{{Name: "v", RawData: big[:10]}}})
	data = protoAppendBytes(data, modelGraphField, g2)
	// An unknown field survives.
	data = protoAppendBytes(data, 99, []byte("future"))
	want := &ModelProto{}
	if err := proto.Unmarshal(data, want); err != nil {
		t.Fatal(err)
	}
	got := &ModelProto{}
	if err := unmarshalAliased(data, got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(want, got) || len(got.Graph.Node) != 2 || len(got.Graph.Initializer) != 2 {
		t.Fatalf("merged decode differs: %v", got)
	}
	// A tensor with raw_data twice: the last value wins.
	tb, _ := proto.Marshal(&TensorProto{Name: "t", RawData: big})
	tb = protoAppendBytes(tb, tensorRawDataField, big[:aliasMin+1])
	tt, err := unmarshalTensor(tb)
	if err != nil || len(tt.RawData) != aliasMin+1 {
		t.Fatalf("repeated raw_data: %d bytes, %v; want the last one (%d bytes)", len(tt.RawData), err, aliasMin+1)
	}
	for _, bad := range [][]byte{data[:len(data)-3], {0xff, 0xff, 0xff}, append([]byte{0x3a, 0x05}, 1, 2)} {
		if err := unmarshalAliased(bad, &ModelProto{}); err == nil {
			t.Errorf("broken bytes %x accepted", bad[:min(8, len(bad))])
		}
	}
}

func protoAppendBytes(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func uintptrOf(p *byte) uintptr { return uintptr(unsafe.Pointer(p)) }
