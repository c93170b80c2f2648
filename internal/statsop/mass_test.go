package statsop_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"fp16audit/internal/onnx"
	"fp16audit/internal/ortcapi"
	"fp16audit/internal/statsop"
)

// massInput returns n floats spread over the whole float32 range: zeros of
// both signs, subnormals, normals of every exponent, ±Inf and NaN, in runs
// that share an exponent (as a gradient's neighbours do) and scattered.
func massInput(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	x := make([]float32, n)
	for i := range x {
		switch k := r.IntN(100); {
		case k < 3:
			x[i] = float32(math.Copysign(0, float64(r.IntN(2)*2-1)))
		case k < 5:
			x[i] = math.Float32frombits(uint32(r.IntN(1<<23)) | uint32(r.IntN(2))<<31)
		case k == 5:
			x[i] = float32(math.Inf(r.IntN(2)*2 - 1))
		case k == 6:
			x[i] = float32(math.NaN())
		case k < 60 && i > 0:
			// The previous element's exponent, another mantissa.
			b := math.Float32bits(x[i-1])&^0x807fffff | uint32(r.IntN(1<<23))
			if b>>23 == 0xff || b>>23 == 0 {
				b = 0x3f800000
			}
			x[i] = math.Float32frombits(b | uint32(r.IntN(2))<<31)
		default:
			x[i] = math.Float32frombits(uint32(1+r.IntN(254))<<23 | uint32(r.IntN(1<<23)) | uint32(r.IntN(2))<<31)
		}
	}
	return x
}

// massReference is Mass by its definition, one element at a time.
func massReference(x []float32) []float64 {
	h := make([]float64, statsop.MassLen)
	for _, v := range x {
		a := math.Abs(float64(v))
		if math.IsNaN(a) || math.IsInf(a, 0) {
			h[statsop.MassNonFinite]++
			continue
		}
		e := math.Float32bits(v) >> 23 & 0xff
		h[e]++
		h[statsop.MassSumSq+int(e)] += a * a
		h[statsop.MassMax] = max(h[statsop.MassMax], a)
	}
	return h
}

// TestMassKernel: counts per exponent, the maximum and the non-finite
// count equal the definition's exactly; the sums of squares, added in
// another order, agree to float64 rounding (DESIGN: exactness).
func TestMassKernel(t *testing.T) {
	for _, n := range []int{0, 1, 3, 4, 5, 1000, 1 << 16, 1<<17 + 7} {
		x := massInput(n, uint64(n))
		got, want := statsop.Mass(x), massReference(x)
		for e := range statsop.MassSumSq {
			if got[e] != want[e] {
				t.Errorf("n=%d: bucket %d counts %g, want %g", n, e, got[e], want[e])
			}
			g, w := got[statsop.MassSumSq+e], want[statsop.MassSumSq+e]
			if math.Abs(g-w) > 1e-12*w {
				t.Errorf("n=%d: bucket %d sums squares to %g, want %g", n, e, g, w)
			}
		}
		for _, k := range []int{statsop.MassMax, statsop.MassNonFinite} {
			if got[k] != want[k] {
				t.Errorf("n=%d: slot %d is %g, want %g", n, k, got[k], want[k])
			}
		}
	}
}

// TestMassOperator: the Mass operator, its chunks shared by two threads,
// returns statsop.Mass bit for bit.
func TestMassOperator(t *testing.T) {
	rt := runtimes(t)
	n := int64(3<<16 + 11)
	x := massInput(int(n), 7)
	g := &onnx.GraphProto{Name: "mass-op"}
	g.Input = append(g.Input, onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, n), onnx.TensorValueInfo("on", onnx.TensorProto_FLOAT))
	// h is Mass(x); hs is Mass(x, on), switched by on.
	for _, node := range []*onnx.NodeProto{
		onnx.Node(statsop.OpMass, "mass", []string{"x"}, []string{"h"}),
		onnx.Node(statsop.OpMass, "switched", []string{"x", "on"}, []string{"hs"}),
	} {
		node.Domain = statsop.Domain
		g.Node = append(g.Node, node)
		g.Output = append(g.Output, onnx.TensorValueInfo(node.Output[0], onnx.TensorProto_DOUBLE, int64(statsop.MassLen)))
	}
	m := onnx.NewModel(g, 17)
	m.OpsetImport = append(m.OpsetImport, &onnx.OperatorSetIdProto{Domain: statsop.Domain, Version: 1})
	s, err := statsop.NewModelSession(rt, m, "", nil, []string{"x", "on"}, []string{"h", "hs"}, ortcapi.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	in, err := rt.NewTensor(ortcapi.Float32, []int64{n}, unsafe.Pointer(&x[0]), 4*len(x))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Release()
	want := statsop.Mass(x)
	for _, on := range []float32{1, 0} {
		sw := []float32{on}
		onv, err := rt.NewTensor(ortcapi.Float32, []int64{}, unsafe.Pointer(&sw[0]), 4)
		if err != nil {
			t.Fatal(err)
		}
		got, gotSw := make([]float64, statsop.MassLen), make([]float64, statsop.MassLen)
		for k := range gotSw {
			gotSw[k] = -1 // the switched-off operator writes its zeros
		}
		var outs []*ortcapi.Value
		for _, h := range [][]float64{got, gotSw} {
			v, err := rt.NewTensor(ortcapi.Float64, []int64{int64(len(h))}, unsafe.Pointer(&h[0]), 8*len(h))
			if err != nil {
				t.Fatal(err)
			}
			outs = append(outs, v)
		}
		err = s.Run([]*ortcapi.Value{in, onv}, outs)
		for _, v := range append(outs, onv) {
			v.Release()
		}
		if err != nil {
			t.Fatal(err)
		}
		for k := range want {
			if math.Float64bits(got[k]) != math.Float64bits(want[k]) {
				t.Errorf("slot %d: operator %g, statsop.Mass %g", k, got[k], want[k])
			}
			w := want[k]
			if on == 0 {
				w = 0
			}
			if math.Float64bits(gotSw[k]) != math.Float64bits(w) {
				t.Errorf("on=%g: slot %d: operator %g, want %g", on, k, gotSw[k], w)
			}
		}
	}
}
