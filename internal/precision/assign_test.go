package precision

import (
	"slices"
	"strings"
	"testing"

	"fp16audit/internal/onnx"
)

// n builds a default-domain node; inputs and outputs are space-separated.
func n(op, name, inputs, outputs string, attrs ...*onnx.AttributeProto) *onnx.NodeProto {
	return onnx.Node(op, name, strings.Fields(inputs), strings.Fields(outputs), attrs...)
}

// w returns a float initializer of zeros with the given dims (none: 0-dim).
func w(name string, dims ...int64) *onnx.TensorProto {
	size := int64(1)
	for _, d := range dims {
		size *= d
	}
	return onnx.FloatTensor(name, dims, make([]float32, size))
}

// scalar returns a Constant node holding a 0-dim float, as the exporters
// write a Python scalar.
func scalar(out string, v float32) *onnx.NodeProto {
	return n("Constant", out, "", out, onnx.AttrTensor("value", onnx.FloatTensor("", nil, []float32{v})))
}

func castTo(name, in, out string, to onnx.TensorProto_DataType) *onnx.NodeProto {
	return n("Cast", name, in, out, onnx.AttrInt("to", int64(to)))
}

// graph returns a graph with input x [N,4] (float), mask [N,4] (bool),
// initializers W [4,4], b [4] and K [4,4,1,1], plus extra initializers.
func graph(extra []*onnx.TensorProto, nodes ...*onnx.NodeProto) *onnx.GraphProto {
	return &onnx.GraphProto{
		Input: []*onnx.ValueInfoProto{
			onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, "N", 4),
			onnx.TensorValueInfo("mask", onnx.TensorProto_BOOL, "N", 4),
		},
		Initializer: append([]*onnx.TensorProto{w("W", 4, 4), w("b", 4), w("K", 4, 4, 1, 1)}, extra...),
		Node:        nodes,
	}
}

const (
	fp16 = "autocast-fp16"
	bf16 = "autocast-bf16"
)

