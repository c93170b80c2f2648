package batch

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"fp16audit/internal/tensor"
)

var (
	imageSpecs = []InputSpec{{Name: "pixel_values", DType: tensor.Float32, Dims: []int64{-1, 3, 4, 4}, DimNames: []string{"batch", "", "", ""}}}
	textSpecs  = []InputSpec{
		{Name: "input_ids", DType: tensor.Int64, Dims: []int64{-1, -1}, DimNames: []string{"batch", "seq"}},
		{Name: "attention_mask", DType: tensor.Int64, Dims: []int64{-1, -1}, DimNames: []string{"batch", "seq"}},
	}
)

func f32(name string, shape []int64, fill float32) *tensor.Tensor {
	v := make([]float32, tensor.NumElements(shape))
	for i := range v {
		v[i] = fill
	}
	return tensor.FromFloat32s(name, shape, v)
}

func i64(name string, shape []int64, fill int64) *tensor.Tensor {
	n := tensor.NumElements(shape)
	data := make([]byte, 8*n)
	for i := range n {
		binary.LittleEndian.PutUint64(data[8*i:], uint64(fill))
	}
	return &tensor.Tensor{Name: name, DType: tensor.Int64, Shape: shape, Data: data}
}

func writeFile(t *testing.T, path string, b []byte) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func writeNPY(t *testing.T, path string, x *tensor.Tensor) string {
	t.Helper()
	b, err := EncodeNPY(x)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, path, b)
}

func writeNPZ(t *testing.T, path string, compress bool, xs ...*tensor.Tensor) string {
	t.Helper()
	b, err := EncodeNPZ(xs, compress)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, path, b)
}

// summary renders batches compactly: source relative to dir, then each
// input's name, dtype, shape and first value.
func summary(t *testing.T, dir string, bs []Batch) []string {
	t.Helper()
	var out []string
	for _, b := range bs {
		parts := []string{strings.ReplaceAll(b.Source, dir+string(filepath.Separator), "")}
		for _, x := range b.Inputs {
			first := "-"
			if v := floats(t, x); len(v) > 0 {
				first = strconv.FormatFloat(float64(v[0]), 'g', -1, 32)
			}
			parts = append(parts, x.Name+":"+x.DType.String()+tensor.ShapeString(x.Shape)+"="+first)
		}
		out = append(out, strings.Join(parts, " "))
	}
	return out
}

