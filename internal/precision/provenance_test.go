package precision

import (
	"slices"
	"testing"

	"fp16audit/internal/onnx"
)

// TestProvenance: every reason each value is held in reduced precision,
// under the policies that put it there, and whether the model's own casts
// are among them (even where autocast or the half policy would hold the
// value in 16 bits anyway).
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
		// q.half() @ k.half().T: a MatMul of two cast values computes in
		// fp16 without mixed precision too; of a cast value and an fp32
		// weight it would not run as written.
		castTo("/Cast_2", "x", "q16", onnx.TensorProto_FLOAT16),
		castTo("/Cast_3", "x", "k16b", onnx.TensorProto_FLOAT16),
		n("MatMul", "scores", "q16 k16b", "s"),
		n("MatMul", "mixed", "q16 W", "m"),
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
			"l": {0, nil, false},
			"f": {ReasonCast, []int{1}, true},
			"g": {ReasonCast, []int{1}, true},
			"h": {ReasonAutocast, nil, false},
			"y": {ReasonAutocast, nil, false},
			"k": {ReasonAutocast, nil, false},
			// A no-op cast under autocast (k was fp16 already), but
			// without mixed precision k16 would be fp16 because of it.
			"k16": {ReasonAutocast | ReasonCast, []int{6}, true},
			"z":   {ReasonAutocast | ReasonCast, []int{1, 6}, true},
			"r":   {ReasonAutocast, nil, false},
			"s":   {ReasonAutocast | ReasonCast, []int{9, 10}, true},
			"m":   {ReasonAutocast, nil, false},
		}},
		{"half", map[string]want{
			"x": {ReasonHalfPolicy, nil, false},
			"l": {ReasonHalfPolicy, nil, false},
			// The policy holds everything in fp16, and the model's own
			// casts are reasons too: the as-written pass says whether
			// they are to blame.
			"f": {ReasonHalfPolicy | ReasonCast, []int{1}, true},
			"g": {ReasonHalfPolicy | ReasonCast, []int{1}, true},
			"h": {ReasonHalfPolicy, nil, false},
			"z": {ReasonHalfPolicy | ReasonCast, []int{1, 6}, true},
			"s": {ReasonHalfPolicy | ReasonCast, []int{9, 10}, true},
			// W is fp16 because of the policy: as written it is fp32.
			"m": {ReasonHalfPolicy, nil, false},
		}},
		{"fp32", map[string]want{
			"f": {ReasonCast, []int{1}, true},
			"g": {ReasonCast, []int{1}, true},
			"k": {0, nil, false},
			"s": {ReasonCast, []int{9, 10}, true},
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
	a := AssignKeepFP32(p, g, nil, nil, map[int]bool{1: true, 6: true, 9: true, 10: true})
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

// TestPromotionCast: the exporter writes PyTorch's promotion of r.half() +
// proj(r) (fp16 + fp32 when traced) as a Cast of the fp16 operand to
// FLOAT. Under autocast proj is fp16 too and the eager sum stays fp16;
// without autocast (fp32) it is fp32. A Cast to FLOAT that the model
// writes itself (its reader is not a promoting op) stays fp32.
func TestPromotionCast(t *testing.T) {
	g := graph(nil,
		castTo("/block/Cast", "x", "skip", onnx.TensorProto_FLOAT16),
		n("MatMul", "/block/proj/MatMul", "x W", "p"),
		castTo("/block/Cast_1", "skip", "skip32", onnx.TensorProto_FLOAT),
		n("Add", "/block/Add", "skip32 p", "y"),
		castTo("/Cast_2", "skip", "own32", onnx.TensorProto_FLOAT),
		n("LayerNormalization", "/norm", "own32 b b", "z"),
	)
	types := map[string]int32{"x": 1, "W": 1, "b": 1, "skip": 10, "p": 1, "skip32": 1, "y": 1, "own32": 1, "z": 1}
	elemType := func(name string) int32 { return types[name] }
	for _, tc := range []struct {
		policy      string
		skip32, sum Precision
		explicit    bool
	}{
		{"autocast-fp16", FP16, FP16, true},
		{"fp32", FP16, FP32, false},
		{"half", FP16, FP16, true},
	} {
		p, _ := PolicyByName(tc.policy)
		a := Assign(p, g, nil, elemType)
		if a.Value["skip32"] != tc.skip32 || a.Value["y"] != tc.sum {
			t.Errorf("%s: promotion cast %s, sum %s; want %s, %s", tc.policy, a.Value["skip32"], a.Value["y"], tc.skip32, tc.sum)
		}
		if a.Explicit("y") != tc.explicit {
			t.Errorf("%s: sum explicit %v, want %v (why %v)", tc.policy, a.Explicit("y"), tc.explicit, a.Why["y"].Names())
		}
		if a.Value["own32"] != FP32 {
			t.Errorf("%s: the model's own .float() before LayerNorm is %s, want fp32", tc.policy, a.Value["own32"])
		}
	}
}
