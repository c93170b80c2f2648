package replay

import (
	"math"
	"slices"
	"sort"

	"fp16audit/internal/capture"
	"fp16audit/report"
)

// maxTimeline bounds the steps a timeline keeps: a longer log keeps every
// skipped step, the last tailSteps and evenly spaced ones before them.
const (
	maxTimeline = 2000
	tailSteps   = 200
)

// timeline is the run up to and including the captured step.
func timeline(l *capture.Log, upTo int) *report.Timeline {
	if l == nil || len(l.Steps) == 0 {
		return nil
	}
	var steps []capture.Step
	for _, s := range l.Steps {
		if s.Step <= upTo {
			steps = append(steps, s)
		}
	}
	if len(steps) == 0 {
		return nil
	}
	every := 1
	if len(steps) > maxTimeline {
		every = (len(steps) - tailSteps + maxTimeline - tailSteps - 1) / (maxTimeline - tailSteps)
	}
	t := &report.Timeline{}
	for i, s := range steps {
		if every > 1 && i%every != 0 && !s.Skipped && i < len(steps)-tailSteps {
			continue
		}
		t.Steps = append(t.Steps, s.Step)
		t.Loss = append(t.Loss, floatOr(s.Loss))
		t.Scale = append(t.Scale, floatOr(s.Scale))
		t.Skipped = append(t.Skipped, s.Skipped)
	}
	return t
}

func floatOr(f *capture.Float) float64 {
	if f == nil {
		return math.NaN()
	}
	return float64(*f)
}

// earlier is the culprit module's magnitude at the logged steps before
// the capture: its forward output (or its weights, for a weight culprit),
// or its output gradient unscaled for a gradient culprit.
func (d *diag) earlier(c *report.Culprit) []report.Magnitude {
	s := d.series(c)
	if s == nil {
		return nil
	}
	out := make([]report.Magnitude, 0, len(s.Steps))
	for i, st := range s.Steps {
		if st < d.step() {
			out = append(out, report.Magnitude{Step: st, What: s.What, MaxAbs: s.Values[i]})
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func (d *diag) culpritSeries() *report.Series { return d.series(d.r.Culprit) }

// series reads the culprit's logged quantity from the telemetry lines.
func (d *diag) series(c *report.Culprit) *report.Series {
	l := d.in.Log
	if l == nil || c == nil || c.Module == "" {
		return nil
	}
	s := &report.Series{Module: c.Module}
	switch {
	case c.Kind == report.CulpritWeight:
		s.What, s.Limit = "weight max |w|", fp16Max
	case c.Kind == report.CulpritGradient && d.r.Verdict == report.ReplayUnderflow:
		s.What = "parameter gradient's mass lost to fp16"
	case c.Kind == report.CulpritGradient:
		s.What, s.Limit = "output gradient max |g| × the step's scale", fp16Max
	default:
		s.What, s.Limit = "forward output max |x|", fp16Max
	}
	for _, t := range l.Telemetry {
		if t.Step > d.step() {
			continue
		}
		i := slices.IndexFunc(t.Modules, func(m capture.TelemetryModule) bool { return m.Name == c.Module })
		if i < 0 {
			continue
		}
		m := t.Modules[i]
		v, ok := 0.0, false
		switch {
		case c.Kind == report.CulpritWeight:
			if m.WeightMaxAbs != nil {
				v, ok = float64(*m.WeightMaxAbs), true
			}
		case c.Kind == report.CulpritGradient && d.r.Verdict == report.ReplayUnderflow:
			if m.Params != nil && m.Params.LostMass != nil {
				v, ok = float64(*m.Params.LostMass), true
			}
		case c.Kind == report.CulpritGradient:
			if m.Output != nil && m.Output.MaxAbs != nil {
				v, ok = float64(*m.Output.MaxAbs), true
				if m.Output.NonFinite > 0 {
					v = math.Inf(1)
				}
			}
		default:
			if m.Forward != nil && m.Forward.MaxAbs != nil {
				v, ok = float64(*m.Forward.MaxAbs), true
				if m.Forward.NonFinite > 0 {
					v = math.Inf(1)
				}
			}
		}
		if ok {
			s.Steps = append(s.Steps, t.Step)
			s.Values = append(s.Values, v)
		}
	}
	if len(s.Steps) == 0 {
		return nil
	}
	return s
}

// clipNorm proposes clipping's max_norm: the total fp32 gradient norm of
// the captured step, or, lower, the median norm the log's telemetry
// measured on earlier steps whose gradients were finite.
func (d *diag) clipNorm() {
	// the step's fp32 gradient norm; where the forward failed first and
	// the backward did not run, the norm the telemetry logged
	norm := math.NaN()
	if b := d.backward(); b != nil && len(b.Parameters) > 0 {
		sum := 0.0
		for _, p := range b.Parameters {
			sum += p.Norm * p.Norm
		}
		norm = math.Sqrt(sum)
	}
	if typical, ok := d.loggedNorm(); ok && (math.IsNaN(norm) || typical < norm) {
		norm = typical
	}
	if !(norm > 0) || math.IsInf(norm, 0) || math.IsNaN(norm) {
		return
	}
	// two significant digits, rounded down
	e := math.Pow(10, math.Floor(math.Log10(norm))-1)
	norm = math.Floor(norm/e) * e
	d.r.ClipNorm = &norm
}

// loggedNorm is the median total gradient norm of the telemetry lines
// before the capture that measured every parameter gradient finite.
func (d *diag) loggedNorm() (float64, bool) {
	l := d.in.Log
	if l == nil {
		return 0, false
	}
	var norms []float64
	for _, t := range l.Telemetry {
		if t.Step >= d.step() || t.ScaleUsed == nil || !(*t.ScaleUsed > 0) {
			continue
		}
		sum, ok := 0.0, false
		for _, m := range t.Modules {
			if m.Params == nil {
				continue
			}
			if m.Params.NonFinite > 0 || m.Params.Sumsq == nil {
				ok = false
				break
			}
			sum += float64(*m.Params.Sumsq)
			ok = true
		}
		if ok {
			norms = append(norms, math.Sqrt(sum)/float64(*t.ScaleUsed))
		}
	}
	if len(norms) == 0 {
		return 0, false
	}
	sort.Float64s(norms)
	return norms[len(norms)/2], true
}

// proposeStepFixes adds, for the failures that develop over steps, the
// fixes that only a continuation can verify: clipping at the proposed
// norm, a lower learning rate, fp32 (and bf16 where one step did not
// verify it).
func (d *diag) proposeStepFixes() {
	switch d.r.Verdict {
	case report.ReplayForwardOverflow, report.ReplayGradientOverflow, report.ReplayUnderflow:
	default:
		return
	}
	lr := d.in.Capture.Manifest.Optimizer
	var lower *float64
	if lr != nil && lr.LR != nil && *lr.LR > 0 {
		v := float64(*lr.LR) / 10
		lower = &v
	}
	if d.r.Verdict != report.ReplayUnderflow {
		d.addFix(report.ReplayFix{Kind: report.FixClip, ClipNorm: d.r.ClipNorm,
			Summary: "clip the gradients (not verified by one step: a continuation from the captured state verifies it)"}, nil)
		d.addFix(report.ReplayFix{Kind: report.FixLowerLR, LR: lower,
			Summary: "lower the learning rate tenfold (not verified by one step: a continuation from the captured state verifies it)"}, nil)
	}
	d.addFix(report.ReplayFix{Kind: report.FixFP32, Summary: "train in fp32 (the baseline the continuations compare with)"}, nil)
}
