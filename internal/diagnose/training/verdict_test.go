package training

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"

	"fp16audit/checks"
	"fp16audit/internal/grad"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
	"fp16audit/report"
)

// The backward verdict tree on hand-made results: a two-layer MLP's
// backward graph (built, never run), fp32 masses by exponent and
// parameter gradients chosen per case, and emulated runs made up from
// them. None of it needs ONNX Runtime.

// mlp is x[4,8] → fc1 (Gemm) → Relu → fc2 (Gemm) → y[4,3], exported
// names as torch.onnx writes them.
func mlp(t *testing.T) (*onnx.Model, *precision.Assignment, *grad.Result) {
	t.Helper()
	w := func(name string, dims ...int64) *onnx.TensorProto {
		n := int64(1)
		for _, d := range dims {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i%7) / 7
		}
		return onnx.FloatTensor(name, dims, v)
	}
	g := &onnx.GraphProto{Name: "mlp",
		Node: []*onnx.NodeProto{
			onnx.Node("Gemm", "/fc1/Gemm", []string{"x", "fc1.weight", "fc1.bias"}, []string{"/fc1/Gemm_output_0"}, onnx.AttrInt("transB", 1)),
			onnx.Node("Relu", "/act/Relu", []string{"/fc1/Gemm_output_0"}, []string{"/act/Relu_output_0"}),
			onnx.Node("Gemm", "/fc2/Gemm", []string{"/act/Relu_output_0", "fc2.weight", "fc2.bias"}, []string{"y"}, onnx.AttrInt("transB", 1)),
		},
		Initializer: []*onnx.TensorProto{w("fc1.weight", 16, 8), w("fc1.bias", 16), w("fc2.weight", 3, 16), w("fc2.bias", 3)},
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, int64(4), int64(8))},
		Output:      []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, int64(4), int64(3))},
	}
	proto := &onnx.ModelProto{IrVersion: 8, OpsetImport: []*onnx.OperatorSetIdProto{{Domain: "", Version: 17}}, Graph: g}
	ix, err := onnx.NewIndex(g)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := precision.PolicyByName("autocast-fp16")
	if err != nil {
		t.Fatal(err)
	}
	asg := precision.Assign(pol, g, ix.Order(), ix.ElemType)
	facts := &grad.Facts{Shapes: map[string][]int64{"x": {4, 8}, "fc1.weight": {16, 8}, "fc1.bias": {16}, "fc2.weight": {3, 16},
		"fc2.bias": {3}, "/fc1/Gemm_output_0": {4, 16}, "/act/Relu_output_0": {4, 16}, "y": {4, 3}}}
	res, err := grad.Build(proto, facts, grad.Options{Loss: grad.MSE, Rounding: grad.AutocastRounding(g, asg)})
	if err != nil {
		t.Fatal(err)
	}
	return &onnx.Model{Proto: proto, Index: ix}, asg, res
}

// massAt is a gradient of n elements, all of magnitude 2^k.
func massAt(k int, n float64) *grad.Mass {
	m := &grad.Mass{Max: math.Ldexp(1, k)}
	m.Count[k+127] = n
	m.SumSq[k+127] = n * math.Ldexp(1, 2*k)
	return m
}

// world is one case: every 16-bit gradient at 2^-10 unless a case says
// otherwise, parameter gradients of ones, and an emulated run that loses
// of each parameter what its gradients' own rounding loses (or overflows
// where the fp32 masses say so).
type world struct {
	model *onnx.Model
	asg   *precision.Assignment
	b     *Backward
}

