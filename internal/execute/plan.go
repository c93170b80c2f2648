package execute

import (
	"fmt"
	"slices"
	"strings"

	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/shapes"
	"fp16audit/internal/statsop"
	"fp16audit/internal/tensor"
)

// DefaultMemoryFraction is the share of available memory an audit plans
// for when --max-memory is not given: the rest is left to ONNX Runtime's
// own scratch memory and everything else on the machine.
const DefaultMemoryFraction = 0.5

// What the passes side by side hold, per byte the reference pass's values
// hold: an emulated pass holds each value it rounds in both its raw and
// its rounded form (emulatedFactor), and passes compared with each other
// keep each reference value until the Observe node that compares it has
// read every pass's copy (comparedExtra). Measured on the bench
// transformer's attention in parts of a [32, 1024, 64] batch: 2.9 times
// the reference pass for fp32 and fp16 side by side, 3.7 with bf16, within
// the 1.3 of partMargin.
const (
	emulatedFactor = 1.5
	comparedExtra  = 0.5
)

// partMargin is the memory a run in parts holds per sample beyond the
// estimate, as a factor: ONNX Runtime's arena grows in doubling regions and
// its kernels keep scratch buffers, which weigh more in small runs
// (measured on the bench transformer at 2 to 4 samples per part: 1.17 to
// 1.26 times the estimate).
const partMargin = 1.3

