package backward

import (
	"context"
	"fmt"
	"unsafe"

	"fp16audit/internal/grad"
	"fp16audit/internal/grad/vjp"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/ortcapi"
	"fp16audit/internal/statsop"
	"fp16audit/internal/tensor"
)

// Probe runs the forward model once on inputs (in the order of the graph
// inputs that need feeding; ctx ending stops the run) and returns the
// Facts of that batch: it adds a
// Shape node per value and the parameter inputs of the rules as outputs,
// so nothing but shapes and a few integers leaves ONNX Runtime. opt
// configures the session and library is the ONNX Runtime library; when
// modelFile, the file m was loaded from, lies in opt.ExternalDataDir, the
// session takes the weights over m's memory instead of a copy (as
// NewMassSession does).
func Probe(ctx context.Context, library string, m *onnx.ModelProto, modelFile string, inputs []*tensor.Tensor, opt onnxrt.SessionOptions) (*grad.Facts, error) {
	ix, err := onnx.NewIndex(m.Graph)
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	feeds := ix.GraphInputs()
	if len(inputs) != len(feeds) {
		return nil, fmt.Errorf("probe: the model takes %d inputs, got %d", len(feeds), len(inputs))
	}
	f := &grad.Facts{Shapes: map[string][]int64{}, Values: map[string]*tensor.Tensor{}}
	var inNames []string
	for k, vi := range feeds {
		inNames = append(inNames, vi.Name)
		f.Shapes[vi.Name] = inputs[k].Shape
	}
	for _, t := range m.Graph.Initializer {
		f.Shapes[t.Name] = append([]int64{}, t.Dims...)
	}

	// The graph's own outputs stay declared (a value requested below may
	// be one of them); only the added outputs are fetched.
	g := &onnx.GraphProto{
		Node: append([]*onnx.NodeProto(nil), m.Graph.Node...), Name: m.Graph.Name,
		Initializer: m.Graph.Initializer, SparseInitializer: m.Graph.SparseInitializer,
		Input: m.Graph.Input, ValueInfo: m.Graph.ValueInfo,
		Output: append([]*onnx.ValueInfoProto(nil), m.Graph.Output...),
	}
	declared := map[string]bool{}
	for _, vi := range m.Graph.Output {
		declared[vi.Name] = true
	}
	var outNames []string
	var shapeOf []string // value each output's shape belongs to ("" for value outputs)
	seen := map[string]bool{}
	for _, n := range m.Graph.Node {
		for _, o := range n.Output {
			// a sequence or an optional has no shape (Shape refuses it):
			// the tensors taken out of it have theirs
			if o == "" || seen[o] || !ix.Tensor(o) {
				continue
			}
			seen[o] = true
			s := o + "::shape" + vjp.Internal
			g.Node = append(g.Node, onnx.Node("Shape", s, []string{o}, []string{s}))
			g.Output = append(g.Output, onnx.TensorValueInfo(s, onnx.TensorProto_INT64, -1))
			outNames = append(outNames, s)
			shapeOf = append(shapeOf, o)
		}
	}
	for _, n := range m.Graph.Node {
		for _, k := range vjp.ParamInputs(n.OpType) {
			if k >= len(n.Input) || n.Input[k] == "" {
				continue
			}
			v := n.Input[k]
			if _, err := ix.ConstantValue(v); err == nil || ix.Producer(v) < 0 || seen[v+"::value"] {
				continue
			}
			et := ix.ElemType(v)
			if et == 0 {
				continue
			}
			seen[v+"::value"] = true
			if !declared[v] {
				g.Output = append(g.Output, &onnx.ValueInfoProto{Name: v, Type: &onnx.TypeProto{Value: &onnx.TypeProto_TensorType{
					TensorType: &onnx.TypeProto_Tensor{ElemType: et}}}})
			}
			outNames = append(outNames, v)
			shapeOf = append(shapeOf, "")
		}
	}
	if len(outNames) == 0 {
		return f, nil
	}
	pm := &onnx.ModelProto{IrVersion: m.IrVersion, OpsetImport: m.OpsetImport, Graph: g, Functions: m.Functions}
	outs, err := probeRun(ctx, library, pm, modelFile, inNames, outNames, inputs, opt)
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	for k, t := range outs {
		if v := shapeOf[k]; v != "" {
			dims, err := vjp.Int64s(t)
			if err != nil {
				return nil, fmt.Errorf("probe: shape of %q: %w", v, err)
			}
			f.Shapes[v] = dims
			continue
		}
		f.Values[outNames[k]] = t
	}
	return f, nil
}

// probeRun runs m once on inputs in a session of its own and returns the
// outputs named.
func probeRun(ctx context.Context, library string, m *onnx.ModelProto, modelFile string, inNames, outNames []string, inputs []*tensor.Tensor, opt onnxrt.SessionOptions) ([]*tensor.Tensor, error) {
	rt, err := ortcapi.Open(library)
	if err != nil {
		return nil, err
	}
	o, err := fewRunOptions(opt)
	if err != nil {
		return nil, err
	}
	s, err := statsop.NewModelSession(rt, m, declared(modelFile, opt.ExternalDataDir), nil, inNames, outNames, o)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	defer s.StopOn(ctx)()
	in, err := tensorValues(rt, inputs)
	defer release(in)
	if err != nil {
		return nil, err
	}
	out := make([]*ortcapi.Value, len(outNames))
	defer release(out)
	if err := s.Run(in, out); err != nil {
		return nil, err
	}
	ts := make([]*tensor.Tensor, len(out))
	for k, v := range out {
		if ts[k], err = tensorOfValue(outNames[k], v); err != nil {
			return nil, fmt.Errorf("output %q: %w", outNames[k], err)
		}
	}
	return ts, nil
}

