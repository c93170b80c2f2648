package grad_test

import (
	"context"
	"errors"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"fp16audit/internal/execute/backward"
	"fp16audit/internal/grad"
	"fp16audit/internal/grad/vjp"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/internal/tensor"
)

// chain builds x [2,3] → MatMul w1 [3,4] → op → MatMul w2 [4,2] → y, with
// the parameters as initializers.
func chain(op, domain string) *onnx.ModelProto {
	w1 := make([]float32, 12)
	w2 := make([]float32, 8)
	for i := range w1 {
		w1[i] = float32(i%5)*0.1 - 0.2
	}
	for i := range w2 {
		w2[i] = float32(i%3)*0.2 - 0.1
	}
	mid := onnx.Node(op, "/act/"+op, []string{"h"}, []string{"a"})
	mid.Domain = domain
	g := &onnx.GraphProto{
		Name: "chain",
		Node: []*onnx.NodeProto{
			onnx.Node("MatMul", "/fc1/MatMul", []string{"x", "w1"}, []string{"h"}),
			mid,
			onnx.Node("MatMul", "/fc2/MatMul", []string{"a", "w2"}, []string{"y"}),
		},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("w1", []int64{3, 4}, w1), onnx.FloatTensor("w2", []int64{4, 2}, w2)},
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 2, 3)},
		Output:      []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 2, 2)},
	}
	if domain != "" {
		// an unknown op's output type is not inferred: declare it
		g.ValueInfo = append(g.ValueInfo, onnx.TensorValueInfo("a", onnx.TensorProto_FLOAT, 2, 4))
	}
	m := onnx.NewModel(g, 17)
	if domain != "" {
		m.OpsetImport = append(m.OpsetImport, &onnx.OperatorSetIdProto{Domain: domain, Version: 1})
	}
	return m
}

