package execute

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

// The graph outputs of a reference pass, kept from one Run for the next:
// a fix rerun or a what-if pass is judged by its outputs against fp32's on
// the same inputs, and the fp32 pass already computed them beside the
// policy's pass. A later Run whose reference for its outputs alone
// (Pass.OutputsOnly) would recompute outputs kept here drops that pass
// and compares with the kept ones: the rerun costs its own pass, not the
// fp32 one again (on the 600 M decoder of BenchmarkLLM, about 0.7 s of
// each rerun's 2.5–3 s).

// refCacheMax bounds the bytes of kept outputs: a model whose outputs are
// larger (a language model's logits over many long batches) recomputes
// its reference in every rerun, as before.
const refCacheMax = 256 << 20

// refKey names one kept output: the reference pass's graph, the output,
// and the batch, by the addresses of its input tensors (a rerun on other
// inputs, any of them standardized, finds none).
type refKey struct {
	model *onnx.ModelProto
	value string
	batch string
}

// refCache holds the kept outputs, and the outputs kept of each graph.
// It holds the batches' inputs too, so that no tensor a key names is
// collected and its address given to another batch's.
type refCache struct {
	outs   map[refKey]*tensor.Tensor
	values map[*onnx.ModelProto][]string
	inputs map[string][]*tensor.Tensor // by batchKey
	bytes  int64
}

func batchKey(b batch.Batch) string {
	var k strings.Builder
	for _, t := range b.Inputs {
		fmt.Fprintf(&k, "%p,", t)
	}
	return k.String()
}

// keep records the output value of the pass whose graph is model, for a
// whole batch b (callers keep the outputs of a pass observed in full, the
// main passes' fp32 reference on the audit's batches): the tensor itself when owned is set (a copy the caller
// gives away), else a copy of data.
func (c *refCache) keep(model *onnx.ModelProto, value string, b batch.Batch, shape []int64, data []float32, owned *tensor.Tensor) {
	k := refKey{model, value, batchKey(b)}
	if k.batch == "" || model == nil {
		return
	}
	if _, ok := c.outs[k]; ok {
		return
	}
	t := owned
	if t == nil {
		t = tensor.FromFloat32s(value, shape, data) // a copy
	}
	if c.bytes+int64(len(t.Data)) > refCacheMax {
		return
	}
	if c.outs == nil {
		c.outs, c.values, c.inputs = map[refKey]*tensor.Tensor{}, map[*onnx.ModelProto][]string{}, map[string][]*tensor.Tensor{}
	}
	if !slices.Contains(c.values[model], value) {
		c.values[model] = append(c.values[model], value)
	}
	c.inputs[k.batch] = b.Inputs
	c.outs[k] = t
	c.bytes += int64(len(t.Data))
}

// get returns the kept output, or nil.
func (c *refCache) get(model *onnx.ModelProto, value string, b batch.Batch) *tensor.Tensor {
	if k := (refKey{model, value, batchKey(b)}); k.batch != "" {
		return c.outs[k]
	}
	return nil
}

// has reports whether every output kept of the pass whose graph is model
// is kept for every batch.
func (c *refCache) has(model *onnx.ModelProto, batches []batch.Batch) bool {
	values := c.values[model]
	if len(values) == 0 || len(batches) == 0 {
		return false
	}
	for _, b := range batches {
		for _, v := range values {
			if c.get(model, v, b) == nil {
				return false
			}
		}
	}
	return true
}

// errKeptInParts is a Run that would compare with kept outputs but has to
// cut its batches into parts (the outputs are kept whole): it runs again
// with its reference pass.
var errKeptInParts = errors.New("kept reference outputs are whole batches, and the run is in parts")

// withKeptRef returns passes without the reference pass for outputs that
// the kept outputs replace, the index it had, and the passes changed to
// compare with the kept outputs; -1 when no pass can be dropped.
func (e *Engine) withKeptRef(passes []Pass, batches []batch.Batch) ([]Pass, int) {
	for i, p := range passes {
		if !p.OutputsOnly || !e.refs.has(p.Model, batches) {
			continue
		}
		out := make([]Pass, 0, len(passes)-1)
		for j, q := range passes {
			switch {
			case j == i:
				continue
			case q.Ref == p.Name:
				return nil, -1 // it compares values, not outputs alone
			case q.outputRef() == p.Name:
				q.OutputRef, q.keptRef = "", p.Model
			}
			out = append(out, q)
		}
		return out, i
	}
	return nil, -1
}
