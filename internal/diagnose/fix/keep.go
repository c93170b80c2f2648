package fix

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"fp16audit/internal/batch"
	"fp16audit/internal/diagnose/evidence"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/report"
)

// KeepFP32 searches the smallest set of nodes to keep in fp32: it forces
// the current origins to fp32, re-runs, and repeats with the new origins
// until nothing reaches an output or the iteration limit is reached. The
// nodes in seed (the model's own casts, removed) stay in fp32 throughout.
func KeepFP32(ctx context.Context, f *evidence.Facts, run Runner, batches []batch.Batch, origins []report.Origin, before int64, seed map[int]bool) (*report.Fix, error) {
	g := f.Graph()
	keep := maps.Clone(seed)
	if keep == nil {
		keep = map[int]bool{}
	}
	fix := &report.Fix{Kind: report.FixKeepFP32, NonFiniteBefore: before, NonFiniteAfter: before}
	cur := origins
	asg := f.Static.Assign
	for it := 1; it <= f.Thresholds.FixIterations && len(cur) > 0; it++ {
		grown := false
		for _, o := range cur {
			if o.Index >= 0 && !keep[o.Index] {
				keep[o.Index], grown = true, true
			}
		}
		if !grown && it > 1 {
			// Every origin already computes in fp32 and still fails: what
			// it reads was lost upstream (an epsilon rounded to zero in
			// 16 bits before the kept division). Keep the rest of its
			// module, as the user's module.float() does, and once that is
			// all kept, the 16-bit producers of what the kept nodes read.
			if !growKept(f, keep, cur, asg) {
				break
			}
		}
		asg = precision.AssignKeepFP32(f.Static.Policy, g, f.Static.Order, f.Static.Model.Index.ElemType, keep)
		deciding, err := verify(ctx, f, run, Rerun{Name: fmt.Sprintf("%s+keep-fp32#%d", f.Main, it), Assign: asg, Batches: batches}, fix)
		if err != nil {
			return nil, err
		}
		fix.Iterations = it
		cur = deciding
	}
	nameKept(f, fix, keep, seed)
	if fix.Works {
		fix.Summary = fmt.Sprintf("keeping %s in fp32 removes every overflow (%s)",
			strings.Join(fix.Modules, ", "), keepHow(f, "it", "its", "returns"))
		if len(seed) > 0 {
			fix.Summary += ", with the model's own half cast removed"
		}
	} else {
		fix.Summary = fmt.Sprintf("keeping %d node(s) in fp32 does not remove the overflow after %d rerun(s): %s",
			len(fix.Nodes), fix.Iterations, remains(f, fix))
	}
	return fix, nil
}

// keepHow says how a user keeps modules in fp32 under the audited policy,
// in the words of their trainer (words.Trainer.Keep): under autocast, a
// region with autocast off fed float32; under model.half(), the modules
// back in float32, their input cast up and what they return cast back
// down. it, its and returns name the modules.
func keepHow(f *evidence.Facts, it, its, returns string) string {
	return f.Words().Keep(f.Static.Policy.ModelHalf(), f.AutocastDevice, it, its, returns)
}

// growKept adds to keep, for origins that are kept already, the other
// nodes of their modules that asg holds in 16 bits; where those are all
// kept, the nodes held in 16 bits that produce an input of a kept node. It
// reports whether keep grew.
func growKept(f *evidence.Facts, keep map[int]bool, origins []report.Origin, asg *precision.Assignment) bool {
	g := f.Graph()
	half := func(ni int) bool {
		p := asg.Node[ni]
		return !keep[ni] && (p == precision.FP16 || p == precision.BF16)
	}
	grown := false
	for _, o := range origins {
		if o.Index < 0 {
			continue
		}
		m := onnx.ModulePath(g.Node[o.Index])
		if m == "" {
			continue
		}
		for _, ni := range f.Static.Order {
			if half(ni) && onnx.ModulePath(g.Node[ni]) == m {
				keep[ni], grown = true, true
			}
		}
	}
	if grown {
		return true
	}
	ix := f.Static.Model.Index
	for _, ni := range slices.Sorted(maps.Keys(keep)) {
		for _, in := range g.Node[ni].Input {
			if pi := ix.Producer(in); pi >= 0 && half(pi) {
				keep[pi], grown = true, true
			}
		}
	}
	return grown
}

// nameKept lists the nodes kept in fp32 (removed casts among them) and
// the modules of those that are not removed casts on a fix.
func nameKept(f *evidence.Facts, fix *report.Fix, keep, removed map[int]bool) {
	g := f.Graph()
	mods := map[string]bool{}
	for _, ni := range slices.Sorted(maps.Keys(keep)) {
		if removed[ni] {
			fix.Nodes = append(fix.Nodes, f.NodeName(ni))
			continue
		}
		fix.Nodes = append(fix.Nodes, f.NodeName(ni))
		m := onnx.ModulePath(g.Node[ni])
		if m == "" {
			m = f.NodeName(ni)
		}
		if !mods[m] {
			mods[m] = true
			fix.Modules = append(fix.Modules, m)
		}
	}
}

