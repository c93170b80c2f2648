package batch

import (
	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

// Specs lists the inputs of g that a batch must feed: the graph inputs that
// are not initializers, with their declared element type and dimensions,
// and what each holds (its Meaning, from its name and its use in g).
func Specs(g *onnx.GraphProto, idx *onnx.Index) []InputSpec {
	var specs []InputSpec
	for _, vi := range g.Input {
		if idx.IsInitializer(vi.Name) {
			continue
		}
		tt := vi.GetType().GetTensorType()
		spec := InputSpec{Name: vi.Name, DType: tensor.DType(tt.GetElemType())}
		spec.Meaning, spec.Rows = meaningOf(vi.Name, isInteger(spec.DType), idx)
		for _, d := range tt.GetShape().GetDim() {
			if p := d.GetDimParam(); p != "" || d.GetValue() == nil {
				spec.Dims = append(spec.Dims, -1)
				spec.DimNames = append(spec.DimNames, p)
			} else {
				spec.Dims = append(spec.Dims, d.GetDimValue())
				spec.DimNames = append(spec.DimNames, "")
			}
		}
		specs = append(specs, spec)
	}
	return specs
}

// Names returns the names of specs, in order: the order of a batch's
// inputs.
func Names(specs []InputSpec) []string {
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	return names
}

// isInteger reports whether dt holds integers (not floats, bools or
// strings).
func isInteger(dt tensor.DType) bool {
	return !dt.IsFloat() && dt != tensor.Bool && dt.Size() > 0
}
