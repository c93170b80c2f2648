package diagnose

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"fp16audit/checks"
	"fp16audit/internal/batch"
	"fp16audit/internal/diagnose/evidence"
	"fp16audit/internal/diagnose/fix"
	"fp16audit/internal/diagnose/inputs"
	"fp16audit/internal/lint"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/internal/tensor"
	"fp16audit/report"
)

// The forward verdict tree on hand-made results: each test builds a small
// graph, the statistics its passes would have observed and, where a fix
// is verified, the statistics of the rerun. Nothing here runs a model, so
// these tests need neither ONNX Runtime nor cgo (TestNoRuntime checks).

const rows = 4 // samples in the test batch

// world is one audit's input: a graph, the policy, the batch of its input
// x [rows, 4] and what each pass observed (values left out are finite,
// max |x| 1).
type world struct {
	g      *onnx.GraphProto
	policy string
	x      []float32
	saved  tensor.DType
	casts  []int
	passes map[string]map[string]*observe.Stats
}

func node(op, name, inputs, outputs string, attrs ...*onnx.AttributeProto) *onnx.NodeProto {
	return onnx.Node(op, name, strings.Fields(inputs), strings.Fields(outputs), attrs...)
}

func weight(name string, dims ...int64) *onnx.TensorProto {
	n := int64(1)
	for _, d := range dims {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = 0.5
	}
	return onnx.FloatTensor(name, dims, v)
}

// newGraph is a graph with input x [N,4] and the given outputs [N,4].
func newGraph(outputs []string, inits []*onnx.TensorProto, nodes ...*onnx.NodeProto) *onnx.GraphProto {
	g := &onnx.GraphProto{Name: "test", Input: []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, "N", 4)},
		Initializer: inits, Node: nodes}
	for _, o := range outputs {
		g.Output = append(g.Output, onnx.TensorValueInfo(o, onnx.TensorProto_FLOAT, "N", 4))
	}
	return g
}

// mlp: x → fc1 → h → act → r → head → y (the final layer), and
// h → aux (h·h) → z, a second output whose Mul is an inner op.
func mlp() *onnx.GraphProto {
	return newGraph([]string{"y", "z"}, []*onnx.TensorProto{weight("W1", 4, 4), weight("W2", 4, 4)},
		node("MatMul", "/fc1/MatMul", "x W1", "h"),
		node("Relu", "/act/Relu", "h", "r"),
		node("MatMul", "/head/MatMul", "r W2", "y"),
		node("Mul", "/aux/Mul", "h h", "z"),
	)
}

// castNet: the model's own x.half(), squared, then the head.
func castNet() *onnx.GraphProto {
	return newGraph([]string{"y"}, []*onnx.TensorProto{weight("W2", 4, 4)},
		node("Cast", "/sq/Cast", "x", "c", onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT16))),
		node("Mul", "/sq/Mul", "c c", "m"),
		node("MatMul", "/head/MatMul", "m W2", "y"),
	)
}

// maskNet: scores + torch.full((s, s), -inf).triu(1), softmax, head.
func maskNet() *onnx.GraphProto {
	neg := onnx.FloatTensor("", []int64{1}, []float32{float32(math.Inf(-1))})
	return newGraph([]string{"y"}, []*onnx.TensorProto{weight("Wq", 4, 4), weight("W2", 4, 4), onnx.Int64Tensor("one", nil, []int64{1})},
		node("MatMul", "/attn/MatMul", "x Wq", "s"),
		node("Shape", "/Shape", "s", "shape"),
		node("ConstantOfShape", "/ConstantOfShape", "shape", "full", onnx.AttrTensor("value", neg)),
		node("Trilu", "/Trilu", "full one", "mask"),
		node("Add", "/attn/Add", "s mask", "masked"),
		node("Softmax", "/attn/Softmax", "masked", "p"),
		node("MatMul", "/head/MatMul", "p W2", "y"),
	)
}

// fillNet: scores.masked_fill(mask, c) with a Where reading the constant
// fill; softmax absorbs its -Inf unless the Where feeds the output itself.
func fillNet(c float32, softmax bool) *onnx.GraphProto {
	nodes := []*onnx.NodeProto{
		node("MatMul", "/attn/MatMul", "x Wq", "s"),
		node("Less", "/attn/Less", "s zero", "cond"),
		node("Where", "/attn/Where", "cond fill s", "w"),
	}
	if softmax {
		nodes = append(nodes, node("Softmax", "/attn/Softmax", "w", "p"), node("MatMul", "/head/MatMul", "p W2", "y"))
	} else {
		nodes = append(nodes, node("Identity", "/out/Identity", "w", "y"))
	}
	return newGraph([]string{"y"}, []*onnx.TensorProto{weight("Wq", 4, 4), weight("W2", 4, 4),
		onnx.FloatTensor("zero", nil, []float32{0}), onnx.FloatTensor("fill", nil, []float32{c})}, nodes...)
}

