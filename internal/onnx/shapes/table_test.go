package shapes_test

import (
	"fmt"
	"fp16audit/internal/testutil/ortinit"
	"slices"
	"testing"

	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/onnx/shapes"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/tensor"
)

// arg is one input of a row's example node: its type and shape, and the
// int64 values of an axis input (nil: zeros).
type arg struct {
	dtype tensor.DType
	shape []int64
	ints  []int64
}

func f32(shape ...int64) arg { return arg{dtype: tensor.Float32, shape: shape} }

// example is a node of the entry's op that ONNX Runtime can run: its inputs
// (the first a graph input, the others initializers), attributes and
// opset.
type example struct {
	args  []arg
	attrs []*onnx.AttributeProto
	opset int64
}

// examples are the ops whose node needs more than the family's generic
// inputs (unary: x [2,3,4]; broadcast: [2,3,4] and [3,1]; reduce: x
// [2,3,4] over axis 1, as an input at opset 18).
var examples = map[string]example{
	"Cast":     {args: []arg{f32(2, 3, 4)}, attrs: []*onnx.AttributeProto{onnx.AttrInt("to", int64(onnx.TensorProto_DOUBLE))}},
	"CastLike": {args: []arg{f32(2, 3, 4), {dtype: tensor.Float64, shape: []int64{1}}}},
	"Mish":     {args: []arg{f32(2, 3, 4)}, opset: 18},
	"Swish":    {args: []arg{f32(2, 3, 4)}, opset: 24},
	"RotaryEmbedding": {args: []arg{f32(2, 2, 3, 4), f32(3, 2), f32(3, 2), {dtype: tensor.Int64, shape: []int64{2, 3}, ints: []int64{0, 1, 2, 2, 0, 1}}},
		opset: 23},
	"Not":                   {args: []arg{{dtype: tensor.Bool, shape: []int64{2, 3, 4}}}},
	"LayerNormalization":    {args: []arg{f32(2, 3, 4), f32(4), f32(4)}},
	"BatchNormalization":    {args: []arg{f32(2, 3, 4), f32(3), f32(3), f32(3), f32(3)}},
	"InstanceNormalization": {args: []arg{f32(2, 3, 4), f32(3), f32(3)}},
	"GroupNormalization":    {args: []arg{f32(2, 4, 3), f32(4), f32(4)}, attrs: []*onnx.AttributeProto{onnx.AttrInt("num_groups", 2)}, opset: 21},
	"RMSNormalization":      {args: []arg{f32(2, 3, 4), f32(4)}, opset: 23},
	"CumSum":                {args: []arg{f32(2, 3, 4), {dtype: tensor.Int64, shape: []int64{}, ints: []int64{1}}}},
	"Gelu":                  {args: []arg{f32(2, 3, 4)}, opset: 20},
	"And":                   {args: []arg{{dtype: tensor.Bool, shape: []int64{2, 3, 4}}, {dtype: tensor.Bool, shape: []int64{3, 1}}}},
	"Or":                    {args: []arg{{dtype: tensor.Bool, shape: []int64{2, 3, 4}}, {dtype: tensor.Bool, shape: []int64{3, 1}}}},
	"Xor":                   {args: []arg{{dtype: tensor.Bool, shape: []int64{2, 3, 4}}, {dtype: tensor.Bool, shape: []int64{3, 1}}}},
	"Where":                 {args: []arg{{dtype: tensor.Bool, shape: []int64{3, 1}}, f32(2, 3, 4), f32(4)}},
	"BitShift":              {args: []arg{{dtype: tensor.Uint32, shape: []int64{2, 3, 4}}, {dtype: tensor.Uint32, shape: []int64{3, 1}}}, attrs: []*onnx.AttributeProto{onnx.AttrString("direction", "LEFT")}},
	"Mod":                   {args: []arg{f32(2, 3, 4), f32(3, 1)}, attrs: []*onnx.AttributeProto{onnx.AttrInt("fmod", 1)}},
	"PRelu":                 {args: []arg{f32(2, 3, 4), f32(3, 1)}},
}

