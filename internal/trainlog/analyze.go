package trainlog

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"fp16audit/checks"
	"fp16audit/report"
)

// Options are the thresholds of the diagnosis; the report records them.
type Options = report.ScalesThresholds

// DefaultOptions are the thresholds the command line starts from.
var DefaultOptions = Options{
	PlateauTolerance: 0.03,
	EarlySteps:       200,
	SkipRate:         0.01,
	LowScale:         64,
	PinnedIntervals:  3,
	CollapseBits:     4,
	WarmupSkips:      5,
	// The threshold `fp16audit run` uses for an fp16 value (FP3001).
	UnderflowFraction: 0.10,
}

// Limits on what a report lists.
const (
	// SeriesBuckets is the most buckets Report.Series holds.
	SeriesBuckets = 120
	// MaxListedSteps is the most skipped steps report.ScaleStats.SkippedAt lists.
	MaxListedSteps = 1000
	// allSkippedRun is the shortest run of backoffs reaching the end of a
	// log without losses that is read as a NaN loss: eight halvings are
	// not a probe of a higher scale.
	allSkippedRun = 8
	// finalWindowMax caps the number of steps averaged into a final loss.
	finalWindowMax = 200
)

type stepKind uint8

const (
	stepUnknown stepKind = iota
	stepClean
	stepBackoff
	stepGrowth
)

// Analyze reconstructs what GradScaler did in run, compares it with the
// fp32 baseline when one is given (nil otherwise) and classifies the run.
func Analyze(run, baseline *Log, opt Options) *report.ScalesReport {
	a := &analysis{run: run, opt: opt, n: run.Len(), nanIdx: -1, nanStep: -1}
	a.steps = a.n
	if run.Steps != nil {
		a.steps = run.LastStep() - run.FirstStep + 1
	}
	a.r = &report.ScalesReport{
		Schema: report.ScalesSchema, Run: runInfo(run), Thresholds: opt,
		Findings: []checks.Finding{}, NotDerived: []string{}, Notes: []string{},
	}
	a.r.Notes = append(a.r.Notes, run.Notes...)
	a.r.NotDerived = append(a.r.NotDerived, run.NotDerived...)
	if baseline != nil {
		bi := runInfo(baseline)
		a.r.Baseline = &bi
	}
	a.losses()
	if a.nanIdx >= 0 {
		a.nanStep = a.step(a.nanIdx)
	}
	if run.Scales == nil && run.Skipped != nil {
		a.scalesFromSkipped()
	}
	if a.run.Scales != nil && !a.dense() {
		a.sparseScales()
	} else {
		a.scales()
	}
	if run.Sampled() && run.Losses != nil {
		a.note("the first and final losses are means over samples, not steps: the log holds one step in %d", a.r.Run.SampleEvery)
	}
	a.compare(baseline)
	a.epochs()
	a.series(baseline)
	a.classify()
	a.telemetry()
	return a.r
}

// dense reports whether the log holds the scale of every step: the
// reconstruction is then exact.
func (a *analysis) dense() bool {
	if a.run.Steps != nil {
		return false
	}
	for _, s := range a.run.Scales {
		if math.IsNaN(s) {
			return false
		}
	}
	return true
}

type analysis struct {
	run *Log
	opt Options
	r   *report.ScalesReport
	n   int

	cfg  report.ScalerConfig
	kind []stepKind
	// nanIdx is the index of the first non-finite loss (or the inferred
	// one), -1 when none.
	nanIdx int
	// warmup is the number of leading skipped steps.
	warmup int

	highSkip, pinnedLow, collapse bool
	skipThreshold                 float64

	// steps is the number of steps the log spans (entries for a log with
	// one entry per step).
	steps int
	// nanStep is the step of the first NaN (nanIdx's step, or the step
	// a log without losses implies), -1 when none.
	nanStep int
	// skips holds, per entry, the skipped steps the scales prove since
	// the entry before: 0 or 1 with a scale for every step, a lower bound
	// in a sampled log.
	skips []int
	// judged and judgedSkips are the steps after the warm-up and before
	// the first NaN, and the skipped steps among them: the skip rate the
	// diagnosis judges. warmupEnd is the first step after the warm-up.
	judged, judgedSkips, warmupEnd int
	// sampled is set when the scales were read from samples: skip counts
	// are lower bounds. every is the most common gap between them.
	sampled bool
	every   int
}

