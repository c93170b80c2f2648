package logfile

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"fp16audit/internal/trainlog"
)

// The meanings a column of a table can have. A table is any log with named
// values per row: CSV, TSV, JSON records or columns, JSON Lines records,
// TensorBoard tags.
const (
	colStep    = "step"
	colEpoch   = "epoch"
	colLoss    = "loss"
	colScale   = "scale"
	colSkipped = "skipped"
)

// Meanings lists the keys --columns and --tag accept, in the order
// messages name them.
var Meanings = []string{colStep, colEpoch, colLoss, colScale, colSkipped}

// synonyms are the names each meaning is recognised by, after normalize,
// best first: when two columns mean the same, the better name wins.
var synonyms = map[string][]string{
	colStep:    {"step", "global_step", "globalstep", "iteration", "iter", "steps", "iterations", "iters", "train_step", "optimizer_step", "_step"},
	colEpoch:   {"epoch", "epochs"},
	colLoss:    {"loss", "train_loss", "training_loss", "losses", "loss_train", "trn_loss", "train_loss_step", "smooth_loss"},
	colScale:   {"scale", "loss_scale", "grad_scale", "amp_scale", "scales", "lossscale", "loss_scaler", "scaler_scale", "grad_scaler", "grad_scaler_scale", "amp_loss_scale"},
	colSkipped: {"skipped", "found_inf", "overflow", "skip", "skipped_step", "has_overflow", "inf_found", "overflowed"},
}

// notTraining marks a path component of a name (val/loss, eval/loss) that
// makes it something other than the training series.
var notTraining = []string{"val", "valid", "validation", "eval", "test", "dev"}

// normalize folds a column name for matching: lower case, separators as _.
func normalize(name string) string {
	s := strings.ToLower(strings.TrimSpace(name))
	return strings.Map(func(r rune) rune {
		switch r {
		case ' ', '-', '.':
			return '_'
		}
		return r
	}, s)
}

// meaningOf returns the meaning of a column name and the rank of the
// synonym it matched (lower is better), or "" when it has none. A name
// with path components (train/loss, amp/scale, loss/train) is matched as a
// whole, then by its last and its first component; a component naming
// validation or evaluation rules the name out.
func meaningOf(name string) (string, int) {
	n := normalize(name)
	parts := strings.Split(n, "/")
	for _, p := range parts {
		if slices.Contains(notTraining, p) || strings.HasPrefix(p, "val_") || strings.HasPrefix(p, "eval_") || strings.HasPrefix(p, "valid_") {
			return "", 0
		}
	}
	cands := []string{n}
	if len(parts) > 1 {
		cands = append(cands, parts[len(parts)-1], parts[0])
	}
	for ci, c := range cands {
		for _, m := range Meanings {
			if k := slices.Index(synonyms[m], c); k >= 0 {
				return m, ci*100 + k
			}
		}
	}
	return "", 0
}

// ReadOptions says how to read a log whose form leaves something open.
type ReadOptions struct {
	// Columns maps a meaning (Meanings) to the name of the column, JSON
	// field or TensorBoard tag that holds it, for names fp16audit does not
	// recognise by itself.
	Columns map[string]string
	// Series says what a plain list of numbers holds: "loss", "scale" or
	// "fastai-scales" (fastai's MixedPrecision.scales: the scale used by
	// every step that was not skipped); "" decides from the values.
	Series string
	// Baseline is set for the fp32 baseline: only its losses are used, so
	// a --columns entry for the scale or skipped steps that it lacks is
	// not an error.
	Baseline bool
}

// ParseMapping reads a --columns or --tag value, "loss=train_loss,scale=amp/scale".
func ParseMapping(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(part, "=")
		k = strings.ToLower(strings.TrimSpace(k))
		v = strings.TrimSpace(v)
		if !ok || v == "" {
			return nil, fmt.Errorf("%q: want MEANING=NAME, such as loss=train_loss", part)
		}
		if !slices.Contains(Meanings, k) {
			return nil, fmt.Errorf("%q: want one of %s before the =", part, strings.Join(Meanings, ", "))
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%s is named twice", k)
		}
		out[k] = v
	}
	return out, nil
}

