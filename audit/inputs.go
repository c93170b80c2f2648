package audit

import (
	"fmt"
	"math"

	"fp16audit/internal/batch"
	"fp16audit/internal/tensor"
)

// Input analysis: what kind of data each float input holds, its per-channel
// (images) or per-column (tables) statistics, and how to standardize it.

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
func analyzeInput(batches []batch.Batch, i int, stats *Stats) (kind string, chans []channelAcc) {
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
