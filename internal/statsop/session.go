package statsop

// #include <stdlib.h>
// #include "ops.h"
import "C"

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"unsafe"

	"fp16audit/internal/onnx"
	"fp16audit/internal/ortcapi"
	"fp16audit/internal/tensor"
)

// Session runs a Plan: the Observe nodes write the records of every run
// into a record sink this session owns (C memory, registered with the
// operator), so a run allocates nothing for them and only the plan's one
// token leaves ONNX Runtime. It is not for concurrent use: each Run
// overwrites the records of the last.
type Session struct {
	s    *ortcapi.Session
	plan *Plan
	sink C.int64_t
	rec  []int64 // over the C buffer
	buf  unsafe.Pointer
	// weights are the initializers handed to ONNX Runtime over the
	// model's own memory (HandsOver), released with the session.
	weights []*ortcapi.Value
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
	m, weights, err := handOver(rt, withSink(plan.Model, int64(ss.sink)), plan.Declared, plan.Weights, &opts)
	if err != nil {
		ss.Close()
		return nil, err
	}
	ss.weights = weights
	data, err := onnx.Marshal(m)
	if err != nil {
		ss.Close()
		return nil, err
	}
	// ONNX Runtime adds a custom domain to a process-wide schema registry
	// while it creates a session; two sessions created at once race there
	// ("the domain is already exist"), so creations take turns.
	creating.Lock()
	ss.s, err = rt.NewSession(data, inputs, plan.outputs(), opts)
	creating.Unlock()
	if err != nil {
		ss.Close()
		return nil, err
	}
	return ss, nil
}

// handOverMin is the smallest initializer HandsOver hands over: below it
// ONNX Runtime's copy costs less than the bookkeeping.
const handOverMin = 64 << 10

// HandsOver reports whether a session hands initializer t to ONNX Runtime
// over the memory that holds it in the loaded model, instead of letting
// ONNX Runtime copy it from the serialized graph: a large tensor of a
// numeric type in raw_data (a model's weights when they are not in an
// external data file, which ONNX Runtime maps itself). The process then
// holds such weights once, in the model the audit loaded.
func HandsOver(t *onnx.TensorProto) bool {
	return t.GetDataLocation() != onnx.TensorProto_EXTERNAL && len(t.GetRawData()) >= handOverMin &&
		tensor.DType(t.GetDataType()).Size() > 0 && int64(len(t.GetRawData())) == onnx.TensorBytes(t)
}

// handOver returns m with the initializers HandsOver takes replaced by
// declarations, and adds them to opts as tensors over their bytes: those
// w holds (shared by every session of the audit, released by w.Close),
// and the others, which the caller releases after the session is closed.
// ONNX Runtime takes a weight given to the session (AddInitializer)
// without a copy only in place of one the graph declares, and it checks
// an embedded one's data: the declaration says the weight lies in the
// file declared (in the session's external-data folder), which ONNX
// Runtime finds but never reads. A weight in an external data file that w
// holds keeps its declaration and is handed over from w's mapping; a FLOAT
// view of 16-bit external data (onnx.FloatView) is handed over converted
// (Weights) with a plain declaration, or, where w does not hold it,
// converted into the model ONNX Runtime reads. The
// initializers a node updates in place (a training-mode BatchNorm's
// running statistics) are left to ONNX Runtime's own copy.
func handOver(rt *ortcapi.Runtime, m *onnx.ModelProto, declared string, w *Weights, opts *ortcapi.Options) (*onnx.ModelProto, []*ortcapi.Value, error) {
	if declared == "" && w == nil && !slices.ContainsFunc(m.Graph.Initializer, isView) {
		return m, nil, nil
	}
	written := writtenInPlace(m.Graph)
	var out *onnx.ModelProto
	var weights []*ortcapi.Value
	fail := func(err error) (*onnx.ModelProto, []*ortcapi.Value, error) {
		for _, v := range weights {
			v.Release()
		}
		return nil, nil, err
	}
	location := declared
	if location == "" && w != nil {
		location = w.declared
	}
	give := func(name string, v *ortcapi.Value) {
		if out == nil {
			out = onnx.ShallowCopy(m)
			opts.Initializers = maps.Clone(opts.Initializers)
			if opts.Initializers == nil {
				opts.Initializers = map[string]*ortcapi.Value{}
			}
		}
		opts.Initializers[name] = v
	}
	for i, t := range m.Graph.Initializer {
		if written[t.Name] {
			continue
		}
		v, err := w.value(t)
		if err != nil {
			return fail(err)
		}
		view := isView(t)
		if view && v == nil {
			// a FLOAT view of 16-bit weights that w does not hold: its
			// elements converted into the model ONNX Runtime reads
			d, err := onnx.DecodeTensor(t, opts.Config[externalDataKey])
			if err != nil {
				return fail(err)
			}
			if out == nil {
				out = onnx.ShallowCopy(m)
			}
			out.Graph.Initializer[i] = onnx.EncodeTensor(d)
			continue
		}
		switch {
		case v != nil && t.GetDataLocation() == onnx.TensorProto_EXTERNAL && !view:
			give(t.Name, v)
			continue
		case v == nil && (declared == "" || !HandsOver(t)):
			continue
		case v == nil:
			if v, err = rt.NewTensor(ortcapi.ElemType(t.DataType), t.Dims, unsafe.Pointer(unsafe.SliceData(t.RawData)), len(t.RawData)); err != nil {
				return fail(fmt.Errorf("initializer %q: %w", t.Name, err))
			}
			weights = append(weights, v)
		}
		give(t.Name, v)
		at := location
		if view {
			// its own data file, which ONNX Runtime finds but never reads
			for _, e := range t.ExternalData {
				if e.Key == "location" {
					at = e.Value
				}
			}
		}
		out.Graph.Initializer[i] = &onnx.TensorProto{Name: t.Name, DataType: t.DataType, Dims: t.Dims, DataLocation: onnx.TensorProto_EXTERNAL,
			ExternalData: []*onnx.StringStringEntryProto{{Key: "location", Value: at}, {Key: "offset", Value: "0"},
				{Key: "length", Value: strconv.FormatInt(onnx.TensorBytes(t), 10)}}}
	}
	if out == nil {
		return m, nil, nil
	}
	return out, weights, nil
}

