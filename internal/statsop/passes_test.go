package statsop_test

import (
	"fmt"
	"testing"
	"unsafe"

	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/ortcapi"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
	"fp16audit/internal/statsop"
	"fp16audit/internal/tensor"
)

// auditPasses builds what audit.Run's main passes run on m under the
// default policy: the upcast fp32 graph, the fp16 and bf16 emulations
// compared with it, and the values observed (every float output of every
// non-Constant node, in topological order), as audit's prepare and
// runMainPasses do.
type auditPasses struct {
	passes   []statsop.Pass
	names    []string
	elemType func(string) int32
}

func newAuditPasses(t testing.TB, m *onnx.Model) auditPasses {
	t.Helper()
	ap, err := auditPassesOf(m)
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

func auditPassesOf(m *onnx.Model) (auditPasses, error) {
	up, _, err := rewrite.Upcast(m.Proto, m.Dir)
	if err != nil {
		return auditPasses{}, err
	}
	upIdx, err := onnx.NewIndex(up.Graph)
	if err != nil {
		return auditPasses{}, err
	}
	g := m.Proto.Graph
	order := m.Index.Order()
	var names []string
	for _, ni := range order {
		n := g.Node[ni]
		if n.OpType == "Constant" && (n.Domain == "" || n.Domain == "ai.onnx") {
			continue
		}
		for _, o := range n.Output {
			switch upIdx.ElemType(o) {
			case 0, int32(onnx.TensorProto_FLOAT), int32(onnx.TensorProto_DOUBLE), int32(onnx.TensorProto_FLOAT16), int32(onnx.TensorProto_BFLOAT16):
				if o != "" {
					names = append(names, o)
				}
			}
		}
	}
	passes := []statsop.Pass{{Name: "fp32", Model: up, Ref: -1}}
	policies := []string{"autocast-fp16", "autocast-bf16"}
	if opset(up) < 13 {
		// Cast to bfloat16 needs opset 13; audit then runs no bf16 pass.
		policies = policies[:1]
	}
	for _, p := range policies {
		pol, err := precision.PolicyByName(p)
		if err != nil {
			return auditPasses{}, err
		}
		a := precision.Assign(pol, g, order, m.Index.ElemType)
		passes = append(passes, statsop.Pass{Name: pol.Lower.String(), Model: rewrite.Emulate(up, g, a), Ref: 0})
	}
	return auditPasses{passes: passes, names: names, elemType: upIdx.ElemType}, nil
}

func opset(m *onnx.ModelProto) int64 {
	for _, o := range m.OpsetImport {
		if o.Domain == "" || o.Domain == "ai.onnx" {
			return o.Version
		}
	}
	return 0
}

// result is what a pass learned over all batches, as audit's passResult.
type result struct {
	stats  map[string]*observe.Stats
	diffs  map[string]*observe.Diff
	shapes map[string][]int64
}

func newResults(n int) []result {
	rs := make([]result, n)
	for i := range rs {
		rs[i] = result{stats: map[string]*observe.Stats{}, diffs: map[string]*observe.Diff{}, shapes: map[string][]int64{}}
	}
	return rs
}

func (r result) fold(name string, batch int, st observe.Stats, d *observe.Diff, shape []int64) {
	if _, ok := r.stats[name]; !ok {
		s := observe.NewStats()
		r.stats[name] = &s
		r.shapes[name] = shape
	}
	r.stats[name].Merge(st)
	if d != nil {
		acc := r.diffs[name]
		if acc == nil {
			acc = &observe.Diff{}
			r.diffs[name] = acc
		}
		acc.SumSqDiff += d.SumSqDiff
		acc.SumSqRef += d.SumSqRef
		acc.NewNonFinite += d.NewNonFinite
		acc.NonzeroRef += d.NonzeroRef
		acc.Flushed += d.Flushed
		acc.BothFinite += d.BothFinite
	}
}

// todayResults runs the passes as audit does today: each pass instrumented
// with every observed value as a graph output (rewrite.Instrument), run by
// onnxruntime_go at level "none", every output summarised by the Go kernels
// (goReference, in chunks of chunk elements) and compared with the fp32
// pass's output of the same value.
func todayResults(t testing.TB, ap auditPasses, inputs []string, batches [][]*tensor.Tensor, chunk int) []result {
	t.Helper()
	res, err := todayResultsErr(ap, inputs, batches, chunk)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func todayResultsErr(ap auditPasses, inputs []string, batches [][]*tensor.Tensor, chunk int) ([]result, error) {
	res := newResults(len(ap.passes))
	sessions := make([]*onnxrt.Session, len(ap.passes))
	obs := make([][]string, len(ap.passes))
	for p, ps := range ap.passes {
		inst, o := rewrite.Instrument(ps.Model, ap.names, ap.elemType)
		data, err := onnx.Marshal(inst)
		if err != nil {
			return nil, err
		}
		var outs []string
		for _, x := range o {
			outs = append(outs, x.Output)
			obs[p] = append(obs[p], x.Name)
		}
		if len(outs) == 0 {
			return nil, fmt.Errorf("%s pass: no float values", ps.Name)
		}
		s, err := onnxrt.NewSession(data, inputs, outs, onnxrt.SessionOptions{Optimization: "none"})
		if err != nil {
			return nil, fmt.Errorf("%s pass: %w", ps.Name, err)
		}
		defer s.Close()
		sessions[p] = s
	}
	for bi, in := range batches {
		values := make([]map[string][]float32, len(ap.passes))
		for p, ps := range ap.passes {
			outs, err := sessions[p].Run(in)
			if err != nil {
				return nil, fmt.Errorf("%s pass, batch %d: %w", ps.Name, bi, err)
			}
			values[p] = map[string][]float32{}
			for i, name := range obs[p] {
				y := onnxrt.Float32View(outs[i])
				values[p][name] = y
				var ref []float32
				if ps.Ref >= 0 {
					ref = values[ps.Ref][name]
				}
				st, d := goReference(y, ref, bi, chunk)
				var dp *observe.Diff
				if ps.Ref >= 0 {
					dp = &d
				}
				res[p].fold(name, bi, st, dp, outs[i].Shape)
			}
		}
	}
	return res, nil
}

// opResults runs the passes in one combined graph with the statistics ops.
func opResults(t testing.TB, rt *ortcapi.Runtime, ap auditPasses, inputs []string, batches [][]*tensor.Tensor, level ortcapi.Level, chunk int) []result {
	t.Helper()
	res, err := opResultsErr(rt, ap, inputs, batches, level, chunk)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func opResultsErr(rt *ortcapi.Runtime, ap auditPasses, inputs []string, batches [][]*tensor.Tensor, level ortcapi.Level, chunk int) ([]result, error) {
	plan, err := statsop.Combine(ap.passes, ap.names, ap.elemType, chunk)
	if err != nil {
		return nil, err
	}
	s, err := statsop.NewSession(rt, plan, inputs, ortcapi.Options{Level: level})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	res := newResults(len(ap.passes))
	for bi, in := range batches {
		vals, err := valuesErr(rt, in)
		if err != nil {
			return nil, err
		}
		err = s.Run(vals)
		for _, v := range vals {
			v.Release()
		}
		if err != nil {
			return nil, fmt.Errorf("batch %d: %w", bi, err)
		}
		if !s.InOrder() {
			return nil, fmt.Errorf("batch %d: ONNX Runtime did not summarise the values in order", bi)
		}
		for i, o := range plan.Outputs {
			for row, p := range o.Passes {
				r := s.Record(i, row)
				var dp *observe.Diff
				if d, ok := r.Diff(); ok {
					ad := observe.Diff(d)
					dp = &ad
				}
				shape, _ := r.Shape()
				res[p].fold(o.Value, bi, observe.Stats(r.Stats(bi)), dp, shape)
			}
		}
	}
	return res, nil
}

// values wraps batch tensors for ortcapi without copying.
func values(t testing.TB, rt *ortcapi.Runtime, in []*tensor.Tensor) []*ortcapi.Value {
	t.Helper()
	out, err := valuesErr(rt, in)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func valuesErr(rt *ortcapi.Runtime, in []*tensor.Tensor) ([]*ortcapi.Value, error) {
	var out []*ortcapi.Value
	for _, x := range in {
		var p unsafe.Pointer
		if len(x.Data) > 0 {
			p = unsafe.Pointer(&x.Data[0])
		}
		v, err := rt.NewTensor(ortcapi.ElemType(x.DType), x.Shape, p, len(x.Data))
		if err != nil {
			for _, o := range out {
				o.Release()
			}
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// compareResults reports every value whose statistics, difference or
// shape differ between two runs of the same passes.
func compareResults(ap auditPasses, got, want []result) []string {
	var bad []string
	for p, ps := range ap.passes {
		if len(got[p].stats) != len(want[p].stats) {
			bad = append(bad, fmt.Sprintf("%s: %d values observed, want %d", ps.Name, len(got[p].stats), len(want[p].stats)))
		}
		for name, w := range want[p].stats {
			g, ok := got[p].stats[name]
			switch {
			case !ok:
				bad = append(bad, fmt.Sprintf("%s %s: not observed", ps.Name, name))
			case !identical(*g, *w):
				bad = append(bad, fmt.Sprintf("%s %s: stats\n got %+v\nwant %+v", ps.Name, name, *g, *w))
			case fmt.Sprint(got[p].shapes[name]) != fmt.Sprint(want[p].shapes[name]):
				bad = append(bad, fmt.Sprintf("%s %s: shape %v, want %v", ps.Name, name, got[p].shapes[name], want[p].shapes[name]))
			}
			if wd, ok := want[p].diffs[name]; ok {
				if gd := got[p].diffs[name]; gd == nil || !identicalDiff(*gd, *wd) {
					bad = append(bad, fmt.Sprintf("%s %s: diff\n got %+v\nwant %+v", ps.Name, name, gd, *wd))
				}
			}
		}
	}
	return bad
}

// nonFinite counts the NaN/Inf elements all passes saw, so a test can
// tell that its models exercise the non-finite paths.
func nonFinite(rs []result) int64 {
	var n int64
	for _, r := range rs {
		for _, s := range r.stats {
			n += s.NonFinite()
		}
	}
	return n
}
