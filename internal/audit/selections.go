package audit

import (
	"slices"

	"fp16audit/internal/execute"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
)

// judgedOutputs returns the graph the forward passes run, the values it
// adds to the graph outputs and how each of its outputs is judged. A graph output a data-dependent selection chose
// (the boxes NonMaxSuppression kept, what TopK picked) is compared for
// information only; the float values the selection ranks or gathers
// from join the graph outputs and are judged in its place, as PyTorch's
// outputs would be before the selection. Without a selection up itself is
// returned. ix indexes the model as loaded (names and types as exported),
// upIx the upcast graph up.
func judgedOutputs(up *onnx.ModelProto, ix, upIx *onnx.Index) (*onnx.ModelProto, []string, map[string]execute.OutputKind) {
	sel := onnx.FindSelections(ix)
	kinds := map[string]execute.OutputKind{}
	batch := map[string]bool{} // the symbolic first dimensions of the inputs
	for _, vi := range up.Graph.Input {
		if d := vi.GetType().GetTensorType().GetShape().GetDim(); len(d) > 0 && d[0].GetDimParam() != "" {
			batch[d[0].GetDimParam()] = true
		}
	}
	for _, vi := range up.Graph.Output {
		k := execute.OutputKind{Classes: onnx.ClassScores(ix, sel, vi.Name)}
		if d := vi.GetType().GetTensorType().GetShape().GetDim(); len(d) > 0 && batch[d[0].GetDimParam()] {
			k.Batched = true
		}
		if sel.Chosen[vi.Name] {
			k.Role = observe.RoleChosen
		}
		kinds[vi.Name] = k
	}
	var extra []*onnx.ValueInfoProto
	var ranked []string
	for _, v := range sel.Ranked {
		t := upIx.ElemType(v)
		if _, out := kinds[v]; out || upIx.Producer(v) < 0 || !onnx.IsFloatType(t) {
			continue
		}
		kinds[v] = execute.OutputKind{Role: observe.RoleRanked}
		ranked = append(ranked, v)
		// No shape: the value's own (often data-dependent) shape stands.
		extra = append(extra, &onnx.ValueInfoProto{Name: v, Type: &onnx.TypeProto{Value: &onnx.TypeProto_TensorType{
			TensorType: &onnx.TypeProto_Tensor{ElemType: t}}}})
	}
	if len(extra) == 0 {
		return up, nil, kinds
	}
	fwd := onnx.ShallowCopy(up)
	fwd.Graph.Output = append(slices.Clone(up.Graph.Output), extra...)
	return fwd, ranked, kinds
}
