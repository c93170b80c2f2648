package logfile

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"strings"

	"fp16audit/internal/batch"
	"fp16audit/internal/tensor"
	"fp16audit/internal/trainlog"
)

// The values of ReadOptions.Series.
const (
	SeriesLoss         = "loss"
	SeriesScale        = "scale"
	SeriesFastaiScales = "fastai-scales"
)

// readNPYList reads a one-dimensional array saved with np.save: a plain
// list of losses or scales.
func readNPYList(path string, data []byte, opt ReadOptions) (*trainlog.Log, error) {
	t, err := batch.DecodeNPY(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return nil, &ParseError{Path: path, Msg: fmt.Sprintf("%v: want a one-dimensional float array saved with np.save(path, np.array(values, dtype=np.float64))", err)}
	}
	n := int(t.Elements())
	if rank := len(t.Shape); rank > 1 && n != int(t.Shape[0]) && n != int(t.Shape[rank-1]) || rank == 0 {
		return nil, &ParseError{Path: path, Msg: fmt.Sprintf("want a one-dimensional array (one value per step), found shape %s: save a single series, such as np.save(path, np.array(learn.recorder.losses))", tensor.ShapeString(t.Shape))}
	}
	if !t.DType.IsFloat() && t.DType.Size() == 0 {
		return nil, &ParseError{Path: path, Msg: fmt.Sprintf("want a numeric array, found %s", t.DType)}
	}
	vals := make([]float64, n)
	if t.DType == tensor.Float64 {
		for i := range vals {
			vals[i] = math.Float64frombits(binary.LittleEndian.Uint64(t.Data[8*i:]))
		}
	} else {
		f32, err := t.Float32s()
		if err != nil {
			return nil, &ParseError{Path: path, Msg: err.Error()}
		}
		for i, v := range f32 {
			vals[i] = float64(v)
		}
	}
	if n == 0 {
		return nil, &ParseError{Path: path, Msg: "empty array: want one value per optimizer step"}
	}
	return listLog(path, "npy", vals, func(i int) (int, string) { return 0, fmt.Sprintf("[%d]", i) }, opt)
}

// listLog makes a log from a plain list of numbers. What the list holds
// is opt.Series, or else decided from the values: a list of powers of two
// is a loss-scale series (GradScaler's scale is a power of two from the
// default init_scale, and no loss series is), as is a list of positive
// numbers in a file whose name says "scale"; anything else is losses.
func listLog(path, format string, vals []float64, where func(int) (int, string), opt ReadOptions) (*trainlog.Log, error) {
	if len(vals) == 0 {
		return nil, &ParseError{Path: path, Msg: "empty list: want one value per optimizer step"}
	}
	series, why := opt.Series, "as --series says"
	if series == "" {
		series, why = SeriesLoss, "its values are not all powers of two (pass --series scale if they are loss scales)"
		pow2, positive := true, true
		for _, v := range vals {
			if frac, _ := math.Frexp(v); !(v > 0) || math.IsInf(v, 0) || frac != 0.5 {
				pow2 = false
			}
			positive = positive && v > 0 && !math.IsInf(v, 0)
		}
		name := strings.ToLower(filepath.Base(path))
		switch {
		case pow2:
			series, why = SeriesScale, "every value is a power of two, as GradScaler's scale is (pass --series loss if they are losses)"
		case positive && strings.Contains(name, "scale"):
			series, why = SeriesScale, "its name says scale and every value is positive (pass --series loss if they are losses)"
		}
	}
	l := &trainlog.Log{Path: path, Format: format}
	switch series {
	case SeriesLoss:
		l.Losses = vals
		l.Notes = append(l.Notes, fmt.Sprintf("a plain list of %d numbers, read as the loss of every optimizer step: %s", len(vals), why))
	case SeriesScale, SeriesFastaiScales:
		for i, v := range vals {
			prev := math.NaN()
			if i > 0 {
				prev = vals[i-1]
			}
			if msg := badScaleAfter(prev, v); msg != "" {
				line, field := where(i)
				return nil, &ParseError{Path: path, Line: line, Field: field, Msg: msg + " (a list of loss scales; pass --series loss if it holds losses)"}
			}
		}
		if series == SeriesFastaiScales {
			fastaiScales(l, vals)
		} else {
			l.Scales = vals
			l.Notes = append(l.Notes, fmt.Sprintf("a plain list of %d numbers, read as the loss scale after every optimizer step: %s", len(vals), why))
		}
	default:
		return nil, fmt.Errorf("--series %q: want %s, %s or %s", series, SeriesLoss, SeriesScale, SeriesFastaiScales)
	}
	if err := validate(l); err != nil {
		return nil, err
	}
	return l, nil
}