// TestProbeStopsOnContext: a probe whose context has ended runs nothing
// and says why.
func TestProbeStopsOnContext(t *testing.T) {
	requireORT(t)
	m := chain("Tan", "")
	x := tensor.FromFloat32s("x", []int64{2, 3}, []float32{1, -2, 0.5, 0.3, 2, -1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := backward.Probe(ctx, ortLib, m, "", []*tensor.Tensor{x}, sessionOptions); !errors.Is(err, context.Canceled) {
		t.Fatalf("probe with its context cancelled: %v, want an error wrapping context.Canceled", err)
	}
}

func TestUnsupportedOpIsNamed(t *testing.T) {
	requireORT(t)
	m := chain("Tan", "")
	x := tensor.FromFloat32s("x", []int64{2, 3}, []float32{1, -2, 0.5, 0.3, 2, -1})
	facts, err := backward.Probe(context.Background(), ortLib, m, "", []*tensor.Tensor{x}, sessionOptions)
	if err != nil {
		t.Fatal(err)
	}
	res, err := grad.Build(m, facts, grad.Options{Loss: grad.MSE})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Unsupported) != 1 || res.Unsupported[0].Name != "/act/Tan" || res.Unsupported[0].OpType != "Tan" ||
		!strings.Contains(res.Unsupported[0].Reason, "no gradient rule for Tan") {
		t.Fatalf("unsupported = %+v, want /act/Tan without a rule", res.Unsupported)
	}
	if !slices.Equal(res.Blocked, []string{"h"}) {
		t.Errorf("blocked = %v, want [h]", res.Blocked)
	}
	if _, ok := res.GradOf("w1"); ok {
		t.Error("w1 behind the unsupported op got a gradient")
	}
	// The part after the unsupported op is still covered and right:
	// mse on y = a·w2 gives dL/dw2 = aᵀ · 2(y − t)/4.
	s, err := backward.NewSession(res, sessionOptions, append(res.Outputs(), "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	target := tensor.FromFloat32s("t", []int64{2, 2}, []float32{1, 0, -1, 2})
	outs, err := s.Run([]*tensor.Tensor{x}, target, 1)
	if err != nil {
		t.Fatal(err)
	}
	gw2, ok := res.GradOf("w2")
	if !ok {
		t.Fatal("w2 got no gradient")
	}
	a, y, tv := floats(t, outs["a"]), floats(t, outs["y"]), floats(t, target)
	got := floats(t, outs[gw2.Name])
	for i := range 4 {
		for j := range 2 {
			want := 0.0
			for n := range 2 {
				want += float64(a[n*4+i]) * 2 * float64(y[n*2+j]-tv[n*2+j]) / 4
			}
			if math.Abs(float64(got[i*2+j])-want) > 1e-5 {
				t.Errorf("dL/dw2[%d,%d] = %g, want %g", i, j, got[i*2+j], want)
			}
		}
	}
}

func TestCustomDomainOpIsNamed(t *testing.T) {
	m := chain("Relu", "com.example")
	facts := &grad.Facts{Shapes: map[string][]int64{"x": {2, 3}, "w1": {3, 4}, "w2": {4, 2}, "h": {2, 4}, "a": {2, 4}, "y": {2, 2}}}
	res, err := grad.Build(m, facts, grad.Options{Loss: grad.L1})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Unsupported) != 1 || res.Unsupported[0].OpType != "Relu" || res.Unsupported[0].Name != "/act/Relu" {
		t.Fatalf("unsupported = %+v, want the com.example Relu", res.Unsupported)
	}
	if _, ok := res.GradOf("w2"); !ok {
		t.Error("w2 got no gradient")
	}
}

// TestInternalNamesOfOtherRewrites: names other rewrites mint (an upcast
// fp16 input, a BatchNorm's private statistics) end in ::fp16audit too, and
// must not be mistaken for the backward graph's own.
func TestInternalNamesOfOtherRewrites(t *testing.T) {
	m := chain("Relu", "")
	m.Graph.Node[1].Output[0] = "a::up::fp16audit"
	m.Graph.Node[2].Input[0] = "a::up::fp16audit"
	facts := &grad.Facts{Shapes: map[string][]int64{"x": {2, 3}, "w1": {3, 4}, "w2": {4, 2}, "h": {2, 4}, "a::up::fp16audit": {2, 4}, "y": {2, 2}}}
	if _, err := grad.Build(m, facts, grad.Options{Loss: grad.MSE}); err != nil {
		t.Fatal(err)
	}
	m.Graph.Node[1].Output[0] = "a::bw3::fp16audit"
	m.Graph.Node[2].Input[0] = "a::bw3::fp16audit"
	facts.Shapes["a::bw3::fp16audit"] = []int64{2, 4}
	if _, err := grad.Build(m, facts, grad.Options{Loss: grad.MSE}); err == nil || !strings.Contains(err.Error(), "reserved") {
		t.Errorf("a name the builder mints (::bw3::fp16audit): error %v, want it refused", err)
	}
}

func TestBuildErrors(t *testing.T) {
	m := chain("Relu", "")
	facts := &grad.Facts{Shapes: map[string][]int64{"x": {2, 3}, "w1": {3, 4}, "w2": {4, 2}, "h": {2, 4}, "a": {2, 4}, "y": {2, 2}}}
	old := onnx.NewModel(chain("Relu", "").Graph, 12)
	renamed := chain("Relu", "")
	renamed.Graph.Node[1].Output[0] = "a::grad"
	renamed.Graph.Node[2].Input[0] = "a::grad"
	for _, c := range []struct {
		name  string
		m     *onnx.ModelProto
		opt   grad.Options
		facts *grad.Facts
		want  string
	}{
		{"unknown loss", m, grad.Options{Loss: "hinge"}, facts, `loss "hinge"`},
		{"old opset", old, grad.Options{Loss: grad.MSE}, facts, "opset 12"},
		{"not an output", m, grad.Options{Loss: grad.MSE, Output: "h"}, facts, "not a graph output"},
		{"no facts", m, grad.Options{Loss: grad.MSE}, nil, "Probe"},
		{"target size", m, grad.Options{Loss: grad.MSE, TargetShape: []int64{3}}, facts, "target shape [3]"},
		{"cross-entropy on 1-D", m, grad.Options{Loss: grad.CrossEntropy}, &grad.Facts{Shapes: map[string][]int64{"y": {4}}}, "logits with a class axis"},
		{"not an output lists them", m, grad.Options{Loss: grad.MSE, Output: "logits"}, facts, `outputs are "y" [2 2]`},
		{"class axis ambiguous", m, grad.Options{Loss: grad.CrossEntropy, TargetShape: []int64{2, 5}}, seq3(2, 5, 5),
			"fits cross-entropy on output \"y\" [2 5 5] both with the classes on axis 1 (targets [2 5]) and on the last axis (targets [2 5])"},
		{"class axis ambiguous when flattened", m, grad.Options{Loss: grad.CrossEntropy, TargetShape: []int64{10}}, seq3(2, 5, 5), "both with the classes on axis 1"},
		{"target fits no class axis", m, grad.Options{Loss: grad.CrossEntropy, TargetShape: []int64{2, 32}}, seq3(2, 16, 256),
			"target shape [2 32] (64 elements) fits cross-entropy on output \"y\" [2 16 256] neither with the classes on the last axis (targets [2 16], 32 elements) nor on axis 1 (targets [2 256], 512 elements)"},
		{"target size for the class axis chosen", m, grad.Options{Loss: grad.CrossEntropy, TargetShape: []int64{2, 16}, CrossEntropy: grad.CrossEntropyOptions{ClassAxis: 1}}, seq3(2, 16, 256),
			"wants 512 (shape [2 256], the classes on axis 1)"},
		{"class axis 2", m, grad.Options{Loss: grad.CrossEntropy, CrossEntropy: grad.CrossEntropyOptions{ClassAxis: 2}}, seq3(2, 16, 256), "class axis 2: want 1, -1"},
		{"shift of one position", m, grad.Options{Loss: grad.CrossEntropy, CrossEntropy: grad.CrossEntropyOptions{Shift: true}}, seq3(2, 1, 256), "at least 2 positions"},
		{"reserved name", renamed, grad.Options{Loss: grad.MSE}, facts, "reserved"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := grad.Build(c.m, c.facts, c.opt)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

// seq3 are the facts of the chain model with its output y of another
// shape (the loss's checks come before any rule reads the rest).
func seq3(b, s, v int64) *grad.Facts {
	return &grad.Facts{Shapes: map[string][]int64{"y": {b, s, v}}}
}

// TestBuildLeavesModelAlone: a rule that needs an extra output of a
// forward node (MaxPool's indices, Dropout's mask) edits a copy.
func TestBuildLeavesModelAlone(t *testing.T) {
	g := &onnx.GraphProto{
		Name: "pool",
		Node: []*onnx.NodeProto{
			onnx.Node("Conv", "/conv/Conv", []string{"x", "w"}, []string{"c"}),
			onnx.Node("MaxPool", "/pool/MaxPool", []string{"c"}, []string{"y"}, onnx.AttrInts("kernel_shape", 2, 2), onnx.AttrInts("strides", 2, 2)),
		},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("w", []int64{1, 1, 1, 1}, []float32{2})},
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 1, 1, 4, 4)},
		Output:      []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 1, 1, 2, 2)},
	}
	m := onnx.NewModel(g, 17)
	before, _ := onnx.Marshal(m)
	facts := &grad.Facts{Shapes: map[string][]int64{"x": {1, 1, 4, 4}, "w": {1, 1, 1, 1}, "c": {1, 1, 4, 4}, "y": {1, 1, 2, 2}}}
	res, err := grad.Build(m, facts, grad.Options{Loss: grad.MSE})
	if err != nil {
		t.Fatal(err)
	}
	after, _ := onnx.Marshal(m)
	if string(before) != string(after) {
		t.Error("Build modified its input model")
	}
	if n := res.Model.Graph.Node[1]; len(n.Output) != 2 {
		t.Errorf("the generated MaxPool has outputs %v, want the indices added", n.Output)
	}
}