func TestAssign(t *testing.T) {
	type casts map[string][]bool
	type precs map[string]Precision
	tests := []struct {
		name     string
		policy   string
		g        *onnx.GraphProto
		order    []int
		elemType map[string]onnx.TensorProto_DataType
		values   precs // by value name
		nodes    precs // by node name
		casts    casts // by node name, every slot
		unknown  []int
	}{
		{
			name: "linear bias stays in the matmul's precision", policy: fp16,
			g: graph(nil,
				n("MatMul", "mm", "x W", "h"),
				n("Add", "bias", "h b", "y")),
			values: precs{"x": FP32, "W": FP32, "b": FP32, "h": FP16, "y": FP16},
			nodes:  precs{"mm": FP16, "bias": FP16},
			casts:  casts{"mm": {true, true}, "bias": {false, true}},
		},
		{
			name: "linear bias first", policy: fp16,
			g: graph(nil,
				n("MatMul", "mm", "x W", "h"),
				n("Add", "bias", "b h", "y")),
			values: precs{"y": FP16},
			casts:  casts{"bias": {true, false}},
		},
		{
			name: "bias rule needs a single consumer", policy: fp16,
			g: graph(nil,
				n("MatMul", "mm", "x W", "h"),
				n("Add", "bias", "h b", "y"),
				n("Relu", "relu", "h", "r")),
			values: precs{"y": FP32, "r": FP16},
			casts:  casts{"bias": {true, false}},
		},
		{
			name: "bias rule needs a 1-D constant", policy: fp16,
			g: graph(nil,
				n("MatMul", "mm", "x W", "h"),
				n("Add", "add", "h W", "y")),
			values: precs{"y": FP32},
		},
		{
			name: "bias rule under bf16", policy: bf16,
			g: graph(nil,
				n("Gemm", "gemm", "x W", "h"),
				n("Add", "bias", "h b", "y")),
			values: precs{"h": BF16, "y": BF16},
			nodes:  precs{"gemm": BF16, "bias": BF16},
		},
		{
			name: "relu after conv", policy: fp16,
			g: graph(nil,
				n("Conv", "conv", "x K b", "c"),
				n("Relu", "relu", "c", "r")),
			values: precs{"c": FP16, "r": FP16},
			nodes:  precs{"conv": FP16, "relu": FP16},
			casts:  casts{"conv": {true, true, true}, "relu": {false}},
		},
		{
			name: "fp16 plus fp32 activation promotes", policy: fp16,
			g: graph(nil,
				n("MatMul", "mm", "x W", "h"),
				n("Relu", "relu", "x", "rx"),
				n("Add", "add", "h rx", "y")),
			values: precs{"rx": FP32, "y": FP32},
			nodes:  precs{"add": FP32},
			casts:  casts{"add": {true, false}},
		},
		{
			name: "fp16 times fp32 parameter promotes", policy: fp16,
			g: graph([]*onnx.TensorProto{w("gamma", 4)},
				n("MatMul", "mm", "x W", "h"),
				n("Mul", "scale", "h gamma", "y")),
			values: precs{"y": FP32},
		},
		{
			name: "0-dim constant does not promote", policy: fp16,
			g: graph([]*onnx.TensorProto{w("half"), w("one", 1)},
				n("MatMul", "mm", "x W", "h"),
				scalar("c", 1e-9),
				n("Mul", "mulc", "h c", "y1"),
				n("Mul", "muli", "half h", "y2"),
				n("Mul", "mul1", "h one", "y3")),
			values: precs{"c": FP32, "half": FP32, "y1": FP16, "y2": FP16, "y3": FP32},
			casts:  casts{"mulc": {false, false}, "muli": {false, false}, "mul1": {true, false}},
		},
		{
			name: "0-dim constants alone keep their type", policy: fp16,
			g: graph(nil,
				scalar("a", 2), scalar("b2", 3),
				n("Mul", "mul", "a b2", "y")),
			values: precs{"y": FP32},
		},
		{
			name: "value declared rank 0 does not promote", policy: fp16,
			g: func() *onnx.GraphProto {
				g := graph(nil,
					n("MatMul", "mm", "x W", "h"),
					n("Shape", "shape", "h", "s"),
					castTo("cast", "s", "sf", onnx.TensorProto_FLOAT),
					n("Div", "div", "h sf", "y"))
				g.ValueInfo = append(g.ValueInfo, onnx.TensorValueInfo("sf", onnx.TensorProto_FLOAT))
				return g
			}(),
			values: precs{"s": NotFloat, "sf": FP32, "y": FP16},
			nodes:  precs{"shape": NotFloat, "cast": FP32},
			casts:  casts{"div": {false, false}},
		},
		{
			name: "gelu decomposition stays fp16", policy: fp16,
			g: graph(nil,
				n("MatMul", "mm", "x W", "h"),
				scalar("sqrt2", 1.4142135),
				scalar("one", 1),
				scalar("halfc", 0.5),
				n("Div", "div", "h sqrt2", "d"),
				n("Erf", "erf", "d", "e"),
				n("Add", "add", "e one", "a"),
				n("Mul", "mul", "h a", "m"),
				n("Mul", "mul2", "m halfc", "y")),
			values: precs{"d": FP16, "e": FP16, "a": FP16, "m": FP16, "y": FP16},
			nodes:  precs{"div": FP16, "erf": FP16, "add": FP16, "mul": FP16, "mul2": FP16},
			casts:  casts{"div": {false, false}, "add": {false, false}, "mul": {false, false}},
		},
		{
			name: "softmax is fp32 under autocast", policy: fp16,
			g: graph(nil,
				n("MatMul", "mm", "x W", "h"),
				n("Softmax", "softmax", "h", "s"),
				n("MatMul", "mm2", "s W", "o")),
			values: precs{"s": FP32, "o": FP16},
			nodes:  precs{"softmax": FP32},
			casts:  casts{"softmax": {true}, "mm2": {true, true}},
		},
		{
			name: "layer norm casts only its 16-bit input", policy: fp16,
			g: graph([]*onnx.TensorProto{w("ln_w", 4), w("ln_b", 4)},
				n("MatMul", "mm", "x W", "h"),
				n("LayerNormalization", "ln", "h ln_w ln_b", "y")),
			values: precs{"y": FP32},
			casts:  casts{"ln": {true, false, false}},
		},
		{
			name: "rsqrt computes in fp32", policy: fp16,
			g: graph([]*onnx.TensorProto{onnx.FloatTensor("ones", []int64{1}, []float32{1})},
				n("MatMul", "mm", "x W", "h"),
				n("Sqrt", "sqrt", "h", "sq"),
				n("Div", "rsqrt", "ones sq", "r"),
				n("Sqrt", "sqrt2", "h", "sq2"),
				n("Div", "div", "h sq2", "d")),
			values: precs{"sq": FP32, "r": FP32, "sq2": FP16, "d": FP16},
			nodes:  precs{"sqrt": FP32, "rsqrt": FP32, "sqrt2": FP16},
			casts:  casts{"sqrt": {true}, "rsqrt": {false, false}},
		},
		{
			name: "masked fill keeps the scores' type", policy: fp16,
			g: graph(nil,
				n("MatMul", "mm", "x W", "h"),
				scalar("neg", -1e9),
				n("Where", "where", "mask neg h", "y")),
			values: precs{"mask": NotFloat, "y": FP16},
			nodes:  precs{"where": FP16},
			casts:  casts{"where": {false, false, false}},
		},
		{
			name: "concat promotes to the widest input", policy: fp16,
			g: graph(nil,
				n("MatMul", "mm", "x W", "h"),
				n("Concat", "cat", "h x", "y", onnx.AttrInt("axis", 1))),
			values: precs{"y": FP32},
			nodes:  precs{"cat": FP32},
			casts:  casts{"cat": {true, false}},
		},
		{
			name: "explicit half cast is honoured under fp32", policy: "fp32",
			g: graph(nil,
				castTo("tohalf", "x", "xh", onnx.TensorProto_FLOAT16),
				n("Relu", "relu", "xh", "r"),
				n("MatMul", "mm", "r W", "h"),
				castTo("tobf", "x", "xb", onnx.TensorProto_BFLOAT16)),
			values: precs{"x": FP32, "xh": FP16, "r": FP16, "h": FP32, "xb": BF16},
			nodes:  precs{"tohalf": FP16, "relu": FP16, "mm": FP32},
			casts:  casts{"tohalf": {false}, "mm": {true, false}},
		},
		{
			name: "casts to float and int", policy: fp16,
			g: graph(nil,
				n("MatMul", "mm", "x W", "h"),
				castTo("up", "h", "hf", onnx.TensorProto_FLOAT),
				castTo("dbl", "h", "hd", onnx.TensorProto_DOUBLE),
				castTo("toint", "h", "hi", onnx.TensorProto_INT64),
				n("CastLike", "like", "x h", "xl")),
			values: precs{"hf": FP32, "hd": FP32, "hi": NotFloat, "xl": FP16},
			nodes:  precs{"toint": NotFloat},
		},
		{
			name: "resize scales do not promote", policy: "fp32",
			g: graph([]*onnx.TensorProto{w("roi", 0), w("scales", 4)},
				castTo("tohalf", "x", "xh", onnx.TensorProto_FLOAT16),
				n("Resize", "resize", "xh roi scales", "y")),
			values: precs{"y": FP16},
			casts:  casts{"resize": {false, false, false}},
		},
		{
			name: "resize is fp32 under autocast", policy: fp16,
			g: graph([]*onnx.TensorProto{w("roi", 0), w("scales", 4)},
				castTo("tohalf", "x", "xh", onnx.TensorProto_FLOAT16),
				n("Resize", "resize", "xh roi scales", "y")),
			values: precs{"y": FP32},
			casts:  casts{"resize": {true, false, false}},
		},
		{
			name: "half: everything fp16 except batchnorm", policy: "half",
			g: graph([]*onnx.TensorProto{w("bn_s", 4), w("bn_b", 4), w("bn_m", 4), w("bn_v", 4)},
				n("Conv", "conv", "x K b", "c"),
				n("BatchNormalization", "bn", "c bn_s bn_b bn_m bn_v", "bn_out"),
				n("Relu", "relu", "bn_out", "r"),
				n("MatMul", "mm", "r W", "h"),
				scalar("eps", 1e-12),
				n("Add", "add", "h eps", "he"),
				n("Softmax", "softmax", "he", "s"),
				n("Exp", "exp", "s", "e"),
				n("LayerNormalization", "ln", "e b b", "y")),
			values: precs{
				"x": FP16, "W": FP16, "K": FP16, "b": FP16, "eps": FP16,
				"bn_s": FP32, "bn_b": FP32, "bn_m": FP32, "bn_v": FP32,
				"c": FP16, "bn_out": FP16, "r": FP16, "h": FP16, "he": FP16,
				"s": FP16, "e": FP16, "y": FP16,
			},
			nodes: precs{
				"conv": FP16, "bn": FP32, "relu": FP16, "mm": FP16,
				"softmax": FP16, "exp": FP16, "ln": FP16,
			},
			casts: casts{"conv": {false, false, false}, "bn": {true, false, false, false, false}, "softmax": {false}},
		},
		{
			name: "autocast: batchnorm keeps its input type", policy: fp16,
			g: graph([]*onnx.TensorProto{w("bn_s", 4), w("bn_b", 4), w("bn_m", 4), w("bn_v", 4)},
				n("Conv", "conv", "x K b", "c"),
				n("BatchNormalization", "bn", "c bn_s bn_b bn_m bn_v", "bn_out")),
			values: precs{"bn_s": FP32, "bn_out": FP16},
			nodes:  precs{"bn": FP16},
			casts:  casts{"bn": {false, false, false, false, false}},
		},
		{
			// A training step's BatchNormalization also outputs its
			// running statistics: fp32 buffers in PyTorch, never rounded.
			name: "autocast: training batchnorm's running statistics stay fp32", policy: fp16,
			g: graph([]*onnx.TensorProto{w("bn_s", 4), w("bn_b", 4), w("bn_m", 4), w("bn_v", 4)},
				n("Conv", "conv", "x K b", "c"),
				n("BatchNormalization", "bn", "c bn_s bn_b bn_m bn_v", "bn_out bn_rm bn_rv", onnx.AttrInt("training_mode", 1))),
			values: precs{"bn_out": FP16, "bn_rm": FP32, "bn_rv": FP32},
			nodes:  precs{"bn": FP16},
		},
		{
			name: "bf16 policy", policy: bf16,
			g: graph(nil,
				n("MatMul", "mm", "x W", "h"),
				n("Relu", "relu", "h", "r"),
				castTo("tohalf", "x", "xh", onnx.TensorProto_FLOAT16),
				n("Add", "mix", "r xh", "y"),
				n("Softmax", "softmax", "r", "s")),
			values: precs{"h": BF16, "r": BF16, "xh": FP16, "y": FP32, "s": FP32},
			nodes:  precs{"mm": BF16, "mix": FP32},
			casts:  casts{"mix": {true, true}, "softmax": {true}},
		},
		{
			name: "non-float values and float factories", policy: "half",
			g: graph(nil,
				n("MatMul", "mm", "x W", "h"),
				n("Shape", "shape", "h", "s"),
				n("Equal", "eq", "h h", "e"),
				n("ConstantOfShape", "zeros", "s", "z"),
				n("ConstantOfShape", "zeros16", "s", "z16",
					onnx.AttrTensor("value", &onnx.TensorProto{DataType: int32(onnx.TensorProto_FLOAT16), Dims: []int64{1}, RawData: []byte{0, 0}})),
				n("TopK", "topk", "h s", "vals idx"),
				n("Add", "add", "h z", "y")),
			values: precs{"s": NotFloat, "e": NotFloat, "z": FP32, "z16": FP16, "vals": FP16, "idx": NotFloat, "y": FP32},
			nodes:  precs{"shape": NotFloat, "eq": NotFloat, "zeros": FP32, "zeros16": FP16, "topk": FP16},
			casts:  casts{"eq": {false, false}},
		},
		{
			name: "elemType decides float outputs", policy: fp16,
			g: graph(nil,
				n("MatMul", "mm", "x W", "h"),
				&onnx.NodeProto{OpType: "MyIndex", Domain: "com.example", Name: "custom", Input: []string{"h"}, Output: []string{"i", "f"}},
				n("Relu", "relu", "f", "r")),
			elemType: map[string]onnx.TensorProto_DataType{"i": onnx.TensorProto_INT64, "f": onnx.TensorProto_FLOAT},
			values:   precs{"i": NotFloat, "f": FP16, "r": FP16},
			nodes:    precs{"custom": FP16},
			unknown:  []int{1},
		},
		{
			name: "custom op follows its inputs", policy: fp16,
			g: graph(nil,
				n("MatMul", "mm", "x W", "h"),
				&onnx.NodeProto{OpType: "FusedGelu", Domain: "com.microsoft", Name: "custom", Input: []string{"h", "x"}, Output: []string{"y"}}),
			values:  precs{"y": FP32},
			casts:   casts{"custom": {true, false}},
			unknown: []int{1},
		},
		{
			name: "the given order is followed", policy: fp16,
			g: graph(nil,
				n("Relu", "relu", "h", "r"),
				n("MatMul", "mm", "x W", "h")),
			order:  []int{1, 0},
			values: precs{"h": FP16, "r": FP16},
			nodes:  precs{"relu": FP16},
		},
		{
			name: "explicit half initializer is honoured", policy: "fp32",
			g: graph([]*onnx.TensorProto{{Name: "W16", Dims: []int64{4, 4}, DataType: int32(onnx.TensorProto_FLOAT16), RawData: make([]byte, 32)}},
				n("MatMul", "mm", "x W16", "h")),
			values: precs{"W16": FP16, "h": FP32},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var et func(string) int32
			if tt.elemType != nil {
				et = func(name string) int32 { return int32(tt.elemType[name]) }
			}
			a := Assign(mustPolicy(t, tt.policy), tt.g, tt.order, et)
			for name, want := range tt.values {
				if got, ok := a.Value[name]; !ok || got != want {
					t.Errorf("Value[%q] = %v (present %v); want %v", name, got, ok, want)
				}
			}
			index := map[string]int{}
			for i, nd := range tt.g.Node {
				index[nd.Name] = i
			}
			for name, want := range tt.nodes {
				if got := a.Node[index[name]]; got != want {
					t.Errorf("Node[%s] = %v; want %v", name, got, want)
				}
			}
			for name, want := range tt.casts {
				if got := a.CastInputs[index[name]]; !slices.Equal(got, want) {
					t.Errorf("CastInputs[%s] = %v; want %v", name, got, want)
				}
			}
			if !slices.Equal(a.Unknown, tt.unknown) {
				t.Errorf("Unknown = %v; want %v", a.Unknown, tt.unknown)
			}
		})
	}
}

