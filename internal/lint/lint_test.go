package lint

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"fp16audit/checks"
	"fp16audit/internal/onnx"
)

const F = onnx.TensorProto_FLOAT

// load saves a model built from g to a temporary folder and loads it back,
// as the command line would.
func load(t testing.TB, g *onnx.GraphProto, opset int64, edit ...func(*onnx.ModelProto)) *onnx.Model {
	t.Helper()
	m := onnx.NewModel(g, opset)
	for _, e := range edit {
		e(m)
	}
	path := filepath.Join(t.TempDir(), "model.onnx")
	if err := onnx.Save(m, path); err != nil {
		t.Fatal(err)
	}
	mod, err := onnx.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return mod
}

func graph(nodes []*onnx.NodeProto, inits []*onnx.TensorProto, in, out []*onnx.ValueInfoProto) *onnx.GraphProto {
	return &onnx.GraphProto{Name: "g", Node: nodes, Initializer: inits, Input: in, Output: out}
}

func fill(n int, v float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// explicitCast is (x*1e3).half().float(), as torch exports it.
func explicitCast() *onnx.GraphProto {
	return graph([]*onnx.NodeProto{
		onnx.Node("Mul", "/scale/Mul", []string{"x", "k"}, []string{"/scale/Mul_output_0"}),
		onnx.Node("Cast", "/scale/Cast", []string{"/scale/Mul_output_0"}, []string{"h"}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT16))),
		onnx.Node("Cast", "/scale/Cast_1", []string{"h"}, []string{"y"}, onnx.AttrInt("to", int64(F))),
	}, []*onnx.TensorProto{onnx.FloatTensor("k", []int64{}, []float32{1e3})},
		[]*onnx.ValueInfoProto{onnx.TensorValueInfo("x", F, 2, 4)},
		[]*onnx.ValueInfoProto{onnx.TensorValueInfo("y", F, 2, 4)})
}

// attention is scores = q @ k, masked with mask (added or put by Where),
// then Softmax.
func attention(maskNode *onnx.NodeProto, inits ...*onnx.TensorProto) *onnx.GraphProto {
	return graph([]*onnx.NodeProto{
		onnx.Node("MatMul", "/attn/MatMul", []string{"q", "k"}, []string{"scores"}),
		maskNode,
		onnx.Node("Softmax", "/attn/Softmax", []string{"masked"}, []string{"y"}, onnx.AttrInt("axis", -1)),
	}, inits,
		[]*onnx.ValueInfoProto{onnx.TensorValueInfo("q", F, 1, 4, 4), onnx.TensorValueInfo("k", F, 1, 4, 4), onnx.TensorValueInfo("cond", onnx.TensorProto_BOOL, 1, 4, 4)},
		[]*onnx.ValueInfoProto{onnx.TensorValueInfo("y", F, 1, 4, 4)})
}

// addMask adds a [1,4,4] mask initializer holding v above the diagonal.
func addMask(v float32) *onnx.GraphProto {
	vals := make([]float32, 16)
	for i := range 4 {
		for j := i + 1; j < 4; j++ {
			vals[4*i+j] = v
		}
	}
	return attention(onnx.Node("Add", "/attn/Add", []string{"scores", "mask"}, []string{"masked"}),
		onnx.FloatTensor("mask", []int64{1, 4, 4}, vals))
}

// whereMask is scores.masked_fill(cond, v) with v a 0-dim Constant.
func whereMask(v float32) *onnx.GraphProto {
	g := attention(onnx.Node("Where", "/attn/Where", []string{"cond", "scores", "fillv"}, []string{"masked"}))
	c := onnx.Node("Constant", "/attn/Constant", nil, []string{"fillv"}, onnx.AttrTensor("value", onnx.FloatTensor("", []int64{}, []float32{v})))
	g.Node = append([]*onnx.NodeProto{c}, g.Node...)
	return g
}

// fp32Fill is (1 - keep.float()) * v with v a 0-dim Constant: the model's
// own cast to FLOAT keeps the product in fp32 under every policy.
func fp32Fill(v float32) *onnx.GraphProto {
	return graph([]*onnx.NodeProto{
		onnx.Node("Cast", "/mask/Cast", []string{"cond"}, []string{"k"}, onnx.AttrInt("to", int64(F))),
		onnx.Node("Constant", "/mask/Constant", nil, []string{"low"}, onnx.AttrTensor("value", onnx.FloatTensor("", []int64{}, []float32{v}))),
		onnx.Node("Mul", "/mask/Mul", []string{"k", "low"}, []string{"y"}),
	}, nil,
		[]*onnx.ValueInfoProto{onnx.TensorValueInfo("cond", onnx.TensorProto_BOOL, 1, 4, 4)},
		[]*onnx.ValueInfoProto{onnx.TensorValueInfo("y", F, 1, 4, 4)})
}