func runInfo(l *Log) report.RunInfo {
	ri := report.RunInfo{Path: l.Path, Steps: l.Len(), FirstStep: l.FirstStep, HasLosses: l.Losses != nil,
		HasScales: l.Scales != nil, StepsPerEpoch: l.StepsPerEpoch, Format: l.Format, PerEpoch: l.PerEpoch}
	if len(l.Epochs) > 0 {
		ri.Epochs = l.Epochs[len(l.Epochs)-1] - l.Epochs[0] + 1
	}
	if l.Steps != nil && l.Len() > 0 {
		ri.Steps = l.LastStep() - l.FirstStep + 1
		if !l.PerEpoch {
			ri.Samples, ri.SampleEvery = l.Len(), commonGap(l.Steps)
		}
	}
	return ri
}

// commonGap is the most common difference between consecutive steps.
func commonGap(steps []int) int {
	count := map[int]int{}
	best, bestN := 1, 0
	for i := 1; i < len(steps); i++ {
		d := steps[i] - steps[i-1]
		count[d]++
		if n := count[d]; n > bestN || n == bestN && d < best {
			best, bestN = d, n
		}
	}
	return best
}

func (a *analysis) step(i int) int { return a.run.Step(i) }

// unit is what the log's entries count: steps, or epochs for a per-epoch
// log.
func (a *analysis) unit() string {
	if a.run.PerEpoch {
		return "epoch"
	}
	return "step"
}

// atLeast prefixes a count the samples of a sampled log only bound from
// below.
func (a *analysis) atLeast() string {
	if a.sampled {
		return "at least "
	}
	return ""
}

func (a *analysis) note(format string, args ...any) {
	a.r.Notes = append(a.r.Notes, fmt.Sprintf(format, args...))
}

func (a *analysis) notDerived(format string, args ...any) {
	a.r.NotDerived = append(a.r.NotDerived, fmt.Sprintf(format, args...))
}

func (a *analysis) losses() {
	ls := a.run.Losses
	if ls == nil {
		a.notDerived("loss statistics, the first NaN/Inf loss and the comparison with a baseline: the log has no losses")
		return
	}
	st := &report.LossStats{}
	for i, v := range ls {
		if !isFinite(v) {
			st.NonFinite++
			if a.nanIdx < 0 {
				a.nanIdx = i
				s := a.step(i)
				st.FirstNonFiniteStep = &s
				st.FirstNonFiniteValue = describeFloat(v)
			}
		}
	}
	end := len(ls)
	if a.nanIdx >= 0 {
		end = a.nanIdx
	}
	st.FinalWindow = finalWindow(end)
	if end > 0 {
		st.FirstLoss = meanFinite(ls[:st.FinalWindow])
		st.FinalLoss = meanFinite(ls[end-st.FinalWindow : end])
		st.FirstSteps = &report.StepRange{From: a.step(0), To: a.step(st.FinalWindow - 1)}
		st.FinalSteps = &report.StepRange{From: a.step(end - st.FinalWindow), To: a.step(end - 1)}
	}
	// The summary must not read as if the run ended at its final window:
	// say how much of the end is NaN/Inf and where the last finite loss is.
	last := len(ls) - 1
	for last >= 0 && !isFinite(ls[last]) {
		last--
	}
	st.TrailingNonFinite = len(ls) - 1 - last
	if last >= 0 {
		s := a.step(last)
		st.LastFiniteStep = &s
	}
	a.r.Losses = st
}

// finalWindow is how many final steps are averaged into a final loss: a
// tenth of the steps, at least one and at most finalWindowMax.
func finalWindow(steps int) int {
	return min(max(steps/10, 1), finalWindowMax, max(steps, 1))
}

