// Package trainlog diagnoses a mixed-precision training run from its
// history: the loss of every optimizer step and the GradScaler loss scale
// after every step. It reads the log in the forms people have (its own JSON
// and CSV, tables whose columns it recognises by meaning, plain lists of
// numbers, TensorBoard event files, fastai's history.csv, the Python
// companion's JSON Lines log with per-module gradient telemetry),
// reconstructs what the scaler did (skipped steps, backoff runs, collapse,
// pinning, warm-up; lower bounds when the log holds every Nth step),
// classifies the run into one verdict with FP5xxx findings, and names the
// modules whose gradients overflow or underflow when the log carries
// telemetry. The failure classes are those of the table in DESIGN.md:
// early NaN (forward overflow), mid-training NaN after a collapsing scale
// (gradient overflow), mid-training NaN with a healthy scale (the forward
// pass began to overflow), a plateau above the fp32 baseline (underflow,
// skipped steps), wasted warm-up steps, healthy.
package trainlog

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"fp16audit/report"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Log is one training run: one entry per optimizer step, or per sampled
// step when Steps says so. Scales[i] is scaler.get_scale() read after the
// scaler.update() of step i, that is the scale the next step uses; a step
// whose gradients overflowed shows as a backoff (Scales[i] = Scales[i-1] ×
// backoff_factor). Losses may hold NaN and ±Inf. A log has losses, scales
// or both; when both, they have the same length.
type Log struct {
	// Path names the log in messages and reports.
	Path string
	// FirstStep is the step number of the first entry: the CSV's first
	// step value, 0 for JSON.
	FirstStep int
	// Steps holds the step number of every entry when the entries are not
	// consecutive steps (a log written every N steps); nil means FirstStep,
	// FirstStep+1, and so on.
	Steps []int
	// Losses is nil when the log records no losses.
	Losses []float64
	// Scales is nil when the log records no scales. NaN marks an entry
	// whose scale was not recorded (a scale column logged less often than
	// the loss); no GradScaler scale is NaN.
	Scales []float64
	// Skipped holds a log's own record of skipped steps (a skipped,
	// found_inf or overflow column): 1 skipped, 0 not, -1 not recorded;
	// nil when the log has none.
	Skipped []int8
	// Epochs holds the epoch of every step, nil when unknown.
	Epochs []int
	// StepsPerEpoch is the JSON field steps_per_epoch, 0 when absent.
	StepsPerEpoch int
	// Scaler is the GradScaler configuration the log states; zero fields
	// were not stated.
	Scaler report.ScalerConfig
	// Format is how the log was read (report.RunInfo.Format).
	Format string
	// PerEpoch is set when every entry is one epoch (fastai's
	// history.csv); Steps then holds epoch numbers.
	PerEpoch bool
	// ValidLosses holds a per-epoch log's validation losses (NaN where
	// none was computed), nil otherwise.
	ValidLosses []float64
	// Telemetry holds the per-module gradient telemetry of a log written
	// by the Python companion, in file order; TelemetryModules is the
	// number of modules its header says were watched (0: no telemetry).
	Telemetry        []TelemetryLine
	TelemetryModules int
	// Notes and NotDerived are facts the reader learned about the log
	// (columns it recognised, a run that stopped early) and what the form
	// of the log cannot tell; the report carries them.
	Notes      []string
	NotDerived []string
}

// TelemetryLine is one telemetry line of the companion's log: per-module
// gradient summaries of one step, measured on the scaled gradients as fp16
// would hold them (python/README.md, "telemetry").
type TelemetryLine struct {
	// Line is the line of the file, for messages.
	Line  int
	Step  int
	Skip  bool // reasons holds "skipped"
	Full  bool // measured is "full": the underflow counts are present
	Scale float64
	// FirstNonFiniteOutput and FirstNonFiniteParams are the companion's
	// first module, in backward order, whose output or parameter
	// gradient held Inf/NaN in fp16; "" when none did.
	FirstNonFiniteOutput string
	FirstNonFiniteParams string
	// Modules are in backward order: the order their first gradient
	// arrived in.
	Modules []ModuleGrads
}

// ModuleGrads is one module's entry in a telemetry line; Output and Params
// are nil when that gradient did not arrive.
type ModuleGrads struct {
	Name, Type     string
	Output, Params *GradSummary
}

// GradSummary is the companion's summary of one gradient of one module.
// The pointer fields are nil when the line did not measure them.
type GradSummary struct {
	Numel        int
	NonFinite    int
	NonFiniteSrc int
	MaxAbs       float64
	Nonzero      *int
	Underflow    *int
	Subnormal    *int
}

// Len is the number of entries in the log: its steps, or its samples when
// Steps is set.
func (l *Log) Len() int { return max(len(l.Losses), len(l.Scales)) }

