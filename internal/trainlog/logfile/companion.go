package logfile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"

	"fp16audit/internal/trainlog"
)

// The companion's log format (python/README.md, "The log format").
const (
	trainlogFormat  = "fp16audit.trainlog"
	trainlogVersion = 1
)

func isTrainlogHeader(rec map[string]rawValue) bool {
	f, ok := rec["format"]
	return ok && f.cell().text == trainlogFormat
}

// Decoded forms of the companion's lines; pointers tell null from absent
// where the format gives null a meaning. Floats arrive through
// quoteNonFinite, so they are decoded as rawValue.
type (
	tlHeader struct {
		Kind          string    `json:"kind"`
		Version       *int      `json:"version"`
		GradScaler    *tlScaler `json:"grad_scaler"`
		StepsPerEpoch *int      `json:"steps_per_epoch"`
		Telemetry     *struct {
			Modules []struct {
				Name string `json:"name"`
			} `json:"modules"`
		} `json:"telemetry"`
	}
	tlScaler struct {
		Enabled        bool     `json:"enabled"`
		InitScale      rawValue `json:"init_scale"`
		GrowthFactor   rawValue `json:"growth_factor"`
		BackoffFactor  rawValue `json:"backoff_factor"`
		GrowthInterval *int     `json:"growth_interval"`
	}
	tlStep struct {
		Step    *int     `json:"step"`
		Epoch   *int     `json:"epoch"`
		Loss    rawValue `json:"loss"`
		Scale   rawValue `json:"scale"`
		Skipped *bool    `json:"skipped"`
	}
	tlTelemetry struct {
		Step                 *int     `json:"step"`
		Reasons              []string `json:"reasons"`
		Measured             string   `json:"measured"`
		ScaleUsed            rawValue `json:"scale_used"`
		FirstNonFiniteOutput *string  `json:"first_nonfinite_output"`
		FirstNonFiniteParams *string  `json:"first_nonfinite_params"`
		Modules              []struct {
			Name   string     `json:"name"`
			Type   string     `json:"type"`
			Output *tlSummary `json:"output"`
			Params *tlSummary `json:"params"`
		} `json:"modules"`
	}
	tlSummary struct {
		Numel        int      `json:"numel"`
		NonFinite    int      `json:"nonfinite"`
		NonFiniteSrc int      `json:"nonfinite_src"`
		MaxAbs       rawValue `json:"max_abs"`
		Nonzero      *int     `json:"nonzero"`
		Underflow    *int     `json:"underflow"`
		Subnormal    *int     `json:"subnormal"`
		SumSq        rawValue `json:"sumsq"`
		LostSumSq    rawValue `json:"lost_sumsq"`
	}
	tlCapture struct {
		Step    *int   `json:"step"`
		Trigger string `json:"trigger"`
		Path    string `json:"path"`
		Error   string `json:"error"`
	}
	tlEnd struct {
		Steps   *int `json:"steps"`
		Skipped *int `json:"skipped"`
	}
)

// float reads a float field: a number, one of the strings NaN, Infinity,
// -Infinity (or the bare tokens), or null/absent (ok false).
func (v rawValue) float() (float64, bool, error) {
	if len(bytes.TrimSpace(v)) == 0 {
		return 0, false, nil
	}
	c := v.cell()
	if c.null {
		return 0, false, nil
	}
	f, ok := number(c)
	if !ok {
		return 0, false, fmt.Errorf("want a number or one of \"NaN\", \"Infinity\", \"-Infinity\", found %s", describeJSON(json.RawMessage(v)))
	}
	return f, true, nil
}

