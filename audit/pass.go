package audit

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"fp16audit/batch"
	ort "fp16audit/runtime"
	"fp16audit/tensor"
)

// passResult holds what one pass learned: statistics per observed value,
// aggregated over every batch, the shape each value had in the first batch,
// and, for passes compared with a reference, the per-value differences.
type passResult struct {
	Stats  map[string]*Stats
	Shapes map[string][]int64
	Diffs  map[string]*Diff
}

// Progress is told about every finished pass of every batch; nil discards.
type Progress func(pass string, batch, batches int)

// passRun is one pass in flight: a session over an instrumented graph, the
// values it returns, and where its results go. A run with a ref is compared
// element by element with that run's outputs for the same batch.
type passRun struct {
	name string
	sess *ort.Session
	obs  []observed
	res  *passResult
	ref  *passRun
}

func newPassRun(name string, sess *ort.Session, obs []observed, ref *passRun) *passRun {
	res := &passResult{Stats: make(map[string]*Stats, len(obs)), Shapes: make(map[string][]int64, len(obs))}
	for _, o := range obs {
		s := NewStats()
		res.Stats[o.Name] = &s
	}
	if ref != nil {
		res.Diffs = make(map[string]*Diff, len(obs))
		for _, o := range obs {
			res.Diffs[o.Name] = &Diff{}
		}
	}
	return &passRun{name: name, sess: sess, obs: obs, res: res, ref: ref}
}

// runPasses runs every batch through every pass, in the order given (a
// reference before the passes compared with it). Statistics of a run's
// outputs are computed on all cores while they are alive; a batch's outputs
// are dropped once no later pass needs them.
func runPasses(ctx context.Context, runs []*passRun, batches []batch.Batch, progress Progress) error {
	isRef := map[*passRun]bool{}
	refIndex := map[*passRun]map[string]int{}
	for _, r := range runs {
		if r.ref != nil && !isRef[r.ref] {
			isRef[r.ref] = true
			m := make(map[string]int, len(r.ref.obs))
			for i, o := range r.ref.obs {
				m[o.Name] = i
			}
			refIndex[r.ref] = m
		}
	}
	workers := runtime.GOMAXPROCS(0)
	for bi, b := range batches {
		kept := map[*passRun][]*tensor.Tensor{}
		for _, r := range runs {
			if err := ctx.Err(); err != nil {
				return err
			}
			outs, err := r.sess.RunReused(b.Inputs)
			if err != nil {
				return fmt.Errorf("%s pass, batch %s: %w", r.name, b.Source, err)
			}
			var refOuts []*tensor.Tensor
			if r.ref != nil {
				refOuts = kept[r.ref]
			}
			r.observe(outs, refOuts, refIndex[r.ref], bi, workers)
			if isRef[r] {
				kept[r] = outs
			}
			if progress != nil {
				progress(r.name, bi+1, len(batches))
			}
		}
	}
	return nil
}

// observe folds one batch's outputs, one per observed value in obs order,
// into the statistics, and compares them with the reference outputs.
func (r *passRun) observe(outs, refOuts []*tensor.Tensor, refIndex map[string]int, batchIndex, workers int) {
	for i, o := range r.obs {
		if _, ok := r.res.Shapes[o.Name]; !ok {
			r.res.Shapes[o.Name] = outs[i].Shape
		}
	}
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				t := outs[i]
				if t.DType != tensor.Float32 {
					continue
				}
				y := ort.Float32View(t)
				name := r.obs[i].Name
				r.res.Stats[name].Observe(y, batchIndex)
				if refOuts == nil {
					continue
				}
				if j, ok := refIndex[name]; ok && refOuts[j].DType == tensor.Float32 {
					r.res.Diffs[name].Observe(y, ort.Float32View(refOuts[j]))
				}
			}
		}()
	}
	for i := range r.obs {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
}