// cell is one value of a table as read: its text (a JSON number's digits,
// a string's contents), whether it was JSON null, and whether the record
// lacked the field altogether.
type cell struct {
	text   string
	null   bool
	absent bool
}

// table is a log with named columns, before the columns are interpreted.
type table struct {
	path, format string
	names        []string
	rows         [][]cell
	// lines holds the line of every row, nil when rows have no lines
	// (a JSON document).
	lines []int
	// field writes the place of a cell in messages when rows have no
	// lines: [3].loss, loss[3].
	field func(row int, col string) string
}

func (t *table) errAt(row int, col, format string, args ...any) error {
	pe := &ParseError{Path: t.path, Msg: fmt.Sprintf(format, args...)}
	switch {
	case row >= 0 && row < len(t.lines) && t.lines[row] > 0:
		pe.Line, pe.Field = t.lines[row], col
	case t.field != nil && row >= 0:
		pe.Field = t.field(row, col)
	default:
		pe.Field = col
	}
	return pe
}

// resolveColumns assigns a column to every meaning the table holds:
// --columns first, then the names recognised by meaning.
func (t *table) resolveColumns(opt ReadOptions) (map[string]int, []string, error) {
	col := map[string]int{}
	var notes []string
	for _, m := range Meanings {
		name, ok := opt.Columns[m]
		if !ok {
			continue
		}
		i := slices.IndexFunc(t.names, func(n string) bool { return strings.EqualFold(strings.TrimSpace(n), name) })
		if i < 0 {
			if opt.Baseline && (m == colScale || m == colSkipped) {
				continue
			}
			return nil, nil, &ParseError{Path: t.path, Msg: fmt.Sprintf("--columns %s=%s: no such column; the %s %s",
				m, name, t.what(), quoteList(t.names))}
		}
		col[m] = i
	}
	rank := map[string]int{}
	also := map[string][]string{}
	for i, n := range t.names {
		m, r := meaningOf(n)
		if m == "" || slices.Contains(mapValues(col), i) {
			continue
		}
		if _, given := opt.Columns[m]; given {
			continue
		}
		if j, seen := col[m]; seen {
			if r < rank[m] {
				also[m] = append(also[m], t.names[j])
				col[m], rank[m] = i, r
			} else {
				also[m] = append(also[m], n)
			}
			continue
		}
		col[m], rank[m] = i, r
	}
	var read []string
	for _, m := range Meanings {
		if i, ok := col[m]; ok && normalize(t.names[i]) != m {
			read = append(read, fmt.Sprintf("%s as %s", t.names[i], m))
		}
		if len(also[m]) > 0 {
			notes = append(notes, fmt.Sprintf("the columns %s also look like the %s; %s was used (choose with --columns %s=NAME)",
				quoteList(also[m]), m, t.names[col[m]], m))
		}
	}
	if len(read) > 0 {
		notes = append([]string{fmt.Sprintf("columns read by their names: %s", strings.Join(read, ", "))}, notes...)
	}
	return col, notes, nil
}