// TestTableShapes runs every op of the registry whose shape rule is a
// generic one (unary, broadcast, reduce; dropout and batchNorm, whose
// first output is unary's) through ONNX Runtime and checks that
// shapes.Infer gives the shape ONNX Runtime's output has: an entry
// naming a rule its op does not follow fails here. Reductions run with
// keepdims on and off.
func TestTableShapes(t *testing.T) {
	ortinit.Init(t)
	generic := map[string]example{
		"unary":     {args: []arg{f32(2, 3, 4)}},
		"dropout":   {args: []arg{f32(2, 3, 4)}},
		"batchNorm": {args: []arg{f32(2, 3, 4)}},
		"broadcast": {args: []arg{f32(2, 3, 4), f32(3, 1)}},
		"reduce":    {args: []arg{f32(2, 3, 4), {dtype: tensor.Int64, shape: []int64{1}, ints: []int64{1}}}, opset: 18},
	}
	n := 0
	for _, o := range ops.All() {
		ex, ok := generic[o.Shape]
		if o.Domain != ops.Default || !ok {
			continue
		}
		if own, ok := examples[o.Name]; ok {
			ex = own
		}
		keeps := []int64{-1}
		if o.Shape == "reduce" {
			keeps = []int64{1, 0}
		}
		for _, keep := range keeps {
			name := o.Name
			attrs := ex.attrs
			if keep >= 0 {
				name = fmt.Sprintf("%s/keepdims=%d", o.Name, keep)
				attrs = append(slices.Clone(attrs), onnx.AttrInt("keepdims", keep))
			}
			t.Run(name, func(t *testing.T) {
				checkShape(t, o.Name, ex, attrs)
			})
			n++
		}
	}
	if n < 80 {
		t.Fatalf("%d entries checked: the registry lost its shape rules", n)
	}
}

func checkShape(t *testing.T, op string, ex example, attrs []*onnx.AttributeProto) {
	opset := ex.opset
	if opset == 0 {
		opset = 17
	}
	var ins []string
	g := &onnx.GraphProto{Name: op}
	var feed *tensor.Tensor
	for k, a := range ex.args {
		name := fmt.Sprintf("in%d", k)
		ins = append(ins, name)
		size := tensor.NumElements(a.shape) * int64(a.dtype.Size())
		if k == 0 {
			g.Input = append(g.Input, onnx.TensorValueInfo(name, onnx.TensorProto_DataType(a.dtype), dimsOf(a.shape)...))
			feed = &tensor.Tensor{Name: name, DType: a.dtype, Shape: a.shape, Data: make([]byte, size)}
			continue
		}
		if a.ints != nil {
			g.Initializer = append(g.Initializer, onnx.Int64Tensor(name, a.shape, a.ints))
			continue
		}
		g.Initializer = append(g.Initializer, &onnx.TensorProto{Name: name, Dims: a.shape, DataType: int32(a.dtype), RawData: make([]byte, size)})
	}
	g.Node = []*onnx.NodeProto{onnx.Node(op, "node", ins, []string{"y"}, attrs...)}
	g.Output = []*onnx.ValueInfoProto{{Name: "y"}}
	m := onnx.NewModel(g, opset)
	data, err := onnx.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	s, err := onnxrt.NewSession(data, []string{"in0"}, []string{"y"}, onnxrt.SessionOptions{Optimization: "none"})
	if err != nil {
		t.Fatalf("ONNX Runtime cannot run the example: %v", err)
	}
	defer s.Close()
	out, err := s.Run([]*tensor.Tensor{feed})
	if err != nil {
		t.Fatalf("ONNX Runtime cannot run the example: %v", err)
	}
	ix, err := onnx.NewIndex(g)
	if err != nil {
		t.Fatal(err)
	}
	got := shapes.Infer(g, ix, map[string][]int64{"in0": ex.args[0].shape}, nil)["y"]
	if want := out[0].Shape; got == nil || !slices.Equal(got, want) {
		t.Errorf("shapes.Infer gives %v, ONNX Runtime's output is %v", got, want)
	}
}

func dimsOf(shape []int64) []any {
	out := make([]any, len(shape))
	for i, d := range shape {
		out[i] = d
	}
	return out
}

