// Package inputs is the diagnosis's input analysis: what kind of data
// each graph input holds (decided once, from its dtype, shape, name and
// what reads it), its statistics per channel, column or feature, whether
// its scale is a hazard for fp16, and how to standardize it (the batches
// a fix reruns on, and the calls that do it in the user's API).
package inputs

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"

	"fp16audit/internal/batch"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
	"fp16audit/report"
)

// Input is what the input analysis learned about one graph input over all
// batches.
type Input struct {
	Spec batch.InputSpec
	// Index is the input's position in a batch.
	Index int
	// Kind is one of the report.Kind* constants.
	Kind string
	// DType and Shape are those of the first batch's tensor; Saved is the
	// element type it had in its file.
	DType, Shape string
	Saved        tensor.DType
	// Stats are the statistics of every value of the input (float inputs).
	Stats observe.Stats
	// axis is the axis whose entries get their own statistics (-1: none).
	axis  int
	chans []channelAcc
	// Min, Max and Integral describe the finite values; RawPixels marks an
	// image of raw pixels (rawPixels): integers in 0..255 as decoded, or
	// floats spread over that range as resizing and augmentation leave
	// them.
	Min, Max  float64
	Integral  bool
	RawPixels bool
	// Columns lists the channels (columns, features) far from
	// standardized.
	Columns []int
	// Flagged marks an input whose scale can overflow fp16: raw pixels,
	// channels far from standardized or values beyond fp16's range.
	Flagged bool
	// SavedHalfInf is set when the data was saved in float16 and holds ±Inf
	// but no NaN: values beyond 65504 became Inf when it was saved, which is
	// unnormalized data rather than poisoned data.
	SavedHalfInf bool
	// Constant is set when every value of a float input is the same.
	Constant bool
	// Samples lists the samples that hold NaN/Inf (at most MaxSamples).
	Samples []report.Sample
}

// MaxSamples bounds the samples an input, or an origin, lists.
const MaxSamples = 20

// audioName recognises inputs named as waveforms.
var audioName = regexp.MustCompile(`(?i)wave|audio|signal|speech|sound|pcm|wav`)

// inputKind classifies input i from its first batch tensor, its name and
// the ops that read it.
func inputKind(t *tensor.Tensor, name string, readers []string) string {
	sh := t.Shape
	audio := audioName.MatchString(name)
	switch {
	case !t.DType.IsFloat():
		if slices.Contains(readers, "Gather") {
			return report.KindTokens
		}
		return report.KindInteger
	case len(sh) == 4 && (sh[1] >= 1 && sh[1] <= 4 || sh[3] >= 1 && sh[3] <= 4):
		return report.KindImage
	case len(sh) == 2 && (audio || sh[1] >= 4000 || frames(t)):
		return report.KindAudio
	case len(sh) == 2:
		return report.KindTabular
	case len(sh) == 3 && (audio || sh[1] <= 2 && sh[2] >= 1000):
		return report.KindAudio
	case len(sh) == 3:
		return report.KindSequence
	}
	return report.KindOther
}

// minFrame is the fewest columns a 2-D batch of frames of a signal has
// (a 4 ms frame at 16 kHz); a table this wide whose neighbouring columns
// move together is rare.
const minFrame = 64