// fastaiScales rebuilds the scale after every step from fastai's
// MixedPrecision.scales, which holds, for every step that was NOT skipped,
// the scale that step used (read before update()). Between two entries
// every step was skipped, each halving the scale; a growth happens in the
// update() of the growth_interval-th clean step in a row. So the skipped
// steps between entries i and i+1 number log2(e_i·g_i / e_{i+1}), where
// g_i is 2 when entry i's step grew the scale: exact once growth_interval
// is known. It is inferred as the fewest clean entries that preceded an
// observed growth; a growth cancelled by the next step's backoff leaves the
// scale unchanged and is found the same way. Skipped steps after the last
// entry are not in the list.
func fastaiScales(l *trainlog.Log, e []float64) {
	init := trainlog.DefaultScaler.InitScale
	if k := math.Log2(init / e[0]); k < 0 || k != math.Trunc(k) {
		init = e[0]
		l.Notes = append(l.Notes, fmt.Sprintf("the first scale %s is not PyTorch's default init_scale 65536 halved a whole number of times: init_scale taken as %s", formatScaleShort(e[0]), formatScaleShort(e[0])))
	}
	interval, seen, count := 0, false, 0
	for i := 0; i+1 < len(e); i++ {
		count++
		switch r := e[i+1] / e[i]; {
		case r == trainlog.DefaultScaler.GrowthFactor:
			if !seen || count < interval {
				interval = count
			}
			seen = true
			count = 0
		case r < 1:
			count = 0
		}
	}
	if !seen {
		interval = trainlog.DefaultScaler.GrowthInterval
		l.NotDerived = append(l.NotDerived, "skipped steps where a growth was cancelled by the next step's backoff: the scale never grows in the list, so growth_interval is taken as PyTorch's default 2000 and such pairs, which leave the scale unchanged, are not counted")
	}
	out := []float64{}
	for s := init * trainlog.DefaultScaler.BackoffFactor; s >= e[0]; s *= trainlog.DefaultScaler.BackoffFactor {
		out = append(out, s)
	}
	tracker, odd := 0, -1
	for i, used := range e {
		tracker++
		after := used
		if tracker == interval {
			after, tracker = used*trainlog.DefaultScaler.GrowthFactor, 0
		}
		out = append(out, after)
		if i+1 == len(e) {
			break
		}
		k := math.Log2(after / e[i+1])
		if k < 0 || k != math.Trunc(k) {
			if odd < 0 {
				odd = i + 1
			}
			continue
		}
		for s := after * trainlog.DefaultScaler.BackoffFactor; k > 0; s, k = s*trainlog.DefaultScaler.BackoffFactor, k-1 {
			out = append(out, s)
			tracker = 0
		}
	}
	if odd >= 0 {
		l.Notes = append(l.Notes, fmt.Sprintf("entry %d of the list does not follow from the one before by halvings and one growth every %d clean steps: is it fastai's MixedPrecision.scales with GradScaler's default factors?", odd, interval))
	}
	l.Scales = out
	l.Notes = append(l.Notes, fmt.Sprintf("fastai's MixedPrecision.scales (%d steps that were not skipped, each with the scale it used) rebuilt into the scale after each of %d steps: the skipped steps between two entries follow from their ratio, with growth every %d clean steps", len(e), len(out), interval))
	l.NotDerived = append(l.NotDerived, "steps after the last entry of fastai's scales list: they were skipped (a step that was not would be in the list) but the list does not say how many; the losses would")
}

func formatScaleShort(s float64) string { return fmt.Sprintf("%g", s) }