// resolveScaler settles the configuration: the log's values first, then
// what the series shows, then PyTorch's defaults.
func (a *analysis) resolveScaler() report.ScalerInfo {
	c := a.run.Scaler
	info := report.ScalerInfo{InitScaleFrom: "log", GrowthIntervalFrom: "log"}
	if c.GrowthFactor == 0 {
		c.GrowthFactor = DefaultScaler.GrowthFactor
	}
	if c.BackoffFactor == 0 {
		c.BackoffFactor = DefaultScaler.BackoffFactor
	}
	sc := a.run.Scales
	if c.InitScale == 0 {
		c.InitScale = DefaultScaler.InitScale
		info.InitScaleFrom = "default"
		if s0 := sc[0]; s0 != c.InitScale && s0 != c.InitScale*c.BackoffFactor && s0 != c.InitScale*c.GrowthFactor {
			// A run started at another init_scale: its first scale is
			// either that value or half of it; read it as unskipped.
			c.InitScale = s0
			info.InitScaleFrom = "inferred"
			a.note("the first scale %s is not PyTorch's default init_scale 65536 or a step from it: init_scale taken as %s and step %d as not skipped; state grad_scaler.init_scale in the log to be exact",
				report.FormatScale(s0), report.FormatScale(s0), a.step(0))
		}
	}
	// Each growth happens exactly growth_interval clean steps after the
	// last backoff or growth, so every growth shows the interval.
	inferred := map[int]int{}
	last := -1
	prev := c.InitScale
	for i, s := range sc {
		switch {
		case s > prev:
			inferred[i-last]++
			last = i
		case s < prev:
			last = i
		}
		prev = s
	}
	if c.GrowthInterval == 0 {
		info.GrowthIntervalFrom = "default"
		c.GrowthInterval = DefaultScaler.GrowthInterval
		if len(inferred) > 0 {
			best, bestN := 0, 0
			for k, n := range inferred {
				if n > bestN || n == bestN && k < best {
					best, bestN = k, n
				}
			}
			c.GrowthInterval = best
			info.GrowthIntervalFrom = "inferred"
			if len(inferred) > 1 {
				a.note("the scale grew after differing numbers of clean steps; growth_interval taken as %d, the most common", best)
			}
		}
	} else if len(inferred) > 0 {
		if _, ok := inferred[c.GrowthInterval]; !ok || len(inferred) > 1 {
			a.note("the log states growth_interval %d but the scale grew after other numbers of clean steps: is the log one entry per optimizer step?", c.GrowthInterval)
		}
	}
	info.ScalerConfig = c
	return info
}

