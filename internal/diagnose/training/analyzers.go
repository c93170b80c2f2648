package training

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/onnx"
	"fp16audit/internal/rewrite"
	"fp16audit/report"
)

// Analyzer is one training check over the facts of one audit.
type Analyzer = checks.Analyzer[*Facts]

// Analyzers returns every training check in the order its findings are
// listed: the forward mode, then the backward from the loss backwards.
func Analyzers() []*Analyzer {
	return []*Analyzer{
		{Check: checkBNStats, Requires: []*Requirement{needEval}, Run: runBNStats},
		{Check: checkFoldedBN, Requires: []*Requirement{needTrain}, Run: runFoldedBN},
		{Check: checkFP32Backward, Requires: []*Requirement{needFP32Backward}, Run: runFP32Backward},
		{Check: checkSeedOverflow, Requires: []*Requirement{needMass}, Run: runSettle(true)},
		{Check: checkBackwardOverflow, Requires: []*Requirement{needMass}, Run: runSettle(false)},
		{Check: checkOverflowEveryScale, Requires: []*Requirement{needMass}, Run: runOverflowEveryScale},
		{Check: checkUnderflowEveryScale, Requires: []*Requirement{needMass}, Run: runUnderflowEveryScale},
		{Check: checkUnderflowAtInit, Requires: []*Requirement{needMass}, Run: runUnderflowAtInit},
		{Check: checkNoGradRule, Requires: []*Requirement{needBackward}, Run: runNoGradRule},
	}
}

// Requirement is a fact a training check needs, which the driver tests.
type Requirement = checks.Requirement[*Facts]

// The training checks' requirements.
var (
	needEval         = &Requirement{Name: "eval mode", Met: func(f *Facts) bool { return f.Mode == rewrite.ModeEval }}
	needTrain        = &Requirement{Name: "train mode", Met: func(f *Facts) bool { return f.Mode == rewrite.ModeTrain }}
	needBackward     = &Requirement{Name: "backward", Met: func(f *Facts) bool { return f.Backward != nil }}
	needFP32Backward = &Requirement{Name: "fp32 backward", Met: func(f *Facts) bool { return f.Backward != nil && f.Backward.FP32 != nil }}
	needMass         = &Requirement{Name: "backward finite in fp32 with gradients held in 16 bits", Met: (*Facts).ready}
)

func (f *Facts) finding(c *checks.Check, node int, value, msg string) checks.Finding {
	fd := c.Finding(msg)
	if node >= 0 {
		n := f.Model.Proto.Graph.Node[node]
		fd.Node, fd.Module = onnx2name(f, node), modulePath(n)
	}
	fd.Value = value
	return fd
}

// untrainedBN returns the BatchNormalization nodes whose running
// statistics are at the defaults, or one momentum step from them while
// this batch is more than twice or less than half what they expect: in
// eval mode those do not normalize the batch as training would.
func (f *Facts) untrainedBN() []report.BatchNormReport {
	var out []report.BatchNormReport
	for _, bn := range f.batchNorms() {
		if bn.Statistics != "running" {
			continue
		}
		switch bn.RunningStats {
		case "defaults":
			out = append(out, bn)
		case "one-step":
			if bn.InputRMS > 0 && bn.RunningRMS > 0 {
				if r := bn.InputRMS / bn.RunningRMS; r > 2 || r < 0.5 {
					out = append(out, bn)
				}
			}
		}
	}
	return out
}

func runBNStats(f *Facts) ([]checks.Finding, error) {
	bns := f.untrainedBN()
	if len(bns) == 0 {
		return nil, nil
	}
	var parts []string
	for _, bn := range bns {
		s := labelOf(bn.Module, bn.Node)
		if bn.RunningStats == "defaults" {
			s += " (mean 0, variance 1"
		} else {
			s += " (one momentum update from the defaults"
		}
		if bn.InputRMS > 0 && bn.RunningRMS > 0 {
			s += fmt.Sprintf("; input RMS %.3g where they expect %.3g", bn.InputRMS, bn.RunningRMS)
		}
		parts = append(parts, s+")")
	}
	msg := fmt.Sprintf("%d BatchNormalization node(s) hold untrained running statistics: %s. In eval mode they do not normalize this batch the way training's batch statistics do, so this eval-mode audit does not reflect training; audit a training export with --mode train",
		len(bns), strings.Join(limit(parts, 6), ", "))
	fd := checkBNStats.Finding(msg)
	fd.Node, fd.Module = bns[0].Node, bns[0].Module
	return []checks.Finding{fd}, nil
}