func newWorld(t *testing.T, init int, masses map[string]*grad.Mass) *world {
	m, asg, res := mlp(t)
	fp32 := &grad.Run{Grads: map[string]*grad.Mass{}, Sites: map[string]*grad.Mass{}, Params: map[string][]float32{}}
	for _, g := range res.Grads {
		if g.Raw != "" {
			fp32.Grads[g.Value] = massAt(-10, 12)
			if x, ok := masses[g.Value]; ok {
				fp32.Grads[g.Value] = x
			}
		}
	}
	for _, s := range res.Sites {
		fp32.Sites[s.Rounded] = massAt(-10, 12)
		if x, ok := masses[s.Value]; ok {
			fp32.Sites[s.Rounded] = x
		}
	}
	for _, p := range res.Params() {
		v := make([]float32, 4)
		for i := range v {
			v[i] = 1
		}
		fp32.Params[p.Value] = v
	}
	b := &Backward{Loss: grad.MSE, Output: "y", Res: res, FP32: fp32, Runs: map[int]*grad.Run{},
		InitExp: init, MinExp: -20, MaxExp: 24, Tolerance: 0.01}
	return &world{model: m, asg: asg, b: b}
}

func (w *world) facts() *Facts {
	pol, _ := precision.PolicyByName("autocast-fp16")
	return &Facts{Model: w.model, Policy: pol, Assign: w.asg, Mode: rewrite.ModeTrain, Backward: w.b}
}

// emulate makes the run at exponent e from the fp32 facts: a parameter
// loses what the gradients it is computed from lose by their own rounding,
// and every parameter gradient is Inf where a 16-bit gradient overflows.
func (w *world) emulate(f *Facts, e int) *grad.Run {
	r := &grad.Run{Exp: e, Rounded: true, Params: map[string][]float32{}}
	over, _ := f.overflow(e)
	for k, p := range f.gradients().params {
		kept := 1.0
		for _, i := range p.feeds {
			en := f.gradients().entries[i]
			kept *= 1 - en.mass(w.b.FP32).Lost(e, en.format)
		}
		v := make([]float32, len(w.b.FP32.Params[p.value]))
		for i, x := range w.b.FP32.Params[p.value] {
			v[i] = float32(math.Ldexp(float64(x)*kept, e))
			if over {
				v[i] = float32(math.Inf(1))
			}
		}
		r.Params[f.gradients().params[k].value] = v
	}
	return r
}

// audit runs NextRuns to the end with emulate and returns the report.
func (w *world) audit(t *testing.T, sel checks.Selection) (*report.TrainingReport, []checks.Finding, *Facts) {
	t.Helper()
	f := w.facts()
	for i := 0; ; i++ {
		next := f.NextRuns()
		if len(next) == 0 {
			break
		}
		if i > maxRuns {
			t.Fatalf("NextRuns keeps asking: %v", next)
		}
		for _, e := range next {
			w.b.Runs[e] = w.emulate(f, e)
		}
	}
	// A fresh Facts: the table is computed once per Facts.
	f = w.facts()
	tr, fs, err := Run(context.Background(), f, nil, sel)
	if err != nil {
		t.Fatal(err)
	}
	return tr, fs, f
}

func ids(fs []checks.Finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Check)
	}
	return out
}

