package logfile

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"fp16audit/internal/tfevents"
	"fp16audit/internal/trainlog"
)

// readTensorBoard reads the scalars of a TensorBoard event file, or of
// every event file in a log directory (in name order, which is creation
// order), and picks the loss, scale and skipped tags: opt.Columns first
// (--tag), then tag names recognised by meaning.
func readTensorBoard(path string, opt ReadOptions) (*trainlog.Log, error) {
	files, err := eventFiles(path)
	if err != nil {
		return nil, err
	}
	scalars := map[string][]tfevents.Point{}
	var notes []string
	for _, f := range files {
		s, err := tfevents.ReadScalars(f)
		if err != nil {
			var fe *tfevents.FormatError
			switch {
			case errors.Is(err, tfevents.ErrTruncated) && errors.As(err, &fe):
				notes = append(notes, fmt.Sprintf("%s ends inside a record at byte %d (a writer still running, or killed mid-write): the scalars before it were read", f, fe.Offset))
			case errors.As(err, &fe):
				return nil, &ParseError{Path: f, Msg: fmt.Sprintf("record at byte %d: %v: %s; want a TensorBoard event file (TFRecord-framed Event protobufs, as SummaryWriter writes)", fe.Offset, fe.Kind, fe.Msg)}
			default:
				return nil, err
			}
		}
		for tag, pts := range s {
			scalars[tag] = append(scalars[tag], pts...)
		}
	}
	for tag, pts := range scalars {
		kept, purged := purgeRestarts(pts)
		scalars[tag] = kept
		if purged > 0 {
			notes = append(notes, fmt.Sprintf("tag %s: %d points of an earlier run at steps the next run wrote again were dropped, as TensorBoard does", tag, purged))
		}
	}
	tags := make([]string, 0, len(scalars))
	for tag := range scalars {
		tags = append(tags, tag)
	}
	sort.Strings(tags)
	chosen := map[string]string{}
	for _, m := range []string{colLoss, colScale, colSkipped} {
		if want, ok := opt.Columns[m]; ok {
			i := indexFold(tags, want)
			if i < 0 {
				if opt.Baseline && m != colLoss {
					continue
				}
				return nil, &ParseError{Path: path, Msg: fmt.Sprintf("--tag %s=%s: no such scalar tag; the event files hold %s", m, want, quoteList(tags))}
			}
			chosen[m] = tags[i]
			continue
		}
		best := math.MaxInt
		for _, tag := range tags {
			if mm, rank := meaningOf(tag); mm == m && rank < best {
				chosen[m], best = tag, rank
			}
		}
	}
	lossTag, hasLoss := chosen[colLoss]
	scaleTag, hasScale := chosen[colScale]
	if !hasLoss && !hasScale {
		return nil, &ParseError{Path: path, Msg: fmt.Sprintf("%s: no scalar tag names the loss or the loss scale; the event files hold %s; choose them with --tag loss=TAG,scale=TAG",
			ErrNoData.Error(), quoteList(tags))}
	}
	var read []string
	for _, m := range []string{colLoss, colScale, colSkipped} {
		if tag, ok := chosen[m]; ok {
			read = append(read, m+"="+tag)
		}
	}
	notes = append([]string{fmt.Sprintf("read %d TensorBoard event file(s), scalar tags %s (choose others with --tag)", len(files), strings.Join(read, ","))}, notes...)

	byStep := func(tag string) map[int64]float64 {
		m := map[int64]float64{}
		for _, p := range scalars[tag] {
			m[p.Step] = p.Value
		}
		return m
	}
	main := scaleTag
	if hasLoss {
		main = lossTag
	}
	scaleAt, skipAt := byStep(scaleTag), byStep(chosen[colSkipped])
	_, hasSkip := chosen[colSkipped]
	r := &rows{path: path, format: "tfevents", hasStep: true, hasSkip: hasSkip, notes: notes}
	for i, p := range scalars[main] {
		e := entry{row: i, step: int(p.Step), loss: math.NaN(), scale: math.NaN(), skipped: -1, epoch: math.NaN(), lossState: lossAbsent}
		if hasLoss {
			e.loss, e.lossState = p.Value, lossValue
		}
		if s, ok := scaleAt[p.Step]; ok && hasScale {
			e.scale, e.hasScale = s, true
		}
		if v, ok := skipAt[p.Step]; ok {
			e.skipped = 0
			if v != 0 {
				e.skipped = 1
			}
		}
		r.entries = append(r.entries, e)
	}
	if hasLoss && hasScale {
		loss := byStep(lossTag)
		off := 0
		for _, p := range scalars[scaleTag] {
			if _, ok := loss[p.Step]; !ok {
				off++
			}
		}
		if off > 0 {
			r.notes = append(r.notes, fmt.Sprintf("%d points of %s fall on steps without a %s point and were not used: the report follows the loss's steps", off, scaleTag, lossTag))
		}
	}
	r.errAt = func(e entry, col string, format string, args ...any) error {
		tag := map[string]string{colStep: main, colScale: scaleTag, colEpoch: main}[col]
		return &ParseError{Path: path, Field: fmt.Sprintf("tag %s at step %d", tag, e.step), Msg: fmt.Sprintf(format, args...)}
	}
	return r.log()
}

// eventFiles lists the event files at path: the file itself, or those in
// the directory.
func eventFiles(path string) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return []string{path}, nil
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var files, runs []string
	for _, e := range ents {
		switch {
		case !e.IsDir() && strings.Contains(e.Name(), "tfevents"):
			files = append(files, filepath.Join(path, e.Name()))
		case e.IsDir():
			if sub, _ := filepath.Glob(filepath.Join(path, e.Name(), "*tfevents*")); len(sub) > 0 {
				runs = append(runs, filepath.Join(path, e.Name()))
			}
		}
	}
	if len(files) == 0 {
		msg := "no events.out.tfevents.* file in the directory: want a TensorBoard log directory or event file"
		if len(runs) > 0 {
			msg = fmt.Sprintf("no events.out.tfevents.* file in the directory itself; its runs %s hold some: pass one of them", quoteList(runs))
		}
		return nil, &ParseError{Path: path, Msg: msg}
	}
	sort.Strings(files)
	return files, nil
}

// purgeRestarts keeps a tag's points the way TensorBoard shows them after
// a restart: a step at or before one already written starts a new run,
// and the earlier run's points from that step on are dropped.
func purgeRestarts(pts []tfevents.Point) ([]tfevents.Point, int) {
	var out []tfevents.Point
	purged := 0
	for _, p := range pts {
		n := len(out)
		for n > 0 && out[n-1].Step >= p.Step {
			n--
		}
		purged += len(out) - n
		out = append(out[:n], p)
	}
	return out, purged
}

func indexFold(names []string, want string) int {
	for i, n := range names {
		if strings.EqualFold(n, want) {
			return i
		}
	}
	return -1
}