func TestDropoutTraining(t *testing.T) {
	// Dropout in training mode: the gradient is g·mask/(1−p) with the mask
	// the forward drew in the same run.
	requireORT(t)
	g := &onnx.GraphProto{
		Name: "drop",
		Node: []*onnx.NodeProto{
			onnx.Node("Mul", "/scale/Mul", []string{"x", "w"}, []string{"h"}),
			onnx.Node("Dropout", "/drop/Dropout", []string{"h", "ratio", "train"}, []string{"y"}, onnx.AttrInt("seed", 7)),
		},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("w", []int64{64}, make([]float32, 64)), onnx.FloatTensor("ratio", nil, []float32{0.25}),
			{Name: "train", DataType: int32(onnx.TensorProto_BOOL), RawData: []byte{1}}},
		Input:  []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 64)},
		Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 64)},
	}
	m := onnx.NewModel(g, 17)
	xs := make([]float32, 64)
	for i := range xs {
		xs[i] = float32(i%7) + 1
	}
	x := tensor.FromFloat32s("x", []int64{64}, xs)
	facts, err := backward.Probe(context.Background(), ortLib, m, "", []*tensor.Tensor{x}, sessionOptions)
	if err != nil {
		t.Fatal(err)
	}
	res, err := grad.Build(m, facts, grad.Options{Loss: grad.ModelOutput})
	if err != nil {
		t.Fatal(err)
	}
	s, err := backward.NewSession(res, sessionOptions, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	outs, err := s.Run([]*tensor.Tensor{x}, nil, 4)
	if err != nil {
		t.Fatal(err)
	}
	// loss = Σy at scale 4: dL/dh is 4/0.75 where the mask kept an
	// element and 0 where it dropped it; dL/dw = dL/dh · x.
	gh, _ := res.GradOf("h")
	gw, _ := res.GradOf("w")
	dh, dw := floats(t, outs[gh.Name]), floats(t, outs[gw.Name])
	kept := 0
	for i := range dh {
		switch {
		case math.Abs(float64(dh[i])-4/0.75) < 1e-5:
			kept++
		case dh[i] != 0:
			t.Fatalf("dL/dh[%d] = %g, want 0 or %g", i, dh[i], 4/0.75)
		}
		if want := dh[i] * xs[i]; math.Abs(float64(dw[i]-want)) > 1e-4 {
			t.Errorf("dL/dw[%d] = %g, want %g", i, dw[i], want)
		}
	}
	if kept < 32 || kept > 60 {
		t.Errorf("%d of 64 elements kept at ratio 0.25", kept)
	}
}