// KeepRegion keeps in fp32 the region where a pass's values drift from
// fp32's, when nothing overflows (underflow, rounding): the nodes from the
// origin on, in topological order, held in reduced precision, whose
// values differ from fp32's beyond the tolerance or flush to zero. The
// reruns grow the region (the first node, then twice as many each time,
// then all of it) until the outputs agree; a fix that does not work says
// how far it got.
//
// With rounded, the region starts with the nodes whose reduced-precision
// outputs the origin reads: where the origin's error is a loss of
// precision (the difference of two values fp16 rounded, h - mean(h) of a
// rounded h), the digits are lost where its inputs are rounded, within
// the tolerance there, and keeping the origin alone in fp32 cannot bring
// them back.
func KeepRegion(ctx context.Context, f *evidence.Facts, run Runner, batches []batch.Batch, o report.Origin, before int64, rounded bool) (*report.Fix, error) {
	region := driftRegion(f, o)
	if rounded {
		region = append(roundedInputs(f, o), region...)
	}
	fix := &report.Fix{Kind: report.FixKeepFP32, NonFiniteBefore: before, NonFiniteAfter: before}
	var keep map[int]bool
	for it, n := 1, 1; it <= f.Thresholds.FixIterations; it++ {
		n = min(n, len(region))
		if it == f.Thresholds.FixIterations {
			n = len(region) // the last rerun tries all of it
		}
		keep = map[int]bool{}
		for _, ni := range region[:n] {
			keep[ni] = true
		}
		asg := precision.AssignKeepFP32(f.Static.Policy, f.Graph(), f.Static.Order, f.Static.Model.Index.ElemType, keep)
		if _, err := verify(ctx, f, run, Rerun{Name: fmt.Sprintf("%s+keep-fp32#%d", f.Main, it), Assign: asg, Batches: batches}, fix); err != nil {
			return nil, err
		}
		fix.Iterations = it
		if fix.Works || n == len(region) {
			break
		}
		n *= 2
	}
	nameKept(f, fix, keep, nil)
	if fix.Works {
		fix.Summary = fmt.Sprintf("keeping %d node(s) in fp32 (%s) brings the outputs back within the tolerance (%s)",
			len(fix.Nodes), listed(fix.Modules, 8), keepHow(f, "them", "their", "return"))
	} else {
		fix.Summary = fmt.Sprintf("keeping %d of the %d drifting node(s) in fp32 (%s) does not bring the outputs back after %d rerun(s): %s",
			len(fix.Nodes), len(region), listed(fix.Modules, 8), fix.Iterations, remains(f, fix))
	}
	return fix, nil
}

// roundedInputs lists, in topological order, the nodes computed in
// reduced precision whose outputs the origin o reads.
func roundedInputs(f *evidence.Facts, o report.Origin) []int {
	if o.Index < 0 {
		return nil
	}
	asg := f.Static.Assign
	ix := f.Static.Model.Index
	feeds := map[int]bool{}
	for _, in := range f.Graph().Node[o.Index].Input {
		if p := ix.Producer(in); in != "" && p >= 0 {
			if q := asg.Node[p]; q == precision.FP16 || q == precision.BF16 {
				feeds[p] = true
			}
		}
	}
	var out []int
	for _, ni := range f.Static.Order {
		if feeds[ni] && f.Graph().Node[ni].OpType != "Constant" {
			out = append(out, ni)
		}
	}
	return out
}

// driftRegion lists the nodes, in topological order from o's on, held in
// reduced precision in the main pass whose outputs differ from fp32's
// beyond the tolerance or lose some of their nonzero values to zero.
func driftRegion(f *evidence.Facts, o report.Origin) []int {
	res := f.Passes[f.Main]
	tol := f.Tolerance(f.Main)
	asg := f.Static.Assign
	var out []int
	started := false
	for _, ni := range f.Static.Order {
		started = started || ni == o.Index
		if !started {
			continue
		}
		if p := asg.Node[ni]; p != precision.FP16 && p != precision.BF16 {
			continue
		}
		for _, v := range f.Graph().Node[ni].Output {
			d, ok := res.Diffs[v]
			if !ok {
				continue
			}
			if e := d.RelErr(); ni == o.Index || d.Flushed > 0 || (!math.IsNaN(e) && e > tol) {
				out = append(out, ni)
				break
			}
		}
	}
	if len(out) == 0 && o.Index >= 0 {
		out = []int{o.Index}
	}
	return out
}