func TestVerdictTree(t *testing.T) {
	all := checks.Selection{}
	cases := []struct {
		name    string
		init    int
		masses  map[string]*grad.Mass
		broken  bool
		minExp  int
		sel     string
		verdict string
		finds   []string
		check   func(t *testing.T, b *report.BackwardReport)
	}{
		{name: "healthy at the initial scale", init: 16, verdict: report.BackwardHealthy,
			check: func(t *testing.T, b *report.BackwardReport) {
				if b.SettledExp == nil || *b.SettledExp != 16 || b.SkippedSteps != 0 || b.InitScaleAdvice != nil {
					t.Errorf("settled %v after %d, advice %v; want 2^16, none skipped", b.SettledExp, b.SkippedSteps, b.InitScaleAdvice)
				}
			}},
		{name: "the scaler settles below the initial scale (seed)", init: 16, masses: map[string]*grad.Mass{"y": massAt(3, 12)},
			verdict: report.BackwardHealthy, finds: []string{"FP6004"},
			check: func(t *testing.T, b *report.BackwardReport) {
				// 2^3 × 2^12 = 32768 < 65520 ≤ 2^3 × 2^13
				if b.SettledExp == nil || *b.SettledExp != 12 || b.SkippedSteps != 4 || b.InitScaleAdvice == nil || *b.InitScaleAdvice != 4096 {
					t.Errorf("settled %v after %d, advice %v; want 2^12 after 4, init_scale 4096", b.SettledExp, b.SkippedSteps, b.InitScaleAdvice)
				}
			}},
		{name: "the scaler settles below 1 (a layer inside)", init: 16, masses: map[string]*grad.Mass{"/act/Relu_output_0": massAt(20, 12)},
			verdict: report.BackwardHealthy, finds: []string{"FP6005"},
			check: func(t *testing.T, b *report.BackwardReport) {
				if b.SettledExp == nil || *b.SettledExp != -5 || b.SkippedSteps != 21 {
					t.Errorf("settled %v after %d; want 2^-5 after 21", b.SettledExp, b.SkippedSteps)
				}
			}},
		{name: "fp32 broken beats everything", init: 16, broken: true, masses: map[string]*grad.Mass{"y": massAt(30, 12)},
			verdict: report.BackwardFP32Broken, finds: []string{"FP6003"}},
		{name: "overflow at every scale", init: 0, minExp: -4, masses: map[string]*grad.Mass{"y": massAt(22, 12)},
			verdict: report.BackwardOverflowEveryScale, finds: []string{"FP6006"}},
		{name: "underflow where it settles, no clean scale", init: 16,
			masses:  map[string]*grad.Mass{"/fc1/Gemm_output_0": massAt(-50, 64), "y": massAt(3, 12)},
			verdict: report.BackwardUnderflow, finds: []string{"FP6004", "FP6007"},
			check: func(t *testing.T, b *report.BackwardReport) {
				if !slices.Contains(b.Underflowing, "fc1") || b.LostMass == nil || *b.LostMass < 0.99 || b.Window != nil {
					t.Errorf("underflowing %v, lost %v, window %+v; want fc1 losing everything, no window", b.Underflowing, b.LostMass, b.Window)
				}
			}},
		{name: "underflow switched off: the verdict follows the findings", init: 16, sel: "all,-FP6007",
			masses:  map[string]*grad.Mass{"/fc1/Gemm_output_0": massAt(-50, 64), "y": massAt(3, 12)},
			verdict: report.BackwardHealthy, finds: []string{"FP6004"}},
		{name: "underflow at the initial scale, a larger one keeps it", init: 4,
			masses:  map[string]*grad.Mass{"/fc1/Gemm_output_0": massAt(-32, 64)},
			verdict: report.BackwardInitUnderflow, finds: []string{"FP6008"},
			check: func(t *testing.T, b *report.BackwardReport) {
				// 2^-32 × 2^s: within 1% from 2^-19 (ulp 2^-24: 2^-5/√12 = 0.9%)
				if b.Window == nil || b.Window.From != 13 || b.InitScaleAdvice == nil || *b.InitScaleAdvice != 1<<13 {
					t.Errorf("window %+v, advice %v; want clean from 2^13", b.Window, b.InitScaleAdvice)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, c.init, c.masses)
			if c.minExp != 0 {
				w.b.MinExp = c.minExp
			}
			if c.broken {
				w.b.FP32.Grads["y"].NonFinite = 1
			}
			sel := all
			if c.sel != "" {
				var err error
				if sel, err = checks.ParseSelection(c.sel); err != nil {
					t.Fatal(err)
				}
			}
			tr, fs, _ := w.audit(t, sel)
			b := tr.Backward
			if b.Verdict != c.verdict {
				t.Errorf("verdict %s (%s), want %s", b.Verdict, b.VerdictText, c.verdict)
			}
			var got []string
			for _, id := range ids(fs) {
				if strings.HasPrefix(id, "FP600") && id != "FP6009" {
					got = append(got, id)
				}
			}
			if !slices.Equal(got, c.finds) {
				t.Errorf("findings %v, want %v", got, c.finds)
			}
			if c.check != nil {
				c.check(t, b)
			}
		})
	}
}

