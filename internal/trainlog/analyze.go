package trainlog

import (
	"fmt"
	"math"
	"slices"
	"sort"

	"fp16audit/checks"
	"fp16audit/report"
)

// Options are the thresholds of the diagnosis, which the report records,
// and the checks it runs.
type Options struct {
	report.ScalesThresholds
	// Checks selects the analyzers (--checks); a check switched off does
	// not run and cannot decide the verdict. The zero value selects all.
	Checks checks.Selection
}

// DefaultOptions are the thresholds the command line starts from, with
// every check.
var DefaultOptions = Options{ScalesThresholds: report.ScalesThresholds{
	PlateauTolerance: 0.03,
	EarlySteps:       200,
	SkipRate:         0.01,
	LowScale:         64,
	PinnedIntervals:  3,
	CollapseBits:     4,
	WarmupSkips:      5,
	// The threshold `fp16audit run` uses for an fp16 value (FP3001).
	UnderflowFraction: 0.10,
	// The mass a gradient may lose to fp16 (issue 18: 1 %), as the
	// training audit judges it.
	LostMassTolerance: 0.01,
}}

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
// fp32 baseline when one is given (nil otherwise), runs the analyzers that
// opt.Checks selects over those facts and walks the verdict tree over
// their findings.
func Analyze(run, baseline *Log, opt Options) (*report.ScalesReport, error) {
	f := newFacts(run, baseline, opt)
	findings, err := checks.RunAnalyzers(Analyzers(), f, opt.Checks, "")
	if err != nil {
		return nil, err
	}
	sort.SliceStable(findings, func(i, j int) bool {
		if findings[i].Severity != findings[j].Severity {
			return findings[i].Severity > findings[j].Severity
		}
		return findings[i].Check < findings[j].Check
	})
	f.r.Findings = findings
	f.verdict(findings)
	return f.r, nil
}

// newFacts computes, once, everything the analyzers and the verdict read:
// the loss statistics, the reconstruction of the scale series (exact, or
// bounds for a sampled log), the comparison with the baseline, the skips
// per epoch, the series for plots and what the telemetry says about the
// modules. What it learns goes into the report it holds; what the log
// cannot tell goes into the report's notes.
func newFacts(run, baseline *Log, opt Options) *Facts {
	f := &Facts{run: run, opt: opt, n: run.Len(), nanIdx: -1, nanStep: -1}
	f.steps = f.n
	if run.Steps != nil {
		f.steps = run.LastStep() - run.FirstStep + 1
	}
	f.r = &report.ScalesReport{
		Schema: report.ScalesSchema, Run: runInfo(run), Thresholds: opt.ScalesThresholds, Checks: opt.Checks.String(),
		Findings: []checks.Finding{}, NotDerived: []string{}, Notes: []string{},
	}
	f.r.Notes = append(f.r.Notes, run.Notes...)
	f.r.NotDerived = append(f.r.NotDerived, run.NotDerived...)
	if baseline != nil {
		bi := runInfo(baseline)
		f.r.Baseline = &bi
	}
	f.losses()
	if f.nanIdx >= 0 {
		f.nanStep = f.step(f.nanIdx)
	}
	if run.Scales == nil && run.Skipped != nil {
		f.scalesFromSkipped()
	}
	if f.run.Scales != nil && !f.dense() {
		f.sparseScales()
	} else {
		f.scales()
	}
	if run.Sampled() && run.Losses != nil {
		f.note("the first and final losses are means over samples, not steps: the log holds one step in %d", f.r.Run.SampleEvery)
	}
	f.compare(baseline)
	f.epochs()
	f.series(baseline)
	f.judge()
	f.telemetry()
	return f
}

// dense reports whether the log holds the scale of every step: the
// reconstruction is then exact.
func (f *Facts) dense() bool {
	if f.run.Steps != nil {
		return false
	}
	for _, s := range f.run.Scales {
		if math.IsNaN(s) {
			return false
		}
	}
	return true
}

