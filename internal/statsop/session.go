package statsop

// #include <stdlib.h>
// #include "ops.h"
import "C"

import (
	"context"
	"fmt"
	"sync"
	"unsafe"

	"fp16audit/internal/onnx"
	"fp16audit/internal/ortcapi"
)

// Session runs a Plan: the Observe nodes write the records of every run
// into a record sink this session owns (C memory, registered with the
// operator), so a run allocates nothing for them and only the plan's one
// token and the graph outputs of the passes (plan.Fetch) leave ONNX
// Runtime. It is not for concurrent use: each Run overwrites the records
// and the outputs of the last.
type Session struct {
	s    *ortcapi.Session
	plan *Plan
	sink C.int64_t
	rec  []int64 // over the C buffer
	buf  unsafe.Pointer
	// fetched holds the last Run's values of plan.Fetch.
	fetched []*ortcapi.Value
}

// NewSession creates the session of plan, whose graph inputs are inputs,
// with Observe registered on top of opts.
func NewSession(rt *ortcapi.Runtime, plan *Plan, inputs []string, opts ortcapi.Options) (*Session, error) {
	d, err := Register(rt)
	if err != nil {
		return nil, fmt.Errorf("register the statistics operator: %w", err)
	}
	opts.Domains = append(append([]*ortcapi.CustomOpDomain(nil), opts.Domains...), d)
	ss := &Session{plan: plan}
	n := max(plan.Records, 1) * RecordLen
	ss.buf = C.fa_calloc(C.size_t(n), 8)
	if ss.buf == nil {
		return nil, fmt.Errorf("records of %d values: out of memory", plan.Records)
	}
	ss.rec = unsafe.Slice((*int64)(ss.buf), n)
	if ss.sink = C.fa_sink_new((*C.int64_t)(ss.buf), C.int64_t(plan.Records)); ss.sink == 0 {
		ss.Close()
		return nil, fmt.Errorf("too many statistics sessions open at once")
	}
	data, err := onnx.Marshal(withSink(plan.Model, int64(ss.sink)))
	if err != nil {
		ss.Close()
		return nil, err
	}
	// ONNX Runtime adds a custom domain to a process-wide schema registry
	// while it creates a session; two sessions created at once race there
	// ("the domain is already exist"), so creations take turns.
	outs := []string{plan.Token}
	for _, f := range plan.Fetch {
		outs = append(outs, f.Name)
	}
	creating.Lock()
	ss.s, err = rt.NewSession(data, inputs, outs, opts)
	creating.Unlock()
	if err != nil {
		ss.Close()
		return nil, err
	}
	return ss, nil
}

// creating serialises session creation (see NewSession).
var creating sync.Mutex

// withSink returns m with every Observe node writing into sink.
func withSink(m *onnx.ModelProto, sink int64) *onnx.ModelProto {
	out := onnx.ShallowCopy(m)
	for i, n := range out.Graph.Node {
		if n.Domain != Domain || n.OpType != OpObserve {
			continue
		}
		c := onnx.CloneNode(n)
		for k, a := range c.Attribute {
			if a.Name == AttrSink {
				c.Attribute[k] = onnx.AttrInt(AttrSink, sink)
			}
		}
		out.Graph.Node[i] = c
	}
	return out
}

// Run runs the plan on inputs (in the session's input order). Record and
// Fetched then hold the records and outputs until the next Run.
func (s *Session) Run(inputs []*ortcapi.Value) error {
	s.release()
	outs := make([]*ortcapi.Value, 1+len(s.plan.Fetch))
	if err := s.s.Run(inputs, outs); err != nil {
		return err
	}
	if outs[0] != nil {
		outs[0].Release()
	}
	s.fetched = outs[1:]
	return nil
}

// Fetched returns the elements and shape of plan.Fetch[i] from the last
// Run; they stay valid until the next Run or Close.
func (s *Session) Fetched(i int) ([]float32, []int64, error) {
	if i >= len(s.fetched) || s.fetched[i] == nil {
		return nil, nil, fmt.Errorf("output %q of pass %d: not fetched", s.plan.Fetch[i].Value, s.plan.Fetch[i].Pass)
	}
	v := s.fetched[i]
	t, shape, err := v.Info()
	if err != nil {
		return nil, nil, err
	}
	if t != ortcapi.Float32 {
		return nil, nil, fmt.Errorf("output %q: element type %d, want FLOAT", s.plan.Fetch[i].Value, t)
	}
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	if n == 0 {
		return []float32{}, shape, nil
	}
	p, err := v.Data()
	if err != nil {
		return nil, nil, err
	}
	return unsafe.Slice((*float32)(p), n), shape, nil
}

// release frees the outputs of the last Run.
func (s *Session) release() {
	for _, v := range s.fetched {
		v.Release()
	}
	s.fetched = nil
}

// Record returns record row of output i from the last Run (the pass
// plan.Outputs[i].Passes[row]); it is overwritten by the next.
func (s *Session) Record(i, row int) Record {
	lo := (s.plan.Outputs[i].Slot + row) * RecordLen
	return Record(s.rec[lo : lo+RecordLen])
}

// InOrder reports whether the last Run summarised the values in the
// order the plan lists them, which the chain of tokens asks ONNX Runtime
// for and which keeps a run's memory near a plain inference's.
func (s *Session) InOrder() bool {
	last := int64(-1)
	for i := range s.plan.Outputs {
		seq := s.Record(i, 0).Seq()
		if seq < last {
			return false
		}
		last = seq
	}
	return true
}

// StopOn stops the session's runs when ctx ends (ortcapi.Session.StopOn):
// the run in flight ends at its next node, with ctx's cause. The function
// returned detaches ctx.
func (s *Session) StopOn(ctx context.Context) (detach func() bool) { return s.s.StopOn(ctx) }

// Plan returns the plan the session runs.
func (s *Session) Plan() *Plan { return s.plan }

// Close releases the session and its record sink.
func (s *Session) Close() {
	s.release()
	if s.s != nil {
		s.s.Close()
		s.s = nil
	}
	if s.sink != 0 {
		C.fa_sink_free(s.sink)
		s.sink = 0
	}
	if s.buf != nil {
		C.free(s.buf)
		s.buf, s.rec = nil, nil
	}
}
