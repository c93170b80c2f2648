// Package logfile reads a training log, in the forms people have, into a
// *trainlog.Log: fp16audit's own JSON and CSV, tables whose columns it
// recognises by meaning (CSV, TSV, JSON records or columns, JSON Lines,
// Hugging Face's trainer_state.json), plain lists of numbers (one per
// line, a JSON array, np.save), TensorBoard event files, fastai's
// history.csv and MixedPrecision.scales, and the Python companion's JSON
// Lines log with per-module gradient telemetry. A malformed log is a
// *ParseError that names the file, the place, what was expected and what
// was found.
package logfile

import (
	"encoding/csv"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"fp16audit/internal/trainlog"
)

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

// Error writes the error as PATH[:LINE][: FIELD]: MSG.
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
func validate(l *trainlog.Log) error {
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

// isFinite reports whether v is neither NaN nor infinite.
func isFinite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