// TestNextRunsFollowsTheRuns: an emulated run at the largest clean scale
// that overflows after all (rounding compounded) moves the edge down, and
// NextRuns asks for the new one; the runs stay few.
func TestNextRunsFollowsTheRuns(t *testing.T) {
	w := newWorld(t, 16, map[string]*grad.Mass{"y": massAt(3, 12)})
	f := w.facts()
	first := f.NextRuns()
	if !slices.Equal(first, []int{12}) {
		t.Fatalf("first runs %v, want [12] (settled and largest clean; the settled scale is clean, so not the window's start)", first)
	}
	r := w.emulate(f, 12)
	for _, v := range r.Params {
		v[0] = float32(math.Inf(1))
	}
	w.b.Runs[12] = r
	if next := f.NextRuns(); !slices.Equal(next, []int{11}) {
		t.Fatalf("after an overflow at 2^12, runs %v, want [11]", next)
	}
}

// TestNoiseNotJudged: a parameter gradient far below the gradient it is
// summed from is zero up to rounding; whatever share of it rounding loses
// does not decide the verdict.
func TestNoiseNotJudged(t *testing.T) {
	w := newWorld(t, 16, nil)
	w.b.FP32.Params["fc2.bias"] = []float32{1e-9, -1e-9, 1e-9}
	f := w.facts()
	r := w.emulate(f, 16)
	r.Params["fc2.bias"] = []float32{float32(math.Ldexp(1e-7, 16)), 0, 0}
	w.b.Runs[16] = r
	tr, _, _ := w.audit(t, checks.Selection{})
	b := tr.Backward
	if b.Verdict != report.BackwardHealthy {
		t.Errorf("verdict %s (%s): a noise gradient decided it", b.Verdict, b.VerdictText)
	}
	for _, p := range b.Parameters {
		if p.Name == "fc2.bias" && !p.Noise {
			t.Errorf("fc2.bias %+v: want marked noise", p)
		}
	}
}

// TestMassLost: the estimate from the buckets against the definition on
// real numbers.
func TestMassLost(t *testing.T) {
	m := &grad.Mass{}
	m.Add(massAt(-12, 1)) // flushes below 2^-25 from 2^-14 down
	m.Add(massAt(0, 1))
	norm := math.Sqrt(1 + math.Ldexp(1, -24))
	// At 2^-16 the small element flushes (its whole square) and the large
	// one, 2^-16 scaled, is subnormal: ulp 2^-24 scaled, 2^-8 unscaled
	// (ulp²/12 expected).
	if got, want := m.Lost(-16, grad.FP16), math.Sqrt(math.Ldexp(1, -24)+math.Ldexp(1, -16)/12)/norm; math.Abs(got-want)/want > 1e-9 {
		t.Errorf("lost at 2^-16: %g, want %g", got, want)
	}
	if m.Lost(10, grad.FP16) > 1e-3 || !m.Overflows(16, grad.FP16) || m.Overflows(15, grad.FP16) {
		t.Errorf("at 2^10 lost %g; overflow at 2^15 %v, 2^16 %v", m.Lost(10, grad.FP16), m.Overflows(15, grad.FP16), m.Overflows(16, grad.FP16))
	}
	if l, ok := grad.LostMass([]float32{2, 0}, []float32{1, 1}, 1); !ok || math.Abs(l-math.Sqrt(0.5)) > 1e-12 {
		t.Errorf("LostMass %g %v, want √½", l, ok)
	}
}