// parseTrainlog reads the companion's JSON Lines log: a header, a step line
// per optimizer step with its telemetry line after it, a capture line
// after the step line of a step the recorder captured (docs/capture.md),
// an end line when the run finished. Unknown kinds and fields are ignored,
// as the format asks of readers.
func parseTrainlog(path string, data []byte) (*trainlog.Log, error) {
	perr := func(line int, format string, args ...any) error {
		return &ParseError{Path: path, Line: line, Msg: fmt.Sprintf(format, args...)}
	}
	l := &trainlog.Log{Path: path, Format: "trainlog"}
	var (
		header       *tlHeader
		steps        []int
		losses       []float64
		scales       []float64
		skipped      []int8
		epochs       []int
		epochsKnown  = true
		lossNulls    = 0
		end          *tlEnd
		lastStepLine = -1
		scaling      = false
	)
	for i, raw := range bytes.Split(data, []byte("\n")) {
		line := bytes.TrimSpace(raw)
		if len(line) == 0 {
			continue
		}
		n := i + 1
		q := quoteNonFinite(line)
		var kind struct {
			Kind string `json:"kind"`
		}
		if err := json.Unmarshal(q, &kind); err != nil {
			return nil, perr(n, "want one JSON object per line (%s v1, python/README.md): %s", trainlogFormat, strings.TrimPrefix(err.Error(), "json: "))
		}
		if header == nil {
			var h tlHeader
			if err := json.Unmarshal(q, &h); err != nil || h.Kind != "header" {
				return nil, perr(n, `want the header line {"kind": "header", "format": %q, ...} first, found kind %q`, trainlogFormat, kind.Kind)
			}
			if h.Version == nil || *h.Version != trainlogVersion {
				v := "none"
				if h.Version != nil {
					v = fmt.Sprint(*h.Version)
				}
				return nil, perr(n, "want %s version %d, found version %s: this fp16audit reads version %d (python -m fp16audit.convert writes the JSON form every version reads)", trainlogFormat, trainlogVersion, v, trainlogVersion)
			}
			header = &h
			if g := h.GradScaler; g != nil && g.Enabled {
				scaling = true
				for _, f := range []struct {
					name string
					v    rawValue
					dst  *float64
				}{{"init_scale", g.InitScale, &l.Scaler.InitScale}, {"growth_factor", g.GrowthFactor, &l.Scaler.GrowthFactor}, {"backoff_factor", g.BackoffFactor, &l.Scaler.BackoffFactor}} {
					x, ok, err := f.v.float()
					if err != nil || ok && !(x > 0 && isFinite(x)) {
						return nil, perr(n, "grad_scaler.%s: want a positive number, found %s", f.name, describeJSON(json.RawMessage(f.v)))
					}
					*f.dst = x
				}
				if g.GrowthInterval != nil {
					if *g.GrowthInterval <= 0 {
						return nil, perr(n, "grad_scaler.growth_interval: want a positive integer, found %d", *g.GrowthInterval)
					}
					l.Scaler.GrowthInterval = *g.GrowthInterval
				}
			}
			if h.StepsPerEpoch != nil && *h.StepsPerEpoch > 0 {
				l.StepsPerEpoch = *h.StepsPerEpoch
			}
			if h.Telemetry != nil {
				l.TelemetryModules = len(h.Telemetry.Modules)
			}
			continue
		}
		switch kind.Kind {
		case "header":
			return nil, perr(n, "a second header line: two logs written into one file? keep one")
		case "step":
			var s tlStep
			if err := json.Unmarshal(q, &s); err != nil {
				return nil, perr(n, "step line: %s", strings.TrimPrefix(err.Error(), "json: "))
			}
			if s.Step == nil {
				return nil, perr(n, "step line: want an integer step, found none")
			}
			if k := len(steps); k > 0 && *s.Step <= steps[k-1] {
				return nil, perr(n, "step: want steps in increasing order, found %d after %d", *s.Step, steps[k-1])
			}
			loss, ok, err := s.Loss.float()
			if err != nil {
				return nil, perr(n, "loss: %v", err)
			}
			if !ok {
				// null: not recorded. A Log holds a loss per entry or none;
				// a loss missing among recorded ones is read as NaN and
				// counted for a note.
				loss = math.NaN()
				lossNulls++
			}
			scale, ok, err := s.Scale.float()
			if err != nil {
				return nil, perr(n, "scale: %v", err)
			}
			if !ok {
				scale = math.NaN()
			} else {
				prev := math.NaN()
				for j := len(scales) - 1; j >= 0; j-- {
					if !math.IsNaN(scales[j]) {
						prev = scales[j]
						break
					}
				}
				if msg := badScaleAfter(prev, scale); msg != "" {
					return nil, perr(n, "scale: %s", msg)
				}
			}
			sk := int8(-1)
			if s.Skipped != nil {
				sk = 0
				if *s.Skipped {
					sk = 1
				}
			}
			if s.Epoch == nil {
				epochsKnown = false
			} else {
				epochs = append(epochs, *s.Epoch)
			}
			steps = append(steps, *s.Step)
			losses = append(losses, loss)
			scales = append(scales, scale)
			skipped = append(skipped, sk)
			lastStepLine = *s.Step
		case "telemetry":
			var t tlTelemetry
			if err := json.Unmarshal(q, &t); err != nil {
				return nil, perr(n, "telemetry line: %s", strings.TrimPrefix(err.Error(), "json: "))
			}
			if t.Step == nil || *t.Step != lastStepLine {
				return nil, perr(n, "telemetry line: want the step of the step line before it (%d), found %s", lastStepLine, describeStep(t.Step))
			}
			tl, err := telemetryLine(n, &t)
			if err != nil {
				return nil, perr(n, "telemetry line: %v", err)
			}
			l.Telemetry = append(l.Telemetry, tl)
		case "capture":
			var c tlCapture
			if err := json.Unmarshal(q, &c); err != nil {
				return nil, perr(n, "capture line: %s", strings.TrimPrefix(err.Error(), "json: "))
			}
			if c.Step == nil {
				return nil, perr(n, `capture line: want the captured step ({"kind": "capture", "step": N, "trigger": ..., "path": ...}, docs/capture.md), found none`)
			}
			if c.Path == "" && c.Error == "" {
				return nil, perr(n, "capture line of step %d: want the capture folder (path) or why it failed (error), found neither", *c.Step)
			}
			l.Captures = append(l.Captures, trainlog.Capture{Line: n, Step: *c.Step, Trigger: c.Trigger, Path: c.Path, Error: c.Error})
		case "end":
			var e tlEnd
			if err := json.Unmarshal(q, &e); err != nil {
				return nil, perr(n, "end line: %s", strings.TrimPrefix(err.Error(), "json: "))
			}
			end = &e
		}
	}
	if header == nil {
		return nil, perr(0, "empty log: want a header line first")
	}
	if len(steps) == 0 {
		return nil, perr(0, "%s: the log has a header but no step lines (the run stopped before its first step)", ErrNoData.Error())
	}
	if end == nil {
		l.Notes = append(l.Notes, "the log has no end line: the run stopped early (crashed, killed, or still running); every step before that was read")
	} else if end.Steps != nil && *end.Steps != len(steps) {
		l.Notes = append(l.Notes, fmt.Sprintf("the end line counts %d steps, the log holds %d step lines", *end.Steps, len(steps)))
	}
	l.FirstStep = steps[0]
	if steps[len(steps)-1]-steps[0] != len(steps)-1 {
		l.Steps = steps
	}
	allNull := lossNulls == len(losses)
	switch {
	case allNull:
	case lossNulls > 0:
		l.Losses = losses
		l.Notes = append(l.Notes, fmt.Sprintf("%d step lines have a null loss (not recorded) among recorded ones: read as NaN", lossNulls))
	default:
		l.Losses = losses
	}
	if scaling && slices.ContainsFunc(scales, func(s float64) bool { return !math.IsNaN(s) }) {
		l.Scales = scales
	}
	if !scaling {
		l.Notes = append(l.Notes, "the header's grad_scaler is null or disabled: a run without loss scaling (fp32, or to_bf16()); losses only")
	}
	l.Skipped = skipped
	if epochsKnown {
		l.Epochs = epochs
		for i := 1; i < len(epochs); i++ {
			if epochs[i] < epochs[i-1] {
				l.Epochs = nil
				l.Notes = append(l.Notes, "the epochs of the step lines go back: epochs were not used")
				break
			}
		}
	} else if l.StepsPerEpoch > 0 {
		l.Epochs = make([]int, len(steps))
		for i, s := range steps {
			l.Epochs[i] = s / l.StepsPerEpoch
		}
	}
	if err := validate(l); err != nil {
		return nil, err
	}
	return l, nil
}

