package statsop_test

import (
	"path/filepath"
	"strings"
	"testing"

	"fp16audit/internal/batch"
	"fp16audit/internal/conformance"
	"fp16audit/internal/onnx"
	"fp16audit/internal/ortcapi"
	"fp16audit/internal/tensor"
)

// TestConformanceEqualToday extends TestOpsEqualToday to the ONNX backend
// test models (Debian's libonnx-testdata, as internal/conformance sweeps
// them): every case today's path can run gives bit-identical statistics,
// differences and shapes through Observe, and Observe runs every such case.
func TestConformanceEqualToday(t *testing.T) {
	if testing.Short() {
		t.Skip("the sweep takes minutes")
	}
	cases, err := conformance.Cases(conformance.DefaultRoot)
	if err != nil {
		t.Skipf("backend test data missing (apt-get install libonnx-testdata): %v", err)
	}
	rt := runtimes(t)
	compared, skipped, random := 0, 0, 0
	for _, c := range cases {
		m, err := onnx.Load(filepath.Join(c.Dir, "model.onnx"))
		if err != nil {
			skipped++
			continue
		}
		// Random ops: today's sessions each drew the numbers of ONNX
		// Runtime's unseeded default, Combine seeds them so that every
		// pass draws the same; their values cannot match today's.
		hasRandom := false
		for _, n := range m.Proto.Graph.Node {
			hasRandom = hasRandom || n.OpType == "Bernoulli" || strings.HasPrefix(n.OpType, "Random") || n.OpType == "Multinomial"
		}
		ap, err := auditPassesOf(m)
		if err != nil {
			skipped++
			continue
		}
		var specs []batch.InputSpec
		var inputs []string
		for _, vi := range m.Index.GraphInputs() {
			tt := vi.GetType().GetTensorType()
			spec := batch.InputSpec{Name: vi.Name, DType: tensor.DType(tt.GetElemType())}
			for _, d := range tt.GetShape().GetDim() {
				if d.GetDimParam() != "" || d.GetValue() == nil {
					spec.Dims = append(spec.Dims, -1)
				} else {
					spec.Dims = append(spec.Dims, d.GetDimValue())
				}
			}
			specs = append(specs, spec)
			inputs = append(inputs, vi.Name)
		}
		bs, _, err := batch.Load(specs, batch.Options{Args: []string{c.Dir}})
		if err != nil {
			skipped++
			continue
		}
		var batches [][]*tensor.Tensor
		for _, b := range bs {
			batches = append(batches, b.Inputs)
		}
		want, err := todayResultsErr(ap, inputs, batches, chunkLen)
		if err != nil {
			// As audit does, drop the values of undeclared type once.
			typed := ap.names[:0:0]
			for _, n := range ap.names {
				if ap.elemType(n) != 0 {
					typed = append(typed, n)
				}
			}
			ap.names = typed
			if want, err = todayResultsErr(ap, inputs, batches, chunkLen); err != nil {
				skipped++
				continue
			}
		}
		got, err := opResultsErr(rt, ap, inputs, batches, ortcapi.LevelNone, chunkLen)
		if err != nil {
			t.Errorf("%s: today's passes run, Observe's do not: %v", c.Name, err)
			continue
		}
		if hasRandom {
			random++
			continue
		}
		for _, b := range compareResults(ap, got, want) {
			t.Errorf("%s: %s", c.Name, b)
		}
		compared++
	}
	t.Logf("%d cases compared, %d with random ops run only, %d that today's passes cannot run skipped", compared, random, skipped)
	if compared < len(cases)/2 {
		t.Errorf("compared only %d of %d cases", compared, len(cases))
	}
}