// foldedConvs returns the Conv nodes that read a folded weight and bias,
// and the Conv and Gemm nodes into which the dynamo exporter folded a
// BatchNorm (onnx.FusedBatchNorm).
func (f *Facts) foldedConvs() []int {
	var out []int
	ix := f.Model.Index
	for i, n := range f.Model.Proto.Graph.Node {
		if _, _, ok := onnx.FusedBatchNorm(n); ok {
			out = append(out, i)
			continue
		}
		if onnx.FoldedByName(n, ix) {
			out = append(out, i)
		}
	}
	return out
}

// layerOps names the op types of the layers a BatchNorm was folded into,
// in the order met: "Conv", or "Conv/Gemm" where the dynamo exporter
// folded a BatchNorm1d into a Linear too.
func layerOps(g *onnx.GraphProto, nodes []int) string {
	var types []string
	for _, i := range nodes {
		if t := g.Node[i].OpType; !slices.Contains(types, t) {
			types = append(types, t)
		}
	}
	return strings.Join(types, "/")
}

func runFoldedBN(f *Facts) ([]checks.Finding, error) {
	convs := f.foldedConvs()
	if len(convs) == 0 {
		return nil, nil
	}
	var names []string
	for _, i := range convs {
		names = append(names, onnx2name(f, i))
	}
	msg := fmt.Sprintf("%d %s node(s) read a BatchNorm folded in by an eval-mode export (%s): --mode train cannot recover batch statistics from them, so this train-mode forward still normalizes with the running statistics (and Dropout, which eval exports drop, is missing); re-export with torch.onnx.export(..., training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)",
		len(convs), layerOps(f.Model.Proto.Graph, convs), strings.Join(limit(names, 6), ", "))
	if onnx.FromDynamo(f.Model.Proto.Graph) {
		var bns []string
		for _, i := range convs {
			if bn, layer, ok := onnx.FusedBatchNorm(f.Model.Proto.Graph.Node[i]); ok {
				bns = append(bns, fmt.Sprintf("%s into %s", bn, layer))
			}
		}
		msg = fmt.Sprintf("the dynamo exporter folded %d BatchNorm(s) into the layer before them (%s), which torch 2.9.1 does even for a model exported in train() mode: this export computes the eval-mode forward (running statistics, no Dropout), and --mode train cannot recover batch statistics from it; re-export with torch.onnx.export(..., dynamo=False, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)",
			len(bns), strings.Join(limit(bns, 6), ", "))
	}
	return []checks.Finding{f.finding(checkFoldedBN, convs[0], "", msg)}, nil
}

func runFP32Backward(f *Facts) ([]checks.Finding, error) {
	b := f.Backward
	if !f.fp32Broken() {
		return nil, nil
	}
	if isNaNOrInf(b.FP32.Loss) {
		return []checks.Finding{f.finding(checkFP32Backward, -1, b.Res.Loss, fmt.Sprintf("the fp32 %s loss on %q is %g: every gradient is NaN/Inf; check the prediction and the target (range, dtype, class indices within the number of classes)", b.Loss, b.Output, b.FP32.Loss))}, nil
	}
	bad := f.fp32NonFinite()
	msg := fmt.Sprintf("in fp32 at loss scale 1 the gradient of %q is NaN/Inf first (in backward order), and %d gradient(s) in all: not an fp16 problem; fix the model or the data first",
		bad[0].value, len(bad))
	return []checks.Finding{f.finding(checkFP32Backward, bad[0].node, bad[0].value, msg)}, nil
}

// namedValue is a gradient named for a reader: its value and node.
type namedValue struct {
	value string
	node  int
}

// fp32NonFinite lists the gradients holding NaN/Inf in the fp32 backward,
// in backward order: those held in 16 bits, then the parameters.
func (f *Facts) fp32NonFinite() []namedValue {
	b, t := f.Backward, f.gradients()
	var out []namedValue
	for i := len(t.entries) - 1; i >= 0; i-- {
		if m := t.entries[i].mass(b.FP32); m != nil && m.NonFinite > 0 {
			out = append(out, namedValue{t.entries[i].value, t.entries[i].node})
		}
	}
	for _, gr := range b.Res.Params() {
		if !allFinite(b.FP32.Params[gr.Value]) {
			out = append(out, namedValue{gr.Value, gr.Node})
		}
	}
	if len(out) == 0 {
		out = append(out, namedValue{b.Res.Loss, -1})
	}
	return out
}

// what names the gradient of entry e.
func (e *entry) what() string {
	if e.site {
		return fmt.Sprintf("%s gradient of %q (%s computes it in %s)", e.kind, e.value, e.op, e.prec)
	}
	return fmt.Sprintf("gradient of %q (%s output, %s)", e.value, e.op, e.prec)
}