// TestRoundingSites: under autocast's rounding, a Linear (Gemm) runs in
// fp16, so the gradients of its weight and bias are computed in fp16 (one
// Site each) and its output's gradient is held in fp16; a large loss scale
// overflows them, and the unrounded values stay finite.
func TestRoundingSites(t *testing.T) {
	requireORT(t)
	w := make([]float32, 12)
	for i := range w {
		w[i] = 0.5
	}
	g := &onnx.GraphProto{
		Name: "linear",
		Node: []*onnx.NodeProto{
			onnx.Node("Gemm", "/fc/Gemm", []string{"x", "fc.weight", "fc.bias"}, []string{"y"}, onnx.AttrInt("transB", 1)),
		},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("fc.weight", []int64{3, 4}, w), onnx.FloatTensor("fc.bias", []int64{3}, []float32{0, 0, 0})},
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 2, 4)},
		Output:      []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 2, 3)},
	}
	m := onnx.NewModel(g, 17)
	ix, err := onnx.NewIndex(g)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := precision.PolicyByName("autocast-fp16")
	if err != nil {
		t.Fatal(err)
	}
	a := precision.Assign(pol, g, ix.Order(), ix.ElemType)
	r := grad.AutocastRounding(g, a)
	if r.Values["y"] != elemFloat16 {
		t.Errorf("y is not held in fp16: %v", r.Values)
	}
	x := tensor.FromFloat32s("x", []int64{2, 4}, []float32{1, 2, 3, 4, 5, 6, 7, 8})
	facts, err := backward.Probe(context.Background(), ortLib, m, "", []*tensor.Tensor{x}, sessionOptions)
	if err != nil {
		t.Fatal(err)
	}
	res, err := grad.Build(m, facts, grad.Options{Loss: grad.MSE, Rounding: r})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sites) != 2 || res.Sites[0].Value != "fc.weight" && res.Sites[1].Value != "fc.weight" {
		t.Fatalf("sites = %+v, want fc.weight and fc.bias", res.Sites)
	}
	s, err := backward.NewSession(res, sessionOptions, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	target := tensor.FromFloat32s("t", []int64{2, 3}, []float32{0, 0, 0, 0, 0, 0})
	// y = 0.5·Σx: 5 and 13; dL/dy = 2y/6; dL/dW[j,k] = Σ_n dL/dy[n]·x[n,k]
	// up to 2·13/6·8 + 2·5/6·4 ≈ 41.3; at scale 2^11 that is 84600 > 65504.
	for _, c := range []struct {
		scale    float32
		overflow bool
	}{{1 << 10, false}, {1 << 11, true}} {
		outs, err := s.Run([]*tensor.Tensor{x}, target, c.scale)
		if err != nil {
			t.Fatal(err)
		}
		for _, site := range res.Sites {
			raw, rounded := floats(t, outs[site.Raw]), floats(t, outs[site.Rounded])
			over, _ := fp16Stats(raw, rounded)
			if site.Value == "fc.weight" && over != c.overflow {
				t.Errorf("scale %g: weight gradient overflow %v, want %v (raw %v)", c.scale, over, c.overflow, raw)
			}
			for i, v := range raw {
				if math.IsInf(float64(v), 0) {
					t.Errorf("scale %g: raw %s[%d] is Inf", c.scale, site.Raw, i)
				}
			}
		}
		// the parameter's gradient is the rounded contribution
		gw, _ := res.GradOf("fc.weight")
		if over, _ := fp16Stats(floats(t, outs[gw.Name]), floats(t, outs[gw.Name])); over != c.overflow {
			t.Errorf("scale %g: dL/dW overflow %v, want %v", c.scale, over, c.overflow)
		}
	}
}

