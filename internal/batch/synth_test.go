package batch

import (
	"bytes"
	"strings"
	"testing"

	"fp16audit/internal/tensor"
)

func TestSynthesize(t *testing.T) {
	specs := []InputSpec{
		{Name: "pixel_values", DType: tensor.Float32, Dims: []int64{-1, 3, 8, 8}, DimNames: []string{"batch"}},
		{Name: "input_ids", DType: tensor.Int64, Dims: []int64{-1, -1}, DimNames: []string{"batch_size", "seq"}},
		{Name: "attention_mask", DType: tensor.Int64, Dims: []int64{-1, -1}, DimNames: []string{"batch_size", "seq"}},
		{Name: "flag", DType: tensor.Bool, Dims: []int64{4}},
		{Name: "half", DType: tensor.Float16, Dims: []int64{-1, 16}},
	}
	pins := map[string][]int64{"input_ids": {2, 7}}
	opt := Options{Seed: 42, SyntheticBatches: 3, Shapes: pins}
	a, notes, err := Load(specs, opt)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := Load(specs, opt)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 3 {
		t.Fatalf("%d batches, want 3", len(a))
	}
	if !strings.Contains(notes[0].Text, "synthetic") || notes[0].Input != "" {
		t.Errorf("first note %+v does not say synthetic data was used", notes[0])
	}
	wantShapes := []string{"[1,3,8,8]", "[2,7]", "[2,7]", "[4]", "[1,16]"}
	for k := range a {
		for i, x := range a[k].Inputs {
			if got := tensor.ShapeString(x.Shape); got != wantShapes[i] || x.DType != specs[i].DType || x.Name != specs[i].Name {
				t.Errorf("batch %d input %d: %s %s %q, want %s %s", k, i, got, x.DType, x.Name, wantShapes[i], specs[i].DType)
			}
			if !bytes.Equal(x.Data, b[k].Inputs[i].Data) {
				t.Errorf("batch %d input %d differs between runs with the same seed", k, i)
			}
		}
	}
	if bytes.Equal(a[0].Inputs[0].Data, a[1].Inputs[0].Data) {
		t.Error("batches 0 and 1 are identical")
	}
	c, _, _ := Load(specs, Options{Seed: 43, SyntheticBatches: 1, Shapes: pins})
	if bytes.Equal(a[0].Inputs[0].Data, c[0].Inputs[0].Data) {
		t.Error("seeds 42 and 43 gave the same data")
	}

	// Values: normal floats, integers in [0,10), bools 0/1.
	big, _, err := Load(specs[:2], Options{Shapes: map[string][]int64{"pixel_values": {64, 3, 8, 8}, "input_ids": {64, 64}}})
	if err != nil {
		t.Fatal(err)
	}
	v := floats(t, big[0].Inputs[0])
	var sum, sq float64
	for _, f := range v {
		sum += float64(f)
		sq += float64(f) * float64(f)
	}
	mean, variance := sum/float64(len(v)), sq/float64(len(v))-(sum/float64(len(v)))*(sum/float64(len(v)))
	if mean < -0.05 || mean > 0.05 || variance < 0.95 || variance > 1.05 {
		t.Errorf("float input mean %.3f variance %.3f, want about N(0,1)", mean, variance)
	}
	seen := map[float32]bool{}
	for _, f := range floats(t, big[0].Inputs[1]) {
		if f < 0 || f >= 10 || f != float32(int(f)) {
			t.Fatalf("integer input holds %v", f)
		}
		seen[f] = true
	}
	if len(seen) != 10 {
		t.Errorf("integer input used %d distinct values, want all 10", len(seen))
	}
	for _, f := range floats(t, a[0].Inputs[3]) {
		if f != 0 && f != 1 {
			t.Errorf("bool input holds %v", f)
		}
	}
}

func TestSynthesizeErrors(t *testing.T) {
	tests := []struct {
		name  string
		specs []InputSpec
		pins  map[string][]int64
		want  string
	}{
		{"unknown seq dim", []InputSpec{{Name: "input_ids", DType: tensor.Int64, Dims: []int64{-1, -1}, DimNames: []string{"batch", "sequence"}}}, nil,
			`input "input_ids": cannot make a synthetic batch: dim 1 ("sequence") of [batch,sequence] has no fixed size; pass it with --shape input_ids=1x<sequence>, or pass real batches with -i`},
		{"unnamed dim", []InputSpec{{Name: "x", DType: tensor.Float32, Dims: []int64{-1, 3, -1}}}, nil,
			`dim 2 ("dim2") of [?,3,?] has no fixed size; pass it with --shape x=1x3x<dim2>`},
		{"no shape", []InputSpec{{Name: "x", DType: tensor.Float32}}, nil,
			`input "x" has no shape in the model; give one with --shape x=DIMS`},
		{"conflicting pins", []InputSpec{
			{Name: "a", DType: tensor.Int64, Dims: []int64{-1, -1}, DimNames: []string{"b", "seq"}},
			{Name: "m", DType: tensor.Int64, Dims: []int64{-1, -1}, DimNames: []string{"b", "seq"}},
		}, map[string][]int64{"a": {1, 5}, "m": {1, 6}}, `--shape pins dim "seq" to both 5 and 6`},
		{"too large", []InputSpec{{Name: "x", DType: tensor.Float32, Dims: []int64{-1, -1}, DimNames: []string{"", "n"}}},
			map[string][]int64{"x": {1 << 20, 1 << 20}}, `synthetic shape [1048576,1048576] is too large`},
		{"string input", []InputSpec{{Name: "s", DType: tensor.String, Dims: []int64{1}}}, nil,
			`input "s": cannot make synthetic string data`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Load(tc.specs, Options{Shapes: tc.pins})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error\n%v\nwant it to contain\n%s", err, tc.want)
			}
		})
	}
}
