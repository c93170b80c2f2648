package backward

import (
	"context"
	"errors"
	"fmt"
	"math"

	"fp16audit/internal/grad"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/tensor"
)

// Scanner runs a backward graph built with grad.Options.Summaries and
// fetches only the loss and the summaries: a few numbers per gradient
// leave ONNX Runtime instead of every tensor.
type Scanner struct {
	s      *Session
	res    *grad.Result
	inputs []*tensor.Tensor
	target *tensor.Tensor
}

// NewScanner opens a session for res that feeds inputs and target on
// every run. The caller has initialized ONNX Runtime.
func NewScanner(res *grad.Result, opt onnxrt.SessionOptions, inputs []*tensor.Tensor, target *tensor.Tensor) (*Scanner, error) {
	s, err := NewSession(res, opt, res.SummaryOutputs())
	if err != nil {
		return nil, err
	}
	return &Scanner{s: s, res: res, inputs: inputs, target: target}, nil
}

// Close releases the session.
func (sc *Scanner) Close() error { return sc.s.Close() }

// StopOn stops the scanner's runs when ctx ends: the run in flight ends at
// its next node, with ctx's cause. The function returned detaches ctx.
func (sc *Scanner) StopOn(ctx context.Context) (detach func() bool) { return sc.s.StopOn(ctx) }

// Scan runs forward and backward at loss scale 2^exp.
func (sc *Scanner) Scan(exp int) (*grad.Scan, error) {
	outs, err := sc.s.Run(sc.inputs, sc.target, float32(math.Ldexp(1, exp)))
	if err != nil {
		return nil, fmt.Errorf("backward at scale 2^%d: %w", exp, err)
	}
	scan := &grad.Scan{Exp: exp, Grads: map[string]grad.Reading{}, Sites: map[string]grad.Reading{}}
	if scan.Loss, err = scalar(outs, sc.res.Loss); err != nil {
		return nil, err
	}
	for _, g := range sc.res.Grads {
		if g.Summary == nil {
			return nil, errors.New("backward scan: the graph was built without summaries")
		}
		if scan.Grads[g.Value], err = reading(outs, g.Summary); err != nil {
			return nil, err
		}
	}
	for _, s := range sc.res.Sites {
		if scan.Sites[s.Rounded], err = reading(outs, s.Summary); err != nil {
			return nil, err
		}
	}
	return scan, nil
}

func reading(outs Outputs, s *grad.Summary) (grad.Reading, error) {
	var r grad.Reading
	var err error
	if r.MaxAbs, err = scalar(outs, s.MaxAbs); err != nil {
		return r, err
	}
	if r.NonZero, err = scalar(outs, s.NonZero); err != nil {
		return r, err
	}
	if s.Flushed != "" {
		if r.Flushed, err = scalar(outs, s.Flushed); err != nil {
			return r, err
		}
	}
	nf, ok := outs[s.NonFinite]
	if !ok || len(nf.Data) != 1 {
		return r, fmt.Errorf("backward scan: output %q missing", s.NonFinite)
	}
	r.NonFinite = nf.Data[0] != 0
	return r, nil
}

func scalar(outs Outputs, name string) (float64, error) {
	t, ok := outs[name]
	if !ok {
		return 0, fmt.Errorf("backward scan: output %q missing", name)
	}
	v := onnxrt.Float32View(t)
	if len(v) != 1 {
		return 0, fmt.Errorf("backward scan: output %q has %d elements, want 1", name, len(v))
	}
	return float64(v[0]), nil
}

// Status is what a caller tracks per key across loss scales: a small set
// of flags (overflowed, flushed beyond a threshold) that change with the
// scale at most once each, overflow switching on and flushing switching
// off as the scale grows.
type Status func(*grad.Scan) map[string]uint8

// Sweep scans the exponents lo..hi (and each of must, within them) with
// scan, and as many in between as it takes to find, for every key of
// status, where its flags change: an interval whose ends agree on every
// key is not looked into, since a flag that changes once cannot change and
// change back inside it. So a sweep costs a few runs per distinct change
// point instead of one per exponent. The result maps each scanned exponent
// to its scan. scan is usually (*Scanner).Scan.
func Sweep(scan func(exp int) (*grad.Scan, error), lo, hi int, must []int, status Status) (map[int]*grad.Scan, error) {
	scans := map[int]*grad.Scan{}
	flags := map[int]map[string]uint8{}
	get := func(e int) error {
		if _, ok := scans[e]; ok {
			return nil
		}
		s, err := scan(e)
		if err != nil {
			return err
		}
		scans[e], flags[e] = s, status(s)
		return nil
	}
	var refine func(a, b int) error
	refine = func(a, b int) error {
		if b-a <= 1 || sameFlags(flags[a], flags[b]) {
			return nil
		}
		mid := (a + b) / 2
		if err := get(mid); err != nil {
			return err
		}
		if err := refine(a, mid); err != nil {
			return err
		}
		return refine(mid, b)
	}
	points := []int{lo, hi}
	for _, e := range must {
		if e > lo && e < hi {
			points = append(points, e)
		}
	}
	for _, e := range points {
		if err := get(e); err != nil {
			return nil, err
		}
	}
	// Refine between consecutive scanned points.
	for e := lo; e < hi; {
		next := e + 1
		for next < hi && scans[next] == nil {
			next++
		}
		if err := refine(e, next); err != nil {
			return nil, err
		}
		e = next
	}
	return scans, nil
}

func sameFlags(a, b map[string]uint8) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
