package statsop_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"fp16audit/internal/ortcapi"
	"fp16audit/internal/statsop"
	"fp16audit/internal/tensor"
)

// subBatch returns samples [lo, hi) of t along axis 0, sharing t's bytes.
func subBatch(t *tensor.Tensor, lo, hi int64) *tensor.Tensor {
	per := int64(len(t.Data)) / t.Shape[0]
	shape := append([]int64{hi - lo}, t.Shape[1:]...)
	return &tensor.Tensor{Name: t.Name, DType: t.DType, Shape: shape, Data: t.Data[lo*per : hi*per]}
}

// sumsClose: every field equal but the float64 sums, equal to rel.
func sumsClose(a, b statsop.Stats, rel float64) bool {
	close := func(x, y float64) bool { return math.Abs(x-y) <= rel*math.Max(math.Abs(x), math.Abs(y)) }
	a2, b2 := a, b
	a2.Sum, a2.SumSq, b2.Sum, b2.SumSq = 0, 0, 0, 0
	return a2 == b2 && close(a.Sum, b.Sum) && close(a.SumSq, b.SumSq)
}

// records is a RecordSource over records made by statsop.Observe.
type records map[[2]int]statsop.Record

func (r records) Record(i, row int) statsop.Record { return r[[2]int{i, row}] }

// withShape records the statistics of x as a value of shape shape.
func withShape(x []float32, shape []int64) statsop.Record {
	r := observeRecord(x)
	r[statsop.SlotRank] = int64(len(shape))
	copy(r[statsop.SlotDims:], shape)
	return r
}

func observeRecord(x []float32) statsop.Record { return statsop.ObserveRecord(x) }

// TestMergerExact: values laid out with one element per sample along
// their batch axis (axis 0 and axis 1), with repeated maxima, split every
// way: the merge equals the whole batch's statistics, the maximum located
// in the whole batch, the sums to rounding. A value with several elements
// per sample on its batch axis keeps the maximum's sub-batch instead.
func TestMergerExact(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	const total = 6
	shapes := map[string][]int64{"a0": {total, 5, 7}, "a1": {3, total, 11}, "inner": {4 * total, 3}, "const": {13}}
	plan := &statsop.Plan{}
	for _, v := range []string{"a0", "a1", "inner", "const"} {
		plan.Outputs = append(plan.Outputs, statsop.Output{Name: v, Value: v, Passes: []int{0}})
	}
	for _, unique := range []bool{true, false} {
		t.Run(fmt.Sprintf("unique=%v", unique), func(t *testing.T) {
			mergerExact(t, r, shapes, plan, unique)
		})
	}
}