// MemoryPlan is the memory side of running a set of passes: the estimate
// of one run, the budget, and how many samples each run takes.
type MemoryPlan struct {
	passes []string
	// weights are the weights ONNX Runtime holds; handed those the
	// sessions take over the loaded model's memory (in resident).
	weights  int64
	handed   int64
	peak     int64 // the costliest batch run whole, weights included
	resident int64 // the process's memory before the passes start
	samples  int64 // its samples
	unknown  int   // values whose size the estimate lacks
	budget   int64
	explicit bool
	avail    int64
	availSrc string
	// maxBlock, when set, is the most nodes of the model's order one block
	// holds (MaxSessionNodes in the combined graph); bySize makes cut
	// ignore the budget, for a plan cut for its size alone.
	maxBlock int
	bySize   bool
	// probed is whether measured shapes completed the estimate;
	// splittable whether a batch may run in parts.
	probed, splittable bool
	// step is the samples per run (0: every batch whole); parts the most
	// runs one batch takes.
	step  int64
	parts int
	// rounded is the most the emulated passes' rounded copies of one
	// node's weights hold at once (each lives until its node has run);
	// roundedBy gives it per model node.
	rounded   int64
	roundedBy map[int]int64
	// prof is the costliest batch's memory along the model's order, and
	// all the number of samples of every batch: what a cut into blocks
	// is planned from.
	prof *profile
	all  int64
	// blocks, when set, cuts the model into blocks that run one after
	// another, each in a session holding only its own weights.
	blocks *blockPlan
	// factor is what the passes side by side hold per byte of the
	// reference pass's values.
	factor float64
	// inferred holds each batch's shapes of the model's values, complete
	// when unknown is 0; nodeName names a node of the model in messages.
	inferred []map[string][]int64
	nodeName func(int) string
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
	budgetBlocks := m.blocks != nil && !m.blocks.bySize
	if m.parts <= 1 && !budgetBlocks && (m.unknown == 0 || m.budget <= 0 || 2*(m.resident+m.peak) < m.budget) {
		return ""
	}
	s := fmt.Sprintf("memory estimate: %s for one run of the %d pass(es) %s side by side on %d samples (weights %s, shared)",
		FormatSize(m.peak), len(m.passes), strings.Join(m.passes, ", "), m.samples, FormatSize(m.weights))
	if m.handed > 0 {
		s += fmt.Sprintf(", besides the %s of weights the loaded model holds and ONNX Runtime reads in place", FormatSize(m.handed))
	}
	if m.unknown > 0 {
		s += fmt.Sprintf("; partial: %d value(s) of unknown size are not counted", m.unknown)
	}
	how := "--max-memory"
	if !m.explicit {
		how = fmt.Sprintf("the default: %.0f%% of the %s available", 100*DefaultMemoryFraction, FormatSize(m.avail))
	}
	var ran []string
	if bp := m.blocks; budgetBlocks {
		ran = append(ran, fmt.Sprintf("the model ran in %d blocks of consecutive nodes, one session at a time holding only its block's weights (the largest block estimated at %s)",
			bp.ran, FormatSize(slices.Max(bp.cost))))
	}
	if m.parts > 1 {
		ran = append(ran, fmt.Sprintf("each batch ran in parts of %d samples", m.step))
	}
	if len(ran) > 0 {
		s += fmt.Sprintf("; with %s in use before the passes, over the budget of %s (%s), so %s", FormatSize(m.resident), FormatSize(m.budget), how, strings.Join(ran, " and "))
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
	// The weights ONNX Runtime holds: those a session hands over over the
	// loaded model's memory are counted in what the process holds already.
	weight := func(t *onnx.TensorProto) int64 {
		if e.handsOver() && statsop.HandsOver(t) {
			return 0
		}
		return onnx.TensorBytes(t)
	}
	for _, t := range base.Initializer {
		if b := weight(t); b > 0 {
			m.weights += b
		} else {
			m.handed += onnx.TensorBytes(t)
		}
	}
	m.nodeName = idx.NodeLabel
	if m.roundedBy, err = roundedWeights(passes, e.Nodes); err != nil {
		return nil, err
	}
	for _, b := range m.roundedBy {
		m.rounded = max(m.rounded, b)
	}
	factor := 0.0
	for _, p := range passes {
		if rounds(p.Model.Graph) {
			factor += emulatedFactor
		} else {
			factor++
		}
	}
	if len(passes) > 1 {
		factor += comparedExtra
	}
	m.factor = factor
	// Batches of the same input shapes share their shapes and profile:
	// inferring and profiling the graph once per batch made thousands of
	// equal batches cost seconds before the first run.
	type sized struct {
		sh   map[string][]int64
		prof *profile
	}
	seen := map[string]sized{}
	for _, b := range batches {
		key := fmt.Sprint(b.Size())
		for _, t := range b.Inputs {
			key += fmt.Sprint(t.Shape)
		}
		z, ok := seen[key]
		if !ok {
			in := map[string][]int64{}
			for k, t := range b.Inputs {
				in[e.Inputs[k]] = t.Shape
			}
			var known map[string][]int64
			if probe != nil {
				known = probe.full(b.Size())
			}
			z.sh = shapes.Infer(base, idx, in, known)
			z.prof = newProfile(base, idx, z.sh, weight)
			seen[key] = z
		}
		sh, prof := z.sh, z.prof
		m.inferred = append(m.inferred, sh)
		m.unknown = max(m.unknown, prof.unknown)
		var inputs int64
		for _, t := range b.Inputs {
			inputs += int64(len(t.Data))
		}
		// Every pass's graph outputs come back as a FLOAT copy, held with
		// the values until the run ends.
		fetched := int64(len(passes)) * outputBytes(base, sh)
		if peak := m.weights + m.rounded + inputs + int64(factor*float64(prof.peak())) + fetched; peak > m.peak {
			m.peak, m.samples, m.prof = peak, b.Size(), prof
		}
		m.all += b.Size()
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
	if e.forceStep > 0 && m.splittable {
		m.step = e.forceStep
		m.parts = int((m.samples + m.step - 1) / m.step)
	}
	if e.forceBlocks > 0 {
		m.blocks = m.cutEvery(e.forceBlocks)
		return m, nil
	}
	if e.sessionNodes > maxSessionNodes*3/2 && m.prof != nil && !e.noSizeCut {
		m.maxBlock = max(2, maxSessionNodes*len(m.prof.order)/e.sessionNodes)
	}
	if e.forceStep > 0 || m.budget <= 0 || m.resident+m.peak <= m.budget {
		if !e.noSizeCut {
			m.cutBySize(e.sessionNodes)
		}
		return m, nil
	}
	perSample := int64(partMargin * float64((m.peak-m.weights-m.rounded)/max(m.samples, 1)))
	room := m.budget - m.resident - m.weights - m.rounded
	if m.splittable && perSample > 0 && room >= perSample {
		m.step = room / perSample
		m.parts = int((m.samples + m.step - 1) / m.step)
		return m, nil
	}
	if m.budget <= m.resident {
		// Nothing is left for the passes at all: no cut can help.
		return nil, &BudgetError{Err: fmt.Errorf("the budget of %s (%s) is below the %s the process holds before the passes start (the ONNX Runtime library, the model, the batches); the audit needs an estimated %s more: pass a larger --max-memory",
			FormatSize(m.budget), m.budgetSource(), FormatSize(m.resident), FormatSize(m.peak))}
	}
	// The weights and one run do not fit together: the model runs in
	// blocks of consecutive nodes, each session holding only its own
	// weights; whole batches if the blocks fit them, else in parts.
	var tight *blockError
	for step := m.samples; step >= 1; step = (step + 1) / 2 {
		bp, err := m.cut(step)
		if err == nil {
			m.blocks = bp
			if step < m.samples {
				m.step = step
				m.parts = int((m.samples + m.step - 1) / m.step)
			}
			return m, nil
		}
		tight = err
		if !m.splittable || step == 1 {
			break
		}
	}
	if why := crossSample(base, e.Inputs); why != "" {
		return nil, &BudgetError{Err: fmt.Errorf("the audit needs an estimated %s but the budget is %s (%s); even in blocks of consecutive nodes %s, and the batch cannot run in parts because %s; audit smaller batches or pass a larger --max-memory",
			FormatSize(m.resident+m.peak), FormatSize(m.budget), m.budgetSource(), tight.Error(), why)}
	}
	return nil, &BudgetError{Err: fmt.Errorf("the audit does not fit the budget of %s (%s) even one sample at a time in blocks of consecutive nodes: %s (%s in use before the passes); pass a larger --max-memory, or audit on a machine with more memory",
		FormatSize(m.budget), m.budgetSource(), tight.Error(), FormatSize(m.resident))}
}

// MaxSessionNodes is about the most nodes one session of the combined
// graph holds: a larger one runs in blocks of consecutive nodes (the
// out-of-core machinery, within the memory it has), each block's session
// created once per run and handed the shared weights. ONNX Runtime's
// memory planner, at session creation, compares each new value with the
// freed buffers it has not reused, and a value whose shape an exporter
// computes (a Reshape from Shape/Gather/Concat: most of a transformer's)
// matches none, so the creation time grows with the square of the graph.
// Measured on the 600 M decoder of BenchmarkLLM (fp32 and fp16 side by
// side: 11445 nodes): one session 2.6–3.5 s to create; blocks of about
// 2900 nodes 0.07–0.19 s each (0.54 s in all); at this limit ten blocks,
// 0.4–0.5 s in all, and a failing audit with its fix reruns 8.9–9.8 s
// against 9.8–10.0 s at 3000.
const MaxSessionNodes = 1500

// maxSessionNodes is MaxSessionNodes; tests lower it.
var maxSessionNodes = MaxSessionNodes

// cutBySize cuts a plan that fits its budget into blocks when its
// combined graph holds more than MaxSessionNodes nodes (nodes of them):
// blocks as long as that allows, each ended where the fewest values
// cross, as cut ends them. Out of budget, cut adds the same limit to its
// own.
func (m *MemoryPlan) cutBySize(nodes int) {
	if nodes <= maxSessionNodes*3/2 || m.prof == nil || m.blocks != nil {
		return
	}
	m.maxBlock = max(2, maxSessionNodes*len(m.prof.order)/nodes)
	m.bySize = true
	if bp, err := m.cut(m.samples); err == nil && len(bp.starts) > 1 {
		bp.bySize = true
		m.blocks = bp
	}
	m.bySize = false
}

// rounds reports whether a pass's graph rounds values to half precision
// (an emulated pass; the fp32 reference is upcast and rounds nothing).
func rounds(g *onnx.GraphProto) bool {
	for _, n := range g.Node {
		if n.OpType == "Cast" && onnx.IsDefaultDomain(n.Domain) && onnx.IsHalfType(int32(onnx.IntAttr(n, "to", 0))) {
			return true
		}
	}
	return false
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