// Facts is what one log says, computed once by newFacts: the analyzers
// and the verdict read it and change nothing in it but the report's
// findings and verdict.
type Facts struct {
	run *Log
	opt Options
	r   *report.ScalesReport
	n   int

	cfg  report.ScalerConfig
	kind []stepKind
	// nanIdx is the index of the failing non-finite loss (the first of
	// the stretch the run did not recover from, or the inferred one), -1
	// when none; recovered holds the indices of the non-finite losses
	// before it (all of them when there is none): steps the run went on
	// from.
	nanIdx    int
	recovered []int
	// warmup is the number of leading skipped steps.
	warmup int

	// collapse: the scale fell CollapseBits before the failing NaN, with
	// as many halvings from backoffs of finite losses (gradient overflow).
	highSkip, pinnedLow, collapse bool
	// heldFrom is the highest scale after the warm-up, which a scale held
	// down (ScaleStats.PinnedSince) fell from.
	heldFrom      float64
	skipThreshold float64

	// What judge settles for the analyzers: a NaN within the early limit
	// (limitText says which), a final loss beyond the tolerance above the
	// baseline's, and a warm-up long enough to report.
	early, gapOver, longWarmup bool
	limitText                  string

	// steps is the number of steps the log spans (entries for a log with
	// one entry per step).
	steps int
	// nanStep is the step of the failing NaN (nanIdx's step, or the step
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

func (f *Facts) step(i int) int { return f.run.Step(i) }

// unit is what the log's entries count: steps, or epochs for a per-epoch
// log.
func (f *Facts) unit() string {
	if f.run.PerEpoch {
		return "epoch"
	}
	return "step"
}

// atLeast prefixes a count the samples of a sampled log only bound from
// below.
func (f *Facts) atLeast() string {
	if f.sampled {
		return "at least "
	}
	return ""
}

func (f *Facts) note(format string, args ...any) {
	f.r.Notes = append(f.r.Notes, fmt.Sprintf(format, args...))
}

func (f *Facts) notDerived(format string, args ...any) {
	f.r.NotDerived = append(f.r.NotDerived, fmt.Sprintf(format, args...))
}

func (f *Facts) losses() {
	ls := f.run.Losses
	if ls == nil {
		f.notDerived("loss statistics, the first NaN/Inf loss and the comparison with a baseline: the log has no losses")
		return
	}
	st := &report.LossStats{}
	var nonfinite []int
	for i, v := range ls {
		if !isFinite(v) {
			nonfinite = append(nonfinite, i)
		}
	}
	st.NonFinite = len(nonfinite)
	if len(nonfinite) > 0 {
		s := f.step(nonfinite[0])
		st.FirstNonFiniteStep = &s
		st.FirstNonFiniteValue = describeFloat(ls[nonfinite[0]])
	}
	f.nanIdx = failingIndex(ls)
	f.recovered = nonfinite
	if f.nanIdx >= 0 {
		s := f.step(f.nanIdx)
		st.FailingStep = &s
		st.FailingValue = describeFloat(ls[f.nanIdx])
		f.recovered = nonfinite[:slices.Index(nonfinite, f.nanIdx)]
	}
	st.Recovered = len(f.recovered)
	for _, i := range f.recovered[:min(len(f.recovered), MaxListedSteps)] {
		st.RecoveredAt = append(st.RecoveredAt, f.step(i))
	}
	end := len(ls)
	if f.nanIdx >= 0 {
		end = f.nanIdx
	}
	st.FinalWindow = finalWindow(end)
	if end > 0 {
		st.FirstLoss = meanFinite(ls[:st.FinalWindow])
		st.FinalLoss = meanFinite(ls[end-st.FinalWindow : end])
		st.FirstSteps = &report.StepRange{From: f.step(0), To: f.step(st.FinalWindow - 1)}
		st.FinalSteps = &report.StepRange{From: f.step(end - st.FinalWindow), To: f.step(end - 1)}
	}
	// The summary must not read as if the run ended at its final window:
	// say how much of the end is NaN/Inf and where the last finite loss is.
	last := len(ls) - 1
	for last >= 0 && !isFinite(ls[last]) {
		last--
	}
	st.TrailingNonFinite = len(ls) - 1 - last
	if last >= 0 {
		s := f.step(last)
		st.LastFiniteStep = &s
	}
	f.r.Losses = st
}

// failingIndex is where the loss went NaN/Inf for good, -1 when the last
// loss is finite: the first entry of the shortest final stretch in which
// at least half the losses are non-finite. A forward overflow that begins
// on a few batches and then takes every one is one failure from its first
// non-finite loss; a non-finite loss followed by a run of finite ones is
// a step the run recovered from, whatever came later.
func failingIndex(ls []float64) int {
	if len(ls) == 0 || isFinite(ls[len(ls)-1]) {
		return -1
	}
	at, bad := -1, 0
	for i := len(ls) - 1; i >= 0; i-- {
		if !isFinite(ls[i]) {
			bad++
			if 2*bad >= len(ls)-i {
				at = i
			}
		}
	}
	return at
}

// finalWindow is how many final steps are averaged into a final loss: a
// tenth of the steps, at least one and at most finalWindowMax.
func finalWindow(steps int) int {
	return min(max(steps/10, 1), finalWindowMax, max(steps, 1))
}

// resolveScaler settles the configuration: the log's values first, then
// what the series shows, then PyTorch's defaults.
func (f *Facts) resolveScaler() report.ScalerInfo {
	c := f.run.Scaler
	info := report.ScalerInfo{InitScaleFrom: "log", GrowthIntervalFrom: "log"}
	if c.GrowthFactor == 0 {
		c.GrowthFactor = DefaultScaler.GrowthFactor
	}
	if c.BackoffFactor == 0 {
		c.BackoffFactor = DefaultScaler.BackoffFactor
	}
	sc := f.run.Scales
	if c.InitScale == 0 {
		c.InitScale = DefaultScaler.InitScale
		info.InitScaleFrom = "default"
		if s0 := sc[0]; s0 != c.InitScale && s0 != c.InitScale*c.BackoffFactor && s0 != c.InitScale*c.GrowthFactor {
			// A run started at another init_scale: its first scale is
			// either that value or half of it; read it as unskipped.
			c.InitScale = s0
			info.InitScaleFrom = "inferred"
			f.note("the first scale %s is not PyTorch's default init_scale 65536 or a step from it: init_scale taken as %s and step %d as not skipped; state grad_scaler.init_scale in the log to be exact",
				report.FormatScale(s0), report.FormatScale(s0), f.step(0))
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
				f.note("the scale grew after differing numbers of clean steps; growth_interval taken as %d, the most common", best)
			}
		}
	} else if len(inferred) > 0 {
		if _, ok := inferred[c.GrowthInterval]; !ok || len(inferred) > 1 {
			f.note("the log states growth_interval %d but the scale grew after other numbers of clean steps: is the log one entry per optimizer step?", c.GrowthInterval)
		}
	}
	info.ScalerConfig = c
	return info
}