func describeStep(p *int) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}

func telemetryLine(line int, t *tlTelemetry) (trainlog.TelemetryLine, error) {
	tl := trainlog.TelemetryLine{Line: line, Step: *t.Step, Skip: slices.Contains(t.Reasons, "skipped"), Full: t.Measured == "full", Scale: math.NaN()}
	if v, ok, err := t.ScaleUsed.float(); err != nil {
		return tl, fmt.Errorf("scale_used: %v", err)
	} else if ok {
		tl.Scale = v
	}
	if t.FirstNonFiniteOutput != nil {
		tl.FirstNonFiniteOutput = *t.FirstNonFiniteOutput
	}
	if t.FirstNonFiniteParams != nil {
		tl.FirstNonFiniteParams = *t.FirstNonFiniteParams
	}
	for i, m := range t.Modules {
		mg := trainlog.ModuleGrads{Name: m.Name, Type: m.Type}
		for _, g := range []struct {
			which string
			src   *tlSummary
			dst   **trainlog.GradSummary
		}{{"output", m.Output, &mg.Output}, {"params", m.Params, &mg.Params}} {
			if g.src == nil {
				continue
			}
			max, _, err := g.src.MaxAbs.float()
			if err != nil {
				return tl, fmt.Errorf("modules[%d].%s.max_abs: %v", i, g.which, err)
			}
			gs := &trainlog.GradSummary{Numel: g.src.Numel, NonFinite: g.src.NonFinite, NonFiniteSrc: g.src.NonFiniteSrc, MaxAbs: max,
				Nonzero: g.src.Nonzero, Underflow: g.src.Underflow, Subnormal: g.src.Subnormal}
			for _, sum := range []struct {
				name string
				v    rawValue
				dst  **float64
			}{{"sumsq", g.src.SumSq, &gs.SumSq}, {"lost_sumsq", g.src.LostSumSq, &gs.LostSumSq}} {
				x, ok, err := sum.v.float()
				if err != nil || ok && !(x >= 0 && isFinite(x)) {
					return tl, fmt.Errorf("modules[%d].%s.%s: want a finite number of zero or more, found %s", i, g.which, sum.name, describeJSON(json.RawMessage(sum.v)))
				}
				if ok {
					*sum.dst = &x
				}
			}
			*g.dst = gs
		}
		tl.Modules = append(tl.Modules, mg)
	}
	return tl, nil
}
