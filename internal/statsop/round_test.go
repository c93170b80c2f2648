package statsop_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/ortcapi"
	"fp16audit/internal/statsop"
	"fp16audit/internal/tensor"
)

// roundFormats are the two formats Round rounds to.
var roundFormats = []struct {
	name string
	to   onnx.TensorProto_DataType
}{{"fp16", onnx.TensorProto_FLOAT16}, {"bf16", onnx.TensorProto_BFLOAT16}}

// roundPatterns are float32 bit patterns around every place where
// rounding to fp16 or bf16 can go either way: for each sign and exponent,
// the mantissas whose low 13 (fp16) and 16 (bf16) bits sit at, just below
// and just above the tie, with even and odd kept bits, plus the fp16
// subnormal range bit by bit at its low end, NaNs with payloads, and
// random patterns.
func roundPatterns() []uint32 {
	var out []uint32
	lows := []uint32{0, 1, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x2fff, 0x3000, 0x3001,
		0x7fff, 0x8000, 0x8001, 0xffff, 0x10000, 0x17fff, 0x18000, 0x18001, 0x7fffff, 0x7fe000, 0x7ff000, 0x7fefff}
	for se := uint32(0); se < 512; se++ {
		for _, lo := range lows {
			out = append(out, se<<23|lo)
		}
	}
	for a := uint32(0x32fff000); a <= 0x33001000; a++ {
		out = append(out, a, a|0x80000000)
	}
	for _, a := range []uint32{0x477fe000, 0x477fefff, 0x477ff000, 0x477ff001, 0x38800000, 0x387fffff, 0x387ff000,
		0x7f7fffff, 0x7f7f8000, 0x7f7f7fff, 0x7f800001, 0x7fbfffff, 0x7fc00000, 0x7fffffff, 0x7f802000} {
		out = append(out, a, a|0x80000000)
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 1 << 18 {
		out = append(out, r.Uint32())
	}
	return out
}

// TestRoundMatchesCast compares Round, in C with and without the vector
// loops and as an operator in a session, with what ONNX Runtime's Cast to
// FLOAT16 (BFLOAT16) and back to FLOAT returns for every pattern: equal
// bit for bit, except that a NaN need only stay a NaN (its payload
// reaches no statistic).
func TestRoundMatchesCast(t *testing.T) {
	rt := runtimes(t)
	pats := roundPatterns()
	x := make([]float32, len(pats))
	for i, p := range pats {
		x[i] = math.Float32frombits(p)
	}
	n := int64(len(x))
	g := &onnx.GraphProto{Name: "round"}
	g.Input = append(g.Input, onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, n))
	for _, c := range roundFormats {
		g.Node = append(g.Node,
			onnx.Node("Cast", "down_"+c.name, []string{"x"}, []string{"h_" + c.name}, onnx.AttrInt("to", int64(c.to))),
			onnx.Node("Cast", "up_"+c.name, []string{"h_" + c.name}, []string{"cast_" + c.name}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT))))
		g.Output = append(g.Output, onnx.TensorValueInfo("cast_"+c.name, onnx.TensorProto_FLOAT, n))
	}
	data, err := onnx.Marshal(onnx.NewModel(g, 17))
	if err != nil {
		t.Fatal(err)
	}
	s, err := onnxrt.NewSession(data, []string{"x"}, []string{"cast_fp16", "cast_bf16"}, onnxrt.SessionOptions{Optimization: "none"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	outs, err := s.Run([]*tensor.Tensor{tensor.FromFloat32s("x", []int64{n}, x)})
	if err != nil {
		t.Fatal(err)
	}
	opOut := roundInSession(t, rt, x)
	for k, c := range roundFormats {
		want := onnxrt.Float32View(outs[k])
		for _, simd := range []bool{true, false} {
			got := make([]float32, len(x))
			old := statsop.SetRoundSIMD(simd)
			statsop.Round(got, x, int32(c.to))
			statsop.SetRoundSIMD(old)
			compareRounded(t, c.name+map[bool]string{true: " vector", false: " portable"}[simd], x, got, want)
		}
		compareRounded(t, c.name+" operator", x, opOut[k], want)
	}
}

func compareRounded(t *testing.T, what string, x, got, want []float32) {
	t.Helper()
	bad := 0
	for i := range x {
		g, w := math.Float32bits(got[i]), math.Float32bits(want[i])
		if g == w || (got[i] != got[i] && want[i] != want[i]) {
			continue
		}
		if bad++; bad <= 5 {
			t.Errorf("%s: x=%#08x (%g): got %#08x, Cast pair gives %#08x", what, math.Float32bits(x[i]), x[i], g, w)
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d patterns in all differ", what, bad)
	}
}

// roundInSession runs x through two Round operators (fp16, bf16) in a
// session, the way Combine's graphs use them.
func roundInSession(t *testing.T, rt *ortcapi.Runtime, x []float32) [][]float32 {
	t.Helper()
	d, err := statsop.Register(rt)
	if err != nil {
		t.Fatal(err)
	}
	n := int64(len(x))
	g := &onnx.GraphProto{Name: "round-op"}
	g.Input = append(g.Input, onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, n))
	for _, c := range roundFormats {
		node := onnx.Node(statsop.OpRound, "round_"+c.name, []string{"x"}, []string{"y_" + c.name}, onnx.AttrInt(statsop.AttrTo, int64(c.to)))
		node.Domain = statsop.Domain
		g.Node = append(g.Node, node)
		g.Output = append(g.Output, onnx.TensorValueInfo("y_"+c.name, onnx.TensorProto_FLOAT, n))
	}
	m := onnx.NewModel(g, 17)
	m.OpsetImport = append(m.OpsetImport, &onnx.OperatorSetIdProto{Domain: statsop.Domain, Version: 1})
	data, err := onnx.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	s, err := rt.NewSession(data, []string{"x"}, []string{"y_fp16", "y_bf16"}, ortcapi.Options{Domains: []*ortcapi.CustomOpDomain{d}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	in, err := rt.NewTensor(ortcapi.Float32, []int64{n}, unsafe.Pointer(&x[0]), 4*len(x))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Release()
	// ONNX Runtime writes both outputs into buffers of the test.
	res := [][]float32{make([]float32, n), make([]float32, n)}
	outs := make([]*ortcapi.Value, len(res))
	for i, r := range res {
		if outs[i], err = rt.NewTensor(ortcapi.Float32, []int64{n}, unsafe.Pointer(&r[0]), 4*len(r)); err != nil {
			t.Fatal(err)
		}
		defer outs[i].Release()
	}
	if err := s.Run([]*ortcapi.Value{in}, outs); err != nil {
		t.Fatal(err)
	}
	return res
}

// TestRoundSwitch runs Round(x, on) with the attribute alt as the backward
// audit's session does: on 0 copies x, 1 rounds to "to", 2 to "alt" (0:
// unrounded), every result bit for bit Round's own in C.
func TestRoundSwitch(t *testing.T) {
	rt := runtimes(t)
	x := make([]float32, 3<<16+5)
	r := rand.New(rand.NewPCG(5, 6))
	for i := range x {
		x[i] = float32(r.NormFloat64() * math.Ldexp(1, r.IntN(60)-40))
	}
	n := int64(len(x))
	g := &onnx.GraphProto{Name: "round-switch"}
	g.Input = append(g.Input, onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, n), onnx.TensorValueInfo("on", onnx.TensorProto_FLOAT))
	// y_bf16 rounds to fp16, or to bf16 when on is 2; y_none to fp16, or
	// not at all when on is 2; y_same has no alt: on 2 rounds to fp16.
	nodes := []struct {
		out string
		alt *int64
	}{{"y_bf16", ptr(int64(onnx.TensorProto_BFLOAT16))}, {"y_none", ptr(int64(0))}, {"y_same", nil}}
	var outs []string
	for _, nd := range nodes {
		attrs := []*onnx.AttributeProto{onnx.AttrInt(statsop.AttrTo, int64(onnx.TensorProto_FLOAT16))}
		if nd.alt != nil {
			attrs = append(attrs, onnx.AttrInt(statsop.AttrAlt, *nd.alt))
		}
		node := onnx.Node(statsop.OpRound, "round_"+nd.out, []string{"x", "on"}, []string{nd.out}, attrs...)
		node.Domain = statsop.Domain
		g.Node = append(g.Node, node)
		g.Output = append(g.Output, onnx.TensorValueInfo(nd.out, onnx.TensorProto_FLOAT, n))
		outs = append(outs, nd.out)
	}
	m := onnx.NewModel(g, 17)
	m.OpsetImport = append(m.OpsetImport, &onnx.OperatorSetIdProto{Domain: statsop.Domain, Version: 1})
	s, err := statsop.NewModelSession(rt, m, "", nil, []string{"x", "on"}, outs, ortcapi.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	in, err := rt.NewTensor(ortcapi.Float32, []int64{n}, unsafe.Pointer(&x[0]), 4*len(x))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Release()
	rounded := func(to int32) []float32 {
		if to == 0 {
			return x
		}
		y := make([]float32, len(x))
		statsop.Round(y, x, to)
		return y
	}
	fp16, bf16 := int32(onnx.TensorProto_FLOAT16), int32(onnx.TensorProto_BFLOAT16)
	for _, c := range []struct {
		on   float32
		want [3]int32 // per node: the format (0 none)
	}{{0, [3]int32{0, 0, 0}}, {1, [3]int32{fp16, fp16, fp16}}, {2, [3]int32{bf16, 0, fp16}}} {
		sw := []float32{c.on}
		onv, err := rt.NewTensor(ortcapi.Float32, []int64{}, unsafe.Pointer(&sw[0]), 4)
		if err != nil {
			t.Fatal(err)
		}
		got := make([][]float32, len(nodes))
		var vals []*ortcapi.Value
		for k := range got {
			got[k] = make([]float32, len(x))
			v, err := rt.NewTensor(ortcapi.Float32, []int64{n}, unsafe.Pointer(&got[k][0]), 4*len(x))
			if err != nil {
				t.Fatal(err)
			}
			vals = append(vals, v)
		}
		err = s.Run([]*ortcapi.Value{in, onv}, vals)
		for _, v := range append(vals, onv) {
			v.Release()
		}
		if err != nil {
			t.Fatal(err)
		}
		for k, nd := range nodes {
			compareRounded(t, fmt.Sprintf("on=%g %s", c.on, nd.out), x, got[k], rounded(c.want[k]))
		}
	}
}

func ptr[T any](v T) *T { return &v }