// TestUpgradeBatchNormalization9: at opset 13 a BatchNormalization in
// training mode says so by its extra outputs (mean, var, saved_mean,
// saved_var). The backward graph needs opset 16, where that node must
// carry training_mode=1 and three outputs; its gradients must equal those
// of the same node written at opset 15.
func TestUpgradeBatchNormalization9(t *testing.T) {
	requireORT(t)
	build := func(opset int64, outs []string, attrs ...*onnx.AttributeProto) (*grad.Result, []*tensor.Tensor) {
		g := &onnx.GraphProto{
			Name: "bn",
			Node: []*onnx.NodeProto{
				onnx.Node("BatchNormalization", "/bn/BatchNormalization", []string{"x", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"}, outs, attrs...),
			},
			Initializer: []*onnx.TensorProto{
				onnx.FloatTensor("bn.weight", []int64{2}, []float32{1.5, 0.5}), onnx.FloatTensor("bn.bias", []int64{2}, []float32{0.1, -0.2}),
				onnx.FloatTensor("bn.running_mean", []int64{2}, []float32{0, 0}), onnx.FloatTensor("bn.running_var", []int64{2}, []float32{1, 1}),
			},
			Input:  []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 3, 2, 2)},
			Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 3, 2, 2)},
		}
		xs := make([]float32, 12)
		for i := range xs {
			xs[i] = float32((i*7)%11) - 4
		}
		x := []*tensor.Tensor{tensor.FromFloat32s("x", []int64{3, 2, 2}, xs)}
		facts := &grad.Facts{Shapes: map[string][]int64{"x": {3, 2, 2}, "y": {3, 2, 2}}}
		res, err := grad.Build(onnx.NewModel(g, opset), facts, grad.Options{Loss: grad.MSE})
		if err != nil {
			t.Fatal(err)
		}
		return res, x
	}
	old, x := build(13, []string{"y", "m", "v", "sm", "sv"})
	if old.Opset != 16 {
		t.Errorf("opset %d, want 16", old.Opset)
	}
	bn := old.Model.Graph.Node[0]
	if len(bn.Output) != 3 || onnx.IntAttr(bn, "training_mode", 0) != 1 {
		t.Fatalf("upgraded node: outputs %v, training_mode %d", bn.Output, onnx.IntAttr(bn, "training_mode", 0))
	}
	cur, _ := build(15, []string{"y", "m", "v"}, onnx.AttrInt("training_mode", 1))
	target := tensor.FromFloat32s("t", []int64{3, 2, 2}, make([]float32, 12))
	var grads [2][]float32
	for k, res := range []*grad.Result{old, cur} {
		s, err := backward.NewSession(res, sessionOptions, nil)
		if err != nil {
			t.Fatal(err)
		}
		outs, err := s.Run(x, target, 1)
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		gw, _ := res.GradOf("bn.weight")
		grads[k] = floats(t, outs[gw.Name])
	}
	if !slices.Equal(grads[0], grads[1]) {
		t.Errorf("dL/dweight at opset 13 %v, at opset 15 %v", grads[0], grads[1])
	}
}