// frames reports whether a 2-D float batch [N, L] holds frames of a
// signal (audio samples, a sensor trace) rather than rows of a table:
// at least minFrame columns, and either neighbouring columns move
// together (the correlation of x[i, j] with x[i, j+1], pooled over the
// batch, is 0.5 or more: a sampled waveform is smooth at its sampling
// rate) or every column looks alike (the same mean and spread, as the
// samples of one signal do: the columns' means no further apart than
// sampling explains, twice the typical spread over √rows; the middle
// half of their spreads within a factor of two)
// while the values are whole numbers beyond 8 bits, as 16-bit PCM is.
// A table's columns are different quantities: uncorrelated neighbours,
// each its own scale.
func frames(t *tensor.Tensor) bool {
	sh := t.Shape
	if len(sh) != 2 || sh[0] < 1 || sh[1] < minFrame {
		return false
	}
	vals, err := t.Float32s()
	if err != nil {
		return false
	}
	rows, cols := int(sh[0]), int(sh[1])
	var n, sx, sy, sxx, syy, sxy float64
	col := make([]channelAcc, cols)
	whole, wide := true, false
	for r := range rows {
		row := vals[r*cols : (r+1)*cols]
		for j, v := range row {
			x := float64(v)
			if math.IsNaN(x) || math.IsInf(x, 0) {
				continue
			}
			col[j].add(v)
			whole = whole && x == math.Trunc(x)
			wide = wide || math.Abs(x) > 255
			if j+1 < cols {
				y := float64(row[j+1])
				if math.IsNaN(y) || math.IsInf(y, 0) {
					continue
				}
				n++
				sx, sy, sxx, syy, sxy = sx+x, sy+y, sxx+x*x, syy+y*y, sxy+x*y
			}
		}
	}
	if n < 2 {
		return false
	}
	vx, vy := sxx/n-(sx/n)*(sx/n), syy/n-(sy/n)*(sy/n)
	if vx > 0 && vy > 0 && (sxy/n-(sx/n)*(sy/n))/math.Sqrt(vx*vy) >= 0.5 {
		return true
	}
	if !whole || !wide || rows < 2 {
		return false
	}
	var means, stds []float64
	for j := range col {
		means, stds = append(means, col[j].mean()), append(stds, col[j].std())
	}
	spread := &channelAcc{}
	for _, m := range means {
		spread.add(float32(m))
	}
	slices.Sort(stds)
	q1, typical, q3 := stds[len(stds)/4], stds[len(stds)/2], stds[3*len(stds)/4]
	return q1 > 0 && q3 <= 2*q1 && spread.std() <= 2*typical/math.Sqrt(float64(rows))
}

// channelAxis is the axis whose entries get their own statistics: the
// channels of an image (NCHW, or NHWC when only the last axis is small),
// the columns of a table, the features of a sequence, the channels of a
// [batch, channels, time] waveform; -1 (the whole input) otherwise.
func channelAxis(kind string, shape []int64) int {
	switch kind {
	case report.KindImage:
		if shape[1] >= 1 && shape[1] <= 4 {
			return 1
		}
		return 3
	case report.KindTabular:
		return 1
	case report.KindSequence:
		return 2
	case report.KindAudio:
		if len(shape) == 3 && shape[1] <= 2 {
			return 1
		}
	}
	return -1
}

// channelAcc accumulates the statistics of one channel or column.
type channelAcc struct {
	n           int64
	sum, sumSq  float64
	min, max    float64
	nonIntegral int64
}

func (c *channelAcc) add(v float32) {
	x := float64(v)
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return
	}
	if c.n == 0 || x < c.min {
		c.min = x
	}
	if c.n == 0 || x > c.max {
		c.max = x
	}
	c.n++
	c.sum += x
	c.sumSq += x * x
	if x != math.Trunc(x) {
		c.nonIntegral++
	}
}

func (c *channelAcc) mean() float64 {
	if c.n == 0 {
		return 0
	}
	return c.sum / float64(c.n)
}

func (c *channelAcc) std() float64 {
	if c.n == 0 {
		return 0
	}
	m := c.mean()
	v := c.sumSq/float64(c.n) - m*m
	if v < 0 {
		v = 0
	}
	return math.Sqrt(v)
}

// channelOf maps a flat row-major index of a tensor of the given shape to
// its position along axis (0 for every element when axis is -1).
func channelOf(shape []int64, axis, nch int) func(int) int {
	if axis < 0 {
		return func(int) int { return 0 }
	}
	inner := 1
	for _, d := range shape[axis+1:] {
		inner *= int(d)
	}
	return func(j int) int { return (j / inner) % nch }
}