func (f *Facts) scales() {
	sc := f.run.Scales
	if sc == nil {
		// A per-epoch log says what it lacks in its own words.
		if !f.run.PerEpoch {
			f.notDerived("skipped steps, skip rate, backoff runs, minimum scale, pinning, warm-up and the scale before the first NaN: the log has no scales")
		}
		return
	}
	info := f.resolveScaler()
	f.r.GradScaler = &info
	f.cfg = info.ScalerConfig
	if info.GrowthIntervalFrom == "default" {
		f.note("growth_interval taken as PyTorch's default 2000: the scale never grew in the log and the log does not state it")
	}
	st := &report.ScaleStats{SkippedAt: []int{}, MinScale: sc[0], MaxScale: sc[0], FinalScale: sc[len(sc)-1]}
	f.kind = make([]stepKind, len(sc))
	prev := f.cfg.InitScale
	oddRatio := -1
	for i, s := range sc {
		switch {
		case s < prev:
			f.kind[i] = stepBackoff
			if oddRatio < 0 && s != 0 && !closeTo(s/prev, f.cfg.BackoffFactor) {
				oddRatio = i
			}
		case s > prev:
			f.kind[i] = stepGrowth
			if oddRatio < 0 && !closeTo(s/prev, f.cfg.GrowthFactor) {
				oddRatio = i
			}
		default:
			f.kind[i] = stepClean
		}
		prev = s
		if s < st.MinScale {
			st.MinScale, st.MinScaleStep = s, i
		}
		st.MaxScale = max(st.MaxScale, s)
	}
	st.MinScaleStep = f.step(st.MinScaleStep)
	f.skips = make([]int, len(sc))
	for i, k := range f.kind {
		if k == stepBackoff {
			f.skips[i] = 1
		}
	}
	f.checkSkippedFlags()
	if oddRatio >= 0 {
		f.note("the scale changed by a factor other than backoff %g or growth %g at step %d: is the log one entry per optimizer step?",
			f.cfg.BackoffFactor, f.cfg.GrowthFactor, f.step(oddRatio))
	}

	run, runStart := 0, 0
	for i, k := range f.kind {
		if k != stepBackoff {
			run = 0
			if k == stepGrowth {
				st.Growths++
			}
			continue
		}
		st.Skipped++
		if len(st.SkippedAt) < MaxListedSteps {
			st.SkippedAt = append(st.SkippedAt, f.step(i))
		} else {
			st.SkippedAtTruncated = true
		}
		if run == 0 {
			runStart = i
		}
		run++
		if run > st.LongestBackoffRun {
			st.LongestBackoffRun, st.LongestBackoffRunStart = run, f.step(runStart)
		}
	}
	st.SkipRate = float64(st.Skipped) / float64(len(sc))
	for f.warmup < len(sc) && f.kind[f.warmup] == stepBackoff {
		f.warmup++
	}
	st.WarmupSkipped = f.warmup
	if f.warmup > 0 && f.warmup < len(sc) {
		st.WarmupScale = sc[f.warmup-1]
	}

	if f.run.Losses == nil {
		// Without losses a NaN shows as the scale halving on every step to
		// the end: NaN gradients overflow whatever the scale.
		start := len(sc)
		for start > 0 && f.kind[start-1] == stepBackoff {
			start--
		}
		if len(sc)-start >= allSkippedRun {
			f.nanIdx, f.nanStep = start, f.step(start)
			at := f.step(start)
			st.InferredNaNStep = &at
			f.note("the log has no losses; every step from %d to the end was skipped (the scale halved %d times in a row), which is what a NaN loss does: the first NaN is taken to be at step %d",
				f.step(start), len(sc)-start, f.step(start))
		}
	}
	cut := len(sc)
	if f.nanIdx >= 0 {
		cut = f.nanIdx
		// Steps skipped because the loss was already NaN are no warm-up.
		f.warmup = min(f.warmup, cut)
		st.WarmupSkipped, st.WarmupScale = f.warmup, 0
		if f.warmup > 0 {
			st.WarmupScale = sc[f.warmup-1]
		}
		at := f.cfg.InitScale
		if f.nanIdx > 0 {
			at = sc[f.nanIdx-1]
		}
		st.ScaleAtFirstNaN = &at
		f.collapseWindow(st, cut)
	}

	// The skip rate and pinning are judged between the warm-up and the
	// first NaN: neither the scale coming down from init_scale nor the
	// scale halving on every NaN step says anything about the rest.
	skipped := 0
	for i := f.warmup; i < cut; i++ {
		if f.kind[i] == stepBackoff {
			skipped++
		}
	}
	if cut > f.warmup {
		st.SkipRateAfterWarmup = float64(skipped) / float64(cut-f.warmup)
	}
	f.judged, f.judgedSkips, f.warmupEnd = max(cut-f.warmup, 0), skipped, f.step(0)+f.warmup
	f.skipThreshold = max(f.opt.SkipRate, 2/float64(f.cfg.GrowthInterval+1))
	f.highSkip = cut-f.warmup > 0 && st.SkipRateAfterWarmup > f.skipThreshold

	start, backoffs := f.warmup, 0
	flush := func(end int) {
		if end-start > st.LongestNoGrowth {
			st.LongestNoGrowth, st.LongestNoGrowthStart, st.LongestNoGrowthBackoffs = end-start, f.step(start), backoffs
			st.Pinned = end-start >= f.opt.PinnedIntervals*f.cfg.GrowthInterval && backoffs >= f.opt.PinnedIntervals
			st.PinnedScale = 0
			if st.Pinned {
				st.PinnedScale = sc[end-1]
			}
		}
	}
	for i := f.warmup; i < cut; i++ {
		switch f.kind[i] {
		case stepGrowth:
			flush(i)
			start, backoffs = i+1, 0
		case stepBackoff:
			backoffs++
		}
	}
	flush(cut)
	f.pinnedLow = st.Pinned && st.PinnedScale <= f.opt.LowScale
	if !f.pinnedLow {
		pts := make([]scalePoint, 0, cut-f.warmup)
		for i := f.warmup; i < cut; i++ {
			pts = append(pts, scalePoint{f.step(i), sc[i]})
		}
		f.heldDown(st, pts, cut)
	}
	f.r.Scales = st
}