// describe names entry e with its module for a message.
func (e *entry) describe() string {
	if e.module != "" {
		return "module " + e.module + ": " + e.what()
	}
	return e.what()
}

// runSettle: FP6004 or FP6005 when the first backward overflows at the
// initial scale, which the GradScaler answers by skipping steps until it
// settles.
func runSettle(seed bool) func(*Facts) ([]checks.Finding, error) {
	return func(f *Facts) ([]checks.Finding, error) {
		b, t := f.Backward, f.gradients()
		s := f.scales()
		over, k := f.overflow(b.InitExp)
		if s.settled == nil || !over || k < 0 {
			return nil, nil
		}
		e := t.entries[k]
		isSeed := !e.site && e.value == b.Output
		if isSeed != seed {
			return nil, nil
		}
		n := b.InitExp - *s.settled
		settle := fmt.Sprintf("the GradScaler skips %d step(s), halving the scale each time, and settles at 2^%d; to start there, use %s",
			n, *s.settled, f.words().StartScale(*s.settled))
		if seed {
			seedMax := math.NaN()
			if m := e.mass(b.FP32); m != nil {
				seedMax = m.Max
			}
			msg := fmt.Sprintf("the scaled loss gradient overflows at 2^%d: scale × max |dL/dpred| = 2^%d × %.4g = %.4g > 65504 at %q, held in %s; %s",
				b.InitExp, b.InitExp, seedMax, math.Ldexp(seedMax, b.InitExp), b.Output, e.prec, settle)
			if b.Loss == "mse" || b.Loss == "l1" {
				msg += "; scaling the targets gives the loss a sensible size"
			}
			return []checks.Finding{f.finding(checkSeedOverflow, e.node, e.value, msg)}, nil
		}
		msg := fmt.Sprintf("the first backward overflows at 2^%d, first at %s (max |g| %s at scale 1); %s",
			b.InitExp, e.describe(), fmtMax(e.mass(b.FP32).Max), settle)
		return []checks.Finding{f.finding(checkBackwardOverflow, e.node, e.value, msg)}, nil
	}
}

func runOverflowEveryScale(f *Facts) ([]checks.Finding, error) {
	if f.scales().maxClean != nil {
		return nil, nil
	}
	b, t := f.Backward, f.gradients()
	_, k := f.overflow(b.MinExp)
	if k < 0 {
		k = len(t.entries) - 1
	}
	e := t.entries[k]
	msg := fmt.Sprintf("even at scale 2^%d the fp16 backward overflows, first at %s: no loss scale keeps it finite; use %s or keep %s in fp32",
		b.MinExp, e.describe(), f.bf16(), e.label())
	switch f.savedValues() {
	case forwardLoss:
		msg = fmt.Sprintf("even at scale 2^%d the fp16 backward is NaN/Inf, first at %s, while the fp32 backward is finite: the fp16 forward's loss is already NaN/Inf "+
			"(the forward overflows before the backward starts; see the forward verdict), so no loss scale keeps it finite; fix the forward, or use %s or keep %s in fp32",
			b.MinExp, e.describe(), f.bf16(), e.label())
	case savedGradient:
		msg = fmt.Sprintf("even at scale 2^%d the fp16 backward is NaN/Inf, first at %s, while the fp32 backward is finite and far from fp16's range there: "+
			"what makes it non-finite is the values the fp16 forward saved for the backward (a difference fp16 rounds to 0 under a square root or a division), not the loss scale, so no loss scale keeps it finite; use %s or keep %s and what feeds it in fp32",
			b.MinExp, e.describe(), f.bf16(), e.label())
	}
	return []checks.Finding{f.finding(checkOverflowEveryScale, e.node, e.value, msg)}, nil
}

// Why the emulated backward is NaN/Inf at the smallest scale judged
// (savedValues).
const (
	// scaled: the fp32 maxima overflow there too.
	scaled = iota
	// forwardLoss: the fp16 forward's loss is NaN/Inf already.
	forwardLoss
	// savedGradient: the loss is finite, and the fp32 maxima keep every
	// gradient below overflow even at twice the scale: the values the
	// fp16 forward saved break the backward.
	savedGradient
)

// savedValues says why the emulated backward is NaN/Inf at the smallest
// scale judged: the scale (scaled, also when no run there is NaN/Inf), or
// the values of the fp16 forward, its loss already (forwardLoss) or the
// values it saved for the backward (savedGradient), where by the fp32
// maxima no gradient would overflow even at twice that scale
// (unexplained).
func (f *Facts) savedValues() int {
	b := f.Backward
	r, ok := b.Runs[b.MinExp]
	switch {
	case !ok || !f.runOverflows(r) || f.maximaOverflow(b.MinExp+1):
		return scaled
	case isNaNOrInf(r.Loss):
		return forwardLoss
	}
	return savedGradient
}