func TestLoadLayouts(t *testing.T) {
	dir := t.TempDir()
	p := func(parts ...string) string { return filepath.Join(append([]string{dir}, parts...)...) }

	img := writeNPY(t, p("img.npy"), f32("whatever", []int64{2, 3, 4, 4}, 1))
	for i := range 3 {
		writeNPY(t, p("imgs", "b"+strconv.Itoa(i)+".npy"), f32("x", []int64{1, 3, 4, 4}, float32(i)))
	}
	writeFile(t, p("imgs", "README.txt"), []byte("ignored"))
	writePB(t, p("img.pb"), f32("pixel_values", []int64{1, 3, 4, 4}, 5))

	ids, mask := i64("input_ids", []int64{1, 5}, 7), i64("attention_mask", []int64{1, 5}, 1)
	writeNPZ(t, p("text.npz"), true, mask, ids)
	writeNPZ(t, p("positional.npz"), false, i64("", []int64{1, 5}, 3), i64("", []int64{1, 5}, 4))
	writeNPZ(t, p("npzs", "a.npz"), false, ids, mask)
	writeNPZ(t, p("npzs", "b.npz"), true, i64("input_ids", []int64{2, 8}, 9), i64("attention_mask", []int64{2, 8}, 0))
	writeNPY(t, p("ids", "0.npy"), i64("", []int64{1, 5}, 1))
	writeNPY(t, p("ids", "1.npy"), i64("", []int64{1, 5}, 2))
	writeNPY(t, p("masks", "0.npy"), i64("", []int64{1, 5}, 1))
	writeNPY(t, p("masks", "1.npy"), i64("", []int64{1, 5}, 0))
	writeNPY(t, p("byname", "input_ids.npy"), i64("", []int64{1, 5}, 11))
	writeNPY(t, p("byname", "attention_mask.npy"), i64("", []int64{1, 5}, 12))
	writeNPY(t, p("mask.npy"), i64("", []int64{1, 5}, 1))
	writeNPY(t, p("ids.npy"), i64("", []int64{1, 5}, 2))

	// ONNX test data: names that match the model bind by name (note the
	// reversed order), unknown names bind in order.
	writePB(t, p("onnxtest", "input_0.pb"), i64("attention_mask", []int64{1, 5}, 1))
	writePB(t, p("onnxtest", "input_1.pb"), i64("input_ids", []int64{1, 5}, 42))
	writePB(t, p("onnxtest", "output_0.pb"), f32("logits", []int64{1, 2}, 0))
	for i := range 2 {
		writePB(t, p("sets", "test_data_set_"+strconv.Itoa(i), "input_0.pb"), i64("a", []int64{1, 3}, int64(10+i)))
		writePB(t, p("sets", "test_data_set_"+strconv.Itoa(i), "input_1.pb"), i64("b", []int64{1, 3}, int64(20+i)))
	}

	tests := []struct {
		name  string
		specs []InputSpec
		args  []string
		want  []string
	}{
		{"npy positional", imageSpecs, []string{img},
			[]string{"img.npy pixel_values:float32[2,3,4,4]=1"}},
		{"npy named", imageSpecs, []string{"pixel_values=" + img},
			[]string{"img.npy pixel_values:float32[2,3,4,4]=1"}},
		{"folder of npy is one batch each", imageSpecs, []string{p("imgs")},
			[]string{"imgs/b0.npy pixel_values:float32[1,3,4,4]=0", "imgs/b1.npy pixel_values:float32[1,3,4,4]=1", "imgs/b2.npy pixel_values:float32[1,3,4,4]=2"}},
		{"pb file", imageSpecs, []string{p("img.pb")},
			[]string{"img.pb pixel_values:float32[1,3,4,4]=5"}},
		{"npz binds members by name", textSpecs, []string{p("text.npz")},
			[]string{"text.npz input_ids:int64[1,5]=7 attention_mask:int64[1,5]=1"}},
		{"npz with savez positional names", textSpecs, []string{p("positional.npz")},
			[]string{"positional.npz input_ids:int64[1,5]=3 attention_mask:int64[1,5]=4"}},
		{"named npz picks its member", textSpecs, []string{"attention_mask=" + p("text.npz"), "input_ids=" + p("ids.npy")},
			[]string{"text.npz, ids.npy input_ids:int64[1,5]=2 attention_mask:int64[1,5]=1"}},
		{"folder of npz", textSpecs, []string{p("npzs")},
			[]string{"npzs/a.npz input_ids:int64[1,5]=7 attention_mask:int64[1,5]=1", "npzs/b.npz input_ids:int64[2,8]=9 attention_mask:int64[2,8]=0"}},
		{"one folder per input", textSpecs, []string{p("ids"), p("masks")},
			[]string{"ids/0.npy, masks/0.npy input_ids:int64[1,5]=1 attention_mask:int64[1,5]=1",
				"ids/1.npy, masks/1.npy input_ids:int64[1,5]=2 attention_mask:int64[1,5]=0"}},
		{"folder of npy named after inputs", textSpecs, []string{p("byname")},
			[]string{"byname input_ids:int64[1,5]=11 attention_mask:int64[1,5]=12"}},
		{"named then positional fills the rest", textSpecs, []string{p("ids.npy"), "input_ids=" + p("mask.npy")},
			[]string{"ids.npy, mask.npy input_ids:int64[1,5]=1 attention_mask:int64[1,5]=2"}},
		{"test-data folder by name", textSpecs, []string{p("onnxtest")},
			[]string{"onnxtest input_ids:int64[1,5]=42 attention_mask:int64[1,5]=1"}},
		{"test_data_set folders in order", textSpecs, []string{p("sets")},
			[]string{"sets/test_data_set_0 input_ids:int64[1,3]=10 attention_mask:int64[1,3]=20", "sets/test_data_set_1 input_ids:int64[1,3]=11 attention_mask:int64[1,3]=21"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs, _, err := Load(tc.specs, Options{Args: tc.args})
			if err != nil {
				t.Fatal(err)
			}
			got := summary(t, dir, bs)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	p := func(parts ...string) string { return filepath.Join(append([]string{dir}, parts...)...) }
	nhwc := writeNPY(t, p("nhwc.npy"), f32("", []int64{2, 4, 4, 3}, 0))
	nobatch := writeNPY(t, p("nobatch.npy"), f32("", []int64{3, 4, 4}, 0))
	wrong := writeNPY(t, p("wrong.npy"), f32("", []int64{2, 3, 5, 4}, 0))
	rank2 := writeNPY(t, p("rank2.npy"), f32("", []int64{2, 48}, 0))
	good := writeNPY(t, p("good.npy"), f32("", []int64{2, 3, 4, 4}, 0))
	idsF := writeNPY(t, p("ids_f.npy"), f32("", []int64{1, 5}, 1))
	ids := writeNPY(t, p("ids.npy"), i64("", []int64{1, 5}, 1))
	mask6 := writeNPY(t, p("mask6.npy"), i64("", []int64{1, 6}, 1))
	text := writeNPZ(t, p("text.npz"), false, i64("input_ids", []int64{1, 5}, 1), i64("attention_mask", []int64{1, 5}, 1))
	odd := writeNPZ(t, p("odd.npz"), false, i64("tokens", []int64{1, 5}, 1), i64("mask", []int64{1, 5}, 1))
	writeNPY(t, p("two", "0.npy"), i64("", []int64{1, 5}, 1))
	writeNPY(t, p("two", "1.npy"), i64("", []int64{1, 5}, 1))
	writeNPY(t, p("mixed", "0.npy"), i64("", []int64{1, 5}, 1))
	writeNPZ(t, p("mixed", "1.npz"), false, i64("input_ids", []int64{1, 5}, 1))
	os.MkdirAll(p("empty"), 0o755)
	badNPY := writeFile(t, p("bad.npy"), []byte("\x93NUMPY\x01\x00\x05\x00{'a':"))

	tests := []struct {
		name   string
		specs  []InputSpec
		args   []string
		shapes map[string][]int64
		want   string
	}{
		{"channels-last", imageSpecs, []string{nhwc}, nil,
			nhwc + `: input "pixel_values": want shape [batch,3,4,4], got [2,4,4,3] (channels-last? transpose the batch to NCHW)`},
		{"missing batch dim", imageSpecs, []string{nobatch}, nil,
			nobatch + `: input "pixel_values": want shape [batch,3,4,4], got [3,4,4] (missing batch dimension? add one with x[None])`},
		{"fixed dim mismatch", imageSpecs, []string{wrong}, nil,
			wrong + `: input "pixel_values": want shape [batch,3,4,4], got [2,3,5,4]`},
		{"rank mismatch", imageSpecs, []string{rank2}, nil,
			rank2 + `: input "pixel_values": want shape [batch,3,4,4], got [2,48]`},
		{"pinned batch", imageSpecs, []string{good}, map[string][]int64{"pixel_values": {4, 3, 4, 4}},
			good + `: input "pixel_values": want shape [batch=4,3,4,4], got [2,3,4,4]; --shape pixel_values=4x3x4x4 pins it`},
		{"pin contradicts model", imageSpecs, []string{good}, map[string][]int64{"pixel_values": {1, 1, 4, 4}},
			`--shape pixel_values=1x1x4x4: input "pixel_values" has shape [batch,3,4,4] in the model; a pin may only fix its symbolic dimensions`},
		{"pin names no input", imageSpecs, []string{good}, map[string][]int64{"pixels": {1, 3, 4, 4}},
			`--shape pixels: the model has no input "pixels"; its inputs are "pixel_values"`},
		{"float data for int input", textSpecs, []string{"input_ids=" + idsF, "attention_mask=" + ids}, nil,
			idsF + `: input "input_ids": want dtype int64, got float32; the model wants integer data (token ids, indices or masks), not floats; save the batch as int64`},
		{"float32 for float16 input", []InputSpec{{Name: "x", DType: tensor.Float16, Dims: []int64{-1, 3, 4, 4}}}, []string{good}, nil,
			good + `: input "x": want dtype float16, got float32; the model takes float16 input (exported after model.half()?)`},
		{"bool for float input", imageSpecs, []string{writeNPY(t, p("bool.npy"), &tensor.Tensor{DType: tensor.Bool, Shape: []int64{1, 3, 4, 4}, Data: make([]byte, 48)})}, nil,
			p("bool.npy") + `: input "pixel_values": want dtype float32, got bool; save the batch as float32`},
		{"int64 for int32 input", []InputSpec{{Name: "idx", DType: tensor.Int32, Dims: []int64{1, 5}}}, []string{ids}, nil,
			ids + `: input "idx": want dtype int32, got int64; save the batch as int32`},
		{"missing input", textSpecs, []string{"input_ids=" + ids}, nil,
			`no batch for input "attention_mask"; the model's inputs are "input_ids", "attention_mask"; bind each with -i name=path`},
		{"unknown input name", textSpecs, []string{"token_ids=" + ids}, nil,
			ids + `: -i token_ids=` + ids + `: the model has no input "token_ids"; its inputs are "input_ids", "attention_mask"`},
		{"bound twice", textSpecs, []string{text, "input_ids=" + ids}, nil,
			text + `: input "input_ids" is bound twice: by -i input_ids=` + ids + ` and by -i ` + text},
		{"too many positional", imageSpecs, []string{good, good}, nil,
			good + `: more -i values than model inputs: every input is already bound; the model's inputs are "pixel_values"`},
		{"batch counts differ", textSpecs, []string{p("two"), ids}, nil,
			ids + `: gives 1 batches but ` + p("two") + ` gives 2; every -i must give the same number of batches`},
		{"dim names disagree", textSpecs, []string{ids, mask6}, nil,
			mask6 + `: input "attention_mask": dim "seq" is 6, but input "input_ids" (` + ids + `) has "seq" = 5; inputs sharing a dim name must agree`},
		{"npz members match nothing", textSpecs, []string{odd}, nil,
			odd + `: holds "tokens", "mask", which do not match the model's inputs "input_ids", "attention_mask"; name the arrays after the inputs or bind one with -i name=path`},
		{"named npz lacks member", textSpecs, []string{"input_ids=" + odd, "attention_mask=" + ids}, nil,
			odd + `: holds "tokens", "mask"; none is named "input_ids", so -i input_ids=… cannot pick one`},
		{"folder mixes npz and npy", textSpecs, []string{p("mixed")}, nil,
			p("mixed") + `: folder mixes .npz files with .npy/.pb files`},
		{"empty folder", imageSpecs, []string{p("empty")}, nil,
			p("empty") + `: folder holds no .npy, .npz or .pb files`},
		{"no such file", imageSpecs, []string{p("nope.npy")}, nil,
			p("nope.npy") + `: no such file or directory`},
		{"malformed npy", imageSpecs, []string{badNPY}, nil,
			badNPY + `: npy header: malformed header dict`},
		{"unknown extension", imageSpecs, []string{writeFile(t, p("x.bin"), []byte{1})}, nil,
			p("x.bin") + `: unknown batch file type ".bin"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Load(tc.specs, Options{Args: tc.args, Shapes: tc.shapes})
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("error\n%v\nwant it to start with\n%s", err, tc.want)
			}
		})
	}
}

func TestLoadConversions(t *testing.T) {
	dir := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	shape := []int64{1, 3, 4, 4}
	n := int(tensor.NumElements(shape))
	f64 := &tensor.Tensor{DType: tensor.Float64, Shape: shape, Data: make([]byte, 8*n)}
	u8 := &tensor.Tensor{DType: tensor.Uint8, Shape: shape, Data: bytes.Repeat([]byte{255}, n)}
	f16 := &tensor.Tensor{DType: tensor.Float16, Shape: shape, Data: bytes.Repeat([]byte{0x00, 0x3c}, n)}
	for i := range n {
		binary.LittleEndian.PutUint64(f64.Data[8*i:], math.Float64bits(0.5))
	}
	i32 := &tensor.Tensor{DType: tensor.Int32, Shape: []int64{1, 2}, Data: []byte{0xff, 0xff, 0xff, 0xff, 7, 0, 0, 0}}
	tests := []struct {
		name  string
		specs []InputSpec
		in    *tensor.Tensor
		want  []float32
		note  string
	}{
		{"float64", imageSpecs, f64, []float32{0.5}, "converted float64 data to float32"},
		{"uint8 pixels", imageSpecs, u8, []float32{255}, "converted uint8 data to float32 (values kept as they are, not rescaled)"},
		{"float16", imageSpecs, f16, []float32{1}, "converted float16 data to float32"},
		{"int32 ids", textSpecs[:1], i32, []float32{-1, 7}, "converted int32 data to int64"},
		{"uint8 ids", textSpecs[:1], &tensor.Tensor{DType: tensor.Uint8, Shape: []int64{1, 2}, Data: []byte{200, 3}}, []float32{200, 3}, "converted uint8 data to int64"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeNPY(t, p(tc.name+".npy"), tc.in)
			bs, notes, err := Load(tc.specs, Options{Args: []string{path}})
			if err != nil {
				t.Fatal(err)
			}
			x := bs[0].Inputs[0]
			if x.DType != tc.specs[0].DType || x.Name != tc.specs[0].Name {
				t.Fatalf("got %s %q", x.DType, x.Name)
			}
			if v := floats(t, x); !slices.Equal(v[:len(tc.want)], tc.want) {
				t.Errorf("values %v, want prefix %v", v, tc.want)
			}
			if want := []Note{{Input: tc.specs[0].Name, Text: tc.note}}; !slices.Equal(notes, want) {
				t.Errorf("notes %v, want %v", notes, want)
			}
		})
	}
	// A conversion applied to every batch of a folder is noted once.
	writeNPY(t, filepath.Join(dir, "many", "a.npy"), f64)
	writeNPY(t, filepath.Join(dir, "many", "b.npy"), f64)
	bs, notes, err := Load(imageSpecs, Options{Args: []string{filepath.Join(dir, "many")}})
	if err != nil || len(bs) != 2 || len(notes) != 1 {
		t.Errorf("folder: %d batches, notes %v, err %v", len(bs), notes, err)
	}
}

func TestParseShape(t *testing.T) {
	tests := []struct {
		in   string
		name string
		dims []int64
		err  string
	}{
		{"pixel_values=1x3x224x224", "pixel_values", []int64{1, 3, 224, 224}, ""},
		{"ids=2,128", "ids", []int64{2, 128}, ""},
		{"a=b=4", "a=b", []int64{4}, ""},
		{"x=0x3", "x", []int64{0, 3}, ""},
		{"1x3", "", nil, "want name=DIMS"},
		{"=1x3", "", nil, "missing the input name"},
		{"x=", "", nil, "missing the dimensions"},
		{"x=1x-3", "", nil, `dimension "-3" is not a non-negative integer`},
		{"x=1xx3", "", nil, "want dimensions like"},
		{"x=1x", "", nil, "want dimensions like"},
		{"x=ax3", "", nil, `dimension "a"`},
	}
	for _, tc := range tests {
		name, dims, err := ParseShape(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseShape(%q) error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || name != tc.name || !slices.Equal(dims, tc.dims) {
			t.Errorf("ParseShape(%q) = %q %v %v", tc.in, name, dims, err)
		}
	}
}
