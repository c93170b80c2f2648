package grad_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"fp16audit/internal/batch"
	"fp16audit/internal/execute/backward"
	"fp16audit/internal/grad"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/precision"
	"fp16audit/internal/tensor"
)

// The fixtures under fixtures/torch/train come from PyTorch (gen.py there):
// models exported by torch.onnx.export, a batch, a target, and the
// torch.autograd gradients of the same loss for every parameter and for
// the outputs of the leaf modules. The backward graph must reproduce all of
// them in fp32.

const fixtureDir = "../../fixtures/torch/train"

// dynamoFixtureDir holds the same fixtures exported by torch 2.9's dynamo
// exporter (gen.py --exporter dynamo), with torch 2.9's autograd; those
// whose truth is a train-mode BatchNorm are left out there (the exporter
// folds it), as its manifest's "skipped" says.
const dynamoFixtureDir = "../../fixtures/torch/train_dynamo"

// autogradTol bounds max|ours − torch| / max|torch| per tensor: fp32
// rounding differences between two implementations of the same formulas
// (different summation orders in MatMul, Conv and the reductions), relative
// to the tensor's largest element.
const autogradTol = 5e-5

type manifest struct {
	Scales   []int          `json:"scales"`
	Fixtures []fixtureEntry `json:"fixtures"`
}

type fixtureEntry struct {
	// Dir is the folder the entry's manifest lies in (set on reading).
	Dir       string  `json:"-"`
	Name      string  `json:"name"`
	Model     string  `json:"model"`
	Data      string  `json:"data"`
	Loss      string  `json:"loss"`
	LossValue float64 `json:"loss_value"`
	Output    string  `json:"output"`
	Inputs    []struct {
		Name, Key string
	} `json:"inputs"`
	Target string `json:"target"`
	// ClassAxis, IgnoreIndex and Shift say how the cross-entropy read
	// its target (absent: PyTorch's defaults); Scored is how many
	// targets it averaged over.
	ClassAxis   int    `json:"class_axis"`
	IgnoreIndex *int64 `json:"ignore_index"`
	Shift       bool   `json:"shift"`
	Scored      int64  `json:"scored"`
	Params      []struct {
		Name, Key string
	} `json:"params"`
	Activations []struct {
		Module, Value, Fwd, Grad string
	} `json:"activations"`
	Experiment *struct {
		Modules map[string]struct {
			Value    string     `json:"value"`
			Overflow []bool     `json:"overflow"`
			Flush    []float64  `json:"flush"`
			MaxAbs   []*float64 `json:"maxabs"`
		} `json:"modules"`
	} `json:"experiment"`
}

func readManifest(t testing.TB) manifest { return readManifestIn(t, fixtureDir) }

func readManifestIn(t testing.TB, dir string) manifest {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m manifest
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for i := range m.Fixtures {
		m.Fixtures[i].Dir = dir
	}
	return m
}

// bothExporters returns the fixtures of both exporters, labelled
// "torchscript/<name>" and "dynamo/<name>".
func bothExporters(t testing.TB) (labels []string, entries []fixtureEntry) {
	for _, d := range []struct{ label, dir string }{{"torchscript", fixtureDir}, {"dynamo", dynamoFixtureDir}} {
		for _, e := range readManifestIn(t, d.dir).Fixtures {
			labels = append(labels, d.label+"/"+e.Name)
			entries = append(entries, e)
		}
	}
	return labels, entries
}

// loaded is a fixture with its backward graph built and a session open.
type loaded struct {
	e      fixtureEntry
	model  *onnx.Model
	arrays map[string]*tensor.Tensor
	inputs []*tensor.Tensor
	target *tensor.Tensor
	facts  *grad.Facts
	res    *grad.Result
	sess   *backward.Session
}