func mapValues(m map[string]int) []int {
	var out []int
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func (t *table) what() string {
	switch t.format {
	case "tfevents":
		return "event file's scalar tags are"
	case "json", "jsonl":
		return "records' fields are"
	}
	return "header names are"
}

func quoteList(names []string) string {
	const most = 12
	var q []string
	for i, n := range names {
		if i == most {
			q = append(q, fmt.Sprintf("and %d more", len(names)-most))
			break
		}
		q = append(q, strconv.Quote(n))
	}
	if len(q) == 0 {
		return "none"
	}
	return strings.Join(q, ", ")
}

// missingWord is a cell that holds no value: an empty CSV cell (how
// pandas writes NaN), JSON null, None, fastai's #na#, or a field the
// record lacks.
func missingWord(c cell) bool {
	s := strings.TrimSpace(c.text)
	return c.null || c.absent || s == "" || s == "#na#" || strings.EqualFold(s, "none") || strings.EqualFold(s, "null")
}

// notRecorded is a missing cell that says the value was not recorded at
// all, rather than recorded as NaN: a field the record lacks, fastai's #na#.
func notRecorded(c cell) bool {
	return c.absent || strings.TrimSpace(c.text) == "#na#"
}

// number reads a cell as a float, the non-finite words included.
func number(c cell) (float64, bool) {
	s := strings.TrimPrefix(strings.TrimSpace(c.text), bareMark)
	if v, ok := nonFiniteWord(s); ok {
		return v, true
	}
	v, err := strconv.ParseFloat(s, 64)
	return v, err == nil
}

func readFlag(c cell) (int8, bool) {
	switch strings.ToLower(strings.TrimSpace(c.text)) {
	case "1", "1.0", "true", "yes", "y", "t":
		return 1, true
	case "0", "0.0", "false", "no", "n", "f":
		return 0, true
	}
	return 0, false
}

// rowsFromTable interprets a table's columns: a per-step log, or fastai's
// per-epoch history.csv.
func rowsFromTable(t *table, opt ReadOptions) (*trainlog.Log, error) {
	col, notes, err := t.resolveColumns(opt)
	if err != nil {
		return nil, err
	}
	if isHistory(t, col, opt) {
		return historyLog(t, col, notes)
	}
	_, hasLoss := col[colLoss]
	_, hasScale := col[colScale]
	if !hasLoss && !hasScale {
		return nil, &ParseError{Path: t.path, Line: firstLine(t), Msg: fmt.Sprintf(
			"%s: no column holds the loss or the loss scale (the %s %s); want names such as step,loss,scale (iteration, train_loss, loss_scale are recognised too) or name them with --columns loss=NAME,scale=NAME",
			ErrNoData.Error(), t.what(), quoteList(t.names))}
	}
	r := &rows{path: t.path, format: t.format, notes: notes}
	stepCol, hasStep := col[colStep]
	epochCol, hasEpoch := col[colEpoch]
	skipCol, hasSkip := col[colSkipped]
	lossCol, scaleCol := col[colLoss], col[colScale]
	for i, row := range t.rows {
		get := func(c int) cell {
			if c < len(row) {
				return row[c]
			}
			return cell{absent: true}
		}
		e := entry{row: i, loss: math.NaN(), scale: math.NaN(), skipped: -1, epoch: math.NaN(), lossState: lossAbsent}
		if hasLoss {
			c := get(lossCol)
			switch {
			case notRecorded(c):
			case missingWord(c):
				e.lossState = lossEmpty
			default:
				v, ok := number(c)
				if !ok {
					return nil, t.errAt(i, t.names[lossCol], "want a number (nan, inf and empty cells allowed), found %q", c.text)
				}
				e.loss, e.lossState = v, lossValue
			}
		}
		if hasScale {
			if c := get(scaleCol); !missingWord(c) {
				v, ok := number(c)
				if !ok {
					return nil, t.errAt(i, t.names[scaleCol], "want a positive number, found %q", c.text)
				}
				e.scale, e.hasScale = v, true
			}
		}
		if hasSkip {
			if c := get(skipCol); !missingWord(c) {
				v, ok := readFlag(c)
				if !ok {
					return nil, t.errAt(i, t.names[skipCol], "want true/false or 1/0, found %q", c.text)
				}
				e.skipped = v
			}
		}
		// A record that holds none of the series (an evaluation record
		// among training records) is no step of the log.
		if e.lossState == lossAbsent && !e.hasScale && e.skipped < 0 {
			continue
		}
		if hasStep {
			c := get(stepCol)
			v, ok := number(c)
			if !ok || v != math.Trunc(v) || math.Abs(v) > 1<<40 {
				return nil, t.errAt(i, t.names[stepCol], "want an integer step, found %q", c.text)
			}
			e.step = int(v)
		}
		if hasEpoch {
			if c := get(epochCol); !missingWord(c) {
				v, ok := number(c)
				if !ok || !isFinite(v) || v < 0 {
					return nil, t.errAt(i, t.names[epochCol], "want an epoch number, found %q", c.text)
				}
				e.epoch = v
			}
		}
		r.entries = append(r.entries, e)
	}
	r.hasStep, r.hasEpoch, r.hasSkip = hasStep, hasEpoch, hasSkip
	r.errAt = func(e entry, col string, format string, args ...any) error {
		name := map[string]int{colStep: stepCol, colScale: scaleCol, colEpoch: epochCol}[col]
		return t.errAt(e.row, t.names[name], format, args...)
	}
	if len(r.entries) == 0 {
		return nil, &ParseError{Path: t.path, Msg: fmt.Sprintf("no row holds a loss or a scale after the %s: want one row per optimizer step (or every N steps)", headerWord(t))}
	}
	return r.log()
}

func headerWord(t *table) string {
	if t.format == "csv" || t.format == "tsv" {
		return "header"
	}
	return "field names"
}

func firstLine(t *table) int {
	if len(t.lines) > 0 && t.lines[0] > 1 && (t.format == "csv" || t.format == "tsv") {
		return t.lines[0] - 1
	}
	return 0
}

// The states of a row's loss.
const (
	lossValue  = iota // a number, NaN and ±Inf included
	lossEmpty         // an empty cell or null: NaN, as pandas writes it
	lossAbsent        // not recorded in this row
)

// entry is one row of a per-step table, interpreted.
type entry struct {
	row       int
	step      int
	loss      float64
	lossState int
	scale     float64
	hasScale  bool
	skipped   int8
	epoch     float64
}

// rows turns interpreted entries into a Log: steps in order, the loss's
// empty cells read, epochs numbered, sampling detected.
type rows struct {
	path, format               string
	entries                    []entry
	hasSkip, hasStep, hasEpoch bool
	notes, notDerived          []string
	errAt                      func(e entry, col string, format string, args ...any) error
}

func (r *rows) log() (*trainlog.Log, error) {
	es := r.entries
	l := &trainlog.Log{Path: r.path, Format: r.format, Notes: r.notes, NotDerived: r.notDerived}
	if !r.hasStep {
		for i := range es {
			es[i].step = i
		}
		l.Notes = append(l.Notes, "the log has no step column: its rows are taken as consecutive optimizer steps from 0 (name one with --columns step=NAME)")
	}
	for i := 1; i < len(es); i++ {
		if es[i].step <= es[i-1].step {
			what := "repeats"
			if es[i].step < es[i-1].step {
				what = "goes back"
			}
			return nil, r.errAt(es[i], colStep, "want steps in increasing order, found %d after %d: the step %s (a restarted run appended to the same log, or a step counter that restarts every epoch?); keep one run's rows, or name the column that counts optimizer steps with --columns step=NAME",
				es[i].step, es[i-1].step, what)
		}
	}
	es = r.readEmptyLosses(l, es)
	if len(es) == 0 {
		return nil, &ParseError{Path: r.path, Msg: "no row holds a loss or a scale: want one row per optimizer step (or every N steps)"}
	}
	anyScale := false
	for _, e := range es {
		anyScale = anyScale || e.hasScale
	}
	anyLoss := false
	for _, e := range es {
		anyLoss = anyLoss || e.lossState != lossAbsent
	}
	l.FirstStep = es[0].step
	consecutive := es[len(es)-1].step-es[0].step == len(es)-1
	if !consecutive {
		l.Steps = make([]int, len(es))
	}
	if anyLoss {
		l.Losses = make([]float64, len(es))
	}
	if anyScale {
		l.Scales = make([]float64, len(es))
	}
	if r.hasSkip {
		l.Skipped = make([]int8, len(es))
	}
	for i, e := range es {
		if l.Steps != nil {
			l.Steps[i] = e.step
		}
		if l.Losses != nil {
			l.Losses[i] = e.loss
		}
		if l.Scales != nil {
			l.Scales[i] = e.scale
			if e.hasScale {
				prev := math.NaN()
				for j := i - 1; j >= 0; j-- {
					if es[j].hasScale {
						prev = es[j].scale
						break
					}
				}
				if msg := badScaleAfter(prev, e.scale); msg != "" {
					return nil, r.errAt(e, colScale, "%s", msg)
				}
			}
		}
		if l.Skipped != nil {
			l.Skipped[i] = e.skipped
		}
	}
	if r.hasEpoch {
		if err := r.epochs(l, es); err != nil {
			return nil, err
		}
	}
	if err := validate(l); err != nil {
		return nil, err
	}
	return l, nil
}

// readEmptyLosses settles the rows whose loss cell is empty. An empty cell
// is NaN, the way pandas writes it, unless the loss was plainly logged
// less often than the other columns: empty on most rows while finite
// losses keep coming after the first empty one. Rows without a loss are
// then left out (a Log holds a loss for every entry or for none).
func (r *rows) readEmptyLosses(l *trainlog.Log, es []entry) []entry {
	empty, values, firstEmpty, finiteAfter := 0, 0, -1, false
	for i, e := range es {
		switch e.lossState {
		case lossEmpty:
			empty++
			if firstEmpty < 0 {
				firstEmpty = i
			}
		case lossValue:
			values++
			if firstEmpty >= 0 && isFinite(e.loss) {
				finiteAfter = true
			}
		}
	}
	if values == 0 {
		// No loss anywhere: the column is not recorded at all.
		for i := range es {
			es[i].lossState = lossAbsent
		}
		return es
	}
	if empty*2 > len(es) && finiteAfter {
		for i := range es {
			if es[i].lossState == lossEmpty {
				es[i].lossState = lossAbsent
			}
		}
		l.Notes = append(l.Notes, fmt.Sprintf("the loss is empty on %d of %d rows while finite losses follow: read as logged less often than the other columns, not as NaN", empty, len(es)))
	} else if empty > 0 {
		l.Notes = append(l.Notes, fmt.Sprintf("%d empty loss cells read as NaN (pandas writes NaN as an empty cell)", empty))
	}
	kept, dropped := es[:0], 0
	for _, e := range es {
		if e.lossState == lossAbsent {
			dropped++
			continue
		}
		kept = append(kept, e)
	}
	if dropped > 0 {
		l.Notes = append(l.Notes, fmt.Sprintf("%d rows with a scale or a skipped flag but no loss were left out: the report follows the steps that have a loss", dropped))
	}
	return kept
}

// epochs numbers the epoch of every entry. Whole numbers are epoch
// indices; fractional ones are epochs completed after the step (Hugging
// Face's Trainer writes 0.5 half-way through the first epoch and 1.0 at its
// last step), so the index is the value rounded up, less one.
func (r *rows) epochs(l *trainlog.Log, es []entry) error {
	frac := false
	for _, e := range es {
		if isFinite(e.epoch) && e.epoch != math.Trunc(e.epoch) {
			frac = true
		}
	}
	ep := make([]int, len(es))
	for i, e := range es {
		if math.IsNaN(e.epoch) {
			// An entry without an epoch: the epoch column cannot give
			// per-epoch statistics.
			l.Notes = append(l.Notes, "the epoch column is empty on some rows: epochs were not used")
			return nil
		}
		v := int(e.epoch)
		if frac {
			v = max(int(math.Ceil(e.epoch))-1, 0)
		}
		if i > 0 && v < ep[i-1] {
			return r.errAt(e, colEpoch, "want epochs in increasing order, found %v after %d", e.epoch, ep[i-1])
		}
		ep[i] = v
	}
	if frac {
		l.Notes = append(l.Notes, "fractional epochs read as epochs completed after the step (epoch index = value rounded up, less one)")
	}
	l.Epochs = ep
	return nil
}

// badScaleAfter is badScale for a scale following prev (NaN: none before).
func badScaleAfter(prev, s float64) string {
	if math.IsNaN(prev) {
		return badScale(nil, s)
	}
	return badScale([]float64{prev}, s)
}

// isHistory reports whether a table is fastai's CSVLogger history.csv:
// one row per epoch with epoch, train_loss and valid_loss (and the
// metrics and time), no step column.
func isHistory(t *table, col map[string]int, opt ReadOptions) bool {
	if _, ok := col[colStep]; ok {
		return false
	}
	if _, ok := col[colScale]; ok {
		return false
	}
	has := func(n string) bool {
		return slices.ContainsFunc(t.names, func(x string) bool { return normalize(x) == n })
	}
	_, mapped := opt.Columns[colLoss]
	return has("epoch") && (has("train_loss") || mapped) && has("valid_loss")
}

// historyLog reads fastai's history.csv: train_loss (fastai's smoothed
// training loss at the end of the epoch) as the loss of every epoch,
// valid_loss beside it.
func historyLog(t *table, col map[string]int, notes []string) (*trainlog.Log, error) {
	l := &trainlog.Log{Path: t.path, Format: "fastai-history", PerEpoch: true, Notes: notes}
	validCol := slices.IndexFunc(t.names, func(x string) bool { return normalize(x) == "valid_loss" })
	epochCol, lossCol := col[colEpoch], col[colLoss]
	var epochs []int
	for i, row := range t.rows {
		if len(row) <= max(epochCol, lossCol, validCol) {
			return nil, t.errAt(i, "", "want as many fields as the header names")
		}
		ev, ok := number(row[epochCol])
		if !ok || ev != math.Trunc(ev) || ev < 0 {
			return nil, t.errAt(i, t.names[epochCol], "want an epoch number, found %q", row[epochCol].text)
		}
		if n := len(epochs); n > 0 && int(ev) <= epochs[n-1] {
			return nil, t.errAt(i, t.names[epochCol], "want epochs in increasing order, found %d after %d (history.csv of two fits appended? keep one)", int(ev), epochs[n-1])
		}
		epochs = append(epochs, int(ev))
		loss := math.NaN()
		if c := row[lossCol]; !missingWord(c) {
			v, ok := number(c)
			if !ok {
				return nil, t.errAt(i, t.names[lossCol], "want a number, found %q", c.text)
			}
			loss = v
		}
		l.Losses = append(l.Losses, loss)
		valid := math.NaN()
		if c := row[validCol]; !missingWord(c) {
			v, ok := number(c)
			if !ok {
				return nil, t.errAt(i, t.names[validCol], "want a number or #na#, found %q", c.text)
			}
			valid = v
		}
		l.ValidLosses = append(l.ValidLosses, valid)
	}
	if len(epochs) == 0 {
		return nil, &ParseError{Path: t.path, Msg: "history.csv has no rows after its header: want one row per epoch"}
	}
	l.FirstStep = epochs[0]
	if epochs[len(epochs)-1]-epochs[0] != len(epochs)-1 {
		l.Steps = epochs
	}
	l.Epochs = epochs
	l.Notes = append(l.Notes, "read as fastai's history.csv (CSVLogger): one row per epoch, train_loss as the loss (fastai's smoothed training loss at the end of the epoch); step numbers in this report are epochs")
	l.NotDerived = append(l.NotDerived,
		"skipped steps, the scale's collapse or pinning, and so whether a gap to the baseline comes from the loss scaler (FP5005) or not (FP5006), or a NaN from a gradient overflow (FP5002) or the forward pass (FP5003): history.csv holds one loss per epoch and no loss scale; record every step with the Python companion's Fp16AuditCallback (python/README.md)",
		"the step of a NaN: an epoch whose train_loss is NaN turned NaN somewhere in that epoch")
	return l, nil
}

// parseDelimited reads a table of comma- or tab-separated values: a header
// naming the columns, then one row per optimizer step (or every N steps).
// Columns are recognised by meaning (step, iteration, global_step; loss,
// train_loss; scale, loss_scale, grad_scale, amp_scale; skipped, found_inf,
// overflow; epoch); other columns are ignored. Losses may be nan, inf, -inf
// or empty (NaN). Lines starting with '#' are comments. fastai's
// history.csv (epoch, train_loss, valid_loss, …) is read as a per-epoch
// log.
func parseDelimited(path string, data []byte, opt ReadOptions) (*trainlog.Log, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, &ParseError{Path: path, Msg: "empty file: " + formatHint}
	}
	t, err := readDelimited(path, data)
	if err != nil {
		return nil, err
	}
	return rowsFromTable(t, opt)
}

