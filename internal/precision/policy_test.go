package precision

import (
	"strings"
	"testing"

	"fp16audit/internal/onnx/ops"
)

func mustPolicy(t *testing.T, name string) *Policy {
	t.Helper()
	p, err := PolicyByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCategoryDesignLists pins one row per ONNX op of DESIGN.md's autocast
// lists, plus ops that must follow their inputs.
func TestCategoryDesignLists(t *testing.T) {
	const (
		L = LowerPrecision
		A = AlwaysFP32
		P = Promote
		F = FollowInputs
	)
	tests := []struct {
		op                   string
		autocast, half, fp32 Category
	}{
		// lower precision
		{op: "Conv", autocast: L, half: F, fp32: F},
		{op: "ConvTranspose", autocast: L, half: F, fp32: F},
		{op: "MatMul", autocast: L, half: F, fp32: F},
		{op: "Gemm", autocast: L, half: F, fp32: F},
		{op: "Einsum", autocast: L, half: F, fp32: F},
		{op: "PRelu", autocast: L, half: F, fp32: F},
		{op: "LSTM", autocast: L, half: F, fp32: F},
		{op: "GRU", autocast: L, half: F, fp32: F},
		{op: "RNN", autocast: L, half: F, fp32: F},
		{op: "Attention", autocast: L, half: F, fp32: F},
		// fp32
		{op: "Exp", autocast: A, half: F, fp32: F},
		{op: "Log", autocast: A, half: F, fp32: F},
		{op: "Pow", autocast: A, half: F, fp32: F},
		{op: "Reciprocal", autocast: A, half: F, fp32: F},
		{op: "Softplus", autocast: A, half: F, fp32: F},
		{op: "Acos", autocast: A, half: F, fp32: F},
		{op: "Asin", autocast: A, half: F, fp32: F},
		{op: "Cosh", autocast: A, half: F, fp32: F},
		{op: "Sinh", autocast: A, half: F, fp32: F},
		{op: "Tan", autocast: A, half: F, fp32: F},
		{op: "LayerNormalization", autocast: A, half: F, fp32: F},
		{op: "GroupNormalization", autocast: A, half: F, fp32: F},
		{op: "LpNormalization", autocast: A, half: F, fp32: F},
		{op: "ReduceSum", autocast: A, half: F, fp32: F},
		{op: "ReduceProd", autocast: A, half: F, fp32: F},
		{op: "ReduceL1", autocast: A, half: F, fp32: F},
		{op: "ReduceL2", autocast: A, half: F, fp32: F},
		{op: "ReduceLogSumExp", autocast: A, half: F, fp32: F},
		{op: "ReduceSumSquare", autocast: A, half: F, fp32: F},
		{op: "CumSum", autocast: A, half: F, fp32: F},
		{op: "Softmax", autocast: A, half: F, fp32: F},
		{op: "LogSoftmax", autocast: A, half: F, fp32: F},
		{op: "Resize", autocast: A, half: F, fp32: F},
		{op: "Upsample", autocast: A, half: F, fp32: F},
		{op: "NegativeLogLikelihoodLoss", autocast: A, half: F, fp32: F},
		{op: "SoftmaxCrossEntropyLoss", autocast: A, half: F, fp32: F},
		// promote
		{op: "Concat", autocast: P, half: F, fp32: F},
		{op: "ScatterND", autocast: P, half: F, fp32: F},
		{op: "ScatterElements", autocast: P, half: F, fp32: F},
		{op: "GridSample", autocast: P, half: F, fp32: F},
		{op: "Where", autocast: P, half: F, fp32: F},
		// everything else follows; gelu's Erf and rsqrt's Sqrt are not on
		// the fp32 list, BatchNorm is fp32 only under half.
		{op: "Erf", autocast: F, half: F, fp32: F},
		{op: "Sqrt", autocast: F, half: F, fp32: F},
		{op: "Div", autocast: F, half: F, fp32: F},
		{op: "Relu", autocast: F, half: F, fp32: F},
		{op: "Add", autocast: F, half: F, fp32: F},
		{op: "Mul", autocast: F, half: F, fp32: F},
		{op: "Gelu", autocast: F, half: F, fp32: F},
		{op: "ReduceMean", autocast: F, half: F, fp32: F},
		{op: "ReduceMax", autocast: F, half: F, fp32: F},
		{op: "MaxPool", autocast: F, half: F, fp32: F},
		{op: "Reshape", autocast: F, half: F, fp32: F},
		{op: "Cast", autocast: F, half: F, fp32: F},
		{op: "BatchNormalization", autocast: F, half: A, fp32: F},
		{op: "InstanceNormalization", autocast: F, half: F, fp32: F},
		{op: "Abs", autocast: F, half: F, fp32: F},
		{op: "Xor", autocast: F, half: F, fp32: F},
		// opset 23: torch 2.9's rms_norm (RMSNormalization) is on no
		// autocast list and computes in fp32 internally, returning its
		// input's dtype: PyTorch's own output is float16 under autocast
		// (checked with fixtures/torch/oracle.py on an nn.RMSNorm after
		// an fp16 Linear), which following the input emulates, ONNX
		// Runtime's kernel computing in fp32 in between. RotaryEmbedding
		// is elementwise with its cos/sin caches.
		{op: "RMSNormalization", autocast: F, half: F, fp32: F},
		{op: "RotaryEmbedding", autocast: F, half: F, fp32: F},
	}
	for _, tt := range tests {
		for _, pc := range []struct {
			policy string
			want   Category
		}{
			{"autocast-fp16", tt.autocast},
			{"autocast-bf16", tt.autocast},
			{"half", tt.half},
			{"fp32", tt.fp32},
		} {
			for _, domain := range []string{"", "ai.onnx"} {
				got, known := mustPolicy(t, pc.policy).Category(domain, tt.op)
				if got != pc.want || !known {
					t.Errorf("%s: Category(%q, %q) = %v, %v; want %v, true", pc.policy, domain, tt.op, got, known, pc.want)
				}
			}
		}
	}
}

func TestCategoryUnknown(t *testing.T) {
	tests := []struct {
		domain, op string
		want       Category
		known      bool
	}{
		{"com.microsoft", "FusedMatMul", FollowInputs, false},
		{"com.microsoft", "MatMul", FollowInputs, false},
		{"custom", "Softmax", FollowInputs, false},
		{"", "NoSuchOp", FollowInputs, false},
		{"ai.onnx.ml", "TreeEnsembleClassifier", FollowInputs, true},
		{"ai.onnx.ml", "MatMul", FollowInputs, false},
	}
	for _, policy := range Policies() {
		for _, tt := range tests {
			got, known := policy.Category(tt.domain, tt.op)
			if got != tt.want || known != tt.known {
				t.Errorf("%s: Category(%q, %q) = %v, %v; want %v, %v", policy.Name, tt.domain, tt.op, got, known, tt.want, tt.known)
			}
		}
	}
}

// TestAutocastCategories: the policy reads every autocast entry of the op
// registry as its category, under both autocast policies, and nothing else
// moves an op of the default domain off FollowInputs there.
func TestAutocastCategories(t *testing.T) {
	want := map[ops.Autocast]Category{ops.Follow: FollowInputs, ops.Lower: LowerPrecision, ops.FP32: AlwaysFP32, ops.Promote: Promote}
	for _, name := range []string{"autocast-fp16", "autocast-bf16"} {
		p, err := PolicyByName(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range ops.All() {
			if o.Domain != ops.Default {
				continue
			}
			if c, known := p.Category("", o.Name); !known || c != want[o.Autocast] {
				t.Errorf("%s: %s is %v (known %v), its entry says %v", name, o.Name, c, known, want[o.Autocast])
			}
		}
	}
}

func TestPolicyByName(t *testing.T) {
	want := map[string]struct{ lower, params Precision }{
		"autocast-fp16": {FP16, FP32},
		"autocast-bf16": {BF16, FP32},
		"half":          {FP16, FP16},
		"fp32":          {FP32, FP32},
	}
	ps := Policies()
	if len(ps) != len(want) || ps[0].Name != DefaultPolicy {
		t.Fatalf("Policies() = %d policies starting with %q; want %d starting with %q", len(ps), ps[0].Name, len(want), DefaultPolicy)
	}
	for _, p := range ps {
		got, err := PolicyByName(p.Name)
		if err != nil || got != p {
			t.Errorf("PolicyByName(%q) = %v, %v", p.Name, got, err)
		}
		w, ok := want[p.Name]
		if !ok || p.Lower != w.lower || p.Params != w.params || p.Doc == "" {
			t.Errorf("policy %q: Lower %v Params %v Doc %q; want %v %v and a doc", p.Name, p.Lower, p.Params, p.Doc, w.lower, w.params)
		}
	}
	_, err := PolicyByName("fp8")
	if err == nil {
		t.Fatal("PolicyByName(fp8): no error")
	}
	for name := range want {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not list %q", err, name)
		}
	}
}

func TestPrecision(t *testing.T) {
	for _, tt := range []struct {
		elemType int32
		want     Precision
		str      string
	}{
		{1, FP32, "fp32"},
		{11, FP32, "fp32"},
		{10, FP16, "fp16"},
		{16, BF16, "bf16"},
		{7, NotFloat, "-"},
		{17, NotFloat, "-"},
		{0, NotFloat, "-"},
	} {
		got := PrecisionOf(tt.elemType)
		if got != tt.want || got.String() != tt.str {
			t.Errorf("PrecisionOf(%d) = %v; want %v", tt.elemType, got, tt.want)
		}
	}
	for _, p := range []Precision{FP32, FP16, BF16} {
		if PrecisionOf(p.ElemType()) != p {
			t.Errorf("%v does not round-trip through ElemType %d", p, p.ElemType())
		}
	}
	for _, tt := range []struct{ a, b, want Precision }{
		{FP16, FP16, FP16},
		{FP16, FP32, FP32},
		{BF16, FP32, FP32},
		{FP16, BF16, FP32},
		{NotFloat, BF16, BF16},
		{FP16, NotFloat, FP16},
	} {
		if got := widest(tt.a, tt.b); got != tt.want {
			t.Errorf("widest(%v, %v) = %v; want %v", tt.a, tt.b, got, tt.want)
		}
		if got := widest(tt.b, tt.a); got != tt.want {
			t.Errorf("widest(%v, %v) = %v; want %v", tt.b, tt.a, got, tt.want)
		}
	}
}
