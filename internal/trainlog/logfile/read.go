package logfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"fp16audit/internal/trainlog"
)

// npyMagic starts every .npy file.
const npyMagic = "\x93NUMPY"

// Read reads the training log at path in whichever form it has:
//
//   - a directory or a file named events.out.tfevents.*: TensorBoard;
//   - .npy, or a file starting with numpy's magic: a plain list;
//   - .jsonl/.ndjson, or lines that are JSON objects: JSON Lines, the
//     companion's fp16audit.trainlog log included;
//   - .json, or a file starting with '{' or '[': JSON (fp16audit's own
//     object, an object of columns, an array of records, a plain array of
//     numbers, Hugging Face's trainer_state.json);
//   - .csv/.tsv or anything else: a table with a header, or a plain list
//     of numbers one per line.
//
// Errors are *ParseError naming the file, the line or field, what was
// expected and how to convert, or I/O errors.
func Read(path string, opt ReadOptions) (*trainlog.Log, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	base := strings.ToLower(filepath.Base(path))
	if fi.IsDir() || strings.Contains(base, "tfevents") {
		return readTensorBoard(path, opt)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	ext := strings.ToLower(filepath.Ext(path))
	trimmed := bytes.TrimSpace(data)
	switch {
	case ext == ".npy" || bytes.HasPrefix(data, []byte(npyMagic)):
		return readNPYList(path, data, opt)
	case len(trimmed) == 0:
		return nil, &ParseError{Path: path, Msg: "empty file: " + formatHint}
	case ext == ".jsonl" || ext == ".ndjson" || trimmed[0] == '{' && looksJSONLines(trimmed):
		return parseJSONLines(path, data, opt)
	case ext == ".json" || trimmed[0] == '{' || trimmed[0] == '[':
		return parseJSON(path, data, opt)
	case ext != ".csv" && ext != ".tsv" && firstLineIsNumber(data):
		return parseTextList(path, data, opt)
	}
	return parseDelimited(path, data, opt)
}

// looksJSONLines reports whether data holds a complete JSON object on its
// first line and another object after it: JSON Lines, whatever its name.
func looksJSONLines(data []byte) bool {
	first, rest, ok := bytes.Cut(data, []byte("\n"))
	if !ok || !json.Valid(quoteNonFinite(bytes.TrimSpace(first))) {
		return false
	}
	rest = bytes.TrimSpace(rest)
	return len(rest) > 0 && rest[0] == '{'
}

func firstLineIsNumber(data []byte) bool {
	for _, line := range bytes.Split(data, []byte("\n")) {
		s := strings.TrimSpace(string(line))
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		_, ok := number(cell{text: s})
		return ok
	}
	return false
}

// rawValue is one JSON value after quoteNonFinite, kept undecoded.
type rawValue json.RawMessage

// UnmarshalJSON keeps the value's bytes, as json.RawMessage does.
func (v *rawValue) UnmarshalJSON(b []byte) error {
	*v = append((*v)[:0], b...)
	return nil
}

func (v rawValue) cell() cell {
	s := strings.TrimSpace(string(v))
	switch {
	case s == "null":
		return cell{null: true}
	case strings.HasPrefix(s, `"`):
		var str string
		if err := json.Unmarshal(v, &str); err == nil {
			return cell{text: strings.TrimPrefix(str, bareMark)}
		}
	}
	return cell{text: s}
}

// parseJSON reads a JSON log. fp16audit's own form is an object
//
//	{"losses": [...], "scales": [...], "steps_per_epoch": N,
//	 "grad_scaler": {"init_scale": 65536, "growth_factor": 2, "backoff_factor": 0.5, "growth_interval": 2000}}
//
// where every field is optional, but losses or scales must be present.
// Losses may be NaN, Infinity, -Infinity (Python's json module writes them
// bare), null (read as NaN) or those words as strings. Other fields are
// ignored. Other JSON is read as a table (an object of column arrays, an
// array of records, Hugging Face's trainer_state.json) or, for an array of
// numbers, as a plain list.
func parseJSON(path string, data []byte, opt ReadOptions) (*trainlog.Log, error) {
	perr := func(line int, field, format string, args ...any) error {
		return &ParseError{Path: path, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, perr(0, "", "empty file: %s", formatHint)
	}
	q := quoteNonFinite(data)
	var doc json.RawMessage
	if err := json.Unmarshal(q, &doc); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			hint := ""
			if strings.Contains(syn.Error(), "after top-level value") {
				hint = ": one JSON value per line is JSON Lines; name the file .jsonl"
			}
			return nil, perr(lineAt(data, syn.Offset), "", "invalid JSON: %v%s", syn, hint)
		}
		return nil, perr(0, "", "invalid JSON: %v", err)
	}
	doc = bytes.TrimSpace(doc)
	switch doc[0] {
	case '[':
		return jsonArray(path, doc, opt)
	case '{':
	default:
		return nil, perr(0, "", "want a JSON object at the top (%s) or an array of records or numbers, found %s", formatHint, describeJSON(doc))
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(doc, &top); err != nil {
		return nil, perr(0, "", "invalid JSON: %v", err)
	}
	_, hasLosses := top["losses"]
	_, hasScales := top["scales"]
	if (hasLosses || hasScales) && len(opt.Columns) == 0 {
		return ownJSON(path, top)
	}
	if raw, ok := top["log_history"]; ok {
		// Hugging Face's trainer_state.json: the Trainer's log records.
		l, err := jsonArray(path, raw, opt)
		if err != nil {
			return nil, err
		}
		l.Notes = append(l.Notes, "read the log_history records of a Hugging Face trainer_state.json (the Trainer logs every logging_steps steps; it records no loss scale)")
		return l, nil
	}
	return jsonColumns(path, top, opt)
}

// ownJSON reads fp16audit's own JSON form.
func ownJSON(path string, top map[string]json.RawMessage) (*trainlog.Log, error) {
	perr := func(field, format string, args ...any) error {
		return &ParseError{Path: path, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	l := &trainlog.Log{Path: path, Format: "json"}
	var err error
	if raw, ok := top["losses"]; ok {
		if l.Losses, err = jsonNumbers(raw, "losses", true); err != nil {
			return nil, perr("", "%v", err)
		}
	}
	if raw, ok := top["scales"]; ok {
		if l.Scales, err = jsonNumbers(raw, "scales", false); err != nil {
			return nil, perr("", "%v", err)
		}
	}
	if err := jsonExtras(path, top, l); err != nil {
		return nil, err
	}
	if err := validate(l); err != nil {
		return nil, err
	}
	return l, nil
}

// jsonExtras reads the fields of fp16audit's JSON form that sit beside the
// series: steps_per_epoch and grad_scaler.
func jsonExtras(path string, top map[string]json.RawMessage, l *trainlog.Log) error {
	if raw, ok := top["steps_per_epoch"]; ok && string(raw) != "null" {
		v, err := jsonInt(raw)
		if err != nil || v <= 0 {
			return &ParseError{Path: path, Field: "steps_per_epoch", Msg: fmt.Sprintf("want a positive integer, found %s", raw)}
		}
		l.StepsPerEpoch = v
	}
	if raw, ok := top["grad_scaler"]; ok && string(raw) != "null" {
		c, err := jsonScaler(raw)
		if err != nil {
			return &ParseError{Path: path, Field: "grad_scaler", Msg: err.Error()}
		}
		l.Scaler = c
	}
	if l.StepsPerEpoch > 0 && l.Epochs == nil {
		l.Epochs = make([]int, l.Len())
		for i := range l.Epochs {
			l.Epochs[i] = l.Step(i) / l.StepsPerEpoch
		}
	}
	return nil
}

// jsonColumns reads an object whose fields are columns: arrays of equal
// length, or pandas' DataFrame.to_json() objects of {"index": value}.
func jsonColumns(path string, top map[string]json.RawMessage, opt ReadOptions) (*trainlog.Log, error) {
	t := &table{path: path, format: "json"}
	t.field = func(row int, col string) string { return fmt.Sprintf("%s[%d]", col, row) }
	keys := make([]string, 0, len(top))
	for k := range top {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	n := -1
	var cols [][]cell
	var index []string // pandas' row labels, for messages
	for _, k := range keys {
		raw := bytes.TrimSpace(top[k])
		var vals []cell
		switch {
		case len(raw) > 0 && raw[0] == '[':
			var elems []rawValue
			if err := json.Unmarshal(raw, &elems); err != nil {
				return nil, &ParseError{Path: path, Field: k, Msg: fmt.Sprintf("want an array, found %s", describeJSON(json.RawMessage(raw)))}
			}
			for _, e := range elems {
				vals = append(vals, e.cell())
			}
		case len(raw) > 0 && raw[0] == '{':
			var obj map[string]rawValue
			if json.Unmarshal(raw, &obj) != nil || !integerKeys(obj) {
				continue
			}
			labels := sortedIndex(obj)
			if index == nil {
				index = labels
			}
			for _, lab := range labels {
				vals = append(vals, obj[lab].cell())
			}
		default:
			continue
		}
		if n >= 0 && len(vals) != n {
			return nil, &ParseError{Path: path, Field: k, Msg: fmt.Sprintf("has %d entries and %s %d: want columns of one entry per step each", len(vals), t.names[0], n)}
		}
		n = len(vals)
		t.names = append(t.names, k)
		cols = append(cols, vals)
	}
	if len(t.names) == 0 {
		found := "it is empty"
		if len(keys) > 0 {
			found = "its fields " + quoteList(keys) + " hold no arrays"
		}
		return nil, &ParseError{Path: path, Msg: fmt.Sprintf("%s: %s; %s", ErrNoData.Error(), found, formatHint)}
	}
	for i := 0; i < n; i++ {
		row := make([]cell, len(cols))
		for j := range cols {
			row[j] = cols[j][i]
		}
		t.rows = append(t.rows, row)
	}
	if index != nil {
		t.field = func(row int, col string) string { return fmt.Sprintf("%s[%q]", col, index[row]) }
	}
	l, err := rowsFromTable(t, opt)
	if err != nil {
		return nil, err
	}
	if err := jsonExtras(path, top, l); err != nil {
		return nil, err
	}
	return l, nil
}

func integerKeys(obj map[string]rawValue) bool {
	if len(obj) == 0 {
		return false
	}
	for k := range obj {
		if _, err := strconv.Atoi(k); err != nil {
			return false
		}
	}
	return true
}

func sortedIndex(obj map[string]rawValue) []string {
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, _ := strconv.Atoi(keys[i])
		b, _ := strconv.Atoi(keys[j])
		return a < b
	})
	return keys
}

// jsonArray reads a top-level array: records (objects) as a table, numbers
// as a plain list.
func jsonArray(path string, doc json.RawMessage, opt ReadOptions) (*trainlog.Log, error) {
	var elems []rawValue
	if err := json.Unmarshal(doc, &elems); err != nil {
		return nil, &ParseError{Path: path, Msg: fmt.Sprintf("want an array, found %s", describeJSON(doc))}
	}
	if len(elems) == 0 {
		return nil, &ParseError{Path: path, Msg: "empty array: want one number or record per optimizer step"}
	}
	first := bytes.TrimSpace(elems[0])
	if len(first) > 0 && first[0] == '{' {
		recs := make([]map[string]rawValue, len(elems))
		for i, e := range elems {
			if err := json.Unmarshal(e, &recs[i]); err != nil || recs[i] == nil {
				return nil, &ParseError{Path: path, Field: fmt.Sprintf("[%d]", i), Msg: fmt.Sprintf("want a record (an object) like the first element, found %s", describeJSON(json.RawMessage(e)))}
			}
		}
		return rowsFromTable(recordsTable(path, "json", recs, nil), opt)
	}
	vals := make([]float64, len(elems))
	for i, e := range elems {
		c := e.cell()
		v, ok := number(c)
		switch {
		case c.null:
			v = math.NaN()
		case !ok:
			return nil, &ParseError{Path: path, Field: fmt.Sprintf("[%d]", i), Msg: fmt.Sprintf("want a number (a plain list of losses or scales) or a record, found %s", describeJSON(json.RawMessage(e)))}
		}
		vals[i] = v
	}
	return listLog(path, "list", vals, func(i int) (int, string) { return 0, fmt.Sprintf("[%d]", i) }, opt)
}

// parseJSONLines reads JSON Lines: the companion's fp16audit.trainlog log,
// or one record per line (a table).
func parseJSONLines(path string, data []byte, opt ReadOptions) (*trainlog.Log, error) {
	var recs []map[string]rawValue
	var lines []int
	for i, raw := range bytes.Split(data, []byte("\n")) {
		line := bytes.TrimSpace(raw)
		if len(line) == 0 {
			continue
		}
		if len(recs) == 0 && line[0] != '{' {
			if _, ok := number(cell{text: string(line)}); ok {
				return parseTextList(path, data, opt)
			}
		}
		var rec map[string]rawValue
		if err := json.Unmarshal(quoteNonFinite(line), &rec); err != nil || rec == nil {
			msg := "want one JSON object per line"
			if err != nil {
				msg += ": " + strings.TrimPrefix(err.Error(), "json: ")
			}
			return nil, &ParseError{Path: path, Line: i + 1, Msg: msg}
		}
		if len(recs) == 0 && isTrainlogHeader(rec) {
			return parseTrainlog(path, data)
		}
		recs = append(recs, rec)
		lines = append(lines, i+1)
	}
	if len(recs) == 0 {
		return nil, &ParseError{Path: path, Msg: "empty file: want one JSON object per line"}
	}
	return rowsFromTable(recordsTable(path, "jsonl", recs, lines), opt)
}

// parseTextList reads a plain list of numbers, one per line.
func parseTextList(path string, data []byte, opt ReadOptions) (*trainlog.Log, error) {
	var vals []float64
	var lines []int
	for i, raw := range bytes.Split(data, []byte("\n")) {
		s := strings.TrimSpace(string(raw))
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		v, ok := number(cell{text: s})
		if !ok {
			return nil, &ParseError{Path: path, Line: i + 1, Msg: fmt.Sprintf("want one number per line (a plain list of losses or scales), found %q; a table needs a header line naming its columns", s)}
		}
		vals = append(vals, v)
		lines = append(lines, i+1)
	}
	return listLog(path, "list", vals, func(i int) (int, string) { return lines[i], "" }, opt)
}
