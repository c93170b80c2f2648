package precision

import (
	"slices"
	"testing"

	"fp16audit/internal/onnx"
)

// TestProvenance: why each value is held in reduced precision, under the
// policies that put it there, and whether the model's own casts are the
// reason (removing them would leave the value in fp32).
func TestProvenance(t *testing.T) {
	// x → LayerNorm (fp32 list) → Cast to fp16 → Mul(f, f) → MatMul → Add
	// bias; a second branch casts a MatMul output (already fp16) to fp16
	// again, and a third adds the cast value to a MatMul output.
	g := graph([]*onnx.TensorProto{w("scale", 4), w("shift", 4)},
		n("LayerNormalization", "ln", "x scale shift", "l"),
		castTo("/Cast", "l", "f", onnx.TensorProto_FLOAT16),
		n("Mul", "sq", "f f", "g"),
		n("MatMul", "mm", "g W", "h"),
		n("Add", "bias", "h b", "y"),
		n("MatMul", "mm2", "x W", "k"),
		castTo("/Cast_1", "k", "k16", onnx.TensorProto_FLOAT16),
		n("Add", "mix", "k16 f", "z"),
		n("Relu", "relu", "k", "r"),
	)
	type want struct {
		why      Reason
		casts    []int
		explicit bool
	}
	for _, tc := range []struct {
		policy string
		values map[string]want
	}{
		{"autocast-fp16", map[string]want{
			"l":   {0, nil, false},
			"f":   {ReasonCast, []int{1}, true},
			"g":   {ReasonCast, []int{1}, true},
			"h":   {ReasonAutocast, nil, false},
			"y":   {ReasonAutocast, nil, false},
			"k":   {ReasonAutocast, nil, false},
			"k16": {ReasonAutocast, nil, false}, // a no-op cast: k was fp16 already
			"z":   {ReasonAutocast | ReasonCast, []int{1}, true},
			"r":   {ReasonAutocast, nil, false},
		}},
		{"half", map[string]want{
			"x": {ReasonHalfPolicy, nil, false},
			"l": {ReasonHalfPolicy, nil, false},
			"f": {ReasonHalfPolicy, nil, false},
			"g": {ReasonHalfPolicy, nil, false},
			"h": {ReasonHalfPolicy, nil, false},
			"z": {ReasonHalfPolicy, nil, false},
		}},
		{"fp32", map[string]want{
			"f": {ReasonCast, []int{1}, true},
			"g": {ReasonCast, []int{1}, true},
			"k": {0, nil, false},
		}},
	} {
		p, err := PolicyByName(tc.policy)
		if err != nil {
			t.Fatal(err)
		}
		a := Assign(p, g, nil, nil)
		for v, w := range tc.values {
			if got := a.Why[v]; got != w.why {
				t.Errorf("%s: why %s = %v, want %v", tc.policy, v, got.Names(), w.why.Names())
			}
			if got := a.Casts[v]; !slices.Equal(got, w.casts) {
				t.Errorf("%s: casts %s = %v, want %v", tc.policy, v, got, w.casts)
			}
			if got := a.Explicit(v); got != w.explicit {
				t.Errorf("%s: explicit %s = %v, want %v", tc.policy, v, got, w.explicit)
			}
		}
		for v := range a.Why {
			if pr := a.Value[v]; pr != FP16 && pr != BF16 {
				t.Errorf("%s: %s has a provenance but is held in %s", tc.policy, v, pr)
			}
		}
	}
	// Removing the casts (AssignKeepFP32 on them) leaves no explicit value.
	p, _ := PolicyByName("autocast-fp16")
	a := AssignKeepFP32(p, g, nil, nil, map[int]bool{1: true, 6: true})
	for v := range a.Why {
		if a.Explicit(v) {
			t.Errorf("without the casts %s is still explicit", v)
		}
	}
	if a.Value["g"] != FP32 {
		t.Errorf("without the cast g is %s, want fp32", a.Value["g"])
	}
}

// TestProvenanceHalfModel: a model that stores fp16 weights (an export
// after model.half()) holds them in fp16 under autocast too, for its own
// reason.
func TestProvenanceHalfModel(t *testing.T) {
	w16 := onnx.FloatTensor("W16", []int64{4, 4}, make([]float32, 16))
	w16.DataType = int32(onnx.TensorProto_FLOAT16)
	w16.RawData = make([]byte, 32)
	g := graph([]*onnx.TensorProto{w16}, n("Relu", "r", "W16", "rw"), n("Add", "a", "rw x", "y"))
	p, _ := PolicyByName("autocast-fp16")
	a := Assign(p, g, nil, nil)
	if a.Why["W16"] != ReasonHalfModel || a.Why["rw"] != ReasonHalfModel {
		t.Errorf("why W16 %v, rw %v; want fp16-model", a.Why["W16"].Names(), a.Why["rw"].Names())
	}
	if a.Value["y"] != FP32 || a.Why["y"] != 0 {
		t.Errorf("y = %s %v, want fp32 without provenance (fp16 + fp32 promotes)", a.Value["y"], a.Why["y"].Names())
	}
}

// TestShapeScalars: a number computed from a shape (head_dim ** -0.5,
// traced as Shape → Gather → Cast → Pow) is a Python float in the eager
// model, so multiplying an fp16 tensor by it keeps fp16; a tensor made to
// a shape (ConstantOfShape) is a tensor and promotes.
func TestShapeScalars(t *testing.T) {
	idx := onnx.Int64Tensor("idx", nil, []int64{1})
	half := onnx.FloatTensor("p", nil, []float32{-0.5})
	g := graph([]*onnx.TensorProto{idx, half},
		n("Shape", "shape", "x", "s"),
		n("Gather", "dim", "s idx", "d"),
		castTo("cast", "d", "df", onnx.TensorProto_FLOAT),
		n("Pow", "pow", "df p", "scale"),
		n("Mul", "scaled", "x scale", "y"),
		n("ConstantOfShape", "ones", "s", "o"),
		n("Add", "add", "x o", "z"),
	)
	p, _ := PolicyByName("half")
	a := Assign(p, g, nil, nil)
	if a.Value["y"] != FP16 {
		t.Errorf("x * shape-derived scalar = %s, want fp16 (the scalar does not promote)", a.Value["y"])
	}
	if a.Value["z"] != FP32 {
		t.Errorf("x + ConstantOfShape(shape) = %s, want fp32 (a tensor promotes)", a.Value["z"])
	}
}