func (a *analysis) scales() {
	sc := a.run.Scales
	if sc == nil {
		// A per-epoch log says what it lacks in its own words.
		if !a.run.PerEpoch {
			a.notDerived("skipped steps, skip rate, backoff runs, minimum scale, pinning, warm-up and the scale before the first NaN: the log has no scales")
		}
		return
	}
	info := a.resolveScaler()
	a.r.GradScaler = &info
	a.cfg = info.ScalerConfig
	if info.GrowthIntervalFrom == "default" {
		a.note("growth_interval taken as PyTorch's default 2000: the scale never grew in the log and the log does not state it")
	}
	st := &report.ScaleStats{SkippedAt: []int{}, MinScale: sc[0], MaxScale: sc[0], FinalScale: sc[len(sc)-1]}
	a.kind = make([]stepKind, len(sc))
	prev := a.cfg.InitScale
	oddRatio := -1
	for i, s := range sc {
		switch {
		case s < prev:
			a.kind[i] = stepBackoff
			if oddRatio < 0 && s != 0 && !closeTo(s/prev, a.cfg.BackoffFactor) {
				oddRatio = i
			}
		case s > prev:
			a.kind[i] = stepGrowth
			if oddRatio < 0 && !closeTo(s/prev, a.cfg.GrowthFactor) {
				oddRatio = i
			}
		default:
			a.kind[i] = stepClean
		}
		prev = s
		if s < st.MinScale {
			st.MinScale, st.MinScaleStep = s, i
		}
		st.MaxScale = max(st.MaxScale, s)
	}
	st.MinScaleStep = a.step(st.MinScaleStep)
	a.skips = make([]int, len(sc))
	for i, k := range a.kind {
		if k == stepBackoff {
			a.skips[i] = 1
		}
	}
	a.checkSkippedFlags()
	if oddRatio >= 0 {
		a.note("the scale changed by a factor other than backoff %g or growth %g at step %d: is the log one entry per optimizer step?",
			a.cfg.BackoffFactor, a.cfg.GrowthFactor, a.step(oddRatio))
	}

	run, runStart := 0, 0
	for i, k := range a.kind {
		if k != stepBackoff {
			run = 0
			if k == stepGrowth {
				st.Growths++
			}
			continue
		}
		st.Skipped++
		if len(st.SkippedAt) < MaxListedSteps {
			st.SkippedAt = append(st.SkippedAt, a.step(i))
		} else {
			st.SkippedAtTruncated = true
		}
		if run == 0 {
			runStart = i
		}
		run++
		if run > st.LongestBackoffRun {
			st.LongestBackoffRun, st.LongestBackoffRunStart = run, a.step(runStart)
		}
	}
	st.SkipRate = float64(st.Skipped) / float64(len(sc))
	for a.warmup < len(sc) && a.kind[a.warmup] == stepBackoff {
		a.warmup++
	}
	st.WarmupSkipped = a.warmup
	if a.warmup > 0 && a.warmup < len(sc) {
		st.WarmupScale = sc[a.warmup-1]
	}

	if a.run.Losses == nil {
		// Without losses a NaN shows as the scale halving on every step to
		// the end: NaN gradients overflow whatever the scale.
		start := len(sc)
		for start > 0 && a.kind[start-1] == stepBackoff {
			start--
		}
		if len(sc)-start >= allSkippedRun {
			a.nanIdx, a.nanStep = start, a.step(start)
			at := a.step(start)
			st.InferredNaNStep = &at
			a.note("the log has no losses; every step from %d to the end was skipped (the scale halved %d times in a row), which is what a NaN loss does: the first NaN is taken to be at step %d",
				a.step(start), len(sc)-start, a.step(start))
		}
	}
	cut := len(sc)
	if a.nanIdx >= 0 {
		cut = a.nanIdx
		// Steps skipped because the loss was already NaN are no warm-up.
		a.warmup = min(a.warmup, cut)
		st.WarmupSkipped, st.WarmupScale = a.warmup, 0
		if a.warmup > 0 {
			st.WarmupScale = sc[a.warmup-1]
		}
		at := a.cfg.InitScale
		if a.nanIdx > 0 {
			at = sc[a.nanIdx-1]
		}
		st.ScaleAtFirstNaN = &at
		a.collapseWindow(st, cut)
	}

	// The skip rate and pinning are judged between the warm-up and the
	// first NaN: neither the scale coming down from init_scale nor the
	// scale halving on every NaN step says anything about the rest.
	skipped := 0
	for i := a.warmup; i < cut; i++ {
		if a.kind[i] == stepBackoff {
			skipped++
		}
	}
	if cut > a.warmup {
		st.SkipRateAfterWarmup = float64(skipped) / float64(cut-a.warmup)
	}
	a.judged, a.judgedSkips, a.warmupEnd = max(cut-a.warmup, 0), skipped, a.step(0)+a.warmup
	a.skipThreshold = max(a.opt.SkipRate, 2/float64(a.cfg.GrowthInterval+1))
	a.highSkip = cut-a.warmup > 0 && st.SkipRateAfterWarmup > a.skipThreshold

	start, backoffs := a.warmup, 0
	flush := func(end int) {
		if end-start > st.LongestNoGrowth {
			st.LongestNoGrowth, st.LongestNoGrowthStart, st.LongestNoGrowthBackoffs = end-start, a.step(start), backoffs
			st.Pinned = end-start >= a.opt.PinnedIntervals*a.cfg.GrowthInterval && backoffs >= a.opt.PinnedIntervals
			st.PinnedScale = 0
			if st.Pinned {
				st.PinnedScale = sc[end-1]
			}
		}
	}
	for i := a.warmup; i < cut; i++ {
		switch a.kind[i] {
		case stepGrowth:
			flush(i)
			start, backoffs = i+1, 0
		case stepBackoff:
			backoffs++
		}
	}
	flush(cut)
	a.pinnedLow = st.Pinned && st.PinnedScale <= a.opt.LowScale
	a.r.Scales = st
}

// collapseWindow measures how far the scale fell before the first NaN: from
// its highest value in the last two growth intervals (after the warm-up) to
// the scale in effect at the NaN step.
func (a *analysis) collapseWindow(st *report.ScaleStats, cut int) {
	if cut == 0 {
		return
	}
	sc := a.run.Scales
	w := max(2*a.cfg.GrowthInterval, 20)
	from := max(cut-w, a.warmup)
	if from >= cut {
		return
	}
	top := 0.0
	for i := from; i < cut; i++ {
		top = max(top, sc[i])
		if a.kind[i] == stepBackoff {
			st.BackoffsBeforeNaN++
		}
	}
	at := *st.ScaleAtFirstNaN
	bits := collapseBits(top, at)
	st.CollapseBits = &bits
	st.CollapseWindow = cut - from
	a.collapse = bits >= a.opt.CollapseBits
}