// externalDataKey is the session configuration entry naming the folder
// of the model's external data.
const externalDataKey = "session.model_external_initializers_file_folder_path"

// isView reports whether t is a FLOAT view of 16-bit external data
// (onnx.FloatView), which ONNX Runtime cannot read itself.
func isView(t *onnx.TensorProto) bool { return onnx.StoredAs(t) != t.GetDataType() }

// creating serialises session creation (see NewSession).
var creating sync.Mutex

// ModelSession is a plain session of a model that may use the operators
// of Domain, with the weights it was handed.
type ModelSession struct {
	*ortcapi.Session
	weights []*ortcapi.Value
}

// NewModelSession creates a plain session of m (a backward graph with
// Round and Mass nodes): the domain registered on top of opts, the
// creation serialised as NewSession's. declared, when set, hands the
// weights HandsOver takes to ONNX Runtime over m's memory, as
// Plan.Declared does: m must stay as it is until the session is closed.
// w, when set, hands over the audit's shared weights (Plan.Weights).
func NewModelSession(rt *ortcapi.Runtime, m *onnx.ModelProto, declared string, w *Weights, inputs, outputs []string, opts ortcapi.Options) (*ModelSession, error) {
	d, err := Register(rt)
	if err != nil {
		return nil, fmt.Errorf("register the statistics operators: %w", err)
	}
	opts.Domains = append(append([]*ortcapi.CustomOpDomain(nil), opts.Domains...), d)
	m, weights, err := handOver(rt, m, declared, w, &opts)
	if err != nil {
		return nil, err
	}
	ms := &ModelSession{weights: weights}
	data, err := onnx.Marshal(m)
	if err == nil {
		creating.Lock()
		ms.Session, err = rt.NewSession(data, inputs, outputs, opts)
		creating.Unlock()
	}
	if err != nil {
		ms.Close()
		return nil, err
	}
	return ms, nil
}

// Close closes the session and releases the weights handed to it.
func (ms *ModelSession) Close() {
	if ms.Session != nil {
		ms.Session.Close()
		ms.Session = nil
	}
	for _, w := range ms.weights {
		w.Release()
	}
	ms.weights = nil
}

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

// outputs are the names a session of p returns: its token and the
// passes' graph outputs (Fetch), or the values a block hands on (among
// them, in the last block, the graph outputs).
func (p *Plan) outputs() []string {
	if len(p.Hand) > 0 {
		return p.Hand
	}
	outs := []string{p.Token}
	for _, f := range p.Fetch {
		outs = append(outs, f.Name)
	}
	return outs
}

// Run runs the plan on inputs (in the session's input order). Record and
// Fetched then hold the records and the graph outputs until the next Run.
func (s *Session) Run(inputs []*ortcapi.Value) error {
	s.release()
	outs, err := s.RunHand(inputs)
	if err != nil {
		return err
	}
	outs[0].Release()
	s.fetched = outs[1:]
	return nil
}

// Fetched returns the elements and shape of plan.Fetch[i] from the last
// Run; they stay valid until the next Run or Close.
func (s *Session) Fetched(i int) ([]float32, []int64, error) {
	if i >= len(s.fetched) || s.fetched[i] == nil {
		return nil, nil, fmt.Errorf("output %q of pass %d: not fetched", s.plan.Fetch[i].Value, s.plan.Fetch[i].Pass)
	}
	return floats(s.plan.Fetch[i].Value, s.fetched[i])
}

// floats returns the elements and shape of a FLOAT value ONNX Runtime
// returned, over its memory: valid while v is.
func floats(name string, v *ortcapi.Value) ([]float32, []int64, error) {
	t, shape, err := v.Info()
	if err != nil {
		return nil, nil, err
	}
	if t != ortcapi.Float32 {
		return nil, nil, fmt.Errorf("output %q: element type %d, want FLOAT", name, t)
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

// release frees the graph outputs of the last Run.
func (s *Session) release() {
	for _, v := range s.fetched {
		v.Release()
	}
	s.fetched = nil
}

// RunHand runs the plan like Run and returns what its graph returns, in
// the order of the plan's Hand (the token, for a whole plan), for the
// caller to release.
func (s *Session) RunHand(inputs []*ortcapi.Value) ([]*ortcapi.Value, error) {
	outs := make([]*ortcapi.Value, len(s.plan.outputs()))
	if err := s.s.Run(inputs, outs); err != nil {
		return nil, err
	}
	return outs, nil
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
	for _, v := range s.weights {
		v.Release()
	}
	s.weights = nil
}