// TestAssignCoversGraph checks the shape of an assignment: every node has
// a precision slot and a cast flag per input, every value an entry.
func TestAssignCoversGraph(t *testing.T) {
	g := graph(nil,
		n("MatMul", "mm", "x W", "h"),
		n("Shape", "shape", "h", "s"))
	a := Assign(mustPolicy(t, fp16), g, nil, nil)
	if len(a.Node) != 2 || len(a.CastInputs) != 2 || len(a.CastInputs[0]) != 2 || len(a.CastInputs[1]) != 1 {
		t.Fatalf("Node %v CastInputs %v: want one slot per node and input", a.Node, a.CastInputs)
	}
	for _, name := range []string{"x", "mask", "W", "b", "K", "h", "s"} {
		if _, ok := a.Value[name]; !ok {
			t.Errorf("Value has no entry for %q", name)
		}
	}
}

// TestAssignKeepFP32: a kept node computes and outputs fp32, the ops that
// follow its output promote to fp32 by the usual rules, the next
// lower-precision op casts again, and a kept half Cast is removed (its
// output keeps its input's precision).
func TestAssignKeepFP32(t *testing.T) {
	g := &onnx.GraphProto{
		Node: []*onnx.NodeProto{
			onnx.Node("Conv", "c1", []string{"x", "w1"}, []string{"a"}),
			onnx.Node("Relu", "r", []string{"a"}, []string{"b"}),
			onnx.Node("Conv", "c2", []string{"b", "w2"}, []string{"c"}),
			onnx.Node("Cast", "h", []string{"c"}, []string{"d"}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT16))),
			onnx.Node("Cast", "h2", []string{"b"}, []string{"e"}, onnx.AttrInt("to", int64(onnx.TensorProto_FLOAT16))),
		},
		Initializer: []*onnx.TensorProto{
			onnx.FloatTensor("w1", []int64{1, 1, 1, 1}, []float32{1}),
			onnx.FloatTensor("w2", []int64{1, 1, 1, 1}, []float32{1}),
		},
		Input: []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 1, 1, 2, 2)},
	}
	p := mustPolicy(t, "autocast-fp16")
	base := Assign(p, g, nil, nil)
	if base.Node[0] != FP16 || base.Value["b"] != FP16 || base.Value["d"] != FP16 {
		t.Fatalf("without keep: c1 %v b %v d %v", base.Node[0], base.Value["b"], base.Value["d"])
	}
	a := AssignKeepFP32(p, g, nil, nil, map[int]bool{0: true, 3: true, 4: true})
	if a.Node[0] != FP32 || a.Value["a"] != FP32 || a.CastInputs[0][0] || a.CastInputs[0][1] {
		t.Errorf("kept c1: node %v out %v casts %v", a.Node[0], a.Value["a"], a.CastInputs[0])
	}
	if a.Value["b"] != FP32 {
		t.Errorf("relu after a kept conv: %v, want fp32", a.Value["b"])
	}
	if a.Node[2] != FP16 || !a.CastInputs[2][0] {
		t.Errorf("c2: node %v cast input %v, want fp16 casting its fp32 input", a.Node[2], a.CastInputs[2][0])
	}
	// A removed cast passes its input on: c2 is fp16 under autocast with
	// or without the cast after it, the fp32 relu output stays fp32.
	if a.Value["d"] != FP16 || a.Why["d"] != ReasonAutocast {
		t.Errorf("removed half cast after an fp16 conv: %v %v, want fp16 (autocast)", a.Value["d"], a.Why["d"].Names())
	}
	if a.Value["e"] != FP32 {
		t.Errorf("removed half cast after an fp32 value: %v, want fp32", a.Value["e"])
	}
}