func normal() []float32 {
	x := make([]float32, rows*4)
	for i := range x {
		x[i] = float32(math.Sin(float64(i)*1.7)) * 1.5
	}
	return x
}

// raw is an unscaled table: columns around 500.
func raw() []float32 {
	x := normal()
	for i := range x {
		x[i] = 500 + 300*x[i]
	}
	return x
}

func fin(max float32) *observe.Stats {
	s := observe.NewStats()
	s.Count, s.Finite, s.MaxAbs, s.ArgMaxBatch, s.ArgMax, s.MinNonzero = 16, 16, max, 0, 0, max/8
	return &s
}

func bad(max float32, nan, pos, neg int64) *observe.Stats {
	s := fin(max)
	s.NaN, s.PosInf, s.NegInf = nan, pos, neg
	s.Finite = s.Count - nan - pos - neg
	return s
}

func (w world) facts(t *testing.T) (*evidence.Facts, []batch.Batch) {
	t.Helper()
	m := &onnx.Model{Path: "test.onnx", Proto: onnx.NewModel(w.g, 17)}
	idx, err := onnx.NewIndex(w.g)
	if err != nil {
		t.Fatal(err)
	}
	m.Index = idx
	p, err := precision.PolicyByName(w.policy)
	if err != nil {
		t.Fatal(err)
	}
	st := lint.NewFacts(m, p)
	x := w.x
	if x == nil {
		x = normal()
	}
	saved := w.saved
	if saved == 0 {
		saved = tensor.Float32
	}
	b := batch.Batch{Source: "test.npy", Inputs: []*tensor.Tensor{tensor.FromFloat32s("x", []int64{rows, 4}, x)}, Saved: []tensor.DType{saved}}
	f := &evidence.Facts{Static: st, HalfCasts: map[int]bool{}, Inputs: inputs.Analyze(batch.Specs(w.g, idx), []batch.Batch{b}, idx, evidence.DefaultThresholds.ColumnScale),
		Passes: map[string]*observe.PassResult{}, Values: values(w.g, st.Order), Thresholds: evidence.DefaultThresholds}
	if p.Lower != precision.FP32 {
		f.Main = p.Lower.String()
	}
	for _, c := range w.casts {
		f.HalfCasts[c] = true
	}
	for name, stats := range w.passes {
		f.Passes[name] = result(name, f.Values, stats)
	}
	return f, []batch.Batch{b}
}

func values(g *onnx.GraphProto, order []int) []string {
	var out []string
	for _, ni := range order {
		if g.Node[ni].OpType == "Constant" {
			continue
		}
		for _, o := range g.Node[ni].Output {
			if o != "" && o != "shape" && o != "cond" {
				out = append(out, o)
			}
		}
	}
	return out
}

func result(name string, values []string, stats map[string]*observe.Stats) *observe.PassResult {
	res := &observe.PassResult{Name: name, Stats: map[string]*observe.Stats{}}
	for _, v := range values {
		s, ok := stats[v]
		if !ok {
			s = fin(1)
		}
		res.Stats[v] = s
	}
	return res
}

// runner answers reruns with hand-made statistics and records them.
type runner struct {
	values []string
	answer func(r fix.Rerun) map[string]*observe.Stats
	calls  []fix.Rerun
}

func (rn *runner) Rerun(_ context.Context, r fix.Rerun) (*observe.PassResult, error) {
	rn.calls = append(rn.calls, r)
	var stats map[string]*observe.Stats
	if rn.answer != nil {
		stats = rn.answer(r)
	}
	return result(r.Name, rn.values, stats), nil
}

// clean answers every rerun with finite values.
func clean(fix.Rerun) map[string]*observe.Stats { return nil }

type outcome struct {
	verdict string
	origin  string   // node (or input) of the first origin, "" for none
	errors  []string // the checks of the error-level findings, in order
	text    string   // a part of the verdict text
	fixes   []string // kind=works of each fix
}

func diagnose(t *testing.T, w world, answer func(fix.Rerun) map[string]*observe.Stats, opt Options) (*Diagnosis, *runner) {
	t.Helper()
	f, batches := w.facts(t)
	rn := &runner{values: f.Values, answer: answer}
	d, err := Run(context.Background(), f, rn, batches, opt)
	if err != nil {
		t.Fatal(err)
	}
	return d, rn
}

