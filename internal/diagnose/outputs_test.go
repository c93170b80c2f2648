package diagnose

import (
	"context"
	"testing"

	"fp16audit/checks"
	"fp16audit/internal/diagnose/fix"
	"fp16audit/internal/observe"
	"fp16audit/report"
)

// outputDiffs compares the graph outputs y and z of mlp(): y off by
// yErr relative to fp32 in one of two samples, z exact.
func outputDiffs(yErr float32) []*observe.OutputDiff {
	ref := []float32{1, 2, 3, 4, 1, 2, 3, 4}
	y := append([]float32(nil), ref...)
	for i := 4; i < 8; i++ {
		y[i] *= 1 - yErr
	}
	dy, dz := observe.NewOutputDiff("y"), observe.NewOutputDiff("z")
	dy.Observe(0, 0, []int64{2, 4}, []int64{2, 4}, y, ref)
	dz.Observe(0, 0, []int64{2, 4}, []int64{2, 4}, ref, ref)
	return []*observe.OutputDiff{dy, dz}
}

// outputRunner answers reruns with finite values whose outputs are off by
// err (0: they agree).
type outputRunner struct {
	values []string
	err    float32
}

func (rn *outputRunner) Rerun(_ context.Context, r fix.Rerun) (*observe.PassResult, error) {
	res := result(r.Name, rn.values, nil)
	res.Outputs = outputDiffs(rn.err)
	return res, nil
}

// absorbed is an overflow at h to -Inf that the Relu absorbs: nothing
// non-finite reaches y or z.
func absorbed() map[string]*observe.Stats {
	return map[string]*observe.Stats{"h": bad(6e4, 0, 0, 3)}
}

// TestWrongOutputs: outputs finite but beyond the tolerance decide like
// NaN/Inf in them, with the absorbed overflow as the origin (or, when
// nothing overflows, where the error starts); within it an absorbed
// overflow is a warning; a fix works only when its outputs agree.
func TestWrongOutputs(t *testing.T) {
	big := map[string]*observe.Stats{"h": fin(1e5), "r": fin(1e5)}
	for _, tc := range []struct {
		name      string
		fp16      map[string]*observe.Stats
		yErr      float32 // of the fp16 pass's output y
		diffs     map[string]float64
		rerunErr  float32
		checks    string // --checks ("": all)
		want      outcome
		wantCause string
	}{
		{name: "absorbed overflow, outputs wrong", fp16: absorbed(), yErr: 0.9,
			want: outcome{verdict: report.VerdictOverflow, origin: "/fc1/MatMul", errors: []string{"FP2001", "FP2006"},
				text: "outputs finite but wrong (rel. error 90 % in the worst sample", fixes: []string{"keep-fp32=works"}},
			wantCause: report.CauseOverflow},
		{name: "a fix whose outputs stay wrong does not work", fp16: absorbed(), yErr: 0.9, rerunErr: 0.5,
			want: outcome{verdict: report.VerdictOverflow, origin: "/fc1/MatMul", errors: []string{"FP2001", "FP2006"},
				text: "fc1 (MatMul) overflows fp16", fixes: []string{"keep-fp32=fails"}},
			wantCause: report.CauseOverflow},
		{name: "absorbed overflow, outputs within the tolerance", fp16: absorbed(), yErr: 0.01,
			want: outcome{verdict: report.VerdictHealthy, text: "outputs within 1 % of fp32 (tolerance 5 %)"}},
		{name: "nothing overflows, the outputs are wrong", yErr: 0.5, diffs: map[string]float64{"h": 0.5, "r": 0.5, "y": 0.5},
			want: outcome{verdict: report.VerdictPrecision, origin: "/fc1/MatMul", errors: []string{"FP2006", "FP3002"},
				text: "rounding to fp16 loses the outputs: from fc1 (MatMul) on, the values stay in range and lose significant digits (error 50 % there against fp32, fp32 max |x| 1e+05): keep fc1 in fp32 (verified by a rerun)", fixes: []string{"keep-fp32=works"}},
			wantCause: report.CausePrecision},
		{name: "rounding loses the outputs, FP3002 off", yErr: 0.5, diffs: map[string]float64{"h": 0.5, "r": 0.5, "y": 0.5}, checks: "all,-FP3002",
			want: outcome{verdict: report.VerdictHealthy, errors: []string{"FP2006"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := world{g: mlp(), policy: "autocast-fp16", passes: map[string]map[string]*observe.Stats{report.PassFP32: big, report.PassFP16: tc.fp16}}
			f, batches := w.facts(t)
			main := f.Passes[report.PassFP16]
			main.Outputs = outputDiffs(tc.yErr)
			main.Diffs = map[string]*observe.Diff{}
			for _, v := range f.Values {
				e := tc.diffs[v]
				main.Diffs[v] = &observe.Diff{SumSqRef: 1, SumSqDiff: e * e, BothFinite: 16, NonzeroRef: 16}
			}
			var opt Options
			if tc.checks != "" {
				sel, err := checks.ParseSelection(tc.checks)
				if err != nil {
					t.Fatal(err)
				}
				opt.Checks = sel
			}
			d, err := Run(context.Background(), f, &outputRunner{values: f.Values, err: tc.rerunErr}, batches, opt)
			if err != nil {
				t.Fatal(err)
			}
			check(t, d, tc.want)
			if tc.wantCause != "" && (len(d.Origins) == 0 || d.Origins[0].Cause != tc.wantCause || len(d.Origins[0].WrongOutputs) != 1 || d.Origins[0].WrongOutputs[0] != "y") {
				t.Errorf("origins %+v, want cause %s with the wrong output y", d.Origins, tc.wantCause)
			}
			var rows int
			for _, a := range d.OutputAgreement {
				if a.Pass == report.PassFP16 {
					rows++
				}
			}
			if rows != 2 {
				t.Errorf("output agreement %+v, want y and z of the fp16 pass", d.OutputAgreement)
			}
		})
	}
}