// sniffComma tells a TSV from a CSV by its first data line: tabs and no
// commas make it tab-separated.
func sniffComma(data []byte) rune {
	for _, line := range bytes.Split(data, []byte("\n")) {
		t := bytes.TrimSpace(line)
		if len(t) == 0 || t[0] == '#' {
			continue
		}
		if bytes.Contains(line, []byte("\t")) && !bytes.Contains(line, []byte(",")) {
			return '\t'
		}
		return ','
	}
	return ','
}

func readDelimited(path string, data []byte) (*table, error) {
	r := csv.NewReader(bufio.NewReader(bytes.NewReader(data)))
	r.Comment = '#'
	r.Comma = sniffComma(data)
	// Trimming leading space would swallow an empty field between two
	// tabs; cells are trimmed when they are read instead.
	r.TrimLeadingSpace = r.Comma == ','
	t := &table{path: path, format: "csv"}
	if r.Comma == '\t' {
		t.format = "tsv"
	}
	header, err := r.Read()
	if err != nil {
		return nil, csvError(path, err)
	}
	line, _ := r.FieldPos(0)
	numeric := true
	for _, h := range header {
		if _, ok := number(cell{text: h}); !ok {
			numeric = false
		}
	}
	if numeric {
		return nil, &ParseError{Path: path, Line: line, Msg: fmt.Sprintf(
			"want a header naming the columns step,loss,scale (loss or scale may be left out; epoch is optional; iteration, train_loss, loss_scale and other names are recognised), found %q: add a header line", strings.Join(header, string(r.Comma)))}
	}
	t.names = header
	for {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, csvError(path, err)
		}
		line, _ := r.FieldPos(0)
		row := make([]cell, len(rec))
		for i, s := range rec {
			row[i] = cell{text: s}
		}
		t.rows = append(t.rows, row)
		t.lines = append(t.lines, line)
	}
	if len(t.rows) == 0 {
		return nil, &ParseError{Path: path, Line: line, Msg: "the header has no rows after it: want one row per optimizer step"}
	}
	return t, nil
}

// recordsTable builds a table from JSON records: an array of objects, or
// one object per JSON Lines line (lines holds their line numbers). A field
// a record lacks is absent from its row, not null. Every value has been
// through quoteNonFinite.
func recordsTable(path, format string, recs []map[string]rawValue, lines []int) *table {
	t := &table{path: path, format: format, lines: lines}
	seen := map[string]int{}
	for _, rec := range recs {
		keys := make([]string, 0, len(rec))
		for k := range rec {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if _, ok := seen[k]; !ok {
				seen[k] = len(t.names)
				t.names = append(t.names, k)
			}
		}
	}
	for _, rec := range recs {
		row := make([]cell, len(t.names))
		for i := range row {
			row[i] = cell{absent: true}
		}
		for k, v := range rec {
			row[seen[k]] = v.cell()
		}
		t.rows = append(t.rows, row)
	}
	if lines == nil {
		t.field = func(row int, col string) string { return fmt.Sprintf("[%d].%s", row, col) }
	}
	return t
}