// scalePoint is the scale after the step of a log entry.
type scalePoint struct {
	step  int
	scale float64
}

// heldDown pins a scale that fell and stayed down: pts are the scales
// after the warm-up up to the failing NaN, which lies span steps after
// the log's first.
// The scale is held down when it fell CollapseBits or more below the
// scale it settled at after the warm-up (or a later, higher one), to at
// most LowScale, ends the stretch at its lowest, and stayed at or below
// LowScale for at least the final window the comparison with a baseline
// reads. GradScaler regains one growth per growth interval of clean
// steps, so a scale that many halvings below where it was cannot climb
// back in a short run (with the default 2000 steps per growth, in no run
// shorter than tens of thousands of steps): whatever the growth interval,
// the small gradients train at that scale.
func (f *Facts) heldDown(st *report.ScaleStats, pts []scalePoint, span int) {
	if len(pts) == 0 {
		return
	}
	peak := f.cfg.InitScale
	if st.WarmupScale > 0 {
		peak = st.WarmupScale
	}
	low := pts[0].scale
	for _, p := range pts {
		peak, low = max(peak, p.scale), min(low, p.scale)
	}
	final := pts[len(pts)-1].scale
	if final > f.opt.LowScale || final > low || collapseBits(peak, final) < f.opt.CollapseBits {
		return
	}
	since := len(pts) - 1
	for since > 0 && pts[since-1].scale <= f.opt.LowScale {
		since--
	}
	if pts[len(pts)-1].step-pts[since].step+1 < finalWindow(span) {
		return
	}
	s := pts[since].step
	st.Pinned, st.PinnedScale, st.PinnedSince = true, final, &s
	f.pinnedLow, f.heldFrom = true, peak
}