func (a *analysis) compare(baseline *Log) {
	if baseline == nil {
		a.notDerived("the gap to the fp32 baseline (plateau or noise): no --baseline given")
		return
	}
	switch {
	case baseline.Losses == nil:
		a.notDerived("the gap to the fp32 baseline: the baseline log %s has no losses", baseline.Path)
		return
	case a.run.Losses == nil:
		a.notDerived("the gap to the fp32 baseline: the run has no losses")
		return
	case a.nanIdx >= 0:
		a.notDerived("the gap to the fp32 baseline: the run's loss became NaN")
		return
	}
	if a.run.PerEpoch != baseline.PerEpoch {
		a.notDerived("the gap to the fp32 baseline: one log holds a loss per epoch (fastai's history.csv) and the other a loss per step; give both in the same form")
		return
	}
	if a.run.Steps != nil || baseline.Steps != nil {
		a.compareByStep(baseline)
		return
	}
	defer a.compareValid(baseline)
	m := min(len(a.run.Losses), len(baseline.Losses))
	if len(a.run.Losses) != len(baseline.Losses) {
		a.note("the run has %d steps and the baseline %d: their final losses are compared over the first %d steps of both", len(a.run.Losses), len(baseline.Losses), m)
	}
	w := finalWindow(m)
	rl, bl := meanFinite(a.run.Losses[m-w:m]), meanFinite(baseline.Losses[m-w:m])
	if rl == nil || bl == nil {
		a.notDerived("the gap to the fp32 baseline: no finite losses in the final %d steps", w)
		return
	}
	c := &report.Comparison{Steps: m, Window: w, RunLoss: *rl, BaselineLoss: *bl, Tolerance: a.opt.PlateauTolerance}
	c.Gap = a.gap(*rl, *bl)
	a.r.Comparison = c
}

func (a *analysis) epochs() {
	ep := a.run.Epochs
	if ep == nil {
		a.notDerived("skip rate per epoch: the log states no steps_per_epoch (JSON) or epoch column (CSV)")
		return
	}
	if a.skips == nil || a.run.PerEpoch {
		return
	}
	if a.sampled {
		a.notDerived("skip rate per epoch: the log holds the scale of one step in %d, and the skipped steps between two samples cannot be placed in an epoch", a.every)
		return
	}
	for i, e := range ep {
		if n := len(a.r.Epochs); n == 0 || a.r.Epochs[n-1].Epoch != e {
			a.r.Epochs = append(a.r.Epochs, report.EpochStats{Epoch: e})
		}
		es := &a.r.Epochs[len(a.r.Epochs)-1]
		es.Steps++
		es.Skipped += a.skips[i]
	}
	for i := range a.r.Epochs {
		a.r.Epochs[i].SkipRate = float64(a.r.Epochs[i].Skipped) / float64(a.r.Epochs[i].Steps)
	}
}

func (a *analysis) series(baseline *Log) {
	a.r.Series = []report.Bucket{}
	size := (a.n + SeriesBuckets - 1) / SeriesBuckets
	for from := 0; from < a.n; from += size {
		to := min(from+size, a.n)
		b := report.Bucket{From: a.step(from), To: a.step(to - 1)}
		// The baseline is compared step for step from its first entry,
		// as compare does.
		if baseline != nil && from < len(baseline.Losses) {
			b.BaselineLoss = meanFinite(baseline.Losses[from:min(to, len(baseline.Losses))])
		}
		if ls := a.run.Losses; ls != nil {
			b.Loss = meanFinite(ls[from:to])
			for _, v := range ls[from:to] {
				if !isFinite(v) {
					b.NonFinite++
				}
			}
		}
		if sc := a.run.Scales; sc != nil && a.skips != nil {
			lo, hi := math.Inf(1), math.Inf(-1)
			for i := from; i < to; i++ {
				b.Skipped += a.skips[i]
				if math.IsNaN(sc[i]) {
					continue
				}
				l := math.Log2(max(sc[i], math.SmallestNonzeroFloat32))
				lo, hi = min(lo, l), max(hi, l)
			}
			if !math.IsInf(lo, 0) {
				b.Log2ScaleMin, b.Log2ScaleMax = &lo, &hi
			}
		}
		a.r.Series = append(a.r.Series, b)
	}
}

// earlyLimit is the number of steps in which a NaN counts as early: the
// first epoch when known, else EarlySteps.
func (a *analysis) earlyLimit() (int, string) {
	if a.run.PerEpoch {
		return 1, "the first epoch"
	}
	if ep := a.run.Epochs; len(ep) > 0 {
		n := 0
		for n < len(ep) && ep[n] == ep[0] {
			n++
		}
		if n < len(ep) {
			steps := a.step(n) - a.step(0)
			return steps, fmt.Sprintf("the first epoch (%d steps)", steps)
		}
	}
	return a.opt.EarlySteps, fmt.Sprintf("the first %d steps", a.opt.EarlySteps)
}