// Analyze classifies every input of specs and computes its statistics
// over the batches. idx is the model's graph index (what reads each
// input); a channel (column, feature) whose |mean| or std exceeds
// columnScale is far from standardized.
func Analyze(specs []batch.InputSpec, batches []batch.Batch, idx *onnx.Index, columnScale float64) []*Input {
	g := idx.Graph()
	out := make([]*Input, len(specs))
	for i, spec := range specs {
		in := &Input{Spec: spec, Index: i, Stats: observe.NewStats(), Integral: true, Min: math.Inf(1), Max: math.Inf(-1), axis: -1}
		out[i] = in
		if len(batches) == 0 {
			in.Kind = report.KindOther
			continue
		}
		first := batches[0].Inputs[i]
		in.DType, in.Shape = first.DType.String(), tensor.ShapeString(first.Shape)
		in.Saved = first.DType
		if len(batches[0].Saved) > i {
			in.Saved = batches[0].Saved[i]
		}
		var readers []string
		for _, c := range idx.Consumers(spec.Name) {
			readers = append(readers, g.GetNode()[c].GetOpType())
		}
		in.Kind = inputKind(first, spec.Name, readers)
		if !first.DType.IsFloat() {
			continue
		}
		in.analyze(batches)
		in.flag(columnScale)
	}
	return out
}

// analyze computes the statistics of a float input over all batches in one
// pass over the data: the whole, per channel, and the samples holding
// NaN/Inf.
func (in *Input) analyze(batches []batch.Batch) {
	shape0 := batches[0].Inputs[in.Index].Shape
	in.axis = channelAxis(in.Kind, shape0)
	nch := 1
	if in.axis >= 0 {
		nch = int(shape0[in.axis])
	}
	in.chans = make([]channelAcc, nch)
	for bi, b := range batches {
		t := b.Inputs[in.Index]
		vals, err := t.Float32s()
		if err != nil {
			continue
		}
		in.Stats.Observe(vals, bi)
		if in.axis >= 0 && (len(t.Shape) <= in.axis || int(t.Shape[in.axis]) != nch) {
			continue
		}
		channel := channelOf(t.Shape, in.axis, nch)
		perSample := 1
		if len(t.Shape) > 0 && t.Shape[0] > 0 {
			perSample = len(vals) / int(t.Shape[0])
		}
		for j, v := range vals {
			in.chans[channel(j)].add(v)
			if f := float64(v); (math.IsNaN(f) || math.IsInf(f, 0)) && len(in.Samples) <= MaxSamples {
				in.countSample(bi, int64(j/perSample))
			}
		}
	}
}

// countSample counts one non-finite element of sample s of batch bi.
func (in *Input) countSample(bi int, s int64) {
	if k := len(in.Samples) - 1; k >= 0 && in.Samples[k].Batch == bi && in.Samples[k].Index == s {
		in.Samples[k].NonFinite++
		return
	}
	if len(in.Samples) < MaxSamples {
		in.Samples = append(in.Samples, report.Sample{Batch: bi, Index: s, NonFinite: 1})
	}
}

// flag decides from the statistics whether the input's scale is a hazard.
func (in *Input) flag(columnScale float64) {
	for c := range in.chans {
		ch := &in.chans[c]
		if ch.nonIntegral > 0 {
			in.Integral = false
		}
		if ch.n > 0 {
			in.Min = math.Min(in.Min, ch.min)
			in.Max = math.Max(in.Max, ch.max)
		}
		if math.Abs(ch.mean()) > columnScale || ch.std() > columnScale {
			in.Columns = append(in.Columns, c)
		}
	}
	s := in.Stats
	in.RawPixels = in.Kind == report.KindImage && in.rawPixels()
	in.SavedHalfInf = (in.Saved == tensor.Float16 || in.Saved == tensor.BFloat16) && s.NaN == 0 && s.PosInf+s.NegInf > 0
	in.Constant = s.Count > 0 && s.Finite == s.Count && in.Min == in.Max
	in.Flagged = in.RawPixels || len(in.Columns) > 0 || s.MaxAbs > tensor.FP16Max || in.SavedHalfInf
}

