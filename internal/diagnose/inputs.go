package diagnose

import (
	"fmt"
	"math"
	"slices"

	"fp16audit/internal/batch"
	"fp16audit/internal/observe"
	"fp16audit/internal/tensor"
	"fp16audit/report"
)

// Input analysis: what kind of data each float input holds, its per-channel
// (images) or per-column (tables) statistics, and how to standardize it.

// Input is what the input analysis learned about one graph input over all
// batches.
type Input struct {
	Spec batch.InputSpec
	// Index is the input's position in a batch.
	Index int
	Kind  string
	// DType and Shape are those of the first batch's tensor.
	DType, Shape string
	// Stats are the statistics of every value of the input (float inputs).
	Stats observe.Stats
	chans []channelAcc
	// Min, Max and Integral describe the finite values; RawPixels marks an
	// image of integers in 0..255.
	Min, Max  float64
	Integral  bool
	RawPixels bool
	// Columns lists the tabular columns far from standardized.
	Columns []int
	// Flagged marks an input whose scale can overflow fp16: raw pixels,
	// unscaled columns or values beyond fp16's range.
	Flagged bool
}

// AnalyzeInputs classifies every input of specs and computes its statistics
// over the batches.
func AnalyzeInputs(specs []batch.InputSpec, batches []batch.Batch, th Thresholds) []*Input {
	out := make([]*Input, len(specs))
	for i, spec := range specs {
		in := &Input{Spec: spec, Index: i, Stats: observe.NewStats(), Integral: true, Min: math.Inf(1), Max: math.Inf(-1)}
		if len(batches) > 0 {
			t := batches[0].Inputs[i]
			in.DType, in.Shape = t.DType.String(), tensor.ShapeString(t.Shape)
		}
		in.Kind, in.chans = analyzeInput(batches, i, &in.Stats)
		out[i] = in
		if in.Kind == KindInteger {
			continue
		}
		for c := range in.chans {
			ch := &in.chans[c]
			if ch.nonIntegral > 0 {
				in.Integral = false
			}
			if ch.n > 0 {
				in.Min = math.Min(in.Min, ch.min)
				in.Max = math.Max(in.Max, ch.max)
			}
			if in.Kind == KindTabular && (math.Abs(ch.mean()) > th.ColumnScale || ch.std() > th.ColumnScale) {
				in.Columns = append(in.Columns, c)
			}
		}
		in.RawPixels = in.Kind == KindImage && in.Integral && in.Min >= 0 && in.Max <= 255 && in.Max > 1
		in.Flagged = in.RawPixels || len(in.Columns) > 0 || in.Stats.MaxAbs > tensor.FP16Max
	}
	return out
}

// Report returns the input's part of the report: its statistics and, for
// images and tables, one entry per channel or column.
func (in *Input) Report() report.InputReport {
	ir := report.InputReport{ValueReport: report.ValueReport{Name: in.Spec.Name, DType: in.DType, Shape: in.Shape,
		Stats: map[string]report.StatsReport{}}, Kind: in.Kind, RawPixels: in.RawPixels}
	if in.Kind == KindInteger {
		return ir
	}
	ir.Stats[PassFP32] = StatsReport(in.Stats, nil)
	for c := range in.chans {
		ch := &in.chans[c]
		ir.Channels = append(ir.Channels, report.ChannelReport{Index: c, Mean: ch.mean(), Std: ch.std(), Min: ch.min, Max: ch.max,
			Flagged: slices.Contains(in.Columns, c)})
	}
	return ir
}

// means returns the mean of every channel or column.
func (in *Input) means() []float64 {
	out := make([]float64, len(in.chans))
	for i := range in.chans {
		out[i] = in.chans[i].mean()
	}
	return out
}

// Input kinds.
const (
	KindImage   = "image"   // rank 4, NCHW with 1–4 channels
	KindTabular = "tabular" // rank 2: rows × columns
	KindOther   = "other"   // any other float input
	KindInteger = "integer" // token ids, indices: exempt from the input checks
)

// channelAcc accumulates the statistics of one channel or column.
type channelAcc struct {
	n             int64
	sum, sumSq    float64
	min, max      float64
	nonIntegral   int64
	nonFiniteSeen int64
}

func (c *channelAcc) add(v float32) {
	if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
		c.nonFiniteSeen++
		return
	}
	x := float64(v)
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

// inputKind classifies an input by dtype and shape.
func inputKind(t *tensor.Tensor) string {
	switch {
	case !t.DType.IsFloat():
		return KindInteger
	case len(t.Shape) == 4 && t.Shape[1] >= 1 && t.Shape[1] <= 4:
		return KindImage
	case len(t.Shape) == 2:
		return KindTabular
	}
	return KindOther
}

// channelAxis is the axis whose entries get their own statistics: channels
// of an image, columns of a table, none (-1) otherwise.
func channelAxis(kind string) int {
	switch kind {
	case KindImage:
		return 1
	case KindTabular:
		return 1
	}
	return -1
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

// analyzeInput computes the per-channel statistics of input i over all
// batches, and folds its values into stats in the same pass over the data.
// Data that was converted from an integer dtype counts as integral.
func analyzeInput(batches []batch.Batch, i int, stats *observe.Stats) (kind string, chans []channelAcc) {
	if len(batches) == 0 {
		return KindOther, nil
	}
	kind = inputKind(batches[0].Inputs[i])
	if kind == KindInteger {
		return kind, nil
	}
	axis := channelAxis(kind)
	nch := 1
	if axis >= 0 {
		nch = int(batches[0].Inputs[i].Shape[axis])
	}
	chans = make([]channelAcc, nch)
	for bi, b := range batches {
		t := b.Inputs[i]
		vals, err := t.Float32s()
		if err != nil {
			continue
		}
		stats.Observe(vals, bi)
		if axis >= 0 && (len(t.Shape) <= axis || int(t.Shape[axis]) != nch) {
			continue
		}
		channel := channelOf(t.Shape, axis, nch)
		for j, v := range vals {
			chans[channel(j)].add(v)
		}
	}
	return kind, chans
}

// standardize returns batches with input i replaced by (x − mean_c)/std_c
// per channel, using the statistics in chans; a channel with zero spread
// is only centred.
func standardize(batches []batch.Batch, i int, kind string, chans []channelAcc) ([]batch.Batch, error) {
	axis := channelAxis(kind)
	out := make([]batch.Batch, len(batches))
	for bi, b := range batches {
		nb := batch.Batch{Source: b.Source + " (standardized)", Inputs: append([]*tensor.Tensor(nil), b.Inputs...)}
		t := b.Inputs[i]
		if t.DType != tensor.Float32 {
			return nil, fmt.Errorf("input %q: standardizing %s data is not supported", t.Name, t.DType)
		}
		vals, err := t.Float32s()
		if err != nil {
			return nil, err
		}
		channel := channelOf(t.Shape, axis, len(chans))
		for j, v := range vals {
			c := channel(j)
			s := chans[c].std()
			if s == 0 {
				s = 1
			}
			vals[j] = float32((float64(v) - chans[c].mean()) / s)
		}
		nb.Inputs[i] = tensor.FromFloat32s(t.Name, t.Shape, vals)
		out[bi] = nb
	}
	return out, nil
}