func (a *analysis) add(c *checks.Check, format string, args ...any) {
	a.r.Findings = append(a.r.Findings, c.Finding(fmt.Sprintf(format, args...)))
}

func (a *analysis) classify() {
	r, st := a.r, a.r.Scales
	limit, limitText := a.earlyLimit()
	var cmp = r.Comparison
	gapOver := cmp != nil && cmp.Gap > cmp.Tolerance
	signs := a.highSkip || a.pinnedLow

	nanStep, unit, at := a.nanStep, a.unit(), "at"
	if a.run.Sampled() || a.sampled && a.run.Losses == nil {
		// The NaN lies between the sample that shows it and the one before.
		at = "by"
	}
	early := a.nanIdx >= 0 && a.nanStep-a.step(0) < limit
	nanWhat := "the loss became NaN/Inf"
	if r.Losses != nil && r.Losses.FirstNonFiniteValue != "" {
		nanWhat = "the loss became " + r.Losses.FirstNonFiniteValue
	} else if a.nanIdx >= 0 {
		nanWhat = "every step's gradients became non-finite (inferred NaN loss)"
	}
	scaleAtNaN := func() string {
		if st == nil || st.ScaleAtFirstNaN == nil {
			return ""
		}
		s := fmt.Sprintf("; the scale was %s", report.FormatScale(*st.ScaleAtFirstNaN))
		if st.CollapseBits != nil {
			s += fmt.Sprintf(", %.1f bits below its peak in the %d steps before, with %d skipped steps in them",
				*st.CollapseBits, st.CollapseWindow, st.BackoffsBeforeNaN)
		}
		return s
	}

	switch {
	case early:
		r.Verdict = report.ScalesEarlyNaN
		r.VerdictText = fmt.Sprintf("%s %s %s %d, within %s: a forward overflow or poisoned data, not the loss scaler", nanWhat, at, unit, nanStep, limitText)
		r.Fix = "export the model and a batch and run 'fp16audit run model.onnx -i batch.npy' to find the overflowing op and a verified fix (normalize inputs, to_bf16(), keep that module in fp32); lowering init_scale does not fix it"
		a.add(checkEarlyNaN, "%s %s %s %d, within %s%s. The loss scaler cannot cause this; audit the exported model with 'fp16audit run model.onnx -i batch.npy'",
			nanWhat, at, unit, nanStep, limitText, scaleAtNaN())
	case a.nanIdx >= 0 && st == nil:
		r.Verdict = report.ScalesLateNaN
		r.VerdictText = fmt.Sprintf("%s %s %s %d, after %s; without scales the cause cannot be told", nanWhat, at, unit, nanStep, limitText)
		r.Fix = "record the loss scale of every step (the Python companion, python/README.md, or examples/fastai_scales_callback.py) and diagnose again"
		a.add(checkLateNaN, "%s %s %s %d, after %s; the log has no scales to tell a gradient overflow from a forward overflow", nanWhat, at, unit, nanStep, limitText)
	case a.nanIdx >= 0 && a.collapse:
		r.Verdict = report.ScalesGradientOverflowNaN
		r.VerdictText = fmt.Sprintf("%s %s step %d after the loss scale collapsed to %s: chronic gradient overflow", nanWhat, at, nanStep, report.FormatScale(*st.ScaleAtFirstNaN))
		r.Fix = "lower the learning rate, clip gradients (fastai GradientClip; PyTorch scaler.unscale_ then clip_grad_norm_), or train with learn.to_bf16() (Ampere or newer) or in fp32"
		a.add(checkGradOverflowNaN, "%s %s step %d%s: the gradients kept overflowing as training diverged. Lower the learning rate, clip gradients, or use to_bf16()/fp32",
			nanWhat, at, nanStep, scaleAtNaN())
	case a.nanIdx >= 0:
		r.Verdict = report.ScalesForwardOverflowNaN
		r.VerdictText = fmt.Sprintf("%s %s step %d with a healthy loss scale (%s): the forward pass began to overflow", nanWhat, at, nanStep, report.FormatScale(*st.ScaleAtFirstNaN))
		r.Fix = fmt.Sprintf("save a checkpoint from just before step %d, export it with that step's batch and audit it with 'fp16audit run model.onnx -i batch.npy'", nanStep)
		a.add(checkForwardOverflowNaN, "%s %s step %d%s: the gradients fitted fp16, the forward pass did not. Audit a checkpoint from just before step %d with 'fp16audit run'",
			nanWhat, at, nanStep, scaleAtNaN(), nanStep)
	case gapOver && signs:
		r.Verdict = report.ScalesPlateauUnderflow
		r.VerdictText = fmt.Sprintf("final loss %.4g is %.1f%% above the fp32 baseline's %.4g, with %s", cmp.RunLoss, 100*cmp.Gap, cmp.BaselineLoss, a.signsText())
		r.Fix = "train with learn.to_bf16() (Ampere or newer): no loss scaling, no skipped steps; otherwise find and clip the gradients that overflow"
		a.add(checkPlateauUnderflow, "final loss %.4g (mean of the last %d of %d steps) is %.1f%% above the fp32 baseline's %.4g (tolerance %.1f%%), with %s. Prefer to_bf16()",
			cmp.RunLoss, cmp.Window, cmp.Steps, 100*cmp.Gap, cmp.BaselineLoss, 100*cmp.Tolerance, a.signsText())
	case gapOver:
		r.Verdict = report.ScalesPlateauUnexplained
		r.VerdictText = fmt.Sprintf("final loss %.4g is %.1f%% above the fp32 baseline's %.4g, but %s", cmp.RunLoss, 100*cmp.Gap, cmp.BaselineLoss, a.cleanText())
		r.Fix = "check that both runs used the same data, seed and schedule; compare a learn.to_bf16() run; audit the model for underflow with 'fp16audit run'"
		a.add(checkPlateauUnexplained, "final loss %.4g (mean of the last %d of %d steps) is %.1f%% above the fp32 baseline's %.4g (tolerance %.1f%%), but %s",
			cmp.RunLoss, cmp.Window, cmp.Steps, 100*cmp.Gap, cmp.BaselineLoss, 100*cmp.Tolerance, a.cleanText())
	case st != nil && a.warmup >= a.opt.WarmupSkips && a.warmup < a.steps:
		r.Verdict = report.ScalesWastedWarmup
		r.VerdictText = fmt.Sprintf("the first %d steps were all skipped while the scale came down from %s to %s", a.warmup, report.FormatScale(a.cfg.InitScale), report.FormatScale(st.WarmupScale))
		r.Fix = fmt.Sprintf("learn.to_fp16(init_scale=%s) (GradScaler(init_scale=%s) in PyTorch) saves them; the last knob, not a fix for NaN", pyScale(st.WarmupScale), pyScale(st.WarmupScale))
	case cmp != nil && cmp.Gap > 0:
		r.Verdict = report.ScalesFP16Noise
		r.VerdictText = fmt.Sprintf("final loss %.4g is %.1f%% above the fp32 baseline's %.4g, within the %.1f%% tolerance: normal fp16 noise", cmp.RunLoss, 100*cmp.Gap, cmp.BaselineLoss, 100*cmp.Tolerance)
	default:
		r.Verdict = report.ScalesHealthy
		r.VerdictText = a.healthyText()
	}

	if st != nil && a.warmup >= a.opt.WarmupSkips && a.warmup < a.steps {
		a.add(checkWastedWarmup, "%sthe first %d steps were all skipped while the scale halved from %s to %s, the first scale that worked. learn.to_fp16(init_scale=%s) saves them; this is the last knob, not a fix for NaN",
			a.sampledWarmup(), a.warmup, report.FormatScale(a.cfg.InitScale), report.FormatScale(st.WarmupScale), pyScale(st.WarmupScale))
	}
	if cmp != nil && cmp.Gap > 0 && !gapOver && a.nanIdx < 0 {
		a.add(checkNoise, "final loss %.4g (mean of the last %d of %d steps) is %.1f%% above the fp32 baseline's %.4g, within the %.1f%% tolerance: normal fp16 noise",
			cmp.RunLoss, cmp.Window, cmp.Steps, 100*cmp.Gap, cmp.BaselineLoss, 100*cmp.Tolerance)
	}
	if a.highSkip {
		a.add(checkSkipRate, "%s%d of the %d steps after the warm-up%s were skipped (%s%.2f%%, threshold %.2f%%): each one an optimizer step thrown away",
			a.atLeast(), a.skippedAfterWarmup(), a.judgedSteps(), beforeNaN(a.nanIdx >= 0), a.atLeast(), 100*st.SkipRateAfterWarmup, 100*a.skipThreshold)
	}
	if a.pinnedLow {
		a.add(checkPinnedLow, "the scale did not grow for %d steps (%.1f growth intervals of %d) from step %d, with %d backoffs, and ended that stretch at %s (threshold %s)",
			st.LongestNoGrowth, float64(st.LongestNoGrowth)/float64(a.cfg.GrowthInterval), a.cfg.GrowthInterval,
			st.LongestNoGrowthStart, st.LongestNoGrowthBackoffs, report.FormatScale(st.PinnedScale), report.FormatScale(a.opt.LowScale))
	}
	sort.SliceStable(r.Findings, func(i, j int) bool {
		if r.Findings[i].Severity != r.Findings[j].Severity {
			return r.Findings[i].Severity > r.Findings[j].Severity
		}
		return r.Findings[i].Check < r.Findings[j].Check
	})
}

