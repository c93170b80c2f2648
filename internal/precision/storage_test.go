package precision

import (
	"testing"

	"fp16audit/internal/onnx"
)

// halfTensor is an initializer of zeros of the given 16-bit type.
func halfTensor(name string, dt onnx.TensorProto_DataType, dims ...int64) *onnx.TensorProto {
	t := w(name, dims...)
	t.DataType = int32(dt)
	t.FloatData = nil
	t.RawData = make([]byte, 2*len(w(name, dims...).FloatData))
	return t
}

// TestStorage: which models count as stored in half.
func TestStorage(t *testing.T) {
	bf, fp := onnx.TensorProto_BFLOAT16, onnx.TensorProto_FLOAT16
	ids := onnx.TensorValueInfo("ids", onnx.TensorProto_INT64, "N", 4)
	for _, tc := range []struct {
		name   string
		inputs []*onnx.ValueInfoProto
		inits  []*onnx.TensorProto
		want   int32
	}{
		{"bf16 weights, token ids", []*onnx.ValueInfoProto{ids}, []*onnx.TensorProto{halfTensor("E", bf, 8, 4), halfTensor("W", bf, 4, 4), w("eps")}, int32(bf)},
		{"fp16 weights and input", []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", fp, "N", 4)}, []*onnx.TensorProto{halfTensor("W", fp, 4, 4)}, int32(fp)},
		{"fp16 input, no weights", []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", fp, "N", 4)}, nil, int32(fp)},
		{"fp16 weights, fp32 input", []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, "N", 4)}, []*onnx.TensorProto{halfTensor("W", fp, 4, 4)}, 0},
		{"one fp16 buffer among fp32 weights", []*onnx.ValueInfoProto{ids}, []*onnx.TensorProto{w("W", 4, 4), halfTensor("B", fp, 4)}, 0},
		{"fp32", []*onnx.ValueInfoProto{ids}, []*onnx.TensorProto{w("W", 4, 4)}, 0},
	} {
		g := &onnx.GraphProto{Input: tc.inputs, Initializer: tc.inits}
		if got := Storage(g); got != tc.want {
			t.Errorf("%s: Storage = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestStoredHalf: a checkpoint stored in bf16 is the same weights under
// every policy. Its weights and its casts to bf16 (the export's record of
// x.to(self.weight.dtype)) are fp32 under autocast, as model.float() holds
// them, and fp16 under half (model.half()); a cast to fp16 in it stays the
// model's own explicit cast.
func TestStoredHalf(t *testing.T) {
	bf := onnx.TensorProto_BFLOAT16
	g := &onnx.GraphProto{
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("ids", onnx.TensorProto_INT64, "N", 4)},
		Initializer: []*onnx.TensorProto{halfTensor("E", bf, 8, 4), halfTensor("W", bf, 4, 4), halfTensor("g", bf, 4)},
		Node: []*onnx.NodeProto{
			n("Gather", "embed", "E ids", "h"),
			castTo("/norm/Cast", "h", "h32", onnx.TensorProto_FLOAT),
			n("Mul", "/norm/Mul", "h32 h32", "sq"),
			castTo("/norm/Cast_1", "sq", "back", bf),
			n("Mul", "/norm/Mul_1", "g back", "normed"),
			n("MatMul", "proj", "normed W", "p"),
			n("Add", "residual", "h p", "r"),
			castTo("/user/Cast", "r", "r16", onnx.TensorProto_FLOAT16),
		},
	}
	for _, tc := range []struct {
		policy string
		want   map[string]Precision
	}{
		{"autocast-fp16", map[string]Precision{"E": FP32, "h": FP32, "back": FP32, "normed": FP32, "p": FP16, "r": FP32, "r16": FP16}},
		{"autocast-bf16", map[string]Precision{"E": FP32, "back": FP32, "p": BF16, "r": FP32}},
		{"half", map[string]Precision{"E": FP16, "h": FP16, "h32": FP32, "back": FP16, "normed": FP16, "p": FP16, "r": FP16, "r16": FP16}},
		{"fp32", map[string]Precision{"E": FP32, "back": FP32, "p": FP32, "r": FP32, "r16": FP16}},
	} {
		p, err := PolicyByName(tc.policy)
		if err != nil {
			t.Fatal(err)
		}
		a := Assign(p, g, nil, nil)
		for v, want := range tc.want {
			if got := a.Value[v]; got != want {
				t.Errorf("%s: %s is %s, want %s", tc.policy, v, got, want)
			}
		}
		for _, v := range []string{"back", "normed", "r"} {
			if a.Explicit(v) {
				t.Errorf("%s: %s counts as the model's own cast (%v); a cast to the stored type is not", tc.policy, v, a.Why[v].Names())
			}
		}
		if tc.policy == "half" && a.Why["back"] != ReasonHalfPolicy {
			t.Errorf("half: why back = %v, want half-policy", a.Why["back"].Names())
		}
		if tc.policy == "autocast-fp16" && !a.Explicit("r16") {
			t.Errorf("autocast-fp16: the cast to fp16 in a bf16 model is not explicit (%v)", a.Why["r16"].Names())
		}
	}
}

// TestStoredKeptFP32: in a checkpoint stored in fp16, a float32 weight is
// one the checkpoint keeps in fp32 (transformers' _keep_in_fp32_modules
// under from_pretrained(dtype=torch.float16): T5's wo, which casts its
// input to its weight's dtype). Under half the model runs as stored: wo
// computes in fp32 and the residual stream it feeds is promoted to fp32,
// as PyTorch's eager run has it. Under autocast wo is an fp16 op all the
// same.
func TestStoredKeptFP32(t *testing.T) {
	fp := onnx.TensorProto_FLOAT16
	g := &onnx.GraphProto{
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("ids", onnx.TensorProto_INT64, "N", 4)},
		Initializer: []*onnx.TensorProto{halfTensor("E", fp, 8, 4), halfTensor("Wi", fp, 4, 16), w("Wo", 16, 4)},
		Node: []*onnx.NodeProto{
			n("Gather", "embed", "E ids", "h"),
			n("MatMul", "/wi/MatMul", "h Wi", "a"),
			n("Relu", "/act/Relu", "a", "r"),
			castTo("/ff/Cast", "r", "r32", onnx.TensorProto_FLOAT),
			n("MatMul", "/wo/MatMul", "r32 Wo", "o"),
			n("Add", "/residual/Add", "h o", "res"),
		},
	}
	for _, tc := range []struct {
		policy string
		want   map[string]Precision
	}{
		{"half", map[string]Precision{"E": FP16, "h": FP16, "a": FP16, "r32": FP32, "Wo": FP32, "o": FP32, "res": FP32}},
		{"autocast-fp16", map[string]Precision{"h": FP32, "a": FP16, "o": FP16, "res": FP32}},
	} {
		p, err := PolicyByName(tc.policy)
		if err != nil {
			t.Fatal(err)
		}
		a := Assign(p, g, nil, nil)
		for v, want := range tc.want {
			if got := a.Value[v]; got != want {
				t.Errorf("%s: %s is %s, want %s", tc.policy, v, got, want)
			}
		}
	}
}