// stepAt is the step number of entry i.
func (l *Log) stepAt(i int) int {
	if l.Steps != nil {
		return l.Steps[i]
	}
	return l.FirstStep + i
}

// LastStep is the step number of the last entry.
func (l *Log) LastStep() int { return l.stepAt(l.Len() - 1) }

// Sampled reports whether the log holds fewer entries than the steps it
// spans: a log written every N steps.
func (l *Log) Sampled() bool { return l.Steps != nil && !l.PerEpoch }

// PyTorch's GradScaler defaults (torch.amp.GradScaler and fastai's
// MixedPrecision, which passes its kwargs through).
var DefaultScaler = report.ScalerConfig{InitScale: 65536, GrowthFactor: 2, BackoffFactor: 0.5, GrowthInterval: 2000}

// ParseError is a malformed log. It names the file, the place (a line or a
// JSON field) and what was expected against what was found.
type ParseError struct {
	Path string
	// Line is the 1-based line, 0 when the error is not about one line.
	Line int
	// Field is the JSON field or CSV column, "" when not about one field.
	Field string
	Msg   string
}

func (e *ParseError) Error() string {
	var b strings.Builder
	b.WriteString(e.Path)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	if e.Field != "" {
		b.WriteString(": " + e.Field)
	}
	b.WriteString(": " + e.Msg)
	return b.String()
}

// ErrNoData reports a log without losses and without scales.
var ErrNoData = errors.New("the log has neither losses nor scales")

const formatHint = `want a JSON object {"scales": [...], "losses": [...]} or a CSV with a step,loss,scale header`

// ReadFile reads a log from path with the default ReadOptions.
func ReadFile(path string) (*Log, error) { return Read(path, ReadOptions{}) }

// bareMark marks a NaN/Infinity token that was bare in the input, so that a
// string "NaN" in the scales can still be told apart from a bare NaN.
const bareMark = "\x00"

// quoteNonFinite turns the bare tokens NaN, Infinity and -Infinity that
// Python's json module writes (and encoding/json rejects) into marked
// strings, leaving string contents alone.
func quoteNonFinite(data []byte) []byte {
	var out []byte
	inString, escaped := false, false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			out = append(out, c)
			continue
		}
		if c == '"' {
			inString = true
			out = append(out, c)
			continue
		}
		matched := false
		for _, tok := range []string{"NaN", "Infinity", "-Infinity"} {
			if bytes.HasPrefix(data[i:], []byte(tok)) {
				out = append(out, `"\u0000`+tok+`"`...)
				i += len(tok) - 1
				matched = true
				break
			}
		}
		if !matched {
			out = append(out, c)
		}
	}
	return out
}

func lineAt(data []byte, offset int64) int {
	if offset > int64(len(data)) {
		offset = int64(len(data))
	}
	return bytes.Count(data[:offset], []byte{'\n'}) + 1
}

// jsonNumbers decodes an array of numbers. Losses accept null and the
// non-finite words; scales accept only numbers.
func jsonNumbers(raw json.RawMessage, field string, loss bool) ([]float64, error) {
	if string(raw) == "null" {
		return nil, nil
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, fmt.Errorf("%s: want an array of numbers, found %s", field, describeJSON(raw))
	}
	out := make([]float64, len(elems))
	for i, e := range elems {
		v, err := jsonFloat(e, loss)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %v", field, i, err)
		}
		out[i] = v
	}
	return out, nil
}

func jsonFloat(e json.RawMessage, loss bool) (float64, error) {
	s := string(bytes.TrimSpace(e))
	switch {
	case s == "null":
		if loss {
			return math.NaN(), nil
		}
		return 0, errors.New("want a number, found null")
	case strings.HasPrefix(s, `"`):
		var str string
		if err := json.Unmarshal(e, &str); err != nil {
			return 0, fmt.Errorf("want a number, found %s", s)
		}
		bare := strings.HasPrefix(str, bareMark)
		word := strings.TrimPrefix(str, bareMark)
		if loss {
			if v, ok := nonFiniteWord(word); ok {
				return v, nil
			}
		}
		if bare {
			return 0, fmt.Errorf("want a positive finite number, found %s", word)
		}
		return 0, fmt.Errorf("want a number, found string %q", str)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("want a number, found %s", describeJSON(e))
	}
	return v, nil
}

func nonFiniteWord(s string) (float64, bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "nan", "-nan":
		return math.NaN(), true
	case "inf", "+inf", "infinity", "+infinity":
		return math.Inf(1), true
	case "-inf", "-infinity":
		return math.Inf(-1), true
	}
	return 0, false
}

