// Package markup holds what the renderers of every document share, so that
// none exists twice: a writer that remembers its first error and styles
// text with ANSI codes, Markdown escaping, and the pieces both HTML pages
// use (the page frame around their content, the style sheet they start
// from, chart coordinates). Like the renderers, it imports only report and
// checks.
package markup

import (
	"fmt"
	"io"
	"math"
	"strings"

	"fp16audit/checks"
)

// ANSI styles of the text renderings.
const (
	Reset  = "\x1b[0m"
	Bold   = "\x1b[1m"
	Dim    = "\x1b[2m"
	Red    = "\x1b[31m"
	Green  = "\x1b[32m"
	Yellow = "\x1b[33m"
	Cyan   = "\x1b[36m"
)

// Writer writes a text rendering. It remembers the first write error, so
// that a renderer can print line after line and check once at the end,
// and it styles text only when colour is on.
type Writer struct {
	w     io.Writer
	err   error
	color bool
}

// NewWriter returns a Writer to w that styles text when color is set.
func NewWriter(w io.Writer, color bool) *Writer { return &Writer{w: w, color: color} }

// Write writes p unless an earlier write failed.
func (e *Writer) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

// Printf writes like fmt.Fprintf; an error is kept for Err.
func (e *Writer) Printf(format string, args ...any) { fmt.Fprintf(e, format, args...) }

// Err is the first write error, nil when every write succeeded.
func (e *Writer) Err() error { return e.err }

// Style wraps s in the ANSI code when colour is on.
func (e *Writer) Style(code, s string) string {
	if !e.color || s == "" || code == "" {
		return s
	}
	return code + s + Reset
}

// SeverityStyle is the ANSI style of a finding's severity.
func SeverityStyle(s checks.Severity) string {
	switch s {
	case checks.SevError:
		return Red + Bold
	case checks.SevWarning:
		return Yellow
	}
	return Cyan
}

// Spark draws values as a sparkline of at most width cells, each the
// mean of its finite values; a cell with only non-finite values shows ×.
func Spark(v []float64, width int) string {
	if len(v) == 0 {
		return ""
	}
	glyphs := []rune("▁▂▃▄▅▆▇█")
	cells := min(width, len(v))
	means := make([]float64, cells)
	bad := make([]bool, cells)
	lo, hi := math.Inf(1), math.Inf(-1)
	for c := range cells {
		a, b := c*len(v)/cells, (c+1)*len(v)/cells
		sum, n := 0.0, 0
		for _, x := range v[a:b] {
			if math.IsNaN(x) || math.IsInf(x, 0) {
				bad[c] = true
				continue
			}
			sum += x
			n++
		}
		if n == 0 {
			means[c] = math.NaN()
			continue
		}
		means[c] = sum / float64(n)
		lo, hi = math.Min(lo, means[c]), math.Max(hi, means[c])
	}
	var b strings.Builder
	for c, m := range means {
		switch {
		case math.IsNaN(m) || (bad[c] && m == 0):
			b.WriteRune('×')
		case hi == lo:
			b.WriteRune(glyphs[len(glyphs)/2])
		default:
			b.WriteRune(glyphs[int(math.Round((m-lo)/(hi-lo)*float64(len(glyphs)-1)))])
		}
	}
	return b.String()
}
