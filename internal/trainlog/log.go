// Package trainlog diagnoses a mixed-precision training run from its
// history: the loss of every optimizer step and the GradScaler loss scale
// after every step. It reads the log (JSON or CSV), reconstructs what the
// scaler did (skipped steps, backoff runs, collapse, pinning, warm-up),
// classifies the run into one verdict with FP5xxx findings, and renders the
// result as text or JSON. The failure classes are those of the table in
// DESIGN.md: early NaN (forward overflow), mid-training NaN after a
// collapsing scale (gradient overflow), mid-training NaN with a healthy
// scale (the forward pass began to overflow), a plateau above the fp32
// baseline (underflow, skipped steps), wasted warm-up steps, healthy.
package trainlog

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"fp16audit/report"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Log is one training run: one entry per optimizer step. Scales[i] is
// scaler.get_scale() read after the scaler.update() of step i, that is the
// scale the next step uses; a step whose gradients overflowed shows as a
// backoff (Scales[i] = Scales[i-1] × backoff_factor). Losses may hold NaN
// and ±Inf. A log has losses, scales or both; when both, they have the same
// length.
type Log struct {
	// Path names the log in messages and reports.
	Path string
	// FirstStep is the step number of the first entry: the CSV's first
	// step value, 0 for JSON.
	FirstStep int
	// Losses is nil when the log records no losses.
	Losses []float64
	// Scales is nil when the log records no scales.
	Scales []float64
	// Epochs holds the epoch of every step, nil when unknown.
	Epochs []int
	// StepsPerEpoch is the JSON field steps_per_epoch, 0 when absent.
	StepsPerEpoch int
	// Scaler is the GradScaler configuration the log states; zero fields
	// were not stated.
	Scaler report.ScalerConfig
}

// Len is the number of steps in the log.
func (l *Log) Len() int { return max(len(l.Losses), len(l.Scales)) }

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

// ReadFile reads a log from path. The format follows the extension (.json,
// .csv); any other name is sniffed: a log starting with '{' is JSON.
func ReadFile(path string) (*Log, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".json":
		return ParseJSON(path, data)
	case ".csv":
		return ParseCSV(path, data)
	}
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' {
		return ParseJSON(path, data)
	}
	return ParseCSV(path, data)
}

// ParseJSON reads the JSON form of a log:
//
//	{"losses": [...], "scales": [...], "steps_per_epoch": N,
//	 "grad_scaler": {"init_scale": 65536, "growth_factor": 2, "backoff_factor": 0.5, "growth_interval": 2000}}
//
// Every field is optional, but losses or scales must be present. Losses may
// be NaN, Infinity, -Infinity (Python's json module writes them bare), null
// (read as NaN) or those words as strings. Other fields are ignored.
func ParseJSON(path string, data []byte) (*Log, error) {
	perr := func(line int, field, format string, args ...any) error {
		return &ParseError{Path: path, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, perr(0, "", "empty file: %s", formatHint)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(quoteNonFinite(data), &top); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return nil, perr(lineAt(data, syn.Offset), "", "invalid JSON: %v", syn)
		}
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) {
			return nil, perr(0, "", "want a JSON object at the top, found %s", typ.Value)
		}
		return nil, perr(0, "", "invalid JSON: %v", err)
	}
	l := &Log{Path: path}
	var err error
	if raw, ok := top["losses"]; ok {
		if l.Losses, err = jsonNumbers(raw, "losses", true); err != nil {
			return nil, perr(0, "", "%v", err)
		}
	}
	if raw, ok := top["scales"]; ok {
		if l.Scales, err = jsonNumbers(raw, "scales", false); err != nil {
			return nil, perr(0, "", "%v", err)
		}
	}
	if raw, ok := top["steps_per_epoch"]; ok && string(raw) != "null" {
		v, err := jsonInt(raw)
		if err != nil || v <= 0 {
			return nil, perr(0, "steps_per_epoch", "want a positive integer, found %s", raw)
		}
		l.StepsPerEpoch = v
	}
	if raw, ok := top["grad_scaler"]; ok && string(raw) != "null" {
		if l.Scaler, err = jsonScaler(raw); err != nil {
			return nil, perr(0, "grad_scaler", "%v", err)
		}
	}
	if l.StepsPerEpoch > 0 {
		l.Epochs = make([]int, l.Len())
		for i := range l.Epochs {
			l.Epochs[i] = i / l.StepsPerEpoch
		}
	}
	if err := l.validate(); err != nil {
		return nil, err
	}
	return l, nil
}

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

