package diagnose

import (
	"context"
	"fmt"
	"strings"

	"fp16audit/internal/batch"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/report"
)

// Runner reruns the policy's emulated pass, to verify a fix: with another
// precision assignment (nodes kept in fp32) or other batches (standardized
// inputs). The audit's execution stage implements it.
type Runner interface {
	Rerun(ctx context.Context, name string, assign *precision.Assignment, batches []batch.Batch) (*observe.PassResult, error)
}

// fixStandardize re-runs the emulated pass with every float input
// standardized per channel (images) or column (tables).
func (f *Facts) fixStandardize(ctx context.Context, run Runner, batches []batch.Batch, before int64) (*report.Fix, error) {
	fix := &report.Fix{Kind: report.FixStandardize, NonFiniteBefore: before}
	for _, in := range f.Inputs {
		if in.Kind == KindInteger || len(in.chans) == 0 {
			continue
		}
		var err error
		if batches, err = standardize(batches, in.Index, in.Kind, in.chans); err != nil {
			return nil, err
		}
		ns := report.NormalizeStats{Input: in.Spec.Name}
		scale := 1.0
		if in.RawPixels {
			scale = 255
		}
		for c := range in.chans {
			ns.Mean = append(ns.Mean, in.chans[c].mean())
			ns.Std = append(ns.Std, in.chans[c].std())
		}
		fm, fs := make([]float64, len(ns.Mean)), make([]float64, len(ns.Std))
		for c := range ns.Mean {
			fm[c], fs[c] = ns.Mean[c]/scale, ns.Std[c]/scale
		}
		ns.Fastai = fmt.Sprintf("Normalize.from_stats(%s, %s)", formatList(fm, 4), formatList(fs, 4))
		fix.Normalize = append(fix.Normalize, ns)
	}
	res, err := run.Rerun(ctx, f.Main+"+standardized", f.Static.Assign, batches)
	if err != nil {
		return nil, err
	}
	fix.NonFiniteAfter = res.NonFinite(f.Values)
	fix.Works = fix.NonFiniteAfter == 0
	if fix.Works {
		fix.Summary = "standardized inputs remove every overflow; add " + fix.Normalize[0].Fastai + " to the DataLoaders' batch_tfms"
	} else {
		fix.Summary = fmt.Sprintf("standardized inputs do not remove the overflow: %d non-finite values remain", fix.NonFiniteAfter)
	}
	return fix, nil
}

// fixBF16 reads the bf16 pass, which ran beside the fp16 one: would
// to_bf16() remove the overflow?
func (f *Facts) fixBF16(before int64) (*report.Fix, bool) {
	bf, ok := f.Passes[PassBF16]
	if !ok {
		return nil, false
	}
	after := bf.NonFinite(f.Values)
	fix := &report.Fix{Kind: report.FixBF16, Works: after == 0, NonFiniteBefore: before, NonFiniteAfter: after}
	if fix.Works {
		fix.Summary = "learn.to_bf16() removes every overflow (needs an Ampere or newer GPU)"
	} else {
		fix.Summary = fmt.Sprintf("learn.to_bf16() does not remove the overflow: %d non-finite values remain in the bf16 pass", after)
	}
	return fix, true
}

// fixKeepFP32 searches the smallest set of nodes to keep in fp32: it forces
// the current origins to fp32, re-runs, and repeats with the new origins
// until the pass is clean or the iteration limit is reached.
func (f *Facts) fixKeepFP32(ctx context.Context, run Runner, batches []batch.Batch, origins []report.Origin, before int64) (*report.Fix, error) {
	g := f.graph()
	keep := map[int]bool{}
	fix := &report.Fix{Kind: report.FixKeepFP32, NonFiniteBefore: before, NonFiniteAfter: before}
	cur := origins
	for it := 1; it <= f.Thresholds.FixIterations && len(cur) > 0; it++ {
		for _, o := range cur {
			keep[o.Index] = true
		}
		asg := precision.AssignKeepFP32(f.Static.Policy, g, f.Static.Order, f.Static.Model.Index.ElemType, keep)
		res, err := run.Rerun(ctx, fmt.Sprintf("%s+keep-fp32#%d", f.Main, it), asg, batches)
		if err != nil {
			return nil, err
		}
		fix.Iterations = it
		fix.NonFiniteAfter = res.NonFinite(f.Values)
		cur = f.originsIn(f.Main, res, asg)
	}
	nodes := sortedKeys(keep)
	mods := map[string]bool{}
	for _, ni := range nodes {
		fix.Nodes = append(fix.Nodes, f.nodeName(ni))
		m := onnx.ModulePath(g.Node[ni])
		if m == "" {
			m = f.nodeName(ni)
		}
		if !mods[m] {
			mods[m] = true
			fix.Modules = append(fix.Modules, m)
		}
	}
	fix.Works = fix.NonFiniteAfter == 0
	var casts []string
	for _, ni := range nodes {
		if f.HalfCasts[ni] {
			casts = append(casts, f.nodeName(ni))
		}
	}
	switch {
	case fix.Works && len(casts) > 0:
		fix.Summary = fmt.Sprintf("without the model's own half cast (%s: remove the .half()/.to(torch.float16) in forward, or scale before it) every overflow is gone",
			strings.Join(casts, ", "))
		if len(casts) < len(nodes) {
			fix.Summary += fmt.Sprintf("; also keep %s in fp32", strings.Join(fix.Modules, ", "))
		}
	case fix.Works:
		fix.Summary = fmt.Sprintf("keeping %s in fp32 removes every overflow (wrap in torch.autocast(device_type=\"cuda\", enabled=False) and cast its input with .float())",
			strings.Join(fix.Modules, ", "))
	default:
		fix.Summary = fmt.Sprintf("keeping %d node(s) in fp32 does not remove the overflow after %d rerun(s): %d non-finite values remain",
			len(fix.Nodes), fix.Iterations, fix.NonFiniteAfter)
	}
	return fix, nil
}
