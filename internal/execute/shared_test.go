package execute

import (
	"context"
	"slices"
	"testing"

	"fp16audit/internal/batch"
)

// TestBlocksBySizeAndSharedWeights: a combined graph above the session
// size (lowered here) runs in core in blocks cut for their size alone,
// whose sessions share the weights the engine mapped once; its statistics,
// shapes, comparisons and output agreement equal those of one session
// loading its own weights, its memory note stays silent (no budget made
// the cut), and the timing counts every session.
func TestBlocksBySizeAndSharedWeights(t *testing.T) {
	for _, c := range [][2]string{{"bench/llama_tiny/model.onnx", "bench/llama_tiny/batches/input_ids.npy"},
		{"torch/cases/vit_tiny/model.onnx", "torch/cases/vit_tiny/batches"}} {
		t.Run(c[0], func(t *testing.T) {
			e, passes, bs := engineFor(t, c[0], c[1])
			defer func(n int) { maxSessionNodes = n }(maxSessionNodes)
			maxSessionNodes = 1 << 30
			whole, mp, err := e.Run(context.Background(), passes, bs)
			if err != nil {
				t.Fatal(err)
			}
			if mp.blocks != nil {
				t.Fatalf("the model ran in %d blocks with no limit on a session's size", len(mp.blocks.starts))
			}
			if err := e.Share(passes[0].Model.Graph); err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			maxSessionNodes = e.sessionNodes / 4
			for run := range 2 {
				blocks, mp, err := e.Run(context.Background(), passes, bs)
				if err != nil {
					t.Fatal(err)
				}
				if mp.blocks == nil || !mp.blocks.bySize || len(mp.blocks.starts) < 4 {
					t.Fatalf("run %d: blocks %+v, want at least 4 cut for their size", run, mp.blocks)
				}
				if n := mp.Note(); n != "" {
					t.Errorf("run %d: a run in core notes %q", run, n)
				}
				if e.Weights.Mapped() == 0 && c[0] == "bench/llama_tiny/model.onnx" {
					t.Errorf("run %d: no weights of the external data file were handed over from the shared mapping", run)
				}
				tm := e.Timings()[len(e.Timings())-1]
				if tm.Created != mp.blocks.ran || tm.Sessions <= 0 || tm.Total < tm.Sessions {
					t.Errorf("run %d: timing %+v for %d blocks", run, tm, mp.blocks.ran)
				}
				for p := range passes {
					for v, w := range whole[p].Stats {
						if g := blocks[p].Stats[v]; g == nil || *g != *w {
							t.Errorf("run %d, %s %s: in blocks %+v, whole %+v", run, passes[p].Name, v, g, *w)
						}
					}
					for v, w := range whole[p].Diffs {
						if g := blocks[p].Diffs[v]; *g != *w {
							t.Errorf("run %d, %s %s: diff in blocks %+v, whole %+v", run, passes[p].Name, v, *g, *w)
						}
					}
					if len(blocks[p].Outputs) != len(whole[p].Outputs) {
						t.Fatalf("run %d, %s: %d outputs compared in blocks, %d whole", run, passes[p].Name, len(blocks[p].Outputs), len(whole[p].Outputs))
					}
					for k, w := range whole[p].Outputs {
						if g := blocks[p].Outputs[k]; *g != *w {
							t.Errorf("run %d, %s output %s: in blocks %+v, whole %+v", run, passes[p].Name, w.Name, *g, *w)
						}
					}
				}
			}
		})
	}
}

// TestKeptReferenceOutputs: a rerun whose fp32 pass runs for its outputs
// alone, on the batches an earlier Run compared, drops that pass and
// compares with the outputs the earlier Run kept: the same comparisons as
// a fresh engine that runs it, in one session and in blocks. A rerun in
// parts, or on other inputs, runs its reference again.
func TestKeptReferenceOutputs(t *testing.T) {
	for _, c := range [][2]string{{"models/mlp_dynamic.onnx", "batches/mlp_dynamic_b5.npy"},
		{"torch/cases/token_transformer_overflow/model.onnx", "torch/cases/token_transformer_overflow/batches"},
		{"torch/cases/two_inputs_metadata/model.onnx", "torch/cases/two_inputs_metadata/batches"}} {
		t.Run(c[0], func(t *testing.T) {
			e, passes, bs := engineFor(t, c[0], c[1])
			rerun := []Pass{{Name: "fp32", Model: passes[0].Model, OutputsOnly: true},
				{Name: "fp16+fix", Model: passes[1].Model, OutputRef: "fp32"}}
			fresh, _, _ := engineFor(t, c[0], c[1])
			want, _, err := fresh.Run(context.Background(), rerun, bs)
			if err != nil {
				t.Fatal(err)
			}
			for _, blocks := range []int{0, 2} {
				e.forceBlocks = blocks
				if _, _, err := e.Run(context.Background(), passes, bs); err != nil {
					t.Fatal(err)
				}
				if !e.refs.has(passes[0].Model, bs) {
					t.Fatalf("blocks %d: the fp32 outputs of the main run were not kept", blocks)
				}
				if _, skip := e.withKeptRef(rerun, bs); skip != 0 {
					t.Fatalf("blocks %d: the rerun keeps its fp32 pass (%d)", blocks, skip)
				}
				nodes := e.sessionNodes
				got, _, err := e.Run(context.Background(), rerun, bs)
				if err != nil {
					t.Fatal(err)
				}
				if blocks == 0 && e.sessionNodes >= nodes {
					t.Errorf("the rerun's graph has %d nodes, the main run's %d: its fp32 pass was not dropped", e.sessionNodes, nodes)
				}
				if len(got) != 2 || len(got[1].Outputs) == 0 || len(got[1].Outputs) != len(want[1].Outputs) {
					t.Fatalf("blocks %d: %d results, outputs %d against %d", blocks, len(got), len(got[1].Outputs), len(want[1].Outputs))
				}
				for k, w := range want[1].Outputs {
					if g := got[1].Outputs[k]; *g != *w {
						t.Errorf("blocks %d, output %s: with kept outputs %+v, run %+v", blocks, w.Name, *g, *w)
					}
				}
				for v, w := range want[1].Stats {
					if g := got[1].Stats[v]; *g != *w {
						t.Errorf("blocks %d, %s: with kept outputs %+v, run %+v", blocks, v, *g, *w)
					}
				}
			}
			// In parts the kept whole-batch outputs do not serve: the
			// reference runs again, with the same outcome.
			e.forceBlocks, e.forceStep = 0, 1
			got, _, err := e.Run(context.Background(), rerun, bs)
			if err != nil {
				t.Fatal(err)
			}
			if len(got[1].Outputs) != len(want[1].Outputs) {
				t.Fatalf("in parts: %d outputs compared, want %d", len(got[1].Outputs), len(want[1].Outputs))
			}
			e.forceStep = 0
			// Other inputs (a copy of any one of the batch's) find
			// nothing kept.
			for k := range bs[0].Inputs {
				cp := *bs[0].Inputs[k]
				cp.Data = slices.Clone(cp.Data)
				ins := slices.Clone(bs[0].Inputs)
				ins[k] = &cp
				other := []batch.Batch{{Source: "copy", Inputs: ins}}
				if _, skip := e.withKeptRef(rerun, other); skip >= 0 {
					t.Errorf("a rerun with input %d copied would use outputs kept for the audit's batch", k)
				}
			}
		})
	}
}