func check(t *testing.T, d *Diagnosis, want outcome) {
	t.Helper()
	if d.Verdict != want.verdict {
		t.Errorf("verdict %s (%s), want %s", d.Verdict, d.VerdictText, want.verdict)
	}
	origin := ""
	if len(d.Origins) > 0 {
		origin = d.Origins[0].Node + d.Origins[0].Input
	}
	if origin != want.origin {
		t.Errorf("origin %q, want %q", origin, want.origin)
	}
	var errs []string
	for _, fd := range d.Findings {
		if fd.Severity >= checks.SevError {
			errs = append(errs, fd.Check)
		}
	}
	if !slices.Equal(errs, want.errors) {
		t.Errorf("error findings %v, want %v", errs, want.errors)
	}
	if !strings.Contains(d.VerdictText, want.text) {
		t.Errorf("verdict text %q does not say %q", d.VerdictText, want.text)
	}
	var fixes []string
	for _, fx := range d.Fixes {
		w := "fails"
		if fx.Works {
			w = "works"
		}
		fixes = append(fixes, fx.Kind+"="+w)
	}
	if !slices.Equal(fixes, want.fixes) {
		t.Errorf("fixes %v, want %v", fixes, want.fixes)
	}
}

// overflow is what an overflow at h does in the fp16 pass: h, and what
// reads it, is Inf/NaN.
func overflow() map[string]*observe.Stats {
	return map[string]*observe.Stats{"h": bad(6e4, 0, 3, 0), "r": bad(6e4, 0, 3, 0), "y": bad(0, 4, 0, 0), "z": bad(0, 0, 3, 0)}
}

