package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"fp16audit/internal/execute"
)

// progressBar draws one line on stderr while an audit runs: the pass in
// flight, a bar of its batches, and the time so far. It stays silent for
// the first second, so quick audits print nothing, and erases itself when
// done. The command line creates one only when stderr is a terminal.
type progressBar struct {
	mu     sync.Mutex
	w      io.Writer
	width  int
	start  time.Time
	drawn  time.Time
	passes map[string]bool
	shown  bool
	now    func() time.Time
}

// progressDelay is how long an audit runs before the bar appears, and
// progressEvery how often it is redrawn at most.
const (
	progressDelay = time.Second
	progressEvery = 100 * time.Millisecond
)

func newProgressBar(w io.Writer, width int) *progressBar {
	if width <= 0 {
		width = 80
	}
	return &progressBar{w: w, width: width, start: time.Now(), passes: map[string]bool{}, now: time.Now}
}

// update is an audit.Progress: batch b of n of the named pass finished.
func (p *progressBar) update(pass string, b, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.passes[pass] = true
	t := p.now()
	if t.Sub(p.start) < progressDelay || (t.Sub(p.drawn) < progressEvery && b < n) {
		return
	}
	p.drawn = t
	p.shown = true
	fmt.Fprint(p.w, "\r"+p.line(pass, b, n, t.Sub(p.start))+"\x1b[K")
}

// line lays out the bar for the terminal width.
func (p *progressBar) line(pass string, b, n int, elapsed time.Duration) string {
	head := fmt.Sprintf("fp16audit: pass %d (%s) ", len(p.passes), pass)
	tail := fmt.Sprintf(" batch %d/%d  %.1fs", b, n, elapsed.Seconds())
	room := p.width - 1 - len([]rune(head)) - len(tail) - 2 // 2 for the bar's ends
	if room < 10 {
		return strings.TrimSpace(head + tail)
	}
	bar := min(room, 40)
	full := 0
	if n > 0 {
		full = bar * b / n
	}
	return head + "▕" + strings.Repeat("█", full) + strings.Repeat("░", bar-full) + "▏" + tail
}

// done erases the bar; a nil bar does nothing.
func (p *progressBar) done() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shown {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.shown = false
	}
}

// terminalWidth is the width of the terminal behind w: $COLUMNS when set,
// else what the terminal reports, else 0 (unknown).
func terminalWidth(w io.Writer) int {
	if c, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && c > 0 {
		return c
	}
	if f, ok := w.(*os.File); ok {
		return ttyWidth(f)
	}
	return 0
}

// progressFor is what --progress asks for: a bar on a terminal (auto) or
// always (bar), JSON lines, or nothing; the bar is returned too, to be
// finished when the run ends, nil where there is none.
func progressFor(mode string, stderr io.Writer) (*progressBar, execute.Progress, error) {
	switch mode {
	case "auto", "bar":
		if mode == "bar" || isTerminal(stderr) {
			bar := newProgressBar(stderr, terminalWidth(stderr))
			return bar, bar.update, nil
		}
		return nil, nil, nil
	case "json":
		return nil, jsonProgress(stderr), nil
	case "none":
		return nil, nil, nil
	}
	return nil, nil, fmt.Errorf("--progress %q: want auto, bar, json or none", mode)
}

// jsonProgress writes one JSON line per finished batch of a pass:
// {"progress": {"pass": "fp16", "pass_index": 2, "batch": 1, "batches": 4,
// "elapsed_seconds": 0.8}}, for a program that shows its own progress.
func jsonProgress(w io.Writer) func(pass string, b, n int) {
	type line struct {
		Pass      string  `json:"pass"`
		PassIndex int     `json:"pass_index"`
		Batch     int     `json:"batch"`
		Batches   int     `json:"batches"`
		Elapsed   float64 `json:"elapsed_seconds"`
	}
	var mu sync.Mutex
	start := time.Now()
	seen := map[string]int{}
	return func(pass string, b, n int) {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := seen[pass]; !ok {
			seen[pass] = len(seen) + 1
		}
		data, _ := json.Marshal(map[string]line{"progress": {pass, seen[pass], b, n, time.Since(start).Seconds()}})
		fmt.Fprintf(w, "%s\n", data)
	}
}