// TestBatchNormTrainingShapes: a train-mode BatchNormalization (the
// training audit's forward) has the running mean and variance as outputs
// 1 and 2; shapes.Infer sizes all three as ONNX Runtime returns them, so
// that the backward can be built before anything runs.
func TestBatchNormTrainingShapes(t *testing.T) {
	ortinit.Init(t)
	g := &onnx.GraphProto{Name: "bn-train", Input: []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 2, 3, 4, 5)}}
	for _, name := range []string{"scale", "bias", "mean", "var"} {
		g.Initializer = append(g.Initializer, onnx.FloatTensor(name, []int64{3}, []float32{1, 1, 1}))
	}
	outs := []string{"y", "running_mean", "running_var"}
	g.Node = []*onnx.NodeProto{onnx.Node("BatchNormalization", "bn", []string{"x", "scale", "bias", "mean", "var"}, outs, onnx.AttrInt("training_mode", 1))}
	for _, o := range outs {
		g.Output = append(g.Output, &onnx.ValueInfoProto{Name: o})
	}
	data, err := onnx.Marshal(onnx.NewModel(g, 15))
	if err != nil {
		t.Fatal(err)
	}
	s, err := onnxrt.NewSession(data, []string{"x"}, outs, onnxrt.SessionOptions{Optimization: "none"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	shape := []int64{2, 3, 4, 5}
	got, err := s.Run([]*tensor.Tensor{tensor.FromFloat32s("x", shape, make([]float32, tensor.NumElements(shape)))})
	if err != nil {
		t.Fatal(err)
	}
	ix, err := onnx.NewIndex(g)
	if err != nil {
		t.Fatal(err)
	}
	inferred := shapes.Infer(g, ix, map[string][]int64{"x": shape}, nil)
	for k, o := range outs {
		if s, ok := inferred[o]; !ok || !slices.Equal(s, got[k].Shape) {
			t.Errorf("%s: shapes.Infer gives %v (known %v), ONNX Runtime's output is %v", o, s, ok, got[k].Shape)
		}
	}
}

// TestSequenceAtShapes: the tensors SequenceAt takes out of the sequence
// SplitToSequence made (torch.chunk with its shorter last piece,
// torch.split by sizes, unbind's pieces without
// the axis); the sequence itself has no shape.
func TestSequenceAtShapes(t *testing.T) {
	g := &onnx.GraphProto{
		Name:  "seq",
		Input: []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, "batch", 7)},
		Initializer: []*onnx.TensorProto{onnx.Int64Tensor("three", nil, []int64{3}), onnx.Int64Tensor("sizes", []int64{2}, []int64{2, 5}),
			onnx.Int64Tensor("last", nil, []int64{-1}), onnx.Int64Tensor("zero", nil, []int64{0})},
		Node: []*onnx.NodeProto{
			onnx.Node("SplitToSequence", "chunk", []string{"x", "three"}, []string{"chunks"}, onnx.AttrInt("axis", 1)),
			onnx.Node("SequenceAt", "a", []string{"chunks", "last"}, []string{"a"}),
			onnx.Node("SplitToSequence", "split", []string{"x", "sizes"}, []string{"parts"}, onnx.AttrInt("axis", -1)),
			onnx.Node("SequenceAt", "b", []string{"parts", "zero"}, []string{"b"}),
			onnx.Node("SplitToSequence", "unbind", []string{"x"}, []string{"rows"}, onnx.AttrInt("axis", 0), onnx.AttrInt("keepdims", 0)),
			onnx.Node("SequenceAt", "c", []string{"rows", "zero"}, []string{"c"}),
		},
	}
	ix, err := onnx.NewIndex(g)
	if err != nil {
		t.Fatal(err)
	}
	got := shapes.Infer(g, ix, map[string][]int64{"x": {4, 7}}, nil)
	for v, want := range map[string][]int64{"a": {4, 1}, "b": {4, 2}, "c": {7}} {
		if !slices.Equal(got[v], want) {
			t.Errorf("%s: %v, want %v", v, got[v], want)
		}
	}
	for _, v := range []string{"chunks", "parts", "rows"} {
		if s, ok := got[v]; ok {
			t.Errorf("the sequence %s has a shape %v", v, s)
		}
	}
}