func TestVerdictTree(t *testing.T) {
	big := map[string]*observe.Stats{"h": fin(1e5), "r": fin(1e5), "y": fin(1e5), "z": fin(1e10)}
	for _, tc := range []struct {
		name   string
		w      world
		answer func(fix.Rerun) map[string]*observe.Stats
		opt    Options
		want   outcome
	}{
		{"healthy", world{g: mlp(), policy: "autocast-fp16", passes: map[string]map[string]*observe.Stats{report.PassFP32: nil, report.PassFP16: nil}}, nil, Options{},
			outcome{verdict: report.VerdictHealthy, text: "no NaN/Inf in the fp16 pass"}},
		{"fp32 policy", world{g: mlp(), policy: "fp32", passes: map[string]map[string]*observe.Stats{report.PassFP32: nil}}, nil, Options{},
			outcome{verdict: report.VerdictHealthy, text: "policy fp32"}},
		{"overflowing op beats oversized logits", world{g: mlp(), policy: "autocast-fp16", passes: map[string]map[string]*observe.Stats{
			report.PassFP32: big, report.PassFP16: {"z": bad(0, 0, 4, 0), "y": bad(0, 0, 4, 0)}}}, clean, Options{},
			outcome{verdict: report.VerdictOverflow, origin: "/head/MatMul", errors: []string{"FP2003", "FP2001"}, text: "aux (Mul) overflows fp16 on normalized inputs",
				fixes: []string{"keep-fp32=works"}}},
		{"oversized logits", world{g: mlp(), policy: "autocast-fp16", passes: map[string]map[string]*observe.Stats{
			report.PassFP32: big, report.PassFP16: {"y": bad(0, 0, 4, 0)}}}, clean, Options{},
			outcome{verdict: report.VerdictLogits, origin: "/head/MatMul", errors: []string{"FP2003"}, text: "the final layer head outputs values beyond fp16's range",
				fixes: []string{"keep-fp32=works"}}},
		{"overflowing op, bf16 fix read from its pass", world{g: mlp(), policy: "autocast-fp16", passes: map[string]map[string]*observe.Stats{
			report.PassFP32: big, report.PassFP16: overflow(), report.PassBF16: nil}}, clean, Options{},
			outcome{verdict: report.VerdictOverflow, origin: "/fc1/MatMul", errors: []string{"FP2001"}, text: "fc1 (MatMul) overflows fp16",
				fixes: []string{"bf16=works", "keep-fp32=works"}}},
		{"a switched-off check decides nothing", world{g: mlp(), policy: "autocast-fp16", passes: map[string]map[string]*observe.Stats{
			report.PassFP32: big, report.PassFP16: overflow()}}, clean, Options{Checks: selection(t, "all,-FP2001")},
			outcome{verdict: report.VerdictHealthy, text: "1 overflow(s) went unreported because --checks"}},
		{"poisoned input beats fp32-broken", world{g: mlp(), policy: "autocast-fp16", x: poison(normal()), passes: map[string]map[string]*observe.Stats{
			report.PassFP32: overflow(), report.PassFP16: overflow()}}, nil, Options{},
			outcome{verdict: report.VerdictPoisoned, origin: "x", errors: []string{"FP1001"}, text: `input "x"`}},
		{"fp32-broken beats an fp16 overflow", world{g: mlp(), policy: "autocast-fp16", passes: map[string]map[string]*observe.Stats{
			report.PassFP32: overflow(), report.PassFP16: overflow()}}, nil, Options{NoFixes: true},
			outcome{verdict: report.VerdictFP32Broken, origin: "/fc1/MatMul", errors: []string{"FP2002"}, text: "first at /fc1/MatMul (MatMul)"}},
		{"unnormalized input: standardized rerun clean", world{g: mlp(), policy: "autocast-fp16", x: raw(), passes: map[string]map[string]*observe.Stats{
			report.PassFP32: big, report.PassFP16: overflow()}}, clean, Options{},
			outcome{verdict: report.VerdictUnnormalized, origin: "/fc1/MatMul", errors: []string{"FP2001"}, text: `the input "x" is not normalized`,
				fixes: []string{"standardize-inputs=works"}}},
		{"unnormalized input: standardizing does not help", world{g: mlp(), policy: "autocast-fp16", x: raw(), passes: map[string]map[string]*observe.Stats{
			report.PassFP32: big, report.PassFP16: overflow()}}, failsUnless("keep-fp32"), Options{},
			outcome{verdict: report.VerdictOverflow, origin: "/fc1/MatMul", errors: []string{"FP2001"}, text: "fc1 (MatMul) overflows fp16 on these inputs",
				fixes: []string{"standardize-inputs=fails", "keep-fp32=works"}}},
		{"no input finding, no standardized rerun", world{g: mlp(), policy: "autocast-fp16", x: raw(), passes: map[string]map[string]*observe.Stats{
			report.PassFP32: big, report.PassFP16: overflow()}}, clean, Options{Checks: selection(t, "all,-FP1*")},
			outcome{verdict: report.VerdictOverflow, origin: "/fc1/MatMul", errors: []string{"FP2001"}, text: "fc1 (MatMul) overflows fp16",
				fixes: []string{"keep-fp32=works"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := diagnose(t, tc.w, tc.answer, tc.opt)
			check(t, d, tc.want)
		})
	}
}

func selection(t *testing.T, spec string) checks.Selection {
	t.Helper()
	sel, err := checks.ParseSelection(spec)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

func poison(x []float32) []float32 {
	x[5] = float32(math.NaN())
	return x
}

// failsUnless answers reruns whose name holds want with clean values and
// every other rerun with the overflow still there.
func failsUnless(want string) func(fix.Rerun) map[string]*observe.Stats {
	return func(r fix.Rerun) map[string]*observe.Stats {
		if strings.Contains(r.Name, want) {
			return nil
		}
		return overflow()
	}
}

// TestExplicitCast: the model's own x.half() makes x·x fp16. The cast is
// to blame only where the run without mixed precision (as-written)
// overflows too; otherwise the overflow is autocast's and stays an
// overflowing op. Explicit-half-cast comes before unnormalized input.
func TestExplicitCast(t *testing.T) {
	big := map[string]*observe.Stats{"c": fin(300), "m": fin(9e4), "y": fin(9e4)}
	over := map[string]*observe.Stats{"c": fin(300), "m": bad(6e4, 0, 4, 0), "y": bad(0, 4, 0, 0)}
	for _, tc := range []struct {
		name      string
		x         []float32
		asWritten map[string]*observe.Stats
		want      outcome
	}{
		{"overflows without autocast too", nil, over, outcome{verdict: report.VerdictHalfCast, origin: "/sq/Mul", errors: []string{"FP4001"},
			text: "overflows there with mixed precision off too (the as-written pass): switching to_fp16() off will not help", fixes: []string{"remove-cast=works"}}},
		{"before unnormalized input", raw(), over, outcome{verdict: report.VerdictHalfCast, origin: "/sq/Mul", errors: []string{"FP4001"},
			text: "/sq/Cast", fixes: []string{"remove-cast=works"}}},
		{"only autocast overflows", nil, nil, outcome{verdict: report.VerdictOverflow, origin: "/sq/Mul", errors: []string{"FP2001"},
			text: "the model's own cast upstream does not overflow without mixed precision", fixes: []string{"keep-fp32=works"}}},
		{"as-written not run: the provenance decides", nil, nil, outcome{verdict: report.VerdictHalfCast, origin: "/sq/Mul", errors: []string{"FP4001"},
			text: "without the as-written pass it is not known", fixes: []string{"remove-cast=works"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := world{g: castNet(), policy: "autocast-fp16", x: tc.x, casts: []int{0},
				passes: map[string]map[string]*observe.Stats{report.PassFP32: big, report.PassFP16: over, report.PassAsWritten: tc.asWritten}}
			if strings.HasPrefix(tc.name, "as-written not run") {
				delete(w.passes, report.PassAsWritten)
			}
			d, rn := diagnose(t, w, clean, Options{})
			check(t, d, tc.want)
			if tc.want.verdict == report.VerdictHalfCast {
				if len(rn.calls) != 1 || rn.calls[0].Assign.Value["m"] != precision.FP32 {
					t.Errorf("the remove-cast rerun should hold x·x in fp32: %v", rn.calls)
				}
			}
		})
	}
}

// TestDeliberateInfinities: a causal mask torch.full((s, s), -inf).triu(1)
// added to the scores is -inf on purpose: never an origin, never a
// warning, never a keep-fp32 candidate nor counted against a fix; a real
// overflow elsewhere is the origin; a softmax over a row that is -inf
// everywhere is where its NaN starts, with the sample that holds it.
func TestDeliberateInfinities(t *testing.T) {
	mask := func(extra map[string]*observe.Stats) map[string]*observe.Stats {
		m := map[string]*observe.Stats{"full": bad(0, 0, 0, 6), "mask": bad(0, 0, 0, 6), "masked": bad(3, 0, 0, 6)}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	t.Run("absorbed mask is healthy", func(t *testing.T) {
		d, _ := diagnose(t, world{g: maskNet(), policy: "autocast-fp16", passes: map[string]map[string]*observe.Stats{
			report.PassFP32: mask(nil), report.PassFP16: mask(nil)}}, nil, Options{})
		check(t, d, outcome{verdict: report.VerdictHealthy, text: "no NaN/Inf in the fp16 pass"})
		if len(d.Findings) != 0 {
			t.Errorf("findings %v, want none (the mask is -inf on purpose)", d.Findings)
		}
	})
	t.Run("the overflow, not the mask", func(t *testing.T) {
		after := map[string]*observe.Stats{"y": bad(0, 0, 4, 0)}
		d, rn := diagnose(t, world{g: maskNet(), policy: "autocast-fp16", passes: map[string]map[string]*observe.Stats{
			report.PassFP32: mask(map[string]*observe.Stats{"y": fin(1e5)}), report.PassFP16: mask(after)}},
			func(fix.Rerun) map[string]*observe.Stats { return mask(nil) }, Options{})
		check(t, d, outcome{verdict: report.VerdictLogits, origin: "/head/MatMul", errors: []string{"FP2003"}, text: "head", fixes: []string{"keep-fp32=works"}})
		if len(d.Fixes) == 1 && (d.Fixes[0].NonFiniteAfter != 0 || d.Fixes[0].NonFiniteBefore != 4) {
			t.Errorf("fix counts %d → %d NaN/Inf, want 4 → 0 (the mask's -inf do not count)", d.Fixes[0].NonFiniteBefore, d.Fixes[0].NonFiniteAfter)
		}
		if len(rn.calls) != 1 || rn.calls[0].Assign.Node[6] != precision.FP32 || len(d.Fixes) != 1 || !slices.Equal(d.Fixes[0].Nodes, []string{"/head/MatMul"}) {
			t.Errorf("keep-fp32 reruns %d, fixes %v: want one, keeping only /head/MatMul", len(rn.calls), d.Fixes)
		}
	})
	t.Run("all-masked row: the softmax, sample 2", func(t *testing.T) {
		nan := mask(map[string]*observe.Stats{"p": bad(1, 4, 0, 0), "y": bad(0, 4, 0, 0)})
		d, rn := diagnose(t, world{g: maskNet(), policy: "autocast-fp16", passes: map[string]map[string]*observe.Stats{report.PassFP32: nan, report.PassFP16: nan}},
			func(r fix.Rerun) map[string]*observe.Stats {
				// Sample 2 alone holds the NaN: a part holds it when it
				// covers sample 2.
				part := r.Batches[0]
				if !r.Reference || !strings.Contains(part.Source, "samples") {
					t.Errorf("rerun %s: want the fp32 reference on part of the batch", r.Name)
				}
				lo, n := sampleRange(t, part.Source)
				if lo <= 2 && 2 < lo+n {
					return nan
				}
				return mask(nil)
			}, Options{})
		check(t, d, outcome{verdict: report.VerdictFP32Broken, origin: "/attn/Softmax", errors: []string{"FP2002"}, text: "first at /attn/Softmax (Softmax) in batch 0 sample 2"})
		if len(d.Origins) > 0 && !reflect.DeepEqual(d.Origins[0].Samples, []report.Sample{{Batch: 0, Index: 2, NonFinite: 4}}) {
			t.Errorf("samples %v, want batch 0 sample 2", d.Origins[0].Samples)
		}
		if len(rn.calls) != 4 {
			t.Errorf("%d reruns, want 4 (halves, then quarters of the halves that hold NaN)", len(rn.calls))
		}
	})
}

// sampleRange reads "[samples lo:hi]" from a part's source.
func sampleRange(t *testing.T, source string) (lo, n int64) {
	t.Helper()
	var hi int64
	i := strings.Index(source, "[samples ")
	if i < 0 {
		t.Fatalf("source %q names no samples", source)
	}
	if _, err := fmt.Sscanf(source[i:], "[samples %d:%d]", &lo, &hi); err != nil {
		t.Fatal(err)
	}
	return lo, hi - lo
}

// TestConstantFill: a masked_fill constant beyond fp16's range (-1e9) is
// an origin of its own: an error and the verdict where its -Inf reaches an
// output, an error beside a healthy verdict where softmax absorbs it
// (PyTorch raises), and float32's extreme (finfo(x.dtype).min traced in
// fp32), which the emulated pass writes as fp16's -65504, only a warning.
func TestConstantFill(t *testing.T) {
	for _, tc := range []struct {
		name    string
		g       *onnx.GraphProto
		fp16    map[string]*observe.Stats
		want    outcome
		warning bool
	}{
		{"reaches an output", fillNet(-1e9, false), map[string]*observe.Stats{"w": bad(3, 0, 0, 6), "y": bad(3, 0, 0, 6)},
			outcome{verdict: report.VerdictOverflow, origin: "/attn/Where", errors: []string{"FP4004"}, text: "writes the constant fill = -1e+09", fixes: []string{"finfo-constant=works"}}, false},
		{"raises, absorbed", fillNet(-1e9, true), map[string]*observe.Stats{"w": bad(3, 0, 0, 6)},
			outcome{verdict: report.VerdictHealthy, errors: []string{"FP4004"}, text: "; but "}, false},
		{"finfo(x.dtype).min", fillNet(-math.MaxFloat32, true), map[string]*observe.Stats{"w": fin(65504)},
			outcome{verdict: report.VerdictHealthy, text: "no NaN/Inf in the fp16 pass"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := diagnose(t, world{g: tc.g, policy: "half", passes: map[string]map[string]*observe.Stats{report.PassFP32: nil, report.PassFP16: tc.fp16}}, clean, Options{})
			check(t, d, tc.want)
			warned := slices.ContainsFunc(d.Findings, func(fd checks.Finding) bool {
				return fd.Check == lint.CheckConstRange.ID && fd.Severity == checks.SevWarning && fd.Node == "/attn/Where"
			})
			if warned != tc.warning {
				t.Errorf("FP4004 warning %v, want %v: %v", warned, tc.warning, d.Findings)
			}
		})
	}
}

// TestWeightPastFP16: a Linear's weight that grew past 65504 is Inf once
// autocast casts the fp32 master weight for the op. It is a parameter that
// outgrew fp16, not a fill: the verdict and FP4004 say so and what keeps a
// weight in range, and none of them asks for torch.finfo, which the mask
// fill of TestConstantFill still gets.
func TestWeightPastFP16(t *testing.T) {
	v := make([]float32, 16)
	for i := range v {
		v[i] = 0.5
	}
	v[5] = 7e4
	w := onnx.FloatTensor("fc.weight", []int64{4, 4}, v)
	g := newGraph([]string{"y"}, []*onnx.TensorProto{w, weight("fc.bias", 4)}, node("Gemm", "/fc/Gemm", "x fc.weight fc.bias", "y", onnx.AttrInt("transB", 1)))
	d, _ := diagnose(t, world{g: g, policy: "autocast-fp16", passes: map[string]map[string]*observe.Stats{
		report.PassFP32: {"y": fin(5304)}, report.PassFP16: {"y": bad(3, 0, 8, 0)}}}, clean, Options{})
	check(t, d, outcome{verdict: report.VerdictOverflow, origin: "/fc/Gemm", errors: []string{"FP4004"}, text: "takes the weight fc.weight", fixes: []string{"finfo-constant=works"}})
	for _, text := range append([]string{d.VerdictText}, d.Findings[0].Message) {
		if !strings.Contains(text, "weight decay") || !strings.Contains(text, "master weight") && !strings.Contains(text, "casts to fp16") || strings.Contains(text, "instead of a fixed") {
			t.Errorf("want the weight's advice (weight decay, autocast's cast), not torch.finfo's: %s", text)
		}
	}
}

// TestFinfoFill: where the emulated pass writes a number torch.finfo(dtype)
// wrote as its format's limit (fp32: -3.4e38, fp16: -65504, bf16: its
// minimum), the diagnosis warns that only the dtype-aware idiom is fine
// (FP4004), and the masked scores, which differ from fp32's on purpose,
// neither set the headroom nor make an output's precision origin.
func TestFinfoFill(t *testing.T) {
	for _, tc := range []struct {
		policy, pass, limit string
		fill                float32
	}{
		{"autocast-fp16", report.PassFP16, "fp16's own limit -65504", 65504},
		{"half", report.PassFP16, "fp16's own limit -65504", 65504},
		{"autocast-bf16", report.PassBF16, "bf16's own limit -3.38953e+38", tensor.BF16Max},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			w := world{g: fillNet(-math.MaxFloat32, true), policy: tc.policy, passes: map[string]map[string]*observe.Stats{
				report.PassFP32: {"s": fin(2), "w": fin(math.MaxFloat32), "p": fin(1), "y": fin(3)},
				tc.pass:         {"s": fin(2), "w": fin(tc.fill), "p": fin(1), "y": fin(3)}}}
			f, batches := w.facts(t)
			d, err := Run(context.Background(), f, &runner{values: f.Values}, batches, Options{})
			if err != nil {
				t.Fatal(err)
			}
			check(t, d, outcome{verdict: report.VerdictHealthy, text: "no NaN/Inf in the " + tc.pass + " pass"})
			var warned []string
			for _, fd := range d.Findings {
				switch {
				case fd.Check == lint.CheckConstRange.ID && fd.Severity == checks.SevWarning:
					warned = append(warned, fd.Node)
					if !strings.Contains(fd.Message, tc.limit) || !strings.Contains(fd.Message, "hard-coded torch.finfo(torch.float32).min") {
						t.Errorf("FP4004 says %q, want it to name %s and the hard-coded finfo", fd.Message, tc.limit)
					}
				case fd.Check == "FP2004":
					t.Errorf("headroom finding on a mask: %s", fd.Message)
				}
			}
			if !slices.Equal(warned, []string{"/attn/Where"}) {
				t.Errorf("FP4004 warnings at %v, want /attn/Where", warned)
			}
			if !f.Masked(2) || f.Masked(0) {
				t.Errorf("masked: Where %v, MatMul %v; want the Where only", f.Masked(2), f.Masked(0))
			}
			if _, v, _, _ := f.MinHeadroom(); v == "w" {
				t.Error("the smallest headroom is the mask's")
			}
		})
	}
	// Wrong outputs with nothing overflowing: the first value beyond the
	// tolerance is the head's, not the mask the Where writes before it.
	g := newGraph([]string{"y"}, []*onnx.TensorProto{weight("Wq", 4, 4), weight("W2", 4, 4),
		onnx.FloatTensor("zero", nil, []float32{0}), onnx.FloatTensor("fill", nil, []float32{-math.MaxFloat32})},
		node("MatMul", "/attn/MatMul", "x Wq", "s"),
		node("Less", "/attn/Less", "s zero", "cond"),
		node("Where", "/attn/Where", "cond fill s", "w"),
		node("MatMul", "/head/MatMul", "w W2", "y"))
	w := world{g: g, policy: "autocast-fp16", passes: map[string]map[string]*observe.Stats{
		report.PassFP32: {"s": fin(2), "w": fin(math.MaxFloat32), "y": fin(3)},
		report.PassFP16: {"s": fin(2), "w": fin(65504), "y": fin(3)}}}
	f, _ := w.facts(t)
	res := f.Passes[report.PassFP16]
	res.Diffs = map[string]*observe.Diff{}
	for v, e := range map[string]float64{"s": 0, "w": 1, "y": 0.5} {
		res.Diffs[v] = &observe.Diff{SumSqRef: 1, SumSqDiff: e * e, BothFinite: 16, NonzeroRef: 16}
	}
	res.Outputs = outputDiffs(0.5)[:1]
	f.Prepare()
	var got []string
	for _, o := range f.Origins(report.PassFP16) {
		got = append(got, o.Node+" "+o.Cause)
	}
	if !slices.Equal(got, []string{"/head/MatMul " + report.CausePrecision}) {
		t.Errorf("origins of the wrong output %v, want the head's precision", got)
	}
}

// TestSavedHalfInput: a batch saved in float16 whose Inf are values beyond
// 65504 is unnormalized input, decided by FP1002; with FP1002 switched
// off nothing decides it.
func TestSavedHalfInput(t *testing.T) {
	x := normal()
	x[3] = float32(math.Inf(1))
	nan := map[string]*observe.Stats{"h": bad(1, 0, 4, 0), "r": bad(1, 0, 4, 0), "y": bad(0, 4, 0, 0), "z": bad(0, 0, 4, 0)}
	w := world{g: mlp(), policy: "autocast-fp16", x: x, saved: tensor.Float16, passes: map[string]map[string]*observe.Stats{report.PassFP32: nan, report.PassFP16: nan}}
	d, _ := diagnose(t, w, nil, Options{})
	check(t, d, outcome{verdict: report.VerdictUnnormalized, origin: "x", errors: []string{"FP1002"}, text: "was saved in float16"})
	d, _ = diagnose(t, w, nil, Options{Checks: selection(t, "all,-FP1002")})
	if d.Verdict == report.VerdictUnnormalized || !strings.Contains(d.VerdictText, "switched") {
		t.Errorf("without FP1002: verdict %s (%s), want one that says the deciding check is off", d.Verdict, d.VerdictText)
	}
}

// TestAnalyzersPure: analyzers read the facts and write nothing, so their
// findings do not depend on the order they run in, and the derived facts
// are the same after them.
func TestAnalyzersPure(t *testing.T) {
	w := world{g: mlp(), policy: "autocast-fp16", x: raw(), passes: map[string]map[string]*observe.Stats{
		report.PassFP32: {"h": fin(6e4), "r": fin(6e4), "y": fin(5e4), "z": fin(3e4)}, report.PassFP16: nil}}
	f, _ := w.facts(t)
	f.Prepare()
	origins, lowHeadroom, masked := derivedOf(f)
	forward, err := checks.RunAnalyzers(Analyzers(), f, checks.Selection{}, "autocast-fp16")
	if err != nil {
		t.Fatal(err)
	}
	reversed := Analyzers()
	slices.Reverse(reversed)
	backward, err := checks.RunAnalyzers(reversed, f, checks.Selection{}, "autocast-fp16")
	if err != nil {
		t.Fatal(err)
	}
	if len(forward) == 0 || len(forward) != len(backward) {
		t.Fatalf("%d findings forward, %d backward", len(forward), len(backward))
	}
	for _, fd := range forward {
		if !slices.ContainsFunc(backward, func(b checks.Finding) bool { return reflect.DeepEqual(b, fd) }) {
			t.Errorf("finding %s %s only in one order", fd.Check, fd.Node)
		}
	}
	if len(lowHeadroom) == 0 {
		t.Error("no value close to fp16's limit: the test does not exercise FP2004")
	}
	if o, l, m := derivedOf(f); !reflect.DeepEqual(origins, o) || !reflect.DeepEqual(lowHeadroom, l) || !reflect.DeepEqual(masked, m) {
		t.Error("the analyzers changed the derived facts")
	}
	// FP2004 needs a clean emulated pass: the driver does not run it on
	// one whose NaN/Inf reach an output.
	w.passes[report.PassFP16] = overflow()
	d, _ := diagnose(t, w, clean, Options{})
	if slices.ContainsFunc(d.Findings, func(fd checks.Finding) bool { return fd.Check == "FP2004" }) {
		t.Error("FP2004 ran on an emulated pass whose NaN/Inf reach the outputs")
	}
}

// derivedOf copies what Prepare derived and the analyzers may read: the
// origins of every pass, the values low on headroom, the masked nodes.
func derivedOf(f *evidence.Facts) (map[string][]report.Origin, []evidence.HeadroomValue, []bool) {
	origins := map[string][]report.Origin{}
	for p := range f.Passes {
		origins[p] = slices.Clone(f.Origins(p))
	}
	masked := make([]bool, len(f.Graph().Node))
	for ni := range masked {
		masked[ni] = f.Masked(ni)
	}
	return origins, slices.Clone(f.LowHeadroom()), masked
}