// rawPixels decides from the range and the spread of an image's values
// whether they are raw pixels: integers in 0..255, or floats that stay
// within 0..255 (up to the few units a bicubic or antialiased resize
// overshoots by) and spread over much of it, every channel's mean well
// inside it. A standardized image (mean ~0, values of a few units either
// side) or one scaled to 0..1 is neither; integrality is not asked of
// floats: a resized, rotated or colour-jittered batch in 0..255 is raw
// pixels as much as the decoded one.
func (in *Input) rawPixels() bool {
	if in.Integral && in.Min >= 0 && in.Max <= 255 && in.Max > 1 {
		return true
	}
	const overshoot = 8
	if in.Min < -overshoot || in.Max > 255+overshoot || in.Max-in.Min < 64 {
		return false
	}
	for c := range in.chans {
		if m := in.chans[c].mean(); m < 8 || m > 247 {
			return false
		}
	}
	return len(in.chans) > 0
}

// Poisoned reports whether the input holds NaN/Inf that are not the mark
// of unnormalized data saved in half precision.
func (in *Input) Poisoned() bool { return in.Stats.NonFinite() > 0 && !in.SavedHalfInf }

// Float reports whether the input holds floats, whose statistics the
// analysis computed.
func (in *Input) Float() bool { return in.chans != nil }

// Channels is the number of channels (columns, features) the input was
// analysed by; 1 for an input analysed whole, 0 for one that is not float.
func (in *Input) Channels() int { return len(in.chans) }

// ChannelMean is channel c's mean.
func (in *Input) ChannelMean(c int) float64 { return in.chans[c].mean() }

// ChannelStd is channel c's standard deviation.
func (in *Input) ChannelStd(c int) float64 { return in.chans[c].std() }

// Report returns the input's part of the report, but for its statistics
// (the caller adds those in the report's form): what it is and, for
// inputs analysed per channel, one entry per channel.
func (in *Input) Report() report.InputReport {
	ir := report.InputReport{ValueReport: report.ValueReport{Name: in.Spec.Name, DType: in.DType, Shape: in.Shape,
		Stats: map[string]report.StatsReport{}}, Kind: in.Kind, RawPixels: in.RawPixels}
	if in.chans == nil || in.axis < 0 {
		return ir
	}
	for c := range in.chans {
		ch := &in.chans[c]
		ir.Channels = append(ir.Channels, report.ChannelReport{Index: c, Mean: ch.mean(), Std: ch.std(), Min: ch.min, Max: ch.max,
			Flagged: slices.Contains(in.Columns, c)})
	}
	return ir
}

// Means returns the mean of every channel or column.
func (in *Input) Means() []float64 {
	out := make([]float64, len(in.chans))
	for i := range in.chans {
		out[i] = in.chans[i].mean()
	}
	return out
}

// Standardize returns batches with this input replaced by
// (x − mean_c)/std_c per channel; a channel with zero spread is only
// centred.
func (in *Input) Standardize(batches []batch.Batch) ([]batch.Batch, error) {
	out := make([]batch.Batch, len(batches))
	for bi, b := range batches {
		nb := batch.Batch{Source: b.Source + " (standardized)", Inputs: append([]*tensor.Tensor(nil), b.Inputs...), Saved: b.Saved}
		t := b.Inputs[in.Index]
		if t.DType != tensor.Float32 {
			return nil, fmt.Errorf("input %q: standardizing %s data is not supported", t.Name, t.DType)
		}
		vals, err := t.Float32s()
		if err != nil {
			return nil, err
		}
		channel := channelOf(t.Shape, in.axis, len(in.chans))
		for j, v := range vals {
			c := channel(j)
			s := in.chans[c].std()
			if s == 0 {
				s = 1
			}
			vals[j] = float32((float64(v) - in.chans[c].mean()) / s)
		}
		nb.Inputs[in.Index] = tensor.FromFloat32s(t.Name, t.Shape, vals)
		out[bi] = nb
	}
	return out, nil
}