// layerNorm is a LayerNormalization with the given epsilon after a Gemm.
func layerNorm(eps float32) *onnx.GraphProto {
	return graph([]*onnx.NodeProto{
		onnx.Node("Gemm", "/fc/Gemm", []string{"x", "w"}, []string{"h"}, onnx.AttrInt("transB", 1)),
		onnx.Node("LayerNormalization", "/norm/LayerNormalization", []string{"h", "g", "b"}, []string{"y"}, onnx.AttrFloat("epsilon", eps), onnx.AttrInt("axis", -1)),
	}, []*onnx.TensorProto{onnx.FloatTensor("w", []int64{4, 4}, fill(16, 0.1)), onnx.FloatTensor("g", []int64{4}, fill(4, 1)), onnx.FloatTensor("b", []int64{4}, fill(4, 0))},
		[]*onnx.ValueInfoProto{onnx.TensorValueInfo("x", F, 2, 4)},
		[]*onnx.ValueInfoProto{onnx.TensorValueInfo("y", F, 2, 4)})
}

// decomposedLayerNorm is layer_norm as opset-16 exports write it.
func decomposedLayerNorm(eps float32) *onnx.GraphProto {
	return graph([]*onnx.NodeProto{
		onnx.Node("ReduceMean", "/ln/ReduceMean", []string{"x"}, []string{"mean"}, onnx.AttrInts("axes", -1)),
		onnx.Node("Sub", "/ln/Sub", []string{"x", "mean"}, []string{"d"}),
		onnx.Node("Pow", "/ln/Pow", []string{"d", "two"}, []string{"sq"}),
		onnx.Node("ReduceMean", "/ln/ReduceMean_1", []string{"sq"}, []string{"var"}, onnx.AttrInts("axes", -1)),
		onnx.Node("Add", "/ln/Add", []string{"var", "/ln/Constant_output_0"}, []string{"ve"}),
		onnx.Node("Sqrt", "/ln/Sqrt", []string{"ve"}, []string{"sd"}),
		onnx.Node("Div", "/ln/Div", []string{"d", "sd"}, []string{"y"}),
	}, []*onnx.TensorProto{onnx.FloatTensor("two", []int64{}, []float32{2}), onnx.FloatTensor("/ln/Constant_output_0", []int64{}, []float32{eps})},
		[]*onnx.ValueInfoProto{onnx.TensorValueInfo("x", F, 2, 4)},
		[]*onnx.ValueInfoProto{onnx.TensorValueInfo("y", F, 2, 4)})
}

// gemm is x @ w.T with w filled with v.
func gemm(v float32) *onnx.GraphProto {
	return graph([]*onnx.NodeProto{onnx.Node("Gemm", "/fc/Gemm", []string{"x", "fc.weight"}, []string{"y"}, onnx.AttrInt("transB", 1))},
		[]*onnx.TensorProto{onnx.FloatTensor("fc.weight", []int64{4, 4}, append(fill(15, v), 0.5))},
		[]*onnx.ValueInfoProto{onnx.TensorValueInfo("x", F, 2, 4)},
		[]*onnx.ValueInfoProto{onnx.TensorValueInfo("y", F, 2, 4)})
}

func customOp() *onnx.GraphProto {
	n := onnx.Node("FusedGemm", "/fc/FusedGemm", []string{"x", "w"}, []string{"y"})
	n.Domain = "com.microsoft"
	return graph([]*onnx.NodeProto{n}, []*onnx.TensorProto{onnx.FloatTensor("w", []int64{4, 4}, fill(16, 0.1))},
		[]*onnx.ValueInfoProto{onnx.TensorValueInfo("x", F, 2, 4)},
		[]*onnx.ValueInfoProto{onnx.TensorValueInfo("y", F, 2, 4)})
}

// want is a finding expected under one policy: check, severity and
// substrings of the message; node and value must match exactly.
type want struct {
	check, sev, node, value string
	msg                     []string
}

