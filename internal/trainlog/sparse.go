package trainlog

import (
	"math"

	"fp16audit/report"
)

// gap is the stretch of steps between two scale samples: the steps
// from+1..to, whose last one the sample at entry shows. Between them the
// scale changed by growth_factor^net, so at least kmin and at most kmax of
// the d steps were skipped.
type gap struct {
	entry, from, to, d, net, kmin, kmax int
	scale                               float64
}

func (g gap) full() bool { return g.kmin == g.d }

// sparseScales reconstructs what a sampled scale series proves. Between two
// samples d steps apart whose scale changed by growth_factor^net, GradScaler
// made g growths and k backoffs with g − k = net: at least max(0, −net)
// steps were skipped, and since each growth needs growth_interval clean
// steps, at most (d + net + interval − 1)/(interval + 1) − net. Skip counts
// and rates are the lower bounds; a fall of the scale, a collapse before a
// NaN and a long stretch without growth are what the samples show, and the
// report says what they cannot.
func (f *Facts) sparseScales() {
	f.sampled = true
	l, sc := f.run, f.run.Scales
	var idx []int
	for i, s := range sc {
		if !math.IsNaN(s) {
			idx = append(idx, i)
		}
	}
	info := f.resolveSampledScaler(sc[idx[0]])
	f.r.GradScaler = &info
	f.cfg = info.ScalerConfig
	interval, gf, bf := f.cfg.GrowthInterval, f.cfg.GrowthFactor, f.cfg.BackoffFactor
	every := commonGap(stepsOf(f, idx))
	f.every = every
	st := &report.ScaleStats{SkippedAt: []int{}, SkippedLowerBound: true, FinalScale: sc[idx[len(idx)-1]], MinScale: math.Inf(1)}
	f.skips = make([]int, f.n)

	prevStep, prevScale := f.step(idx[0]), sc[idx[0]]
	fromStart := prevStep >= 0 && prevStep <= every
	if fromStart {
		// The log starts within one sampling gap of step 0: the first
		// sample follows init_scale.
		prevStep, prevScale = -1, f.cfg.InitScale
	} else {
		f.notDerived("what the scaler did before step %d, where the log starts", prevStep)
	}
	startStep := prevStep + 1
	if fromStart {
		// The run is read from step 0: the report describes the steps the
		// diagnosis covers, the first sample still shows where the log
		// starts.
		f.r.Run.FirstStep, f.r.Run.Steps = startStep, f.step(f.n-1)-startStep+1
		f.steps = f.r.Run.Steps
	}
	var gaps []gap
	maxTotal, odd, tooFast := 0, -1, -1
	for j, i := range idx {
		t, s := f.step(i), sc[i]
		if s < st.MinScale {
			st.MinScale, st.MinScaleStep = s, t
		}
		st.MaxScale = max(st.MaxScale, s)
		if j == 0 && !fromStart {
			continue
		}
		g := gap{entry: i, from: prevStep, to: t, d: t - prevStep, scale: s}
		net, exact := netGrowths(prevScale, s, gf, bf)
		if !exact && odd < 0 {
			odd = t
		}
		g.net, g.kmin = net, max(0, -net)
		if l.Skipped != nil && l.Skipped[i] == 1 {
			g.kmin = max(g.kmin, 1)
		}
		g.kmax = g.d
		if closeTo(gf*bf, 1) {
			gmax := max((g.d+net+interval-1)/(interval+1), 0)
			g.kmax = min(g.d, max(gmax-net, g.kmin))
			if net > 0 && gmax < net && tooFast < 0 {
				tooFast = t
			}
		}
		if g.kmin > g.d {
			if tooFast < 0 {
				tooFast = t
			}
			g.kmin = g.d
		}
		f.skips[i] = g.kmin
		st.Skipped += g.kmin
		maxTotal += g.kmax
		if net > 0 {
			st.Growths += net
		}
		gaps = append(gaps, g)
		prevStep, prevScale = t, s
	}
	if odd >= 0 {
		f.note("the scale at step %d is not the one before times a power of the growth factor %g: is the scale read after scaler.update()?", odd, gf)
	}
	if tooFast >= 0 {
		f.note("the scale changed faster than GradScaler can by step %d (more halvings than steps, or more growths than growth_interval %d allows): are the step numbers optimizer steps?", tooFast, interval)
	}
	span := f.step(f.n-1) - startStep + 1
	st.SkippedMax = &maxTotal
	st.SkipRate = float64(st.Skipped) / float64(max(span, 1))

	f.sampledNaN(st, gaps)
	cutStep := f.step(f.n-1) + 1
	if f.nanStep >= 0 {
		cutStep = f.nanStep
	}

	// The warm-up: the skipped steps that the first gaps prove, as long as
	// the gaps were skipped throughout, and those of the first gap that
	// was not (GradScaler's warm-up is a run from step 0).
	if fromStart {
		for _, g := range gaps {
			if g.to >= cutStep || g.kmin == 0 {
				break
			}
			f.warmup += g.kmin
			st.WarmupScale = g.scale
			if !g.full() {
				break
			}
		}
	}
	st.WarmupSkipped = f.warmup
	if f.warmup == 0 {
		st.WarmupScale = 0
	}
	f.warmupEnd = startStep + f.warmup

	judgedSkips := 0
	for _, g := range gaps {
		if g.to < cutStep {
			judgedSkips += g.kmin
		}
	}
	f.judged = max(cutStep-startStep-f.warmup, 0)
	f.judgedSkips = max(judgedSkips-f.warmup, 0)
	if f.judged > 0 {
		st.SkipRateAfterWarmup = float64(f.judgedSkips) / float64(f.judged)
	}
	f.skipThreshold = max(f.opt.SkipRate, 2/float64(interval+1))
	f.highSkip = f.judged > 0 && st.SkipRateAfterWarmup > f.skipThreshold

	// The longest run of skipped steps: gaps skipped throughout chain
	// together; inside any other gap, k skips among d steps leave at most
	// d − k + 1 runs, so one of them is at least k/(d − k + 1) long.
	run, runFrom := 0, 0
	for _, g := range gaps {
		if g.full() {
			if run == 0 {
				runFrom = g.from + 1
			}
			run += g.d
		} else {
			run = 0
			if g.kmin > 0 {
				if r := (g.kmin + g.d - g.kmin) / (g.d - g.kmin + 1); r > st.LongestBackoffRun {
					st.LongestBackoffRun, st.LongestBackoffRunStart = r, g.from+1
				}
			}
		}
		if run > st.LongestBackoffRun {
			st.LongestBackoffRun, st.LongestBackoffRunStart = run, runFrom
		}
	}

	// Stretches without growth, between the gaps whose scale rose: the
	// samples show no growth there, though a growth that a backoff undid
	// before the next sample leaves no trace.
	stretchFrom, backoffs, lastScale, lastStep := f.warmupEnd, 0, 0.0, -1
	flush := func(to int, scale float64) {
		if n := to - stretchFrom + 1; to >= stretchFrom && n > st.LongestNoGrowth {
			st.LongestNoGrowth, st.LongestNoGrowthStart, st.LongestNoGrowthBackoffs = n, stretchFrom, backoffs
			st.Pinned = n >= f.opt.PinnedIntervals*interval && backoffs >= f.opt.PinnedIntervals
			st.PinnedScale = 0
			if st.Pinned {
				st.PinnedScale = scale
			}
		}
	}
	for _, g := range gaps {
		if g.to >= cutStep {
			break
		}
		if g.to < f.warmupEnd {
			lastScale, lastStep = g.scale, g.to
			continue
		}
		if g.net > 0 {
			flush(g.from, lastScale)
			stretchFrom, backoffs = g.to, 0
		} else {
			backoffs += g.kmin
		}
		lastScale, lastStep = g.scale, g.to
	}
	if lastStep >= 0 {
		flush(lastStep, lastScale)
	}
	f.pinnedLow = st.Pinned && st.PinnedScale <= f.opt.LowScale
	if !f.pinnedLow {
		var pts []scalePoint
		for _, g := range gaps {
			if g.to >= f.warmupEnd && g.to < cutStep {
				pts = append(pts, scalePoint{g.to, g.scale})
			}
		}
		f.heldDown(st, pts, cutStep-startStep)
	}

	f.r.Scales = st
	f.notDerived("which steps were skipped and how many exactly: the log holds one step in %d (%d samples over %d steps); the scale ratios between samples prove at least %d skipped steps, and growth_interval %d (%s) allows at most %d",
		every, len(idx), span, st.Skipped, interval, info.GrowthIntervalFrom, maxTotal)
	f.notDerived("growths that a backoff undid before the next sample: they leave the scale unchanged, so the growths (%d) and the stretches without growth are those the samples show; the minimum and maximum scale are the samples'", st.Growths)
}

