package batch

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

// maxPBFile bounds a serialized TensorProto. Protobuf messages cannot exceed
// 2 GiB; bigger tensors must use external data, which DecodeTensor reads.
const maxPBFile = 2 << 30

// ReadPB reads a file holding one serialized ONNX TensorProto, as the ONNX
// test-data folders do. External data is resolved against the file's folder.
// The tensor keeps the name stored in the proto; errors start with path.
func ReadPB(path string) (*tensor.Tensor, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, pathError(path, err)
	}
	if st.Size() > maxPBFile {
		return nil, &LoadError{Path: path, Err: fmt.Errorf("%d bytes is larger than a protobuf message can be", st.Size())}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, pathError(path, err)
	}
	var tp onnx.TensorProto
	if err := proto.Unmarshal(b, &tp); err != nil {
		return nil, &LoadError{Path: path, Err: fmt.Errorf("not an ONNX TensorProto: %w", err)}
	}
	t, err := onnx.DecodeTensor(&tp, filepath.Dir(path))
	if err != nil {
		return nil, &LoadError{Path: path, Err: err}
	}
	return t, nil
}

// ReadTestDataSet reads an ONNX test-data folder: input_0.pb, input_1.pb, …
// in index order, and output_0.pb, … likewise. The indices must run from 0
// without gaps, as the ONNX test runner expects.
func ReadTestDataSet(dir string) (inputs, outputs []*tensor.Tensor, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, pathError(dir, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if !e.IsDir() {
			names = append(names, e.Name())
		}
	}
	if inputs, err = readIndexed(dir, names, "input_"); err != nil {
		return nil, nil, err
	}
	if len(inputs) == 0 {
		return nil, nil, &LoadError{Path: dir, Err: fmt.Errorf("no input_0.pb: not an ONNX test-data folder")}
	}
	if outputs, err = readIndexed(dir, names, "output_"); err != nil {
		return nil, nil, err
	}
	return inputs, outputs, nil
}

// readIndexed reads the files prefix<i>.pb for i = 0, 1, … from dir.
func readIndexed(dir string, names []string, prefix string) ([]*tensor.Tensor, error) {
	var idx []int
	for _, n := range names {
		num, ok := strings.CutPrefix(n, prefix)
		if !ok {
			continue
		}
		num, ok = strings.CutSuffix(num, ".pb")
		if !ok {
			continue
		}
		i, err := strconv.Atoi(num)
		if err != nil || i < 0 || strconv.Itoa(i) != num {
			return nil, &LoadError{Path: filepath.Join(dir, n), Err: fmt.Errorf("want a name like %s0.pb", prefix)}
		}
		idx = append(idx, i)
	}
	slices.Sort(idx)
	out := make([]*tensor.Tensor, 0, len(idx))
	for want, i := range idx {
		if i != want {
			return nil, &LoadError{Path: dir, Err: fmt.Errorf("missing %s%d.pb (found %s%d.pb)", prefix, want, prefix, i)}
		}
		t, err := ReadPB(filepath.Join(dir, fmt.Sprintf("%s%d.pb", prefix, i)))
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}
