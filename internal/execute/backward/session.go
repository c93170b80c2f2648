package backward

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"fp16audit/internal/grad"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/tensor"
)

// Session runs a generated backward graph: one ONNX Runtime session that
// computes the forward pass, the loss and every gradient output.
type Session struct {
	s       *onnxrt.Session
	res     *grad.Result
	feeds   int
	inputs  []string
	outputs []string
}

// NewSession creates a session for res that fetches the named outputs, or
// every graph output of res.Model when outputs is nil. A name that is not a
// graph output (a forward activation a caller wants next to its gradient)
// becomes one. ONNX Runtime computes only what the fetched outputs need,
// so fetching Summary outputs alone copies a few numbers per gradient
// instead of every tensor. The caller has initialized ONNX Runtime.
func NewSession(res *grad.Result, opt onnxrt.SessionOptions, outputs []string) (*Session, error) {
	m := res.Model
	g := m.Graph
	ix, err := onnx.NewIndex(g)
	if err != nil {
		return nil, fmt.Errorf("grad session: %w", err)
	}
	s := &Session{res: res}
	for _, vi := range ix.GraphInputs() {
		if vi.Name != res.Target && vi.Name != res.Scale {
			s.inputs = append(s.inputs, vi.Name)
		}
	}
	s.feeds = len(s.inputs)
	if res.Target != "" {
		s.inputs = append(s.inputs, res.Target)
	}
	s.inputs = append(s.inputs, res.Scale)
	declared := map[string]bool{}
	for _, vi := range g.Output {
		declared[vi.Name] = true
	}
	if outputs == nil {
		for _, vi := range g.Output {
			s.outputs = append(s.outputs, vi.Name)
		}
	}
	var extra []*onnx.ValueInfoProto
	seen := map[string]bool{}
	for _, v := range outputs {
		if seen[v] {
			continue
		}
		seen[v] = true
		s.outputs = append(s.outputs, v)
		if !declared[v] {
			extra = append(extra, &onnx.ValueInfoProto{Name: v, Type: &onnx.TypeProto{Value: &onnx.TypeProto_TensorType{
				TensorType: &onnx.TypeProto_Tensor{ElemType: ix.ElemType(v)}}}})
		}
	}
	if len(extra) > 0 {
		ng := &onnx.GraphProto{Node: g.Node, Name: g.Name, Initializer: g.Initializer,
			SparseInitializer: g.SparseInitializer, Input: g.Input, ValueInfo: g.ValueInfo,
			Output: append(append([]*onnx.ValueInfoProto(nil), g.Output...), extra...)}
		m = &onnx.ModelProto{IrVersion: m.IrVersion, OpsetImport: m.OpsetImport, Graph: ng, Functions: m.Functions}
	}
	data, err := onnx.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("grad session: %w", err)
	}
	s.s, err = onnxrt.NewSession(data, s.inputs, s.outputs, opt)
	if err != nil {
		return nil, fmt.Errorf("grad session: %w", err)
	}
	return s, nil
}

// Close releases the session.
func (s *Session) Close() error { return s.s.Close() }

// StopOn stops the session's runs when ctx ends (onnxrt.Session.StopOn):
// the run in flight ends at its next node, with ctx's cause. The function
// returned detaches ctx.
func (s *Session) StopOn(ctx context.Context) (detach func() bool) { return s.s.StopOn(ctx) }

// Outputs holds one run's outputs by name.
type Outputs map[string]*tensor.Tensor

// Run feeds the forward inputs (in graph order), the target (ignored, and
// may be nil, for ModelOutput) and the loss scale, and returns every
// output.
func (s *Session) Run(inputs []*tensor.Tensor, target *tensor.Tensor, scale float32) (Outputs, error) {
	if len(inputs) != s.feeds {
		return nil, fmt.Errorf("grad session: want %d forward inputs, got %d", s.feeds, len(inputs))
	}
	feeds := append([]*tensor.Tensor(nil), inputs...)
	if s.res.Target != "" {
		if target == nil {
			return nil, fmt.Errorf("grad session: the %s loss needs a target", s.res.Target)
		}
		feeds = append(feeds, target)
	}
	sc := make([]byte, 4)
	binary.LittleEndian.PutUint32(sc, math.Float32bits(scale))
	feeds = append(feeds, &tensor.Tensor{Name: s.res.Scale, DType: tensor.Float32, Shape: []int64{}, Data: sc})
	outs, err := s.s.Run(feeds)
	if err != nil {
		return nil, err
	}
	o := Outputs{}
	for i, name := range s.outputs {
		o[name] = outs[i]
	}
	return o, nil
}