// sampledNaN settles the failing NaN of a sampled log: the loss's, placed
// between two samples, or, without losses, the start of the gaps skipped
// throughout that reach the end of the log (at least eight steps: NaN
// gradients overflow at every scale). It then measures how far the scale
// fell before it.
func (f *Facts) sampledNaN(st *report.ScaleStats, gaps []gap) {
	if f.run.Losses == nil {
		total, k := 0, len(gaps)
		for k > 0 && gaps[k-1].full() {
			k--
			total += gaps[k].d
		}
		if total >= allSkippedRun {
			g := gaps[k]
			f.nanIdx, f.nanStep = g.entry, g.from+1
			at := f.nanStep
			st.InferredNaNStep = &at
			f.note("the log has no losses; the samples from step %d to the end show every step skipped (%d halvings in %d steps), which is what a NaN loss does: the first NaN is taken to be at step %d",
				g.from+1, total, total, g.from+1)
		}
	} else if f.nanIdx > 0 && f.run.Sampled() {
		f.note("the loss went NaN/Inf for good at step %d or before, after step %d: the log holds one step in %d", f.nanStep, f.step(f.nanIdx-1), f.r.Run.SampleEvery)
	}
	if f.nanStep < 0 {
		return
	}
	at := f.cfg.InitScale
	for _, g := range gaps {
		if g.to < f.nanStep {
			at = g.scale
		}
	}
	st.ScaleAtFirstNaN = &at
	w := max(2*f.cfg.GrowthInterval, 20)
	from := max(f.nanStep-w, f.warmupEnd)
	top, seen := at, false
	for _, g := range gaps {
		if g.to >= from && g.to < f.nanStep {
			top = max(top, g.scale)
			st.BackoffsBeforeNaN += g.kmin
			// The backoffs of a gap whose sample holds a non-finite loss
			// may be that loss's; only the others surely show
			// gradients overflowing.
			if f.run.Losses == nil || isFinite(f.run.Losses[g.entry]) {
				st.GradientBackoffsBeforeNaN += g.kmin
			}
			seen = true
		}
	}
	if !seen {
		f.notDerived("how far the scale fell before the first NaN: no sample lies in the %d steps before it", w)
		return
	}
	bits := collapseBits(top, at)
	st.CollapseBits = &bits
	st.CollapseWindow = f.nanStep - from
	f.collapse = bits >= f.opt.CollapseBits && float64(st.GradientBackoffsBeforeNaN)*math.Log2(1/f.cfg.BackoffFactor) >= f.opt.CollapseBits
}