// ParseCSV reads the CSV form of a log: a header naming the columns, then
// one row per optimizer step. The columns are step (required, consecutive
// integers), loss and scale (at least one of them) and, optionally, epoch;
// other columns are ignored. Losses may be nan, inf or -inf. Lines starting
// with '#' are comments.
func ParseCSV(path string, data []byte) (*Log, error) {
	perr := func(line int, field, format string, args ...any) error {
		return &ParseError{Path: path, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, perr(0, "", "empty file: %s", formatHint)
	}
	r := csv.NewReader(bufio.NewReader(bytes.NewReader(data)))
	r.Comment = '#'
	r.TrimLeadingSpace = true
	header, err := r.Read()
	if err != nil {
		return nil, csvError(path, err)
	}
	line, _ := r.FieldPos(0)
	col := map[string]int{}
	for i, h := range header {
		col[strings.ToLower(strings.TrimSpace(h))] = i
	}
	_, hasStep := col["step"]
	_, hasLoss := col["loss"]
	_, hasScale := col["scale"]
	if !hasStep || !(hasLoss || hasScale) {
		return nil, perr(line, "", "want a header naming the columns step,loss,scale (loss or scale may be left out; epoch is optional), found %q", strings.Join(header, ","))
	}
	_, hasEpoch := col["epoch"]
	l := &Log{Path: path}
	if hasLoss {
		l.Losses = []float64{}
	}
	if hasScale {
		l.Scales = []float64{}
	}
	if hasEpoch {
		l.Epochs = []int{}
	}
	for row := 0; ; row++ {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, csvError(path, err)
		}
		line, _ := r.FieldPos(0)
		step, err := strconv.Atoi(strings.TrimSpace(rec[col["step"]]))
		if err != nil {
			return nil, perr(line, "step", "want an integer, found %q", rec[col["step"]])
		}
		if row == 0 {
			l.FirstStep = step
		} else if want := l.FirstStep + row; step != want {
			return nil, perr(line, "step", "want %d (one row per optimizer step, in order), found %d", want, step)
		}
		if hasLoss {
			s := strings.TrimSpace(rec[col["loss"]])
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return nil, perr(line, "loss", "want a number (nan and inf allowed), found %q", s)
			}
			l.Losses = append(l.Losses, v)
		}
		if hasScale {
			s := strings.TrimSpace(rec[col["scale"]])
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return nil, perr(line, "scale", "want a positive number, found %q", s)
			}
			if msg := badScale(l.Scales, v); msg != "" {
				return nil, perr(line, "scale", "%s", msg)
			}
			l.Scales = append(l.Scales, v)
		}
		if hasEpoch {
			s := strings.TrimSpace(rec[col["epoch"]])
			v, err := strconv.Atoi(s)
			if err != nil {
				return nil, perr(line, "epoch", "want an integer, found %q", s)
			}
			if n := len(l.Epochs); n > 0 && v < l.Epochs[n-1] {
				return nil, perr(line, "epoch", "want epochs in increasing order, found %d after %d", v, l.Epochs[n-1])
			}
			l.Epochs = append(l.Epochs, v)
		}
	}
	if l.Len() == 0 {
		return nil, perr(0, "", "the header has no rows after it: want one row per optimizer step")
	}
	if err := l.validate(); err != nil {
		return nil, err
	}
	return l, nil
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

// validate checks what both formats share: some data, equal lengths, and
// scales that a GradScaler can produce.
func (l *Log) validate() error {
	if len(l.Losses) == 0 && len(l.Scales) == 0 {
		return &ParseError{Path: l.Path, Msg: ErrNoData.Error() + ": " + formatHint}
	}
	if len(l.Losses) == 0 {
		l.Losses = nil
	}
	if len(l.Scales) == 0 {
		l.Scales = nil
	}
	if l.Losses != nil && l.Scales != nil && len(l.Losses) != len(l.Scales) {
		return &ParseError{Path: l.Path, Msg: fmt.Sprintf("scales has %d entries and losses %d: want one of each per optimizer step "+
			"(fastai's learn.mixed_precision.scales leaves out skipped steps; record the log with examples/fastai_scales_callback.py)",
			len(l.Scales), len(l.Losses))}
	}
	for i, s := range l.Scales {
		if msg := badScale(l.Scales[:i], s); msg != "" {
			return &ParseError{Path: l.Path, Field: fmt.Sprintf("scales[%d]", i), Msg: msg}
		}
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
