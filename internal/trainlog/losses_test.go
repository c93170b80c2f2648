package trainlog_test

import (
	"math"
	"testing"

	"fp16audit/internal/trainlog"
	"fp16audit/report"
)

// TestLossWindows: the loss summary records the steps its windows span,
// how many losses end the log as NaN/Inf and the last finite one, so that
// a run that ended in NaN does not read as ending at its final window.
func TestLossWindows(t *testing.T) {
	nan := math.NaN()
	losses := func(n, nanFrom, nanTo int) []float64 {
		ls := make([]float64, n)
		for i := range ls {
			ls[i] = 3 - 0.001*float64(i)
			if i >= nanFrom && i < nanTo {
				ls[i] = nan
			}
		}
		return ls
	}
	for _, c := range []struct {
		name       string
		log        *trainlog.Log
		first      report.StepRange
		final      report.StepRange
		trailing   int
		lastFinite int // -1: none
	}{
		{"nan tail", &trainlog.Log{Losses: losses(600, 5, 600)}, report.StepRange{From: 0, To: 0}, report.StepRange{From: 4, To: 4}, 595, 4},
		// A run that went on from its NaN steps is judged by its end.
		{"recovered", &trainlog.Log{Losses: losses(1000, 500, 503)}, report.StepRange{From: 0, To: 99}, report.StepRange{From: 900, To: 999}, 0, 999},
		{"clean, csv steps", &trainlog.Log{FirstStep: 100, Losses: losses(300, -1, -1)}, report.StepRange{From: 100, To: 129}, report.StepRange{From: 370, To: 399}, 0, 399},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := analyze(t, c.log, nil, trainlog.DefaultOptions).Losses
			if l.FirstSteps == nil || *l.FirstSteps != c.first || l.FinalSteps == nil || *l.FinalSteps != c.final {
				t.Errorf("windows %v and %v, want %v and %v", l.FirstSteps, l.FinalSteps, c.first, c.final)
			}
			if l.TrailingNonFinite != c.trailing {
				t.Errorf("%d trailing NaN/Inf, want %d", l.TrailingNonFinite, c.trailing)
			}
			if l.LastFiniteStep == nil || *l.LastFiniteStep != c.lastFinite {
				t.Errorf("last finite step %v, want %d", l.LastFiniteStep, c.lastFinite)
			}
		})
	}
	l := analyze(t, &trainlog.Log{Losses: []float64{nan, nan}}, nil, trainlog.DefaultOptions).Losses
	if l.LastFiniteStep != nil || l.TrailingNonFinite != 2 || l.FinalSteps != nil {
		t.Errorf("all-NaN log: last finite %v, trailing %d, final window %v", l.LastFiniteStep, l.TrailingNonFinite, l.FinalSteps)
	}
}

// TestBaselineSeries: with a baseline, each bucket holds the mean of the
// baseline's losses over the same steps, for the plots.
func TestBaselineSeries(t *testing.T) {
	run := &trainlog.Log{Losses: make([]float64, 240)}
	base := &trainlog.Log{Losses: make([]float64, 200)}
	for i := range run.Losses {
		run.Losses[i] = 2
	}
	for i := range base.Losses {
		base.Losses[i] = float64(i)
	}
	r := analyze(t, run, base, trainlog.DefaultOptions)
	first, last := r.Series[0], r.Series[len(r.Series)-1]
	if first.From != 0 || first.To != 1 || first.BaselineLoss == nil || *first.BaselineLoss != 0.5 {
		t.Errorf("first bucket %+v, want steps 0–1 with baseline mean 0.5", first)
	}
	if last.BaselineLoss != nil {
		t.Errorf("bucket of steps %d–%d has a baseline loss, but the baseline ends at step 199", last.From, last.To)
	}
	if r := analyze(t, run, nil, trainlog.DefaultOptions); r.Series[0].BaselineLoss != nil {
		t.Errorf("baseline loss without a baseline")
	}
}