// resolveSampledScaler settles the configuration of a sampled log: the
// log's values, else PyTorch's defaults. The growth interval cannot be
// read off samples.
func (f *Facts) resolveSampledScaler(first float64) report.ScalerInfo {
	c := f.run.Scaler
	info := report.ScalerInfo{InitScaleFrom: "log", GrowthIntervalFrom: "log"}
	if c.GrowthFactor == 0 {
		c.GrowthFactor = DefaultScaler.GrowthFactor
	}
	if c.BackoffFactor == 0 {
		c.BackoffFactor = DefaultScaler.BackoffFactor
	}
	if c.InitScale == 0 {
		c.InitScale, info.InitScaleFrom = DefaultScaler.InitScale, "default"
		if _, exact := netGrowths(c.InitScale, first, c.GrowthFactor, c.BackoffFactor); !exact {
			c.InitScale, info.InitScaleFrom = first, "inferred"
			f.note("the first scale %s is not PyTorch's default init_scale 65536 times a power of two: init_scale taken as %s", report.FormatScale(first), report.FormatScale(first))
		}
	}
	if c.GrowthInterval == 0 {
		c.GrowthInterval, info.GrowthIntervalFrom = DefaultScaler.GrowthInterval, "default"
		f.note("growth_interval taken as PyTorch's default 2000: samples cannot show it; a log that states it (grad_scaler in the JSON form, the companion's header) bounds the skipped steps more tightly")
	}
	info.ScalerConfig = c
	return info
}

// netGrowths is the number n with s = prev × growth^n (negative: backoffs),
// and whether the ratio is a whole power. A scale halved to zero counts
// from float32's smallest subnormal.
func netGrowths(prev, s, growth, backoff float64) (int, bool) {
	if s == 0 {
		s = math.SmallestNonzeroFloat32 * backoff
	}
	r := s / prev
	var x float64
	if r >= 1 {
		x = math.Log(r) / math.Log(growth)
	} else {
		x = -math.Log(r) / math.Log(backoff)
	}
	n := math.Round(x)
	exact := math.Abs(x-n) < 1e-6
	if !exact {
		// Not a whole power: count only the growths it proves, and the
		// backoffs it needs.
		n = math.Floor(x)
	}
	return int(n), exact
}

func stepsOf(f *Facts, idx []int) []int {
	out := make([]int, len(idx))
	for j, i := range idx {
		out[j] = f.step(i)
	}
	return out
}