func TestAnalyzers(t *testing.T) {
	opsetModel := func(ir, opset int64) func(*onnx.ModelProto) {
		return func(m *onnx.ModelProto) { m.IrVersion = ir; m.OpsetImport[0].Version = opset }
	}
	castWant := want{"FP4003", "warning", "/scale/Cast", "/scale/Mul_output_0", []string{`"/scale/Cast" (module scale)`, "FLOAT16", "every policy"}}
	tests := []struct {
		name  string
		g     *onnx.GraphProto
		edit  []func(*onnx.ModelProto)
		wants map[string][]want // by policy
	}{
		{"explicit cast", explicitCast(), nil, map[string][]want{
			"autocast-fp16": {castWant}, "half": {castWant}, "fp32": {castWant}, "autocast-bf16": {castWant},
		}},
		{"additive -1e9 mask", addMask(-1e9), nil, map[string][]want{
			"autocast-fp16": {{"FP4004", "info", "/attn/Add", "mask", []string{`initializer "mask" holds -1e+09 (6 of 16 elements) beyond`, `node "/attn/Add" (module attn)`, "held in fp32", "stays finite"}}},
			"half":          {{"FP4004", "error", "/attn/Add", "mask", []string{"-1e+09", "held in fp16 there under half", "-Inf", "NaN"}}},
			"autocast-bf16": {{"FP4004", "info", "/attn/Add", "mask", []string{"stays finite"}}},
			"fp32":          {{"FP4004", "info", "/attn/Add", "mask", nil}},
		}},
		{"additive -1e4 mask", addMask(-1e4), nil, map[string][]want{"autocast-fp16": nil, "half": nil}},
		// The number torch.finfo(scores.dtype).min exports as: the
		// dtype-aware idiom, which writes the format's own limit.
		{"finfo min masked_fill", whereMask(-math.MaxFloat32), nil, map[string][]want{
			"autocast-fp16": {{"FP4004", "warning", "/attn/Where", "fillv", []string{`constant "fillv" holds -3.403e+38`, "read in fp16 there under autocast-fp16", "fp16's own limit -65504", "hard-coded torch.finfo(torch.float32).min", "PyTorch raises"}}},
			"autocast-bf16": {{"FP4004", "warning", "/attn/Where", "fillv", []string{"read in bf16", "bf16's own limit -3.38953e+38"}}},
			"half":          {{"FP4004", "warning", "/attn/Where", "fillv", []string{"read in fp16 there under half"}}},
			"fp32":          {{"FP4004", "info", "/attn/Where", "fillv", nil}},
		}},
		// Under half the policy holds the number in fp16, but an op in fp32
		// reads it as a Python number: finite.
		{"finfo min read in fp32", fp32Fill(-math.MaxFloat32), nil, map[string][]want{
			"half":          {{"FP4004", "info", "/mask/Mul", "low", []string{"computes in fp32 under half", "stays finite"}}},
			"autocast-fp16": {{"FP4004", "info", "/mask/Mul", "low", []string{"held in fp32", "stays finite"}}},
		}},
		// A tensor of it is a buffer model.half() casts to -Inf.
		{"finfo min mask buffer", addMask(-math.MaxFloat32), nil, map[string][]want{
			"autocast-fp16": {{"FP4004", "info", "/attn/Add", "mask", []string{"held in fp32", "stays finite"}}},
			"half":          {{"FP4004", "error", "/attn/Add", "mask", []string{"held in fp16 there under half", "-Inf"}}},
		}},
		{"-1e9 masked_fill under bf16", whereMask(-1e9), nil, map[string][]want{
			"autocast-fp16": {{"FP4004", "error", "/attn/Where", "fillv", nil}},
			"autocast-bf16": {{"FP4004", "info", "/attn/Where", "fillv", []string{"held in bf16", "stays finite"}}},
		}},
		{"nan constant", whereMask(float32(math.NaN())), nil, map[string][]want{
			"fp32": {{"FP4004", "error", "/attn/Where", "fillv", []string{"NaN"}}},
		}},
		{"-inf constant", whereMask(float32(math.Inf(-1))), nil, map[string][]want{
			"half": {{"FP4004", "info", "/attn/Where", "fillv", []string{"-Inf"}}},
		}},
		{"layer norm eps 1e-12", layerNorm(1e-12), nil, map[string][]want{
			"autocast-fp16": {{"FP4005", "info", "/norm/LayerNormalization", "epsilon=1e-12", []string{`node "/norm/LayerNormalization" (module norm)`, "epsilon=1e-12", "computes in fp32 under autocast-fp16"}}},
			"half":          {{"FP4005", "error", "/norm/LayerNormalization", "epsilon=1e-12", []string{"computes in fp16 under half", "is 0"}}},
			"autocast-bf16": nil,
			"fp32":          nil,
		}},
		{"layer norm eps 1e-5", layerNorm(1e-5), nil, map[string][]want{"half": nil, "autocast-fp16": nil}},
		{"decomposed layer norm eps 1e-12", decomposedLayerNorm(1e-12), nil, map[string][]want{
			"autocast-fp16": {{"FP4005", "info", "/ln/Add", "/ln/Constant_output_0", []string{`adds epsilon "/ln/Constant_output_0" = 1e-12`, "fp32"}}},
			"half":          {{"FP4005", "error", "/ln/Add", "/ln/Constant_output_0", []string{"fp16 under half"}}},
		}},
		{"decomposed layer norm eps 1e-6", decomposedLayerNorm(1e-6), nil, map[string][]want{"half": nil}},
		{"tiny weights", gemm(1e-9), nil, map[string][]want{
			"half":          {{"FP4006", "warning", "/fc/Gemm", "fc.weight", []string{`initializer "fc.weight": 15 of 16 nonzero elements (94%)`, `node "/fc/Gemm" (module fc)`, "under half"}}},
			"autocast-fp16": {{"FP4006", "warning", "/fc/Gemm", "fc.weight", []string{"under autocast-fp16"}}},
			"autocast-bf16": nil,
			"fp32":          nil,
		}},
		{"small but representable weights", gemm(1e-6), nil, map[string][]want{"half": nil}},
		{"huge weights", gemm(1e5), nil, map[string][]want{
			"autocast-fp16": {{"FP4004", "error", "/fc/Gemm", "fc.weight", []string{"1e+05 (15 of 16 elements)", "held in fp16"}}},
		}},
		{"IR 14", gemm(0.1), []func(*onnx.ModelProto){opsetModel(14, 17)}, map[string][]want{
			"autocast-fp16": {{"FP4007", "error", "", "ir_version=14", []string{"IR version 14", "up to 13"}}},
		}},
		{"opset 27", gemm(0.1), []func(*onnx.ModelProto){opsetModel(8, 27)}, map[string][]want{
			"half": {{"FP4007", "error", "", "opset ai.onnx=27", []string{"opset 27", "up to 26"}}},
		}},
		{"opset 6", gemm(0.1), []func(*onnx.ModelProto){opsetModel(8, 6)}, map[string][]want{
			"half": {{"FP4007", "warning", "", "opset ai.onnx=6", nil}},
		}},
		{"IR 13 opset 26", gemm(0.1), []func(*onnx.ModelProto){opsetModel(13, 26)}, map[string][]want{"half": nil}},
		{"custom op", customOp(), nil, map[string][]want{
			"autocast-fp16": {{"FP4002", "info", "/fc/FusedGemm", "y", []string{"com.microsoft::FusedGemm", "unknown precision"}}},
		}},
	}
	for _, tc := range tests {
		m := load(t, tc.g, 17, tc.edit...)
		for policy, wants := range tc.wants {
			t.Run(tc.name+"/"+policy, func(t *testing.T) {
				got, err := Run(m, Options{Policy: policy})
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != len(wants) {
					t.Fatalf("got %d findings, want %d:\n%s", len(got), len(wants), dump(got))
				}
				for i, w := range wants {
					g := got[i]
					if g.Check != w.check || g.Severity.String() != w.sev || g.Node != w.node || g.Value != w.value {
						t.Errorf("finding %d: got %s %s node %q value %q, want %s %s node %q value %q\n%s",
							i, g.Check, g.Severity, g.Node, g.Value, w.check, w.sev, w.node, w.value, g.Message)
					}
					for _, s := range w.msg {
						if !strings.Contains(g.Message, s) {
							t.Errorf("finding %d: message %q lacks %q", i, g.Message, s)
						}
					}
					if w.node != "" && g.Module == "" {
						t.Errorf("finding %d: no module path", i)
					}
				}
			})
		}
	}
}