// TestEstimateCalibrated: where the measured run at the settled scale
// loses three times what the gradients' own rounding explains, the
// estimates at the other scales are three times theirs.
func TestEstimateCalibrated(t *testing.T) {
	w := newWorld(t, 16, nil)
	f := w.facts()
	raw := f.estimate(0, -6)
	r := w.emulate(f, 16)
	p := f.gradients().params[0]
	kept := 1 - 3*f.estimate(0, 16)
	for i, x := range w.b.FP32.Params[p.value] {
		r.Params[p.value][i] = float32(math.Ldexp(float64(x)*kept, 16))
	}
	w.b.Runs[16] = r
	if got, measured := f.lost(0, -6); measured || math.Abs(got-3*raw) > 1e-3*raw {
		t.Errorf("estimate at 2^-6 %g (measured %v), want 3 × %g", got, measured, raw)
	}
	if got, _ := f.lost(0, 16); math.Abs(got-3*f.estimate(0, 16)) > 1e-6 {
		t.Errorf("measured at 2^16 %g, want the run's %g", got, 3*f.estimate(0, 16))
	}
}

// TestHealthyRunsOnce: a clean settled scale far from overflow is
// confirmed by one run; the window's start is then the estimate's with
// estimateMargin, above where the estimate alone would put it.
func TestHealthyRunsOnce(t *testing.T) {
	w := newWorld(t, 16, nil)
	f := w.facts()
	if next := f.NextRuns(); !slices.Equal(next, []int{16}) {
		t.Fatalf("runs %v, want [16]", next)
	}
	w.b.Runs[16] = w.emulate(f, 16)
	if next := f.NextRuns(); len(next) != 0 {
		t.Fatalf("after the settled run, runs %v, want none", next)
	}
	s := f.scales()
	if s.cleanFrom == nil || !f.mayBeClean(*s.cleanFrom-1) || f.mayBeClean(*s.cleanFrom-3) {
		t.Errorf("window from %v: want the estimate alone to call the scale below clean, and not three below", s.cleanFrom)
	}
}

// TestParamName: a weight the exporter renamed is reported by its module.
func TestParamName(t *testing.T) {
	for _, c := range []struct {
		p    param
		want string
	}{
		{param{value: "onnx::MatMul_604", module: "model.layers.0.mlp.down_proj"}, "model.layers.0.mlp.down_proj.weight, exported as onnx::MatMul_604"},
		{param{value: "fc.bias", module: "fc"}, "fc.bias"},
		{param{value: "onnx::MatMul_7"}, "onnx::MatMul_7"},
		{param{value: "val_143", module: "bert.encoder.layer.1.attention.self.query"}, "bert.encoder.layer.1.attention.self.query.weight, exported as val_143"},
		{param{value: "val_", module: "m"}, "val_"},
		{param{value: "val_x1", module: "m"}, "val_x1"},
	} {
		if got := c.p.name(); got != c.want {
			t.Errorf("name of %q in %q = %q, want %q", c.p.value, c.p.module, got, c.want)
		}
	}
}

// runUntilDone answers NextRuns with emulate's runs, NaN/Inf where the
// fp32 maxima overflow or nonFinite says, and returns the exponents run,
// in order.
func (w *world) runUntilDone(t *testing.T, nonFinite func(e int) bool) []int {
	t.Helper()
	var order []int
	for i := 0; ; i++ {
		f := w.facts()
		next := f.NextRuns()
		if len(next) == 0 {
			return order
		}
		if i > maxRuns {
			t.Fatalf("NextRuns keeps asking: %v", next)
		}
		for _, e := range next {
			if f.MassesAt(e) != (e == w.b.MinExp) {
				t.Errorf("masses at 2^%d: %v", e, f.MassesAt(e))
			}
			// the fp32 gradients scaled (emulate's overflow would read
			// the runs made so far)
			r := &grad.Run{Exp: e, Rounded: true, Params: map[string][]float32{}}
			for k, v := range w.b.FP32.Params {
				g := make([]float32, len(v))
				for i, x := range v {
					g[i] = float32(math.Ldexp(float64(x), e))
				}
				if f.maximaOverflow(e) || nonFinite(e) {
					g[0] = float32(math.NaN())
				}
				r.Params[k] = g
			}
			w.b.Runs[e] = r
			order = append(order, e)
		}
	}
}

