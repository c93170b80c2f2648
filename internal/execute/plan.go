package execute

import (
	"fmt"
	"slices"
	"strings"

	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/shapes"
	"fp16audit/internal/tensor"
)

// DefaultMemoryFraction is the share of available memory an audit plans
// for when --max-memory is not given: the rest is left to ONNX Runtime's
// own scratch memory and everything else on the machine.
const DefaultMemoryFraction = 0.5

// emulatedFactor is how much more than the reference pass an emulated pass
// holds at once: each value it rounds lives briefly in both its raw and its
// rounded form.
const emulatedFactor = 1.5

// partMargin is the memory a run in parts holds per sample beyond the
// estimate, as a factor: ONNX Runtime's arena grows in doubling regions and
// its kernels keep scratch buffers, which weigh more in small runs
// (measured on the bench transformer at 2 to 4 samples per part: 1.17 to
// 1.26 times the estimate).
const partMargin = 1.3

// MemoryPlan is the memory side of running a set of passes: the estimate
// of one run, the budget, and how many samples each run takes.
type MemoryPlan struct {
	passes   []string
	weights  int64
	peak     int64 // the costliest batch run whole, weights included
	resident int64 // the process's memory before the passes start
	samples  int64 // its samples
	unknown  int   // values whose size the estimate lacks
	budget   int64
	explicit bool
	avail    int64
	availSrc string
	// probed is whether measured shapes completed the estimate;
	// splittable whether a batch may run in parts.
	probed, splittable bool
	// step is the samples per run (0: every batch whole); parts the most
	// runs one batch takes.
	step  int64
	parts int
}

// subBatch is the number of samples one run of a batch of size samples
// takes.
func (m *MemoryPlan) subBatch(size int64) int64 {
	if m.step <= 0 || m.step >= size {
		return size
	}
	return m.step
}

// Note says what was estimated and how the passes ran, for the report:
// "" when the batches ran whole and the estimate is complete or far below
// the budget, which needs no comment.
func (m *MemoryPlan) Note() string {
	if m.parts <= 1 && (m.unknown == 0 || m.budget <= 0 || 2*(m.resident+m.peak) < m.budget) {
		return ""
	}
	s := fmt.Sprintf("memory estimate: %s for one run of the %d pass(es) %s side by side on %d samples (weights %s, shared)",
		FormatSize(m.peak), len(m.passes), strings.Join(m.passes, ", "), m.samples, FormatSize(m.weights))
	if m.unknown > 0 {
		s += fmt.Sprintf("; partial: %d value(s) of unknown size are not counted", m.unknown)
	}
	if m.parts > 1 {
		how := "--max-memory"
		if !m.explicit {
			how = fmt.Sprintf("the default: %.0f%% of the %s available", 100*DefaultMemoryFraction, FormatSize(m.avail))
		}
		s += fmt.Sprintf("; with %s in use before the passes, over the budget of %s (%s), so each batch ran in parts of %d samples", FormatSize(m.resident), FormatSize(m.budget), how, m.step)
	}
	return s
}

// memoryPlan estimates the memory of one run of every batch and, when the
// costliest exceeds the budget (--max-memory, or DefaultMemoryFraction of
// the available memory), the samples per run that fit. It refuses (a
// *BudgetError) when one sample alone does not fit, or when a batch would
// have to be cut but the model computes across its samples.
//
// With a probe, the shapes it measured replace the inferred ones, so the
// estimate counts the values shape inference could not size.
func (e *Engine) memoryPlan(passes []Pass, batches []batch.Batch, probe *shapeProbe) (*MemoryPlan, error) {
	m := &MemoryPlan{}
	for _, p := range passes {
		m.passes = append(m.passes, p.Name)
	}
	base := passes[0].Model.Graph
	idx, err := onnx.NewIndex(base)
	if err != nil {
		return nil, err
	}
	for _, t := range base.Initializer {
		m.weights += onnx.TensorBytes(t)
	}
	factor := 1 + emulatedFactor*float64(len(passes)-1)
	for _, b := range batches {
		in := map[string][]int64{}
		for k, t := range b.Inputs {
			in[e.Inputs[k]] = t.Shape
		}
		var known map[string][]int64
		if probe != nil {
			known = probe.full(b.Size())
		}
		sh := shapes.Infer(base, idx, in, known)
		live, unknown := liveBytes(base, idx, sh)
		m.unknown = max(m.unknown, unknown)
		var inputs int64
		for _, t := range b.Inputs {
			inputs += int64(len(t.Data))
		}
		// Every pass's graph outputs come back as a FLOAT copy, held with
		// the values until the run ends.
		fetched := int64(len(passes)) * outputBytes(base, sh)
		if peak := m.weights + inputs + int64(factor*float64(live)) + fetched; peak > m.peak {
			m.peak, m.samples = peak, b.Size()
		}
	}
	m.resident = e.resident
	var ok bool
	m.avail, m.availSrc, ok = memAvailable()
	m.budget, m.explicit = e.MaxMemory, e.MaxMemory > 0
	switch {
	case !m.explicit && ok:
		m.budget = int64(DefaultMemoryFraction * float64(m.avail))
	case ok && m.avail < m.budget:
		// More than the machine has would swap or be killed: the budget
		// is what is available.
		m.budget, m.explicit = m.avail, false
	}
	m.parts = 1
	m.probed = probe != nil
	m.splittable = crossSample(base, e.Inputs) == ""
	if e.forceStep > 0 && crossSample(base, e.Inputs) == "" {
		m.step = e.forceStep
		m.parts = int((m.samples + m.step - 1) / m.step)
		return m, nil
	}
	if m.budget <= 0 || m.resident+m.peak <= m.budget {
		return m, nil
	}
	if why := crossSample(base, e.Inputs); why != "" {
		return nil, &BudgetError{Err: fmt.Errorf("the audit needs an estimated %s but the budget is %s (%s), and the batch cannot run in parts because %s; audit smaller batches or pass a larger --max-memory",
			FormatSize(m.resident+m.peak), FormatSize(m.budget), m.budgetSource(), why)}
	}
	perSample := int64(partMargin * float64((m.peak-m.weights)/max(m.samples, 1)))
	room := m.budget - m.resident - m.weights
	if perSample <= 0 || room < perSample {
		return nil, &BudgetError{Err: fmt.Errorf("the audit needs an estimated %s for one sample (%s of weights, %s per sample in %d pass(es), %s in use before the passes) but the budget is %s (%s); %s",
			FormatSize(m.resident+m.weights+perSample), FormatSize(m.weights), FormatSize(perSample), len(passes), FormatSize(m.resident), FormatSize(m.budget), m.budgetSource(),
			"pass a larger --max-memory, or audit on a machine with more memory")}
	}
	m.step = room / perSample
	m.parts = int((m.samples + m.step - 1) / m.step)
	return m, nil
}