// collapseWindow measures how far the scale fell before the first NaN: from
// its highest value in the last two growth intervals (after the warm-up) to
// the scale in effect at the NaN step.
func (f *Facts) collapseWindow(st *report.ScaleStats, cut int) {
	if cut == 0 {
		return
	}
	sc := f.run.Scales
	w := max(2*f.cfg.GrowthInterval, 20)
	from := max(cut-w, f.warmup)
	if from >= cut {
		return
	}
	top := 0.0
	for i := from; i < cut; i++ {
		top = max(top, sc[i])
		if f.kind[i] == stepBackoff {
			st.BackoffsBeforeNaN++
			// A backoff of a non-finite loss is the forward pass's (or
			// the batch's): only those of finite losses show gradients
			// overflowing fp16.
			if f.run.Losses == nil || isFinite(f.run.Losses[i]) {
				st.GradientBackoffsBeforeNaN++
			}
		}
	}
	at := *st.ScaleAtFirstNaN
	bits := collapseBits(top, at)
	st.CollapseBits = &bits
	st.CollapseWindow = cut - from
	f.collapse = bits >= f.opt.CollapseBits && float64(st.GradientBackoffsBeforeNaN)*math.Log2(1/f.cfg.BackoffFactor) >= f.opt.CollapseBits
}

