package training

import (
	"fmt"
	"math"
	"regexp"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/grad"
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
		{Check: checkSeedOverflow, Requires: []*Requirement{needSweep}, Run: runInitOverflow(true)},
		{Check: checkBackwardOverflow, Requires: []*Requirement{needSweep}, Run: runInitOverflow(false)},
		{Check: checkOverflowEveryScale, Requires: []*Requirement{needSweep}, Run: runOverflowEveryScale},
		{Check: checkUnderflowEveryScale, Requires: []*Requirement{needSweep}, Run: runUnderflowEveryScale},
		{Check: checkUnderflowAtInit, Requires: []*Requirement{needSweep}, Run: runUnderflowAtInit},
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
	needSweep        = &Requirement{Name: "backward sweep with a finite fp32 loss", Met: (*Facts).backwardReady}
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

// foldedConv matches the names torch.onnx.export gives the weight and bias
// it computes by folding a BatchNorm into the Conv before it.
var foldedConv = regexp.MustCompile(`^onnx::Conv_\d+$`)

// foldedConvs returns the Conv nodes that read a folded weight and bias.
func (f *Facts) foldedConvs() []int {
	var out []int
	ix := f.Model.Index
	for i, n := range f.Model.Proto.Graph.Node {
		if n.OpType != "Conv" || len(n.Input) < 3 {
			continue
		}
		// The folded bias may come through an Identity: the exporter
		// deduplicates equal folded biases (zeros of untrained layers).
		if foldedConv.MatchString(n.Input[1]) && foldedConv.MatchString(n.Input[2]) && ix.IsInitializer(n.Input[1]) {
			out = append(out, i)
		}
	}
	return out
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
	msg := fmt.Sprintf("%d Conv node(s) read a BatchNorm folded in by an eval-mode export (%s): --mode train cannot recover batch statistics from them, so this train-mode forward still normalizes with the running statistics (and Dropout, which eval exports drop, is missing); re-export with torch.onnx.export(..., training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)",
		len(convs), strings.Join(limit(names, 6), ", "))
	return []checks.Finding{f.finding(checkFoldedBN, convs[0], "", msg)}, nil
}

func runFP32Backward(f *Facts) ([]checks.Finding, error) {
	b := f.Backward
	if isNaNOrInf(b.FP32.Loss) {
		return []checks.Finding{f.finding(checkFP32Backward, -1, b.Res.Loss, fmt.Sprintf("the fp32 %s loss on %q is %g: every gradient is NaN/Inf; check the prediction and the target (range, dtype, class indices within the number of classes)", b.Loss, b.Output, b.FP32.Loss))}, nil
	}
	var bad []string
	first := -1
	for k := len(b.Res.Grads) - 1; k >= 0; k-- {
		g := b.Res.Grads[k]
		r := b.FP32.Grads[g.Value]
		if overflowed(r) {
			bad = append(bad, g.Value)
			if first < 0 {
				first = k
			}
		}
	}
	if first < 0 {
		return nil, nil
	}
	g := b.Res.Grads[first]
	msg := fmt.Sprintf("in fp32 at loss scale 1 the gradient of %q is NaN/Inf first (in backward order), and %d gradient(s) in all: not an fp16 problem; fix the model or the data first",
		g.Value, len(bad))
	return []checks.Finding{f.finding(checkFP32Backward, g.Node, g.Value, msg)}, nil
}

// backwardReady reports whether the backward facts can say anything about
// fp16: a backward ran, it is finite in fp32, and something is held in 16
// bits.
func (f *Facts) backwardReady() bool {
	b := f.Backward
	if b == nil || len(b.Scans) == 0 {
		return false
	}
	if b.FP32 != nil && (isNaNOrInf(b.FP32.Loss) || fp32Broken(b)) {
		return false
	}
	return len(f.gradients().entries) > 0
}

func fp32Broken(b *Backward) bool {
	for _, r := range b.FP32.Grads {
		if overflowed(r) {
			return true
		}
	}
	return false
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

func runInitOverflow(seed bool) func(*Facts) ([]checks.Finding, error) {
	return func(f *Facts) ([]checks.Finding, error) {
		b, t := f.Backward, f.gradients()
		maxClean, _, _ := t.window()
		init := b.Scans[b.InitExp]
		if maxClean == nil || init == nil {
			return nil, nil
		}
		k := t.firstOverflow(init)
		if k < 0 {
			return nil, nil
		}
		e := t.entries[k]
		isSeed := !e.site && e.value == b.Output
		if isSeed != seed {
			return nil, nil
		}
		r, _ := e.reading(init)
		fix := fmt.Sprintf("any scale ≤ 2^%d keeps the backward finite: pass learn.to_fp16(init_scale=2.**%d) (or GradScaler(init_scale=2.**%d))", *maxClean, *maxClean, *maxClean)
		if seed {
			seedMax := math.NaN()
			if b.FP32 != nil {
				seedMax = b.FP32.Grads[b.Output].MaxAbs
			}
			msg := fmt.Sprintf("the scaled loss gradient overflows at 2^%d: scale × max |dL/dpred| = 2^%d × %.4g = %.4g > 65504 at %q, held in %s; the first backward is Inf before any layer; %s",
				b.InitExp, b.InitExp, seedMax, math.Ldexp(seedMax, b.InitExp), b.Output, e.prec, fix)
			if b.Loss == "mse" || b.Loss == "l1" {
				msg += ", or scale the targets"
			}
			return []checks.Finding{f.finding(checkSeedOverflow, e.node, e.value, msg)}, nil
		}
		msg := fmt.Sprintf("the first backward overflows at 2^%d, first at %s (max |g| %s before rounding); %s",
			b.InitExp, e.describe(), fmtMax(r.MaxAbs), fix)
		return []checks.Finding{f.finding(checkBackwardOverflow, e.node, e.value, msg)}, nil
	}
}

func runOverflowEveryScale(f *Facts) ([]checks.Finding, error) {
	b, t := f.Backward, f.gradients()
	if maxClean, _, _ := t.window(); maxClean != nil {
		return nil, nil
	}
	low := b.Scans[b.MinExp]
	k := t.firstOverflow(low)
	if k < 0 {
		return nil, nil
	}
	e := t.entries[k]
	msg := fmt.Sprintf("even at scale 2^%d the fp16 backward overflows, first at %s: no loss scale keeps it finite; use learn.to_bf16() or keep %s in fp32",
		b.MinExp, e.describe(), e.label())
	return []checks.Finding{f.finding(checkOverflowEveryScale, e.node, e.value, msg)}, nil
}

func runUnderflowEveryScale(f *Facts) ([]checks.Finding, error) {
	b, t := f.Backward, f.gradients()
	maxClean, _, under := t.window()
	if maxClean == nil {
		return nil, nil
	}
	var out []checks.Finding
	top := b.Scans[*maxClean]
	for _, mod := range under {
		// The module's worst gradient at the largest clean scale.
		worst, frac, need := -1, -1.0, (*int)(nil)
		for i, e := range t.entries {
			if e.label() != mod {
				continue
			}
			if ff := t.flushFree[i]; ff != nil && *ff <= *maxClean {
				continue
			}
			r, _ := e.reading(top)
			if fr := e.lost(r); fr > frac {
				worst, frac = i, fr
			}
			if ff := t.freeAbove(b, i); ff != nil && (need == nil || *ff > *need) {
				need = ff
			}
		}
		if worst < 0 {
			continue
		}
		e := t.entries[worst]
		needs := "no larger scale at which it stays finite keeps it"
		if need != nil {
			needs = fmt.Sprintf("it would need 2^%d", *need)
		}
		msg := fmt.Sprintf("module %s's fp16 gradients underflow at every scale that keeps the backward finite (≤ 2^%d): at 2^%d, %.1f%% of the %s is lost to underflow (threshold %.1f%%); %s. fp16 cannot train it: use learn.to_bf16() or keep %s in fp32",
			mod, *maxClean, *maxClean, 100*frac, e.what(), 100*b.UnderflowFraction, needs, mod)
		out = append(out, f.finding(checkUnderflowEveryScale, e.node, e.value, msg))
	}
	return out, nil
}

// freeAbove returns the smallest scanned exponent from which entry i
// loses at most the threshold at every larger scale where it is finite,
// ignoring the overflow of other gradients (nil: not even at the largest
// such scale). It searches from the top, as buildTable does.
func (t *table) freeAbove(b *Backward, i int) *int {
	e := t.entries[i]
	var free *int
	for k := len(t.exps) - 1; k >= 0; k-- {
		r, ok := e.reading(b.Scans[t.exps[k]])
		if !ok || overflowed(r) {
			continue
		}
		if e.flushes(r, b.UnderflowFraction) {
			break
		}
		free = ptr(t.exps[k])
	}
	return free
}

func runUnderflowAtInit(f *Facts) ([]checks.Finding, error) {
	b, t := f.Backward, f.gradients()
	maxClean, flushFree, under := t.window()
	init := b.Scans[b.InitExp]
	if maxClean == nil || len(under) > 0 || flushFree == nil || init == nil || b.InitExp > *maxClean {
		return nil, nil
	}
	// Where the flushing happens, in backward order, and the modules that
	// only lose their gradient because a gradient after them flushed.
	var own, downstream []string
	first := -1
	seen := map[string]bool{}
	for i := len(t.entries) - 1; i >= 0; i-- {
		e := t.entries[i]
		r, _ := e.reading(init)
		if !e.flushes(r, b.UnderflowFraction) || seen[e.label()] {
			continue
		}
		seen[e.label()] = true
		if r.FlushedFraction() > b.UnderflowFraction {
			own = append(own, fmt.Sprintf("%s (%.1f%%)", e.label(), 100*r.FlushedFraction()))
			if first < 0 {
				first = i
			}
		} else {
			downstream = append(downstream, fmt.Sprintf("%s (%.1f%% lost)", e.label(), 100*e.lost(r)))
		}
	}
	if first < 0 && len(downstream) == 0 {
		return nil, nil
	}
	where := "the fp16 gradients of " + strings.Join(limit(downstream, 6), ", ") + " are lost to underflow"
	if len(own) > 0 {
		where = "fp16 gradients flush to zero at " + strings.Join(limit(own, 6), ", ")
		if len(downstream) > 0 {
			where += fmt.Sprintf(", and %d module(s) before them lose their gradient with them (%s)", len(downstream), strings.Join(limit(downstream, 4), ", "))
		}
	}
	if first < 0 {
		first = len(t.entries) - 1
		for first > 0 && !t.entries[first].flushes(mustReading(t.entries[first], init), b.UnderflowFraction) {
			first--
		}
	}
	e := t.entries[first]
	msg := fmt.Sprintf("at the initial scale 2^%d %s (threshold %.1f%%); scales 2^%d to 2^%d are clean: pass learn.to_fp16(init_scale=2.**%d) (the GradScaler only doubles its scale every 2000 clean steps)",
		b.InitExp, where, 100*b.UnderflowFraction, *flushFree, *maxClean, *flushFree)
	return []checks.Finding{f.finding(checkUnderflowAtInit, e.node, e.value, msg)}, nil
}

func mustReading(e *entry, s *grad.Scan) grad.Reading {
	r, _ := e.reading(s)
	return r
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
