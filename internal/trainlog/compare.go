package trainlog

import (
	"math"

	"fp16audit/report"
)

// compareByStep sets the run's final loss against the baseline's when
// either log is sampled: over the steps both span, the final window is a
// tenth of them (at least the widest gap between samples, so that both
// logs have entries in it), and each log's finite losses in it are
// averaged.
func (f *Facts) compareByStep(b *Log) {
	run := f.run
	lo, hi := max(run.FirstStep, b.FirstStep), min(run.LastStep(), b.LastStep())
	if hi < lo {
		f.notDerived("the gap to the fp32 baseline: the run spans %ss %d–%d and the baseline %d–%d, which do not overlap", f.unit(), run.FirstStep, run.LastStep(), b.FirstStep, b.LastStep())
		return
	}
	span := hi - lo + 1
	w := min(max(finalWindow(span), widestGap(run), widestGap(b)), span)
	from := hi - w + 1
	window := func(l *Log) *float64 {
		var xs []float64
		for i, v := range l.Losses {
			if s := l.Step(i); s >= from && s <= hi {
				xs = append(xs, v)
			}
		}
		return meanFinite(xs)
	}
	rl, bl := window(run), window(b)
	if rl == nil || bl == nil {
		f.notDerived("the gap to the fp32 baseline: no finite losses of both logs in %ss %d–%d", f.unit(), from, hi)
		return
	}
	c := &report.Comparison{Steps: span, Window: w, RunLoss: *rl, BaselineLoss: *bl, Tolerance: f.opt.PlateauTolerance}
	c.Gap = f.gap(*rl, *bl)
	f.note("the final losses are compared by %s number: the means of each log's losses in %ss %d–%d, the last %d of the %d %ss both logs span", f.unit(), f.unit(), from, hi, w, span, f.unit())
	f.r.Comparison = c
	f.compareValid(b)
}

// widestGap is the largest step difference between consecutive entries.
func widestGap(l *Log) int {
	w := 1
	for i := 1; i < l.Len(); i++ {
		w = max(w, l.Step(i)-l.Step(i-1))
	}
	return w
}

// compareValid adds the validation losses of two per-epoch logs to the
// notes: fastai's history.csv has them, and a plateau shows there too.
func (f *Facts) compareValid(b *Log) {
	if f.run.ValidLosses == nil || b.ValidLosses == nil {
		return
	}
	last := func(l *Log, upTo int) (float64, int, bool) {
		for i := l.Len() - 1; i >= 0; i-- {
			if s := l.Step(i); s <= upTo && isFinite(l.ValidLosses[i]) {
				return l.ValidLosses[i], s, true
			}
		}
		return 0, 0, false
	}
	upTo := min(f.run.LastStep(), b.LastStep())
	rv, re, ok1 := last(f.run, upTo)
	bv, be, ok2 := last(b, upTo)
	if !ok1 || !ok2 || re != be || math.Abs(bv) < 1e-12 {
		return
	}
	f.note("valid_loss at epoch %d: %.4g against the baseline's %.4g (%+.1f%%)", re, rv, bv, 100*(rv-bv)/math.Abs(bv))
}

// checkSkippedFlags sets a log's own skipped column against the backoffs
// of its scales.
func (f *Facts) checkSkippedFlags() {
	flags := f.run.Skipped
	if flags == nil {
		return
	}
	marked, unmarked := 0, 0
	for i, k := range f.kind {
		switch {
		case flags[i] == 1 && k != stepBackoff:
			marked++
		case flags[i] == 0 && k == stepBackoff:
			unmarked++
		}
	}
	if marked > 0 {
		f.note("the log marks %d steps skipped whose scale did not back off (cancelled by something other than the scaler, such as a fastai callback); they are not counted as overflows", marked)
	}
	if unmarked > 0 {
		f.note("the scale backed off on %d steps the log does not mark skipped: is the scale read after scaler.update()?", unmarked)
	}
}

// scalesFromSkipped rebuilds the scale series of a log that marks skipped
// steps but records no scale, with GradScaler's rule and the log's (or
// PyTorch's default) settings: the skipped steps are the log's own, the
// scale values hold only for those settings.
func (f *Facts) scalesFromSkipped() {
	l := f.run
	if l.Steps != nil || l.PerEpoch {
		f.notDerived("the scale from the skipped column: the log does not hold every step")
		return
	}
	for _, flag := range l.Skipped {
		if flag < 0 {
			f.notDerived("the scale from the skipped column: some steps do not say whether they were skipped")
			return
		}
	}
	cfg := l.Scaler
	from := "the log's"
	if cfg.InitScale == 0 || cfg.GrowthInterval == 0 {
		from = "PyTorch's default"
	}
	if cfg.InitScale == 0 {
		cfg.InitScale = DefaultScaler.InitScale
	}
	if cfg.GrowthInterval == 0 {
		cfg.GrowthInterval = DefaultScaler.GrowthInterval
	}
	if cfg.GrowthFactor == 0 {
		cfg.GrowthFactor = DefaultScaler.GrowthFactor
	}
	if cfg.BackoffFactor == 0 {
		cfg.BackoffFactor = DefaultScaler.BackoffFactor
	}
	scale, tracker := float32(cfg.InitScale), 0
	sc := make([]float64, len(l.Skipped))
	for i, flag := range l.Skipped {
		if flag == 1 {
			scale *= float32(cfg.BackoffFactor)
			tracker = 0
		} else if tracker++; tracker == cfg.GrowthInterval {
			if g := scale * float32(cfg.GrowthFactor); !math.IsInf(float64(g), 0) {
				scale = g
			}
			tracker = 0
		}
		sc[i] = float64(scale)
	}
	cp := *l
	cp.Scales = sc
	f.run = &cp
	f.note("the log records no scale but marks skipped steps: the scale after each step was rebuilt with GradScaler's rule from %s init_scale %s and growth_interval %d; the skipped steps are the log's own, the scale values (minimum, pinning, collapse) hold only if the run used those settings",
		from, report.FormatScale(cfg.InitScale), cfg.GrowthInterval)
}

// sampledWarmup qualifies the warm-up of a sampled log, which the samples
// bound rather than show.
func (f *Facts) sampledWarmup() string {
	if f.sampled {
		return "judging by the samples, "
	}
	return ""
}