func (f *Facts) compare(baseline *Log) {
	if baseline == nil {
		f.notDerived("the gap to the fp32 baseline (plateau or noise): no --baseline given")
		return
	}
	switch {
	case baseline.Losses == nil:
		f.notDerived("the gap to the fp32 baseline: the baseline log %s has no losses", baseline.Path)
		return
	case f.run.Losses == nil:
		f.notDerived("the gap to the fp32 baseline: the run has no losses")
		return
	case f.nanIdx >= 0:
		f.notDerived("the gap to the fp32 baseline: the run's loss went NaN")
		return
	}
	if i := failingIndex(baseline.Losses); i >= 0 {
		what := ""
		if len(f.recovered) > 0 {
			what = " (a batch that GradScaler skipped in the fp16 run can ruin fp32)"
		}
		f.notDerived("the gap to the fp32 baseline: the baseline's loss went NaN/Inf for good at %s %d%s; give a baseline that ran to the end", f.unit(), baseline.Step(i), what)
		return
	}
	if f.run.PerEpoch != baseline.PerEpoch {
		f.notDerived("the gap to the fp32 baseline: one log holds a loss per epoch (fastai's history.csv) and the other a loss per step; give both in the same form")
		return
	}
	if f.run.Steps != nil || baseline.Steps != nil {
		f.compareByStep(baseline)
		return
	}
	defer f.compareValid(baseline)
	m := min(len(f.run.Losses), len(baseline.Losses))
	if len(f.run.Losses) != len(baseline.Losses) {
		f.note("the run has %d steps and the baseline %d: their final losses are compared over the first %d steps of both", len(f.run.Losses), len(baseline.Losses), m)
	}
	w := finalWindow(m)
	rl, bl := meanFinite(f.run.Losses[m-w:m]), meanFinite(baseline.Losses[m-w:m])
	if rl == nil || bl == nil {
		f.notDerived("the gap to the fp32 baseline: no finite losses in the final %d steps", w)
		return
	}
	c := &report.Comparison{Steps: m, Window: w, RunLoss: *rl, BaselineLoss: *bl, Tolerance: f.opt.PlateauTolerance}
	c.Gap = f.gap(*rl, *bl)
	f.r.Comparison = c
}

func (f *Facts) epochs() {
	ep := f.run.Epochs
	if ep == nil {
		f.notDerived("skip rate per epoch: the log states no steps_per_epoch (JSON) or epoch column (CSV)")
		return
	}
	if f.skips == nil || f.run.PerEpoch {
		return
	}
	if f.sampled {
		f.notDerived("skip rate per epoch: the log holds the scale of one step in %d, and the skipped steps between two samples cannot be placed in an epoch", f.every)
		return
	}
	for i, e := range ep {
		if n := len(f.r.Epochs); n == 0 || f.r.Epochs[n-1].Epoch != e {
			f.r.Epochs = append(f.r.Epochs, report.EpochStats{Epoch: e})
		}
		es := &f.r.Epochs[len(f.r.Epochs)-1]
		es.Steps++
		es.Skipped += f.skips[i]
	}
	for i := range f.r.Epochs {
		f.r.Epochs[i].SkipRate = float64(f.r.Epochs[i].Skipped) / float64(f.r.Epochs[i].Steps)
	}
}

func (f *Facts) series(baseline *Log) {
	f.r.Series = []report.Bucket{}
	size := (f.n + SeriesBuckets - 1) / SeriesBuckets
	for from := 0; from < f.n; from += size {
		to := min(from+size, f.n)
		b := report.Bucket{From: f.step(from), To: f.step(to - 1)}
		// The baseline is compared step for step from its first entry,
		// as compare does.
		if baseline != nil && from < len(baseline.Losses) {
			b.BaselineLoss = meanFinite(baseline.Losses[from:min(to, len(baseline.Losses))])
		}
		if ls := f.run.Losses; ls != nil {
			b.Loss = meanFinite(ls[from:to])
			for _, v := range ls[from:to] {
				if !isFinite(v) {
					b.NonFinite++
				}
			}
		}
		if sc := f.run.Scales; sc != nil && f.skips != nil {
			lo, hi := math.Inf(1), math.Inf(-1)
			for i := from; i < to; i++ {
				b.Skipped += f.skips[i]
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
		f.r.Series = append(f.r.Series, b)
	}
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
func (f *Facts) gap(run, baseline float64) float64 {
	if math.Abs(baseline) < 1e-12 {
		f.note("the baseline's final loss is zero: the gap is absolute, not relative")
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
