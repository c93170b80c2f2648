package rewrite

import (
	"fmt"
	"math"

	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

// ClampConstants returns a copy of m in which the float initializers and
// Constant outputs named in limits hold their values clamped to
// ±limits[name], infinities included: what torch.finfo(dtype).min writes
// where the model wrote -1e9 or finfo(float32).min. NaN stays NaN. dir is
// the model's folder, for external data.
func ClampConstants(m *onnx.ModelProto, limits map[string]float64, dir string) (*onnx.ModelProto, error) {
	out := onnx.ShallowCopy(m)
	g := out.Graph
	for i, t := range g.Initializer {
		if limit, ok := limits[t.Name]; ok {
			ct, err := clampTensor(t, limit, dir)
			if err != nil {
				return nil, fmt.Errorf("initializer %q: %w", t.Name, err)
			}
			g.Initializer[i] = ct
		}
	}
	for i, n := range g.Node {
		if n.OpType != "Constant" || !onnx.IsDefaultDomain(n.Domain) || len(n.Output) != 1 {
			continue
		}
		limit, ok := limits[n.Output[0]]
		if !ok {
			continue
		}
		for ai, a := range n.Attribute {
			if a.Name != "value" || a.T == nil {
				continue
			}
			ct, err := clampTensor(a.T, limit, dir)
			if err != nil {
				return nil, fmt.Errorf("node %q: %w", n.Name, err)
			}
			c := onnx.CloneNode(n)
			c.Attribute[ai] = onnx.AttrTensor("value", ct)
			g.Node[i] = c
		}
	}
	return out, nil
}

func clampTensor(t *onnx.TensorProto, limit float64, dir string) (*onnx.TensorProto, error) {
	dense, err := onnx.DecodeTensor(t, dir)
	if err != nil {
		return nil, err
	}
	if dense.DType != tensor.Float32 {
		// The upcast graph holds every half constant as FLOAT; DOUBLE is
		// never held in half precision.
		return t, nil
	}
	vals, err := dense.Float32s()
	if err != nil {
		return nil, err
	}
	l := float32(limit)
	for k, v := range vals {
		if !math.IsNaN(float64(v)) {
			vals[k] = min(max(v, -l), l)
		}
	}
	ct := onnx.EncodeTensor(tensor.FromFloat32s(t.Name, dense.Shape, vals))
	ct.DocString = t.DocString
	return ct, nil
}
