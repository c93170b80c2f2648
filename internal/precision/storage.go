package precision

import "fp16audit/internal/onnx"

// Storage returns the 16-bit element type (FLOAT16 or BFLOAT16) a model
// stores itself in, or 0 for a model stored in fp32: a checkpoint exported
// after model.half() or model.bfloat16(). A model is stored in a half type
// when that type holds most of the elements of its float initializers and
// none of its float graph inputs is of another float type (model.half()
// converts parameters and buffers, and the caller feeds x.half()); a model
// without float initializers is stored in half when its float graph inputs
// all are.
//
// Stored half is a property of the file, not of the run: the policies say
// how the same weights run. Under the autocast policies and fp32 a stored
// model is the checkpoint loaded in fp32 (model.float(), which autocast
// and GradScaler need); under half it is the checkpoint converted with
// model.half(). So the stored type's initializers, constants, factories
// and casts (the exporter's record of x.to(self.weight.dtype) and
// x.to(input_dtype)) follow the policy's parameter precision, like their
// fp32 counterparts in an fp32 export, while the other half type stays
// the model's own choice.
func Storage(g *onnx.GraphProto) int32 {
	elems := map[int32]int64{}
	var total int64
	inits := map[string]bool{}
	for _, t := range g.GetInitializer() {
		inits[t.GetName()] = true
		if PrecisionOf(t.GetDataType()) == NotFloat || t.GetDataType() == int32(onnx.TensorProto_DOUBLE) {
			continue
		}
		n := int64(1)
		for _, d := range t.GetDims() {
			n *= d
		}
		elems[t.GetDataType()] += n
		total += n
	}
	inputs := map[int32]int{}
	for _, vi := range g.GetInput() {
		if inits[vi.GetName()] {
			continue // IR < 4 lists initializers as inputs too
		}
		if t := vi.GetType().GetTensorType().GetElemType(); PrecisionOf(t) != NotFloat {
			inputs[t]++
		}
	}
	for _, half := range []int32{int32(onnx.TensorProto_FLOAT16), int32(onnx.TensorProto_BFLOAT16)} {
		var others int
		for t, k := range inputs {
			if t != half {
				others += k
			}
		}
		if others > 0 {
			continue
		}
		if total > 0 && 2*elems[half] > total || total == 0 && inputs[half] > 0 {
			return half
		}
	}
	return 0
}