// losing lists the parameters losing more than the tolerance at x, worst
// first, with what they lose.
func (f *Facts) losing(x int) (idx []int, lost []float64) {
	t := f.gradients()
	for k := range t.params {
		if f.noise(k) {
			continue
		}
		if l, _ := f.lost(k, x); l > f.Backward.Tolerance {
			idx, lost = append(idx, k), append(lost, l)
		}
	}
	order := make([]int, len(idx))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, c int) bool { return lost[order[a]] > lost[order[c]] })
	oi, ol := make([]int, len(idx)), make([]float64, len(idx))
	for i, o := range order {
		oi[i], ol[i] = idx[o], lost[o]
	}
	return oi, ol
}

// lossText names the parameters that lose too much, by module.
func (f *Facts) lossText(idx []int, lost []float64) (text string, modules []string) {
	t := f.gradients()
	var parts []string
	seen := map[string]bool{}
	for i, k := range idx {
		p := t.params[k]
		if !seen[p.label()] {
			seen[p.label()] = true
			modules = append(modules, p.label())
		}
		parts = append(parts, fmt.Sprintf("%s %.1f%%", p.value, 100*lost[i]))
	}
	return strings.Join(limit(parts, 4), ", "), modules
}

func runUnderflowEveryScale(f *Facts) ([]checks.Finding, error) {
	b, t := f.Backward, f.gradients()
	s := f.scales()
	if s.settled == nil || s.cleanFrom != nil {
		return nil, nil
	}
	idx, lost := f.losing(*s.settled)
	if len(idx) == 0 {
		return nil, nil
	}
	text, mods := f.lossText(idx, lost)
	p := t.params[idx[0]]
	msg := fmt.Sprintf("at 2^%d, where the GradScaler settles (the largest scale without overflow is 2^%d), fp16 loses more than %.1f%% of the gradient norm of %d parameter(s) in %s: %s; no scale that keeps the backward finite keeps them. fp16 cannot train them: use %s or keep %s in fp32",
		*s.settled, *s.maxClean, 100*b.Tolerance, len(idx), strings.Join(limit(mods, 4), ", "), text, f.bf16(), strings.Join(limit(mods, 3), ", "))
	return []checks.Finding{f.finding(checkUnderflowEveryScale, p.node, p.value, msg)}, nil
}

func runUnderflowAtInit(f *Facts) ([]checks.Finding, error) {
	b, t := f.Backward, f.gradients()
	s := f.scales()
	if s.settled == nil || s.cleanFrom == nil || *s.cleanFrom <= *s.settled {
		return nil, nil
	}
	idx, lost := f.losing(*s.settled)
	if len(idx) == 0 {
		return nil, nil
	}
	text, mods := f.lossText(idx, lost)
	p := t.params[idx[0]]
	msg := fmt.Sprintf("at the initial scale 2^%d fp16 loses more than %.1f%% of the gradient norm of %d parameter(s) in %s: %s; scales 2^%d to 2^%d keep every parameter gradient within %.1f%%: use %s (the GradScaler only doubles its scale every 2000 clean steps)",
		*s.settled, 100*b.Tolerance, len(idx), strings.Join(limit(mods, 4), ", "), text, *s.cleanFrom, *s.maxClean, 100*b.Tolerance, f.words().StartScale(*s.cleanFrom))
	return []checks.Finding{f.finding(checkUnderflowAtInit, p.node, p.value, msg)}, nil
}

func runNoGradRule(f *Facts) ([]checks.Finding, error) {
	b := f.Backward
	if len(b.Res.Unsupported) == 0 {
		return nil, nil
	}
	var parts []string
	for _, u := range b.Res.Unsupported {
		parts = append(parts, fmt.Sprintf("%s (%s: %s)", u.Name, u.OpType, u.Reason))
	}
	msg := fmt.Sprintf("the backward stops at %d node(s) without a gradient rule: %s; %d value(s) before them get no gradient, and the audit covers the rest",
		len(b.Res.Unsupported), strings.Join(limit(parts, 6), ", "), len(b.Res.Blocked))
	return []checks.Finding{f.finding(checkNoGradRule, b.Res.Unsupported[0].Node, "", msg)}, nil
}

func fmtMax(x float64) string {
	if isNaNOrInf(x) {
		return "non-finite"
	}
	return fmt.Sprintf("%.4g", x)
}

func labelOf(module, node string) string {
	if module != "" {
		return module
	}
	return node
}

func limit(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(append([]string(nil), s[:n]...), fmt.Sprintf("and %d more", len(s)-n))
}