// tensorValues wraps each tensor as a value over its memory; the caller
// releases them, also after an error.
func tensorValues(rt *ortcapi.Runtime, ts []*tensor.Tensor) ([]*ortcapi.Value, error) {
	var out []*ortcapi.Value
	for _, x := range ts {
		var p unsafe.Pointer
		if len(x.Data) > 0 {
			p = unsafe.Pointer(&x.Data[0])
		}
		v, err := rt.NewTensor(ortcapi.ElemType(x.DType), x.Shape, p, len(x.Data))
		if err != nil {
			return out, fmt.Errorf("input %q: %w", x.Name, err)
		}
		out = append(out, v)
	}
	return out, nil
}

func release(vs []*ortcapi.Value) {
	for _, v := range vs {
		v.Release()
	}
}

// tensorOfValue copies a value ONNX Runtime allocated into a tensor.
func tensorOfValue(name string, v *ortcapi.Value) (*tensor.Tensor, error) {
	et, shape, err := v.Info()
	if err != nil {
		return nil, err
	}
	t := &tensor.Tensor{Name: name, DType: tensor.DType(et), Shape: shape}
	size := t.DType.Size()
	if size <= 0 {
		return nil, fmt.Errorf("element type %d", et)
	}
	t.Data = make([]byte, tensor.NumElements(shape)*int64(size))
	if len(t.Data) > 0 {
		p, err := v.Data()
		if err != nil {
			return nil, err
		}
		copy(t.Data, unsafe.Slice((*byte)(p), len(t.Data)))
	}
	return t, nil
}

// A forward pass that ran a batch in parts recorded shapes extrapolated
// from runs of one and two samples, right only for shapes that scale with
// the batch; an op whose output shapes depend on the values of its inputs
// (its entry's DataShaped in internal/onnx/ops) leaves the graph to the
// probe, which runs the whole batch. (Values of integer type, which the
// passes do not observe, already do.)

// Known returns the Facts of m on inputs (in the order of the graph inputs
// that need feeding) from shapes already measured on that batch — a
// forward pass's record of every value's shape — or nil when they do not
// suffice: a value m computes has no shape there, or a rule reads a
// parameter m computes at run time (Probe fetches those), or an op's
// output shape depends on data (DataShaped). When it is not nil, Probe
// would return the same Facts from another forward run.
func Known(m *onnx.ModelProto, inputs []*tensor.Tensor, shapes map[string][]int64) *grad.Facts {
	ix, err := onnx.NewIndex(m.Graph)
	if err != nil {
		return nil
	}
	feeds := ix.GraphInputs()
	if len(inputs) != len(feeds) {
		return nil
	}
	f := &grad.Facts{Shapes: map[string][]int64{}, Values: map[string]*tensor.Tensor{}}
	for k, vi := range feeds {
		f.Shapes[vi.Name] = inputs[k].Shape
	}
	for _, t := range m.Graph.Initializer {
		f.Shapes[t.Name] = append([]int64{}, t.Dims...)
	}
	for _, n := range m.Graph.Node {
		if o := ops.Lookup(n.Domain, n.OpType); o != nil && o.DataShaped {
			return nil
		}
		for _, o := range n.Output {
			if o == "" {
				continue
			}
			s, ok := shapes[o]
			switch {
			case ok || !onnx.IsDefaultDomain(n.Domain):
			case n.OpType == "Constant":
				// The passes observe what the graph computes, not its
				// constants, nor the mask beside a Dropout's output.
				if t, err := ix.ConstantValue(o); err == nil {
					s, ok = t.Shape, true
				}
			case n.OpType == "Dropout" && o != n.Output[0]:
				s, ok = shapes[n.Output[0]]
			}
			if !ok {
				return nil
			}
			f.Shapes[o] = append([]int64{}, s...)
		}
		for _, k := range vjp.ParamInputs(n.OpType) {
			if k >= len(n.Input) || n.Input[k] == "" {
				continue
			}
			if _, err := ix.ConstantValue(n.Input[k]); err != nil && ix.Producer(n.Input[k]) >= 0 {
				return nil
			}
		}
	}
	return f
}

// fewRunOptions are the options of a session run a few times (the probe
// once, the mass session two to five times): memory patterns off, since
// with them the first two runs would both fault in fresh memory, and the
// memory in huge pages, so that the first run's faults are few.
func fewRunOptions(opt onnxrt.SessionOptions) (ortcapi.Options, error) {
	level, err := ortcapi.ParseLevel(opt.Optimization)
	if err != nil {
		return ortcapi.Options{}, err
	}
	o := ortcapi.Options{Threads: opt.Threads, Level: level, NoMemPattern: true, HugePages: true,
		Config: map[string]string{"session.intra_op.allow_spinning": "0"}}
	if opt.ExternalDataDir != "" {
		o.Config["session.model_external_initializers_file_folder_path"] = opt.ExternalDataDir
	}
	return o, nil
}