// TestDocumentedOps keeps the package documentation's list of rules equal
// to the registered ones.
func TestDocumentedOps(t *testing.T) {
	src, err := os.ReadFile("grad.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(src)
	start := strings.Index(doc, "//\tarithmetic:")
	end := strings.Index(doc, "// Comparisons, index")
	if start < 0 || end < start {
		t.Fatal("rule list not found in the package documentation")
	}
	var listed []string
	for _, line := range strings.Split(doc[start:end], "\n") {
		line = strings.TrimPrefix(strings.TrimSpace(strings.TrimPrefix(line, "//")), "\t")
		if i := strings.Index(line, ":"); i >= 0 {
			line = line[i+1:]
		}
		if i := strings.Index(line, "("); i >= 0 {
			line = line[:i]
		}
		listed = append(listed, strings.Fields(line)...)
	}
	slices.Sort(listed)
	if !slices.Equal(listed, vjp.Ops()) {
		t.Errorf("documented %v\nregistered %v", listed, vjp.Ops())
	}
}

// TestPartialGradient: h feeds a supported path and an unsupported one;
// its gradient, and w1's behind it, miss the unsupported share and say so.
func TestPartialGradient(t *testing.T) {
	g := &onnx.GraphProto{
		Name: "partial",
		Node: []*onnx.NodeProto{
			onnx.Node("MatMul", "/fc1/MatMul", []string{"x", "w1"}, []string{"h"}),
			onnx.Node("Tan", "/tan/Tan", []string{"h"}, []string{"c"}),
			onnx.Node("Relu", "/relu/Relu", []string{"h"}, []string{"r"}),
			onnx.Node("Add", "/Add", []string{"c", "r"}, []string{"a"}),
			onnx.Node("MatMul", "/fc2/MatMul", []string{"a", "w2"}, []string{"y"}),
		},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("w1", []int64{3, 4}, make([]float32, 12)), onnx.FloatTensor("w2", []int64{4, 2}, make([]float32, 8))},
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 2, 3)},
		Output:      []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 2, 2)},
	}
	shapes := map[string][]int64{"x": {2, 3}, "w1": {3, 4}, "w2": {4, 2}, "y": {2, 2}}
	for _, v := range []string{"h", "c", "r", "a"} {
		shapes[v] = []int64{2, 4}
	}
	res, err := grad.Build(onnx.NewModel(g, 17), &grad.Facts{Shapes: shapes}, grad.Options{Loss: grad.MSE})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"y": false, "a": false, "r": false, "c": false, "h": true, "w1": true, "w2": false}
	for v, partial := range want {
		gr, ok := res.GradOf(v)
		if !ok {
			t.Errorf("%s: no gradient", v)
			continue
		}
		if gr.Partial != partial {
			t.Errorf("%s: partial %v, want %v", v, gr.Partial, partial)
		}
	}
	if len(res.Blocked) != 0 {
		t.Errorf("blocked %v, want none", res.Blocked)
	}
}