func describeJSON(raw json.RawMessage) string {
	s := strings.TrimSpace(string(raw))
	kind := "a value"
	switch {
	case s == "":
		return "nothing"
	case s[0] == '{':
		kind = "an object"
	case s[0] == '[':
		kind = "an array"
	case s[0] == '"':
		kind = "a string"
	case s == "true" || s == "false":
		kind = "a boolean"
	}
	s = strings.ReplaceAll(s, `\u0000`, "")
	if len(s) > 40 {
		s = s[:37] + "..."
	}
	return kind + " " + s
}

func jsonInt(raw json.RawMessage) (int, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(string(raw)), 64)
	if err != nil || v != math.Trunc(v) || math.Abs(v) > 1<<53 {
		return 0, fmt.Errorf("want an integer, found %s", describeJSON(raw))
	}
	return int(v), nil
}

func jsonScaler(raw json.RawMessage) (report.ScalerConfig, error) {
	var m map[string]json.RawMessage
	var c report.ScalerConfig
	if err := json.Unmarshal(raw, &m); err != nil {
		return c, fmt.Errorf("want an object, found %s", describeJSON(raw))
	}
	pos := func(key string, dst *float64) error {
		r, ok := m[key]
		if !ok || string(r) == "null" {
			return nil
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(string(r)), 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			return fmt.Errorf("%s: want a positive number, found %s", key, describeJSON(r))
		}
		*dst = v
		return nil
	}
	if err := pos("init_scale", &c.InitScale); err != nil {
		return c, err
	}
	if err := pos("growth_factor", &c.GrowthFactor); err != nil {
		return c, err
	}
	if err := pos("backoff_factor", &c.BackoffFactor); err != nil {
		return c, err
	}
	if r, ok := m["growth_interval"]; ok && string(r) != "null" {
		v, err := jsonInt(r)
		if err != nil || v <= 0 {
			return c, fmt.Errorf("growth_interval: want a positive integer, found %s", describeJSON(r))
		}
		c.GrowthInterval = v
	}
	if c.GrowthFactor != 0 && c.GrowthFactor <= 1 {
		return c, fmt.Errorf("growth_factor: want a number above 1, found %g", c.GrowthFactor)
	}
	if c.BackoffFactor >= 1 {
		return c, fmt.Errorf("backoff_factor: want a number below 1, found %g", c.BackoffFactor)
	}
	return c, nil
}

func csvError(path string, err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		msg := pe.Err.Error()
		if errors.Is(pe.Err, csv.ErrFieldCount) {
			msg = "wrong number of fields: want as many as the header names"
		}
		return &ParseError{Path: path, Line: pe.Line, Msg: msg}
	}
	return &ParseError{Path: path, Msg: err.Error()}
}

// validate checks what every form shares: some data, equal lengths, step
// numbers for every entry, and scales that a GradScaler can produce (NaN
// marks a scale not recorded).
func (l *Log) validate() error {
	if len(l.Losses) == 0 && len(l.Scales) == 0 {
		return &ParseError{Path: l.Path, Msg: ErrNoData.Error() + ": " + formatHint}
	}
	if len(l.Losses) == 0 {
		l.Losses = nil
	}
	if len(l.Scales) == 0 || !slices.ContainsFunc(l.Scales, func(s float64) bool { return !math.IsNaN(s) }) {
		l.Scales = nil
	}
	if l.Losses != nil && l.Scales != nil && len(l.Losses) != len(l.Scales) {
		return &ParseError{Path: l.Path, Msg: fmt.Sprintf("scales has %d entries and losses %d: want one of each per optimizer step "+
			"(fastai's learn.mixed_precision.scales leaves out skipped steps: read it alone with --series fastai-scales, or record the log with the Python companion, python/README.md)",
			len(l.Scales), len(l.Losses))}
	}
	n := l.Len()
	if l.Steps != nil && len(l.Steps) != n || l.Skipped != nil && len(l.Skipped) != n || l.Epochs != nil && len(l.Epochs) != n {
		return &ParseError{Path: l.Path, Msg: "steps, skipped flags or epochs do not match the number of entries"}
	}
	prev := math.NaN()
	for i, s := range l.Scales {
		if math.IsNaN(s) {
			continue
		}
		if msg := badScaleAfter(prev, s); msg != "" {
			return &ParseError{Path: l.Path, Field: fmt.Sprintf("scales[%d]", i), Msg: msg}
		}
		prev = s
	}
	return nil
}

// badScale says what is wrong with scale s following the scales before,
// "" when nothing is.
func badScale(before []float64, s float64) string {
	// Exactly zero is what float32 halving reaches after some 150
	// consecutive backoffs; anything else non-positive is no GradScaler
	// scale.
	if s == 0 && len(before) > 0 && before[len(before)-1] < 1e-30 {
		return ""
	}
	if !(s > 0) || math.IsInf(s, 0) {
		return fmt.Sprintf("want a positive finite loss scale, found %v", s)
	}
	return ""
}