// probeBatch returns the batch whose two-sample probe would complete a
// partial estimate, or nil when there is nothing to learn: the estimate
// is complete or already measured, no budget applies, or no batch could
// run in parts anyway (one sample each, or a model that computes across
// samples, which the budget refuses on the estimate alone).
func (m *MemoryPlan) probeBatch(batches []batch.Batch) *batch.Batch {
	if m.unknown == 0 || m.probed || m.budget <= 0 || !m.splittable {
		return nil
	}
	for i := range batches {
		if batches[i].Size() >= 2 {
			return &batches[i]
		}
	}
	return nil
}

func (m *MemoryPlan) budgetSource() string {
	switch {
	case m.explicit:
		return "--max-memory"
	case m.budget == m.avail:
		return fmt.Sprintf("the %s available per %s", FormatSize(m.avail), m.availSrc)
	}
	return fmt.Sprintf("%.0f%% of the %s available per %s", 100*DefaultMemoryFraction, FormatSize(m.avail), m.availSrc)
}

// liveBytes is the most memory the values of g hold at once when its nodes
// run in topological order and every value dies after its last reader,
// and the number of values whose size is unknown.
func liveBytes(g *onnx.GraphProto, idx *onnx.Index, sh map[string][]int64) (int64, int) {
	size := func(name string) (int64, bool) {
		s, ok := sh[name]
		if !ok {
			return 0, false
		}
		es := int64(tensor.DType(idx.ElemType(name)).Size())
		if es == 0 {
			es = 4
		}
		return tensor.NumElements(s) * es, true
	}
	readers := map[string]int{}
	for _, n := range g.Node {
		for _, in := range n.Input {
			readers[in]++
		}
	}
	var live, peak int64
	unknown := 0
	for _, ni := range idx.Order() {
		n := g.Node[ni]
		for _, o := range n.Output {
			if o == "" {
				continue
			}
			b, ok := size(o)
			if !ok {
				unknown++
			}
			live += b
		}
		peak = max(peak, live)
		for _, in := range n.Input {
			if in == "" || idx.Producer(in) < 0 {
				continue
			}
			if readers[in]--; readers[in] == 0 {
				b, _ := size(in)
				live -= b
			}
		}
	}
	return peak, unknown
}

// outputBytes is the size of g's graph outputs as FLOAT, as far as sh
// knows them.
func outputBytes(g *onnx.GraphProto, sh map[string][]int64) int64 {
	var n int64
	for _, o := range g.Output {
		if s, ok := sh[o.Name]; ok {
			n += 4 * tensor.NumElements(s)
		}
	}
	return n
}

// crossSample says why a batch cannot run in parts through g, or "": the
// model fixes its inputs' batch dimension, or its samples interact.
func crossSample(g *onnx.GraphProto, inputs []string) string {
	for _, vi := range g.Input {
		if !slices.Contains(inputs, vi.Name) {
			continue
		}
		dims := vi.GetType().GetTensorType().GetShape().GetDim()
		if len(dims) > 0 && dims[0].GetDimParam() == "" && dims[0].GetValue() != nil {
			return fmt.Sprintf("the model fixes input %q's first dimension at %d (export it with dynamic_axes={%q: {0: \"batch\"}})", vi.Name, dims[0].GetDimValue(), vi.Name)
		}
	}
	for _, n := range g.Node {
		if n.OpType == "BatchNormalization" && onnx.IntAttr(n, "training_mode", 0) != 0 {
			return fmt.Sprintf("the training-mode BatchNormalization %q normalises over the batch", n.Name)
		}
	}
	return ""
}