// TestForwardSaved: with the forward held as autocast holds it
// (grad.Forward), a Linear's rule reads the fp16 copies of its input and
// weight that the forward's Gemm reads, and Relu's rule its rounded
// result, never the fp32 values: the backward nodes read no fp32 input of
// a Gemm and no unrounded output; the forward's own nodes read the copies
// too; and the session's values are what autograd computes at those
// rounded values.
func TestForwardSaved(t *testing.T) {
	requireORT(t)
	w1 := make([]float32, 16)
	for i := range w1 {
		w1[i] = 0.1 + 0.01*float32(i) + 1e-5 // off fp16's grid
	}
	g := &onnx.GraphProto{
		Name: "mlp",
		Node: []*onnx.NodeProto{
			onnx.Node("Gemm", "/fc1/Gemm", []string{"x", "fc1.weight"}, []string{"h"}, onnx.AttrInt("transB", 1)),
			onnx.Node("Relu", "/act/Relu", []string{"h"}, []string{"r"}),
			onnx.Node("Gemm", "/fc2/Gemm", []string{"r", "fc2.weight"}, []string{"y"}, onnx.AttrInt("transB", 1)),
		},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("fc1.weight", []int64{4, 4}, w1), onnx.FloatTensor("fc2.weight", []int64{1, 4}, []float32{0.3, -0.2, 0.1, 0.7})},
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 2, 4)},
		Output:      []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 2, 1)},
	}
	m := onnx.NewModel(g, 17)
	ix, err := onnx.NewIndex(g)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := precision.PolicyByName("autocast-fp16")
	if err != nil {
		t.Fatal(err)
	}
	a := precision.Assign(pol, g, ix.Order(), ix.ElemType)
	r := grad.AutocastRounding(g, a)
	r.Forward = &grad.Forward{Orig: g, Assign: a}
	x := tensor.FromFloat32s("x", []int64{2, 4}, []float32{1.0001, -2, 3, 0.5, 5, -6, 0.25, 8})
	facts, err := backward.Probe(context.Background(), ortLib, m, "", []*tensor.Tensor{x}, sessionOptions)
	if err != nil {
		t.Fatal(err)
	}
	res, err := grad.Build(m, facts, grad.Options{Loss: grad.MSE, Rounding: r})
	if err != nil {
		t.Fatal(err)
	}
	copies := map[string]bool{}
	for _, h := range res.Held {
		if h.Cast {
			copies[h.Value] = true
		}
	}
	for _, v := range []string{"x", "fc1.weight", "fc2.weight"} {
		if !copies[v] {
			t.Errorf("no fp16 copy of %s among %+v", v, res.Held)
		}
	}
	bg := res.Model.Graph
	for k, n := range bg.Node {
		if n.OpType == "Cast" || strings.Contains(n.Name, "::back::") {
			continue // the roundings themselves
		}
		for _, in := range n.Input {
			if copies[in] && (k >= len(g.Node) || n.OpType == "Gemm") {
				t.Errorf("node %s (%s) reads the fp32 %s, not its fp16 copy", n.Name, n.OpType, in)
			}
			if k >= len(g.Node) && strings.Contains(in, "::raw::") {
				t.Errorf("backward node %s (%s) reads the unrounded %s", n.Name, n.OpType, in)
			}
		}
	}
	s, err := backward.NewSession(res, sessionOptions, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	target := tensor.FromFloat32s("t", []int64{2, 1}, []float32{0, 0})
	outs, err := s.Run([]*tensor.Tensor{x}, target, 1)
	if err != nil {
		t.Fatal(err)
	}
	// autograd at the rounded values: h = x16·W1₁₆ᵀ (fp32 sums) rounded,
	// r = relu(h), y = r·w2₁₆ᵀ rounded; dL/dy = 2y/2; dL/dW1 = (dL/dh)ᵀ·x16
	// with dL/dh = (dL/dy·w2₁₆ where h > 0) rounded, dL/dy rounded too.
	h16 := round16
	xs := floats(t, x)
	w2 := []float32{0.3, -0.2, 0.1, 0.7}
	want := make([]float32, 16)
	for n := range 2 {
		var hv [4]float32
		var y float32
		for j := range 4 {
			var acc float32
			for k := range 4 {
				acc += h16(xs[n*4+k]) * h16(w1[j*4+k])
			}
			hv[j] = max(h16(acc), 0)
			y += hv[j] * h16(w2[j])
		}
		dy := h16(h16(y))
		for j := range 4 {
			if hv[j] <= 0 {
				continue
			}
			dh := h16(dy * h16(w2[j]))
			for k := range 4 {
				want[j*4+k] += dh * h16(xs[n*4+k])
			}
		}
	}
	gw, _ := res.GradOf("fc1.weight")
	got := floats(t, outs[gw.Name])
	for i := range want {
		if d := math.Abs(float64(got[i] - h16(want[i]))); d > 1e-3*math.Abs(float64(want[i]))+1e-6 {
			t.Errorf("dL/dW1[%d] = %g, autograd at the saved values %g", i, got[i], h16(want[i]))
		}
	}
}

// round16 rounds v to the nearest fp16 value (ties to even), as a Cast to
// FLOAT16 does.
func round16(v float32) float32 {
	f := float64(v)
	if a := math.Abs(f); a >= 65520 {
		return float32(math.Copysign(math.Inf(1), f))
	} else if a < math.Ldexp(1, -14) {
		return float32(math.Ldexp(math.RoundToEven(math.Ldexp(f, 24)), -24))
	}
	frac, exp := math.Frexp(f)
	return float32(math.Ldexp(math.RoundToEven(math.Ldexp(frac, 11)), exp-11))
}