func beforeNaN(nan bool) string {
	if nan {
		return " and before the first NaN"
	}
	return ""
}

func (a *analysis) judgedSteps() int { return a.judged }

func (a *analysis) skippedAfterWarmup() int { return a.judgedSkips }

func (a *analysis) signsText() string {
	st := a.r.Scales
	var parts []string
	if a.highSkip {
		parts = append(parts, fmt.Sprintf("%s%.1f%% of the steps after the warm-up skipped (%d)", a.atLeast(), 100*st.SkipRateAfterWarmup, a.skippedAfterWarmup()))
	}
	if a.pinnedLow {
		parts = append(parts, fmt.Sprintf("the scale pinned at %s for %d steps without growth", report.FormatScale(st.PinnedScale), st.LongestNoGrowth))
	}
	return strings.Join(parts, " and ")
}

func (a *analysis) cleanText() string {
	st := a.r.Scales
	if st == nil {
		return "the log has no scales to explain it"
	}
	return fmt.Sprintf("the loss scale is healthy (%.2f%% of the steps after the warm-up skipped, final scale %s)", 100*st.SkipRateAfterWarmup, report.FormatScale(st.FinalScale))
}

func (a *analysis) healthyText() string {
	var parts []string
	if st := a.r.Scales; st != nil {
		parts = append(parts, fmt.Sprintf("%s%d of %d steps skipped, final scale %s", a.atLeast(), st.Skipped, a.steps, report.FormatScale(st.FinalScale)))
	}
	if a.run.Losses != nil {
		parts = append(parts, "no NaN/Inf loss")
	}
	if cmp := a.r.Comparison; cmp != nil {
		parts = append(parts, fmt.Sprintf("final loss %.4g at or below the fp32 baseline's %.4g", cmp.RunLoss, cmp.BaselineLoss))
	}
	if a.highSkip || a.pinnedLow {
		parts = append(parts, "but see the warnings: pass --baseline to tell whether they cost accuracy")
	}
	return strings.Join(parts, "; ")
}