func loadFixture(t testing.TB, e fixtureEntry, rounding func(*onnx.Model) *grad.Rounding, extra ...string) *loaded {
	t.Helper()
	requireORT(t)
	dir := e.Dir
	if dir == "" {
		dir = fixtureDir
	}
	m, err := onnx.Load(filepath.Join(dir, e.Model))
	if err != nil {
		t.Fatal(err)
	}
	ts, err := batch.ReadNPZ(filepath.Join(dir, e.Data))
	if err != nil {
		t.Fatal(err)
	}
	l := &loaded{e: e, model: m, arrays: map[string]*tensor.Tensor{}}
	for _, x := range ts {
		l.arrays[x.Name] = x
	}
	for _, in := range e.Inputs {
		l.inputs = append(l.inputs, l.arrays[in.Key])
	}
	l.target = l.arrays[e.Target]
	// the dynamo exporter writes the weights beside the model
	opt := sessionOptions
	opt.ExternalDataDir = dir
	facts, err := backward.Probe(context.Background(), ortLib, m.Proto, "", l.inputs, opt)
	if err != nil {
		t.Fatal(err)
	}
	l.facts = facts
	gopt := grad.Options{Loss: grad.Loss(e.Loss), Output: e.Output, TargetShape: l.target.Shape, CrossEntropy: e.crossEntropy()}
	if rounding != nil {
		gopt.Rounding = rounding(m)
	}
	l.res, err = grad.Build(m.Proto, facts, gopt)
	if err != nil {
		t.Fatal(err)
	}
	l.sess, err = backward.NewSession(l.res, opt, append(l.res.Outputs(), extra...))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// crossEntropy is how the fixture's cross-entropy reads its target.
func (e fixtureEntry) crossEntropy() grad.CrossEntropyOptions {
	return grad.CrossEntropyOptions{ClassAxis: e.ClassAxis, IgnoreIndex: e.IgnoreIndex, Shift: e.Shift}
}

func TestAutograd(t *testing.T) {
	labels, entries := bothExporters(t)
	for k, e := range entries {
		t.Run(labels[k], func(t *testing.T) {
			var values []string
			for _, a := range e.Activations {
				values = append(values, a.Value)
			}
			l := loadFixture(t, e, nil, values...)
			defer l.sess.Close()
			if len(l.res.Unsupported) > 0 {
				t.Errorf("unsupported nodes: %+v", l.res.Unsupported)
			}
			outs, err := l.sess.Run(l.inputs, l.target, 1)
			if err != nil {
				t.Fatal(err)
			}
			loss := float64(floats(t, outs[l.res.Loss])[0])
			if math.Abs(loss-e.LossValue) > 1e-5*math.Max(1, math.Abs(e.LossValue)) {
				t.Errorf("loss %.8g, torch %.8g", loss, e.LossValue)
			}
			if e.Scored != 0 {
				if n, err := l.res.ScoredTargets(l.target); err != nil || n != e.Scored {
					t.Errorf("scored targets %d (%v), torch averaged over %d", n, err, e.Scored)
				}
			}
			// A parameter's gradient sums terms the size of its module's
			// output gradient; when the sum cancels (the attention key bias:
			// softmax ignores a constant added to a row of scores, so its
			// gradient is zero up to rounding), the rounding left over is
			// relative to those terms, not to the sum.
			termSize := map[string]float64{}
			for _, a := range e.Activations {
				_, m := maxAbs(floats(t, l.arrays[a.Grad]))
				termSize[a.Module] = m
			}
			worst, worstAt := 0.0, ""
			check := func(what, value, key string) {
				gr, ok := l.res.GradOf(value)
				if !ok {
					t.Errorf("%s %q: no gradient", what, value)
					return
				}
				want := floats(t, l.arrays[key])
				got := floats(t, outs[gr.Name])
				if len(got) != len(want) {
					t.Errorf("%s %q: %d elements, torch has %d", what, value, len(got), len(want))
					return
				}
				floor := 1e-30
				if i := strings.LastIndex(value, "."); i > 0 && what == "parameter" {
					floor = math.Max(floor, termSize[value[:i]])
				}
				e, at := relErr(got, want, floor)
				if e > worst {
					worst, worstAt = e, what+" "+value
				}
				if e > autogradTol {
					t.Errorf("%s %q: max error %.3g of max |grad| at element %d (ours %g, torch %g)", what, value, e, at, got[at], want[at])
				}
			}
			for _, p := range e.Params {
				check("parameter", p.Name, p.Key)
			}
			for _, a := range e.Activations {
				// the module's output must be the value the mapping names
				fe, _ := relErr(floats(t, outs[a.Value]), floats(t, l.arrays[a.Fwd]), 1e-30)
				if fe > autogradTol {
					t.Errorf("module %s: ONNX value %q differs from torch's output by %.3g", a.Module, a.Value, fe)
				}
				check("module "+a.Module, a.Value, a.Grad)
			}
			t.Logf("%d parameters, %d activations; worst error %.2g (%s)", len(e.Params), len(e.Activations), worst, worstAt)
		})
	}
}

// fp16Stats are one rounded gradient's statistics, as the PyTorch
// experiment records them per module: whether the rounded gradient holds
// Inf or NaN, and the fraction of its nonzero fp32 elements that round to
// zero.
func fp16Stats(raw, rounded []float32) (overflow bool, flush float64) {
	nonzero, flushed := 0, 0
	for i, r := range raw {
		v := rounded[i]
		if math.IsInf(float64(v), 0) || math.IsNaN(float64(v)) {
			overflow = true
		}
		if r != 0 {
			nonzero++
			if v == 0 {
				flushed++
			}
		}
	}
	if nonzero > 0 {
		flush = float64(flushed) / float64(nonzero)
	}
	return overflow, flush
}

// flushTol bounds the difference in flushed fraction between the emulation
// and PyTorch: an element within fp32 rounding of half the smallest fp16
// subnormal may round either way.
const flushTol = 0.01

// deepFlushTol is flushTol for deep_mlp, whose 24 rounded gradients form
// one chain that flushes most of its elements near 2^-25: an element an
// upstream rounding keeps or drops differently (ONNX Runtime's Gemm sums
// in another order than torch's mm) changes the elements it feeds, and
// the flushed fractions drift by up to 2% deep in the chain.
const deepFlushTol = 0.02

func TestFP16Experiment(t *testing.T) {
	man := readManifest(t)
	labels, entries := bothExporters(t)
	for k, e := range entries {
		if e.Experiment == nil {
			continue
		}
		t.Run(labels[k], func(t *testing.T) {
			round := func(*onnx.Model) *grad.Rounding {
				r := &grad.Rounding{Values: map[string]int32{}}
				for _, m := range e.Experiment.Modules {
					r.Values[m.Value] = elemFloat16
				}
				return r
			}
			l := loadFixture(t, e, round)
			defer l.sess.Close()
			tol := flushTol
			if e.Name == "deep_mlp" {
				tol = deepFlushTol
			}
			mismatches, worstFlush := 0, 0.0
			overflowAt := map[string][]bool{}
			flushAt := map[string][]float64{}
			for k, exp := range man.Scales {
				outs, err := l.sess.Run(l.inputs, l.target, float32(math.Ldexp(1, exp)))
				if err != nil {
					t.Fatal(err)
				}
				for mod, want := range e.Experiment.Modules {
					gr, ok := l.res.GradOf(want.Value)
					if !ok || gr.Raw == "" {
						t.Fatalf("module %s: no rounded gradient for %q", mod, want.Value)
					}
					over, flush := fp16Stats(floats(t, outs[gr.Raw]), floats(t, outs[gr.Name]))
					overflowAt[mod] = append(overflowAt[mod], over)
					flushAt[mod] = append(flushAt[mod], flush)
					worstFlush = math.Max(worstFlush, math.Abs(flush-want.Flush[k]))
					if over != want.Overflow[k] || math.Abs(flush-want.Flush[k]) > tol {
						mismatches++
						t.Errorf("scale 2^%d module %s: overflow %v flushed %.4f, PyTorch overflow %v flushed %.4f",
							exp, mod, over, flush, want.Overflow[k], want.Flush[k])
					}
				}
			}
			t.Logf("%d modules × %d scales, %d mismatches, largest flushed-fraction difference %.2g",
				len(e.Experiment.Modules), len(man.Scales), mismatches, worstFlush)
			// The verdicts each fixture was designed for, from the
			// emulation's own numbers.
			for mod, w := range expectedWindows[e.Name] {
				clean, from := window(man.Scales, overflowAt[mod], flushAt[mod])
				if clean != w[0] || from != w[1] {
					t.Errorf("module %s: overflow-free up to 2^%d, flushes ≤ 1%% from 2^%d; want 2^%d and 2^%d", mod, clean, from, w[0], w[1])
				}
			}
		})
	}
}

// expectedWindows holds, per fixture and module, the largest loss-scale
// exponent at which the module's fp16 gradient is still finite and the
// smallest from which at most 1% of its nonzero elements flush to zero.
var expectedWindows = map[string]map[string][2]int{
	// mse on targets near 3000: scale·dL/dpred ≈ 2·3000/16·scale passes
	// 65504 above 2^7; every module overflows from there on.
	"regression": {"head": {6, 0}, "fc1": {6, 0}},
	// LayerScale 1e-6 on block 0's branches: their outputs' gradients are
	// a millionth of the residual stream's and flush below 2^10; the seed
	// ((softmax − onehot)/4 ≤ 0.25) overflows from 2^18 on.
	"transformer_o17": {"blocks.0.attn.proj": {18, 10}, "blocks.0.mlp.fc2": {18, 10}, "blocks.1.attn.proj": {18, 0}, "head": {18, 0}},
	"transformer_o14": {"blocks.0.attn.proj": {18, 10}, "blocks.0.mlp.fc2": {18, 10}},
	// raw pixels: conv1's output (|x| up to 4.5e3) is renormalized by
	// train-mode BatchNorm, which divides its gradient by the batch std.
	"cnn_bn_train": {"conv1": {18, 8}, "conv2": {18, 0}, "fc": {18, 0}},
}

// window returns the largest exponent up to which no scale overflows and
// the smallest exponent at which the flushed fraction is at most 1%.
func window(scales []int, overflow []bool, flush []float64) (int, int) {
	clean := -1
	for k, e := range scales {
		if overflow[k] {
			break
		}
		clean = e
	}
	from := -1
	for k, e := range scales {
		if flush[k] <= 0.01 {
			from = e
			break
		}
	}
	return clean, from
}

// TestAutocastRounding builds the backward of the train-mode CNN with
// autocast's rounding: Conv and Linear run in fp16, so their weight (and
// bias) gradients are rounded Sites, their outputs' gradients are held in
// fp16 (BatchNorm and ReLU keep their input's fp16), and the seed reaching
// the fp16 logits overflows once scale × dL/dlogits passes 65504.
func TestAutocastRounding(t *testing.T) {
	var e fixtureEntry
	for _, f := range readManifest(t).Fixtures {
		if f.Name == "cnn_bn_train" {
			e = f
		}
	}
	round := func(m *onnx.Model) *grad.Rounding {
		pol, err := precision.PolicyByName("autocast-fp16")
		if err != nil {
			t.Fatal(err)
		}
		a := precision.Assign(pol, m.Proto.Graph, m.Index.Order(), m.Index.ElemType)
		return grad.AutocastRounding(m.Proto.Graph, a)
	}
	l := loadFixture(t, e, round)
	defer l.sess.Close()
	var sites []string
	for _, s := range l.res.Sites {
		sites = append(sites, s.Value)
	}
	slices.Sort(sites)
	want := []string{"conv1.weight", "conv2.weight", "conv3.weight", "fc.bias", "fc.weight"}
	if !slices.Equal(sites, want) {
		t.Errorf("rounded sites %v, want %v", sites, want)
	}
	for _, v := range []string{"logits", "/conv1/Conv_output_0", "/bn1/BatchNormalization_output_0", "/relu1/Relu_output_0"} {
		if gr, ok := l.res.GradOf(v); !ok || gr.Raw == "" {
			t.Errorf("%s: gradient not held in fp16", v)
		}
	}
	for _, c := range []struct {
		exp      int
		overflow bool
	}{{10, false}, {24, true}} {
		outs, err := l.sess.Run(l.inputs, l.target, float32(math.Ldexp(1, c.exp)))
		if err != nil {
			t.Fatal(err)
		}
		gr, _ := l.res.GradOf("logits")
		over, _ := fp16Stats(floats(t, outs[gr.Raw]), floats(t, outs[gr.Name]))
		if over != c.overflow {
			t.Errorf("scale 2^%d: logits gradient overflow %v, want %v", c.exp, over, c.overflow)
		}
	}
}

// TestMassSession: the backward audit's session returns, per rounded
// gradient, the Mass of the tensor a full session fetches
// before the rounding, and the parameter gradients that session fetches;
// with the rounding off, the parameter gradients of the fp32 graph.
//
// Both sessions run at the audit's optimization level, "none", where
// every node computes as written, so equal graphs give equal bits and the
// test demands them. At ONNX Runtime's level "all" the two graphs fuse
// differently (the full session fetches every tensor, which blocks
// fusions such as the attention's MatMul with its scale Mul), and the
// results differ by the order of float32 sums (measured ~1e-7 of the
// largest |g|; masses off by an element crossing a bucket edge): no bug
// of the mass session, and no level the audit runs at.
func TestMassSession(t *testing.T) {
	sessionOptions := sessionOptions
	sessionOptions.Optimization = "none"
	var e fixtureEntry
	for _, f := range readManifest(t).Fixtures {
		if f.Name == "transformer_o17" {
			e = f
		}
	}
	requireORT(t)
	lib, err := onnxrt.FindLibrary("")
	if err != nil {
		t.Fatal(err)
	}
	m, err := onnx.Load(filepath.Join(fixtureDir, e.Model))
	if err != nil {
		t.Fatal(err)
	}
	l := loadFixture(t, e, nil)
	l.sess.Close()
	// The mass session is handed the weights over the loaded model's
	// memory, as in an audit; the full sessions copy them.
	massOptions := sessionOptions
	massOptions.ExternalDataDir = filepath.Dir(m.Path)
	facts, err := backward.Probe(context.Background(), ortLib, m.Proto, "", l.inputs, sessionOptions)
	if err != nil {
		t.Fatal(err)
	}
	r := &grad.Rounding{Values: map[string]int32{}}
	for _, mod := range e.Experiment.Modules {
		r.Values[mod.Value] = elemFloat16
	}
	build := func(r *grad.Rounding) *grad.Result {
		res, err := grad.Build(m.Proto, facts, grad.Options{Loss: grad.Loss(e.Loss), Output: e.Output, TargetShape: l.target.Shape, Rounding: r})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res, res32 := build(r), build(nil)
	ms, err := backward.NewMassSession(lib, res, massOptions, m.Path, nil, l.inputs, l.target, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	for _, c := range []struct {
		res     *grad.Result
		exp     int
		rounded bool
	}{{res, 10, true}, {res, 0, true}, {res32, 0, false}} {
		full, err := backward.NewSession(c.res, sessionOptions, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, err := full.Run(l.inputs, l.target, float32(math.Ldexp(1, c.exp)))
		full.Close()
		if err != nil {
			t.Fatal(err)
		}
		got, err := ms.Run(c.exp, c.rounded)
		if err != nil {
			t.Fatal(err)
		}
		// The unrounded run summarises every gradient held in 16 bits,
		// as the fp32 backward computes it; a rounded run skips them.
		if c.rounded && (len(got.Grads) > 0 || len(got.Sites) > 0) {
			t.Errorf("2^%d rounded: %d masses, want none (switched off)", c.exp, len(got.Grads)+len(got.Sites))
		}
		if !c.rounded {
			masses := 0
			for _, g := range res.Grads {
				if g.Raw == "" {
					continue
				}
				masses++
				g32, ok := res32.GradOf(g.Value)
				if !ok {
					t.Fatalf("%s: no fp32 gradient", g.Value)
				}
				if m := got.Grads[g.Value]; m == nil || !sameMass(m, massOf(floats(t, want[g32.Name]))) {
					t.Errorf("%s: mass differs from the fp32 gradient's", g.Value)
				}
			}
			if masses == 0 {
				t.Fatal("no gradient held in 16 bits")
			}
		}
		params := res.Params()
		if len(params) == 0 || len(got.Params) != len(params) {
			t.Fatalf("%d parameter gradients, want %d", len(got.Params), len(params))
		}
		for _, p := range params {
			w := floats(t, want[p.Name])
			if e, k := relErr(got.Params[p.Value], w, 1e-30); e > 0 {
				t.Errorf("2^%d rounded %v: %s differs from the full session at %d (rel %g)", c.exp, c.rounded, p.Value, k, e)
			}
		}
	}
}

// TestCrossEntropyLayouts: the same losses with the targets flattened, as
// language-model code passes them (labels.view(-1)), and with the class
// axis named rather than read from the target's shape, give torch's loss
// again; the tagger's two outputs must be told apart; a class index out of
// range is refused by name.
func TestCrossEntropyLayouts(t *testing.T) {
	requireORT(t)
	entries := map[string]fixtureEntry{}
	for _, e := range readManifest(t).Fixtures {
		entries[e.Name] = e
	}
	for _, c := range []struct {
		fixture string
		flat    bool
		axis    int
	}{
		{"llama", true, 0}, {"llama", false, -1}, {"llama", true, -1},
		{"tagger", true, 0}, {"tagger", false, 1},
	} {
		e := entries[c.fixture]
		t.Run(fmt.Sprintf("%s flat=%v axis=%d", c.fixture, c.flat, c.axis), func(t *testing.T) {
			l := loadFixture(t, e, nil)
			l.sess.Close()
			target := l.target
			if c.flat {
				target = &tensor.Tensor{Name: target.Name, DType: target.DType, Shape: []int64{tensor.NumElements(target.Shape)}, Data: target.Data}
			}
			ce := e.crossEntropy()
			ce.ClassAxis = c.axis
			res, err := grad.Build(l.model.Proto, l.facts, grad.Options{Loss: grad.CrossEntropy, Output: e.Output, TargetShape: target.Shape, CrossEntropy: ce})
			if err != nil {
				t.Fatal(err)
			}
			if res.CrossEntropy.ClassAxis != e.ClassAxis {
				t.Errorf("class axis %d, want %d", res.CrossEntropy.ClassAxis, e.ClassAxis)
			}
			s, err := backward.NewSession(res, sessionOptions, []string{res.Loss})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			outs, err := s.Run(l.inputs, target, 1)
			if err != nil {
				t.Fatal(err)
			}
			if loss := float64(floats(t, outs[res.Loss])[0]); math.Abs(loss-e.LossValue) > 1e-5*math.Max(1, e.LossValue) {
				t.Errorf("loss %.8g, torch %.8g", loss, e.LossValue)
			}
		})
	}

	e := entries["tagger"]
	l := loadFixture(t, e, nil)
	l.sess.Close()
	_, err := grad.Build(l.model.Proto, l.facts, grad.Options{Loss: grad.CrossEntropy, TargetShape: l.target.Shape, CrossEntropy: e.crossEntropy()})
	if want := `the model has 2 outputs ("logits" [3 5 12], "features" [3 12 16])`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("no output named: error %v, want %q", err, want)
	}
	bad := &tensor.Tensor{Name: "target", DType: l.target.DType, Shape: l.target.Shape, Data: slices.Clone(l.target.Data)}
	bad.Data[8*13] = 5 // [1, 1]: class 5 of 5
	if _, err := l.res.ScoredTargets(bad); err == nil || !strings.Contains(err.Error(), "target element 13 (at [1 1] of [3 12]) is 5") {
		t.Errorf("class 5 of 5: error %v", err)
	}
}

// massOf is the Mass of x by its definition, one element at a time.
func massOf(x []float32) *grad.Mass {
	m := &grad.Mass{}
	for _, v := range x {
		a := math.Abs(float64(v))
		if math.IsNaN(a) || math.IsInf(a, 0) {
			m.NonFinite++
			continue
		}
		e := math.Float32bits(v) >> 23 & 0xff
		m.Count[e]++
		m.SumSq[e] += a * a
		m.Max = max(m.Max, a)
	}
	return m
}

// sameMass: counts, maximum and non-finite count equal, sums of squares
// equal up to the order of float64 additions (DESIGN: exactness).
func sameMass(got, want *grad.Mass) bool {
	if got.Count != want.Count || got.Max != want.Max || got.NonFinite != want.NonFinite {
		return false
	}
	for e, w := range want.SumSq {
		if math.Abs(got.SumSq[e]-w) > 1e-12*w {
			return false
		}
	}
	return true
}