// TestSequencesNotCast: a sequence holds its tensors in the precision
// they were made in and no op casts it, though it promotes: the fp32
// tensor inserted beside fp16 ones makes the SequenceInsert fp32, and the
// sequence read is not marked for a cast (a Cast of a sequence is no
// valid ONNX), while the tensor beside it still is where it narrows.
func TestSequencesNotCast(t *testing.T) {
	g := &onnx.GraphProto{
		Name: "seq",
		Node: []*onnx.NodeProto{
			onnx.Node("MatMul", "mm", []string{"x", "w"}, []string{"h"}),
			onnx.Node("SequenceConstruct", "make", []string{"h"}, []string{"seq"}),
			onnx.Node("SequenceInsert", "insert", []string{"seq", "x"}, []string{"seq2"}),
			onnx.Node("SequenceAt", "at", []string{"seq2", "zero"}, []string{"piece"}),
		},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("w", []int64{2, 2}, []float32{1, 0, 0, 1}), onnx.Int64Tensor("zero", nil, []int64{0})},
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 2, 2)},
		Output:      []*onnx.ValueInfoProto{onnx.TensorValueInfo("piece", onnx.TensorProto_FLOAT, 2, 2)},
	}
	p, _ := PolicyByName("autocast-fp16")
	a := Assign(p, g, nil, nil)
	if a.Value["seq"] != FP16 || a.Value["seq2"] != FP32 || a.Value["piece"] != FP32 {
		t.Errorf("seq %s, seq2 %s, piece %s; want fp16, fp32, fp32", a.Value["seq"], a.Value["seq2"], a.Value["piece"])
	}
	if a.CastInputs[2][0] || a.CastInputs[3][0] {
		t.Errorf("a sequence is marked for a cast: %v", a.CastInputs)
	}
	if !a.CastInputs[0][0] {
		t.Error("the MatMul no longer casts its input")
	}
}