func mergerExact(t *testing.T, r *rand.Rand, shapes map[string][]int64, plan *statsop.Plan, unique bool) {
	const total = 6
	vals := map[string][]float32{}
	for v, sh := range shapes {
		// Ties: |x| = 2 repeats all over, so the first one must win.
		x := gen(r, "ties", int(tensor.NumElements(sh)))
		if unique {
			x[r.IntN(len(x))] = 7
		}
		vals[v] = x
	}
	// slice returns samples [lo, hi) of value v as its sub-batch would
	// hold them: a range of the batch axis (axis 0 for a0 and inner,
	// axis 1 for a1), the whole value for const.
	slice := func(v string, lo, hi int64) ([]float32, []int64) {
		sh := shapes[v]
		x := vals[v]
		switch v {
		case "a0", "inner":
			per := int64(len(x)) / total
			out := append([]int64{sh[0] / total * (hi - lo)}, sh[1:]...)
			return x[lo*per : hi*per], out
		case "a1":
			var y []float32
			for i := range sh[0] {
				row := x[i*sh[1]*sh[2] : (i+1)*sh[1]*sh[2]]
				y = append(y, row[lo*sh[2]:hi*sh[2]]...)
			}
			return y, []int64{sh[0], hi - lo, sh[2]}
		}
		return x, sh
	}
	for _, split := range [][]int64{{6}, {1, 5}, {2, 2, 2}, {5, 1}, {1, 1, 1, 1, 1, 1}} {
		m := statsop.NewMerger(plan, 3, total, shapes)
		var lo int64
		for _, n := range split {
			src := records{}
			for i, o := range plan.Outputs {
				x, sh := slice(o.Value, lo, lo+n)
				src[[2]int{i, 0}] = withShape(x, sh)
			}
			if err := m.Add(src, n); err != nil {
				t.Fatalf("split %v: %v", split, err)
			}
			lo += n
		}
		for i, o := range plan.Outputs {
			got, err := m.Result(i, 0)
			if err != nil {
				t.Fatal(err)
			}
			want := withShape(vals[o.Value], shapes[o.Value]).Stats(3)
			if o.Value == "inner" && len(split) > 1 {
				// The location within the whole batch is unknown: the
				// maximum's sub-batch and its index there instead.
				if got.Part < 0 || got.Stats.MaxAbs != want.MaxAbs {
					t.Errorf("split %v, %s: part %d max %v, want a sub-batch and %v", split, o.Value, got.Part, got.Stats.MaxAbs, want.MaxAbs)
				}
				got.Stats.ArgMax, want.ArgMax = 0, 0
			} else if got.Part != -1 {
				t.Errorf("split %v, %s: maximum left in sub-batch %d", split, o.Value, got.Part)
			}
			if !sumsClose(got.Stats, want, 1e-12) || fmt.Sprint(got.Shape) != fmt.Sprint(shapes[o.Value]) {
				t.Errorf("split %v, %s:\n got %+v %v\nwant %+v %v", split, o.Value, got.Stats, got.Shape, want, shapes[o.Value])
			}
		}
	}
}

// TestSplitModels: the benchmark models with a batch of 4 run whole and as
// sub-batches. ONNX Runtime's kernels round a sample's values differently
// at different batch sizes (GEMM and convolution blocking), so the merged
// statistics agree with the whole batch's to that rounding: the same
// counts of non-finite values and shapes, maxima to 1e-5.
func TestSplitModels(t *testing.T) {
	rt := runtimes(t)
	for _, m := range benchModels(t) {
		t.Run(m.name, func(t *testing.T) {
			ap := newAuditPasses(t, m.model)
			plan, err := statsop.Combine(ap.passes, ap.names, ap.elemType, shortChunk)
			if err != nil {
				t.Fatal(err)
			}
			in := m.model.Proto.Graph.Input[0].Name
			s, err := statsop.NewSession(rt, plan, []string{in}, ortcapi.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			const total = 4
			x := m.batches(1, total)[0][0]
			run := func(b *tensor.Tensor) {
				v := values(t, rt, []*tensor.Tensor{b})
				defer v[0].Release()
				if err := s.Run(v); err != nil {
					t.Fatal(err)
				}
			}
			run(x)
			whole := records{}
			full := map[string][]int64{}
			for i, o := range plan.Outputs {
				for row := range o.Passes {
					whole[[2]int{i, row}] = append(statsop.Record(nil), s.Record(i, row)...)
				}
				full[o.Value], _ = s.Record(i, 0).Shape()
			}
			for _, split := range [][]int64{{1, 3}, {2, 2}, {1, 1, 1, 1}} {
				mg := statsop.NewMerger(plan, 0, total, full)
				var lo int64
				for _, n := range split {
					run(subBatch(x, lo, lo+n))
					if err := mg.Add(s, n); err != nil {
						t.Fatalf("split %v: %v", split, err)
					}
					lo += n
				}
				for i, o := range plan.Outputs {
					for row := range o.Passes {
						got, _ := mg.Result(i, row)
						want := whole.Record(i, row).Stats(0)
						close := math.Abs(float64(got.Stats.MaxAbs-want.MaxAbs)) <= 1e-5*float64(want.MaxAbs)
						if !close || got.Stats.NonFinite() != want.NonFinite() || got.Stats.Count != want.Count ||
							fmt.Sprint(got.Shape) != fmt.Sprint(full[o.Value]) {
							t.Errorf("split %v, %s pass %d:\n got %+v %v\nwant %+v %v", split, o.Value, o.Passes[row], got.Stats, got.Shape, want, full[o.Value])
						}
					}
				}
			}
		})
	}
}