// NormalizeAdvice returns the statistics that standardize the input and
// the calls that do it in the user's API for its kind.
func (in *Input) NormalizeAdvice() report.NormalizeStats {
	ns := report.NormalizeStats{Input: in.Spec.Name}
	for c := range in.chans {
		ns.Mean = append(ns.Mean, in.chans[c].mean())
		ns.Std = append(ns.Std, in.chans[c].std())
	}
	scaled := func(k float64) ([]float64, []float64) {
		m, s := make([]float64, len(ns.Mean)), make([]float64, len(ns.Std))
		for c := range ns.Mean {
			m[c], s[c] = ns.Mean[c]/k, ns.Std[c]/k
		}
		return m, s
	}
	name := pyIdent(in.Spec.Name)
	switch in.Kind {
	case report.KindImage:
		k := 1.0
		if in.RawPixels {
			// fastai's IntToFloatTensor divides pixels by 255 before
			// Normalize; torchvision's ToTensor does the same.
			k = 255
		}
		m, s := scaled(k)
		ns.Fastai = fmt.Sprintf("Normalize.from_stats(%s, %s)", FormatList(m, 4), FormatList(s, 4))
		ns.Torch = fmt.Sprintf("transforms.Normalize(mean=%s, std=%s)", FormatList(m, 4), FormatList(s, 4))
		switch {
		case in.RawPixels && in.Integral:
			ns.Torch = "transforms.ToTensor() then " + ns.Torch
		case in.RawPixels:
			// float pixels in 0..255 (resized or augmented): ToTensor
			// divides only uint8 images, so divide by hand
			ns.Torch = fmt.Sprintf("%s = %s / 255 then %s", name, name, ns.Torch)
		}
	case report.KindTabular:
		ns.Fastai = "procs=[Categorify, FillMissing, Normalize] in TabularPandas / TabularDataLoaders.from_df"
		ns.Torch = fmt.Sprintf("%s = (%s - mean) / std with the per-column mean %s and std %s of the training set",
			name, name, FormatList(ns.Mean, 4), FormatList(ns.Std, 4))
	case report.KindAudio:
		if in.Integral && in.Max <= 32767 && in.Min >= -32768 && in.Max-in.Min > 255 {
			ns.Torch = fmt.Sprintf("%s = %s / 32768 (16-bit PCM to [-1, 1]), or (%s - %.4g) / %.4g", name, name, name, ns.Mean[0], ns.Std[0])
		} else {
			ns.Torch = fmt.Sprintf("%s = (%s - %s) / %s", name, name, FormatList(ns.Mean, 4), FormatList(ns.Std, 4))
		}
	case report.KindSequence:
		ns.Torch = fmt.Sprintf("%s = (%s - mean) / std per feature (last axis), mean %s, std %s", name, name, FormatList(ns.Mean, 4), FormatList(ns.Std, 4))
	default:
		ns.Torch = fmt.Sprintf("%s = (%s - %.4g) / %.4g", name, name, ns.Mean[0], ns.Std[0])
	}
	return ns
}

// pyIdent turns an input name into something that reads as a Python
// variable in advice.
func pyIdent(name string) string {
	r := strings.Map(func(c rune) rune {
		if c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			return c
		}
		return '_'
	}, name)
	if r == "" || r[0] >= '0' && r[0] <= '9' {
		r = "x_" + r
	}
	return r
}

// FormatList writes numbers as a Python list with prec decimals.
func FormatList(xs []float64, prec int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.*f", prec, x)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}