func dump(fs []checks.Finding) string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString("  " + f.Severity.String() + " " + f.Check + " " + f.Message + "\n")
	}
	return b.String()
}

func TestRunSelection(t *testing.T) {
	g := explicitCast()
	g.Node = append(g.Node, onnx.Node("LayerNormalization", "/ln/LayerNormalization", []string{"y", "g"}, []string{"z"}, onnx.AttrFloat("epsilon", 1e-12)))
	g.Initializer = append(g.Initializer, onnx.FloatTensor("g", []int64{4}, fill(4, 1)))
	g.Output = []*onnx.ValueInfoProto{onnx.TensorValueInfo("z", F, 2, 4)}
	m := load(t, g, 17)
	for _, tc := range []struct {
		spec string
		want []string
	}{
		{"all", []string{"FP4003", "FP4005"}},
		{"all,-FP4003", []string{"FP4005"}},
		{"-FP40*", nil},
		{"-FP40*,FP4005", []string{"FP4005"}},
		{"FP4003", []string{"FP4003"}},
		{"FP3*", nil},
	} {
		sel, err := checks.ParseSelection(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Run(m, Options{Policy: "half", Checks: sel})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, f := range got {
			ids = append(ids, f.Check)
		}
		if strings.Join(ids, ",") != strings.Join(tc.want, ",") {
			t.Errorf("--checks %s: got %v, want %v", tc.spec, ids, tc.want)
		}
	}
}

func TestRunUnknownPolicy(t *testing.T) {
	m := load(t, gemm(0.1), 17)
	if _, err := Run(m, Options{Policy: "fp8"}); err == nil || !strings.Contains(err.Error(), "autocast-fp16") {
		t.Fatalf("got %v, want an error listing the policies", err)
	}
}

// TestHealthyModels runs every analyzer over models without hazards under
// every policy.
func TestHealthyModels(t *testing.T) {
	for name, g := range map[string]*onnx.GraphProto{
		"gemm": gemm(0.1), "layer norm": layerNorm(1e-5), "decomposed": decomposedLayerNorm(1e-5), "mask": addMask(-1e4),
	} {
		m := load(t, g, 17)
		for _, p := range []string{"autocast-fp16", "autocast-bf16", "half", "fp32"} {
			got, err := Run(m, Options{Policy: p})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 0 {
				t.Errorf("%s under %s: unexpected findings\n%s", name, p, dump(got))
			}
		}
	}
}

func TestStats(t *testing.T) {
	var s Stats
	for _, v := range []float64{0, 1, -1e9, 1e-30, 65504, 65520, math.Inf(1), math.NaN(), -math.MaxFloat32, 3e-8, 2.9e-8} {
		s.add(v)
	}
	want := Stats{Elements: 11, NonZero: 8, Flush: 2, OverFP16: 3, OverBF16: 1, NaN: 1, PosInf: 1, Extreme: -math.MaxFloat32}
	if s != want {
		t.Errorf("got %+v, want %+v", s, want)
	}
}

func TestAnalyzersRegistered(t *testing.T) {
	for _, a := range Analyzers() {
		if err := checks.Validate(a.Check); err != nil {
			t.Error(err)
		}
		if !strings.HasPrefix(a.Check.ID, "FP4") {
			t.Errorf("%s: static checks are FP4xxx", a.Check.ID)
		}
	}
}

// TestStoredHalfCasts: a checkpoint exported after model.bfloat16() casts
// to BFLOAT16 wherever its code writes x.to(dtype); those casts follow the
// policy (precision.Storage), so FP4003 does not call them the model's own.
func TestStoredHalfCasts(t *testing.T) {
	m, err := onnx.Load(filepath.Join("..", "..", "fixtures", "torch", "cases", "llama_bf16_checkpoint", "model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	casts := 0
	for _, n := range m.Proto.Graph.Node {
		if n.OpType == "Cast" && onnx.FindAttr(n, "to").GetI() == int64(onnx.TensorProto_BFLOAT16) {
			casts++
		}
	}
	if casts == 0 {
		t.Fatal("the fixture has no Cast to BFLOAT16: it no longer tests stored casts")
	}
	for _, p := range []string{"autocast-fp16", "autocast-bf16", "half", "fp32"} {
		got, err := Run(m, Options{Policy: p})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range got {
			if f.Check == "FP4003" {
				t.Errorf("%s: %s", p, f.Message)
			}
		}
	}
}