func isFinite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func meanFinite(xs []float64) *float64 {
	sum, n := 0.0, 0
	for _, v := range xs {
		if isFinite(v) {
			sum += v
			n++
		}
	}
	if n == 0 {
		return nil
	}
	m := sum / float64(n)
	return &m
}

func closeTo(x, want float64) bool { return math.Abs(x-want) <= 1e-6*want }

func describeFloat(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return fmt.Sprint(v)
}

// pyScale writes a scale as Python source: 2**k for powers of two.
func pyScale(s float64) string {
	if frac, exp := math.Frexp(s); s > 0 && frac == 0.5 {
		return fmt.Sprintf("2**%d", exp-1)
	}
	return fmt.Sprintf("%g", s)
}

// gap is the run's final loss relative to the baseline's, or the absolute
// difference (with a note saying so) when the baseline's is zero.
func (a *analysis) gap(run, baseline float64) float64 {
	if math.Abs(baseline) < 1e-12 {
		a.note("the baseline's final loss is zero: the gap is absolute, not relative")
		return run - baseline
	}
	return (run - baseline) / math.Abs(baseline)
}

// collapseBits is how many halvings lead from scale top to scale at: a
// scale halved to zero counts down to float32's smallest subnormal, 2^-149.
func collapseBits(top, at float64) float64 {
	switch {
	case at > 0:
		return math.Log2(top / at)
	case top > 0:
		return math.Log2(top) + 150
	}
	return 0
}