// TestSavedValuesEveryScale: the emulated backward is NaN at the settled
// scale where the fp32 maxima keep every gradient far below overflow (the
// values the fp16 forward saved break it, as a distance fp16 rounds to 0
// breaks sqrt's gradient): the next run is the smallest scale, not the
// next one down, and NaN there too is overflow at every scale, said as
// such.
func TestSavedValuesEveryScale(t *testing.T) {
	w := newWorld(t, 16, nil)
	if got := w.runUntilDone(t, func(int) bool { return true }); !slices.Equal(got, []int{16, -20}) {
		t.Fatalf("runs %v, want [16 -20]", got)
	}
	tr, fs, _ := w.audit(t, checks.Selection{})
	b := tr.Backward
	if b.Verdict != report.BackwardOverflowEveryScale || !slices.Contains(ids(fs), "FP6006") || !strings.Contains(b.VerdictText, "saved") {
		t.Errorf("verdict %s (%s), findings %v; want overflow at every scale from the saved values", b.Verdict, b.VerdictText, ids(fs))
	}
}

// TestSavedValuesSearch: where the saved values break the backward only
// from some scale up (a gradient far larger than fp32's, finite), the
// runs halve the range between the smallest scale and the settled one,
// and the largest clean scale is the one the runs bound, not the fp32
// maxima's.
func TestSavedValuesSearch(t *testing.T) {
	w := newWorld(t, 16, nil)
	got := w.runUntilDone(t, func(e int) bool { return e > 2 })
	if len(got) < 3 || got[0] != 16 || got[1] != -20 || len(got) > maxRuns {
		t.Fatalf("runs %v: want 16, then -20, then halving, at most %d", got, maxRuns)
	}
	tr, _, _ := w.audit(t, checks.Selection{})
	b := tr.Backward
	if b.MaxCleanExp == nil || *b.MaxCleanExp != 2 || b.SettledExp == nil || *b.SettledExp != 2 || b.Verdict != report.BackwardHealthy {
		t.Errorf("verdict %s (%s), largest clean %v, settled %v; want healthy at 2^2", b.Verdict, b.VerdictText, b.MaxCleanExp, b.SettledExp)
	}
}

// TestSavedReference: an emulated run loses its mass against the
// backward at the values the fp16 forward saved, not against fp32: a
// forward whose rounding moves a parameter gradient by 20% (the run
// equal to that reference) loses nothing; against fp32 it would lose
// 20%.
func TestSavedReference(t *testing.T) {
	for _, saved := range []bool{true, false} {
		w := newWorld(t, 16, nil)
		ref := &grad.Run{Params: map[string][]float32{}}
		for k, v := range w.b.FP32.Params {
			ref.Params[k] = make([]float32, len(v))
			for i, x := range v {
				ref.Params[k][i] = 1.2 * x
			}
		}
		if saved {
			w.b.Saved = ref
		}
		f := w.facts()
		r := &grad.Run{Exp: 16, Rounded: true, Params: map[string][]float32{}}
		for k, v := range ref.Params {
			r.Params[k] = make([]float32, len(v))
			for i, x := range v {
				r.Params[k][i] = float32(math.Ldexp(float64(x), 16))
			}
		}
		w.b.Runs[16] = r
		l, k := f.worst(16)
		want := 0.0
		if !saved {
			want = 0.2
		}
		if k < 0 || math.Abs(l-want) > 1e-6 {
			t.Errorf("saved reference %v: lost %g (parameter %d), want %g", saved, l, k, want)
		}
	}
}
