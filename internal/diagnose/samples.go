package diagnose

import (
	"context"
	"fmt"

	"fp16audit/internal/batch"
	"fp16audit/internal/diagnose/evidence"
	"fp16audit/internal/diagnose/fix"
	"fp16audit/internal/diagnose/inputs"
	"fp16audit/report"
)

// maxLocateRuns bounds the reruns that locate the samples of the fp32
// origins.
const maxLocateRuns = 32

// locateSamples finds the samples that hold the NaN/Inf of each fp32
// origin at a node (a Softmax over a row masked entirely with -inf). The
// passes summarise whole batches, so it reruns the fp32 reference on
// parts of a batch and halves the parts that hold them, down to single
// samples: about 2·log2(batch size) reruns per sample found. In eval mode
// samples do not interact, so a sample that holds them alone holds them
// in its batch. A model that refuses a smaller batch (a fixed batch
// dimension) leaves the samples unnamed, with a note.
func locateSamples(ctx context.Context, f *evidence.Facts, run fix.Runner, batches []batch.Batch, origins []report.Origin) (note string, err error) {
	if len(origins) == 0 || origins[0].Index < 0 {
		return "", nil
	}
	for _, in := range f.Inputs {
		if d := in.Spec.Dims; len(d) > 0 && d[0] > 1 {
			return fmt.Sprintf("the samples that hold the NaN/Inf of %s are not named: input %q has a fixed batch dimension of %d, so parts of a batch cannot run (export with dynamic_axes to name them)", origins[0].Node, in.Spec.Name, d[0]), nil
		}
	}
	runs := 0
	for k := range origins {
		o := &origins[k]
		if o.Index < 0 || o.Value == "" || len(o.Samples) > 0 {
			continue
		}
		var find func(bi int, lo, n, count int64) error
		find = func(bi int, lo, n, count int64) error {
			if len(o.Samples) >= inputs.MaxSamples || runs >= maxLocateRuns {
				return nil
			}
			if count < 0 {
				part, err := batches[bi].Samples(lo, n)
				if err != nil {
					return err
				}
				runs++
				res, err := run.Rerun(ctx, fix.Rerun{Name: fmt.Sprintf("%s@batch %d samples %d:%d", report.PassFP32, bi, lo, lo+n), Reference: true, Batches: []batch.Batch{part}})
				if err != nil {
					return err
				}
				if s, ok := res.Stats[o.Value]; ok {
					count = s.NonFinite()
				}
				if count == 0 {
					return nil
				}
			}
			if n == 1 {
				o.Samples = append(o.Samples, report.Sample{Batch: bi, Index: lo, NonFinite: count})
				return nil
			}
			if err := find(bi, lo, n/2, -1); err != nil {
				return err
			}
			return find(bi, lo+n/2, n-n/2, -1)
		}
		for bi, b := range batches {
			// One batch holds them all: no need to rerun it whole.
			count := int64(-1)
			if len(batches) == 1 {
				count = o.NonFinite
			}
			if err := find(bi, 0, b.Size(), count); err != nil {
				if ctx.Err() != nil {
					return "", ctx.Err()
				}
				o.Samples = nil
				return fmt.Sprintf("the samples that hold the NaN/Inf of %s are not named: the model did not run on part of batch %d", o.Node, bi), nil
			}
		}
	}
	return "", nil
}
