package onnx

import (
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/tensor"
)

// ErrNotConstant is returned by ConstantValue for a value that is neither an
// initializer nor the output of a Constant node.
var ErrNotConstant = errors.New("not a constant")

// Index answers questions about one graph without rescanning it: who
// produces and consumes each value, a topological order of the nodes, the
// element type and declared shape of each value, and its constant contents.
// It describes the graph as it was when built.
type Index struct {
	// BaseDir is the folder external data of initializers is read from by
	// ConstantValue. Load sets it to the model's folder.
	BaseDir string

	g         *GraphProto
	producer  map[string]int
	consumers map[string][]int
	implicit  [][]string
	order     []int
	elemType  map[string]int32
	kinds     map[string]Kind
	shapes    map[string]Shape
	inits     map[string]*TensorProto
	sparse    map[string]*SparseTensorProto
	constNode map[string]int
}

// Shape is a declared tensor shape. Dims holds -1 where a dimension is not a
// fixed size; Params holds the symbolic name (dim_param) of such a dimension,
// or "" when it is fixed or unnamed.
type Shape struct {
	Dims   []int64
	Params []string
}

// Rank returns the number of dimensions.
func (s Shape) Rank() int { return len(s.Dims) }

// String formats the shape as [batch,3,224,224], with ? for an unnamed
// unknown dimension.
func (s Shape) String() string {
	parts := make([]string, len(s.Dims))
	for i, d := range s.Dims {
		switch {
		case d >= 0:
			parts[i] = fmt.Sprint(d)
		case s.Params[i] != "":
			parts[i] = s.Params[i]
		default:
			parts[i] = "?"
		}
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// CycleError reports nodes whose data dependencies form a cycle, which no
// valid ONNX graph has.
type CycleError struct {
	Graph string
	// Nodes names the nodes on a cycle: their names, or op_type#index when
	// unnamed, in file order.
	Nodes []string
}

func (e *CycleError) Error() string {
	return fmt.Sprintf("graph %q has a cycle through nodes %s; an ONNX graph must be acyclic, the model is corrupt or was edited by hand, export it again",
		e.Graph, strings.Join(e.Nodes, ", "))
}

// NewIndex indexes g. It fails when two nodes produce the same value or the
// nodes form a cycle (*CycleError).
func NewIndex(g *GraphProto) (*Index, error) {
	if g == nil {
		return nil, errors.New("index graph: nil graph")
	}
	ix := &Index{
		g:         g,
		producer:  map[string]int{},
		consumers: map[string][]int{},
		implicit:  make([][]string, len(g.GetNode())),
		elemType:  map[string]int32{},
		shapes:    map[string]Shape{},
		inits:     map[string]*TensorProto{},
		sparse:    map[string]*SparseTensorProto{},
		constNode: map[string]int{},
	}
	for i, n := range g.GetNode() {
		for _, out := range n.GetOutput() {
			if out == "" {
				continue
			}
			if p, ok := ix.producer[out]; ok {
				return nil, fmt.Errorf("graph %q: value %q is produced by both node %s and node %s; ONNX values must have one producer, the model is corrupt",
					g.GetName(), out, ix.NodeLabel(p), ix.NodeLabel(i))
			}
			ix.producer[out] = i
		}
		ix.implicit[i] = implicitInputs(n)
	}
	for i, n := range g.GetNode() {
		seen := map[string]bool{}
		for _, in := range append(slices.Clone(n.GetInput()), ix.implicit[i]...) {
			if in == "" || seen[in] {
				continue
			}
			seen[in] = true
			ix.consumers[in] = append(ix.consumers[in], i)
		}
	}
	if err := ix.sort(); err != nil {
		return nil, err
	}
	ix.collectTypes()
	return ix, nil
}

// Graph returns the indexed graph.
func (ix *Index) Graph() *GraphProto { return ix.g }

// NodeLabel names node i for messages: its quoted name, or op_type#i when
// unnamed.
func (ix *Index) NodeLabel(i int) string { return nodeLabel(ix.g.GetNode()[i], i) }

// Producer returns the index of the node that outputs name, or -1 for graph
// inputs, initializers and unknown names.
func (ix *Index) Producer(name string) int {
	if p, ok := ix.producer[name]; ok {
		return p
	}
	return -1
}

// Consumers returns the indices of the nodes that read name, in file order,
// including nodes whose subgraphs read it from the outer scope. The slice
// must not be modified.
func (ix *Index) Consumers(name string) []int { return ix.consumers[name] }

// ImplicitInputs returns the outer-scope values the subgraphs of node i (If,
// Loop, Scan bodies, at any depth) read without defining them.
func (ix *Index) ImplicitInputs(i int) []string { return ix.implicit[i] }

// Order returns the node indices in topological order. Among nodes that are
// ready at the same time the one earlier in the file comes first, so a graph
// already in order keeps its file order.
func (ix *Index) Order() []int { return slices.Clone(ix.order) }

// ConstantNodes reports, per node, whether its outputs are constants:
// computed from initializers and Constant nodes alone, never from a graph
// input, by ops that draw no random numbers, so that any copy of the node
// computes the same values (a Constant, an Identity of a weight, a shape
// computed from a weight). Nodes of other domains count only where pure
// says so (nil: none).
func (ix *Index) ConstantNodes(pure func(*NodeProto) bool) []bool {
	nodes := ix.g.GetNode()
	out := make([]bool, len(nodes))
	inputs := map[string]bool{}
	for _, vi := range ix.GraphInputs() {
		inputs[vi.GetName()] = true
	}
	for _, i := range ix.order {
		n := nodes[i]
		c := (IsDefaultDomain(n.GetDomain()) && !ops.Random(ops.Default, n.GetOpType())) || (pure != nil && pure(n))
		for _, in := range append(slices.Clone(n.GetInput()), ix.implicit[i]...) {
			if in == "" || !c {
				continue
			}
			if p := ix.Producer(in); p >= 0 {
				c = out[p]
			} else {
				c = !inputs[in] && ix.IsInitializer(in)
			}
		}
		out[i] = c
	}
	return out
}

// IsInitializer reports whether name is a dense or sparse initializer.
func (ix *Index) IsInitializer(name string) bool {
	_, dense := ix.inits[name]
	_, sparse := ix.sparse[name]
	return dense || sparse
}

// Initializer returns the dense initializer called name, or nil.
func (ix *Index) Initializer(name string) *TensorProto { return ix.inits[name] }

// GraphInputs returns the graph inputs a caller must feed: the declared
// inputs minus initializers, which exporters before IR version 4 list as
// inputs too.
func (ix *Index) GraphInputs() []*ValueInfoProto {
	var out []*ValueInfoProto
	for _, vi := range ix.g.GetInput() {
		if !ix.IsInitializer(vi.GetName()) {
			out = append(out, vi)
		}
	}
	return out
}

// ElemType returns the element type (a TensorProto_DataType number) of the
// value called name: declared on a graph input, output or value_info, taken
// from an initializer or Constant, or inferred for ops whose output type is
// plain (Cast, elementwise and shape ops, Shape, comparisons). It returns 0
// when the type is unknown.
func (ix *Index) ElemType(name string) int32 { return ix.elemType[name] }

// Shape returns the declared shape of name (from graph inputs, outputs,
// value_info, initializers and Constant nodes) and whether one is declared.
func (ix *Index) Shape(name string) (Shape, bool) {
	s, ok := ix.shapes[name]
	return s, ok
}

// Kind returns what the value called name is: a tensor (KindTensor, also
// for an unknown name), or a container of tensors that no tensor op may
// read. A value the graph does not declare takes the kind its producer's
// entry in internal/onnx/ops gives (Holds).
func (ix *Index) Kind(name string) Kind { return ix.kinds[name] }

// Tensor reports whether the value called name is a tensor: what a Cast,
// a rounding or a statistics node may read.
func (ix *Index) Tensor(name string) bool { return ix.kinds[name] == KindTensor }

// sort computes the topological order with Kahn's algorithm, taking the
// lowest file index among ready nodes.
func (ix *Index) sort() error {
	nodes := ix.g.GetNode()
	indeg := make([]int, len(nodes))
	succ := make([][]int, len(nodes))
	for i, n := range nodes {
		seen := map[int]bool{}
		for _, in := range append(slices.Clone(n.GetInput()), ix.implicit[i]...) {
			p, ok := ix.producer[in]
			if in == "" || !ok || seen[p] {
				continue
			}
			seen[p] = true
			succ[p] = append(succ[p], i)
			indeg[i]++
		}
	}
	ready := &intHeap{}
	for i := range nodes {
		if indeg[i] == 0 {
			*ready = append(*ready, i)
		}
	}
	heap.Init(ready)
	ix.order = make([]int, 0, len(nodes))
	for ready.Len() > 0 {
		i := heap.Pop(ready).(int)
		ix.order = append(ix.order, i)
		for _, s := range succ[i] {
			if indeg[s]--; indeg[s] == 0 {
				heap.Push(ready, s)
			}
		}
	}
	if len(ix.order) == len(nodes) {
		return nil
	}
	// Nodes left over lie on a cycle or downstream of one; name only those
	// on a cycle.
	left := map[int]bool{}
	for i := range nodes {
		if indeg[i] > 0 {
			left[i] = true
		}
	}
	var names []string
	for _, i := range cycleNodes(len(nodes), succ, left) {
		names = append(names, ix.NodeLabel(i))
	}
	return &CycleError{Graph: ix.g.GetName(), Nodes: names}
}

// cycleNodes returns, in ascending order, the nodes among left that lie on a
// cycle: members of strongly connected components with more than one node,
// or with a self edge (Tarjan's algorithm).
func cycleNodes(n int, succ [][]int, left map[int]bool) []int {
	index := make([]int, n)
	low := make([]int, n)
	onStack := make([]bool, n)
	for i := range index {
		index[i] = -1
	}
	var stack, out []int
	next := 0
	var visit func(v int)
	visit = func(v int) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		onStack[v] = true
		selfLoop := false
		for _, w := range succ[v] {
			if !left[w] {
				continue
			}
			if w == v {
				selfLoop = true
			}
			if index[w] < 0 {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] != index[v] {
			return
		}
		var comp []int
		for {
			w := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			onStack[w] = false
			comp = append(comp, w)
			if w == v {
				break
			}
		}
		if len(comp) > 1 || selfLoop {
			out = append(out, comp...)
		}
	}
	for v := range n {
		if left[v] && index[v] < 0 {
			visit(v)
		}
	}
	slices.Sort(out)
	return out
}

type intHeap []int

func (h intHeap) Len() int           { return len(h) }
func (h intHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h intHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *intHeap) Push(x any)        { *h = append(*h, x.(int)) }
func (h *intHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// implicitInputs returns the names n's subgraphs read from the outer scope,
// in order of first use.
func implicitInputs(n *NodeProto) []string {
	var out []string
	seen := map[string]bool{}
	for _, a := range n.GetAttribute() {
		subs := a.GetGraphs()
		if a.GetG() != nil {
			subs = append([]*GraphProto{a.GetG()}, subs...)
		}
		for _, g := range subs {
			for _, name := range freeNames(g) {
				if !seen[name] {
					seen[name] = true
					out = append(out, name)
				}
			}
		}
	}
	return out
}

// freeNames returns the names g uses, directly or in nested subgraphs, that
// it does not define itself: its references to enclosing scopes.
func freeNames(g *GraphProto) []string {
	defined := sourceNames(g)
	for _, n := range g.GetNode() {
		for _, o := range n.GetOutput() {
			defined[o] = true
		}
	}
	var out []string
	use := func(name string) {
		if !defined[name] {
			defined[name] = true
			out = append(out, name)
		}
	}
	for _, n := range g.GetNode() {
		for _, in := range n.GetInput() {
			use(in)
		}
		for _, in := range implicitInputs(n) {
			use(in)
		}
	}
	for _, vi := range g.GetOutput() {
		use(vi.GetName())
	}
	return out
}

// collectTypes records declared types and shapes, then infers element types
// in topological order for values left without one.
func (ix *Index) collectTypes() {
	g := ix.g
	for _, list := range [][]*ValueInfoProto{g.GetInput(), g.GetOutput(), g.GetValueInfo()} {
		for _, vi := range list {
			ix.declare(vi)
		}
	}
	for _, t := range g.GetInitializer() {
		ix.inits[t.GetName()] = t
		ix.setType(t.GetName(), t.GetDataType())
		ix.setShape(t.GetName(), t.GetDims())
	}
	for _, s := range g.GetSparseInitializer() {
		name := s.GetValues().GetName()
		ix.sparse[name] = s
		ix.setType(name, s.GetValues().GetDataType())
		ix.setShape(name, s.GetDims())
	}
	for i, n := range g.GetNode() {
		if n.GetOpType() != "Constant" || !IsDefaultDomain(n.GetDomain()) || len(n.GetOutput()) == 0 {
			continue
		}
		out := n.GetOutput()[0]
		ix.constNode[out] = i
		dt, dims := constantSignature(n)
		ix.setType(out, dt)
		if dims != nil {
			ix.setShape(out, dims)
		}
	}
	for _, i := range ix.order {
		n := g.GetNode()[i]
		for k, out := range n.GetOutput() {
			if out == "" {
				continue
			}
			if ix.elemType[out] == 0 {
				ix.elemType[out] = ix.inferType(n, k)
			}
		}
	}
	ix.kinds = Kinds(g, ix.order)
}

func (ix *Index) declare(vi *ValueInfoProto) {
	var elem int32
	var shape *TensorShapeProto
	if KindOf(vi.GetType()) != KindTensor {
		// a container's element type is that of the tensors it holds
		ix.setType(vi.GetName(), containedElemType(vi.GetType()))
		return
	}
	switch {
	case vi.GetType().GetTensorType() != nil:
		elem, shape = vi.GetType().GetTensorType().GetElemType(), vi.GetType().GetTensorType().GetShape()
	case vi.GetType().GetSparseTensorType() != nil:
		elem, shape = vi.GetType().GetSparseTensorType().GetElemType(), vi.GetType().GetSparseTensorType().GetShape()
	default:
		return
	}
	ix.setType(vi.GetName(), elem)
	if shape == nil {
		return
	}
	if _, ok := ix.shapes[vi.GetName()]; ok {
		return
	}
	s := Shape{Dims: make([]int64, len(shape.GetDim())), Params: make([]string, len(shape.GetDim()))}
	for i, d := range shape.GetDim() {
		s.Dims[i] = -1
		if v, ok := d.GetValue().(*TensorShapeProto_Dimension_DimValue); ok && v.DimValue >= 0 {
			s.Dims[i] = v.DimValue
		}
		s.Params[i] = d.GetDimParam()
	}
	ix.shapes[vi.GetName()] = s
}

func (ix *Index) setType(name string, dt int32) {
	if name != "" && dt != 0 && ix.elemType[name] == 0 {
		ix.elemType[name] = dt
	}
}

func (ix *Index) setShape(name string, dims []int64) {
	if _, ok := ix.shapes[name]; name == "" || ok {
		return
	}
	ix.shapes[name] = Shape{Dims: slices.Clone(nonNil(dims)), Params: make([]string, len(dims))}
}

// constantSignature returns the element type and shape of a Constant node's
// output, with nil dims when the attribute does not fix them.
func constantSignature(n *NodeProto) (int32, []int64) {
	for _, a := range n.GetAttribute() {
		switch a.GetName() {
		case "value":
			return a.GetT().GetDataType(), nonNil(a.GetT().GetDims())
		case "sparse_value":
			return a.GetSparseTensor().GetValues().GetDataType(), nonNil(a.GetSparseTensor().GetDims())
		case "value_float":
			return int32(TensorProto_FLOAT), []int64{}
		case "value_floats":
			return int32(TensorProto_FLOAT), []int64{int64(len(a.GetFloats()))}
		case "value_int":
			return int32(TensorProto_INT64), []int64{}
		case "value_ints":
			return int32(TensorProto_INT64), []int64{int64(len(a.GetInts()))}
		case "value_string":
			return int32(TensorProto_STRING), []int64{}
		case "value_strings":
			return int32(TensorProto_STRING), []int64{int64(len(a.GetStrings()))}
		}
	}
	return 0, nil
}

func nonNil(dims []int64) []int64 {
	if dims == nil {
		return []int64{}
	}
	return dims
}

// inferType returns the element type of output k of n from its inputs'
// types and attributes, by the type rule of its entry in
// internal/onnx/ops, or 0.
func (ix *Index) inferType(n *NodeProto, k int) int32 {
	if d := n.GetDomain(); !IsDefaultDomain(d) {
		return 0
	}
	o := ops.Lookup(ops.Default, n.GetOpType())
	if o == nil {
		return 0
	}
	in := func(i int) int32 {
		if i < len(n.GetInput()) {
			return ix.elemType[n.GetInput()[i]]
		}
		return 0
	}
	t := o.Type
	if t == ops.TypeInput && slices.Contains(o.IndexOutputs, k) {
		t = o.IndexType
	}
	switch t {
	case ops.TypeInput:
		if k == 0 {
			return in(0)
		}
	case ops.TypeInputAll:
		return in(0)
	case ops.TypeSecond:
		return in(1)
	case ops.TypeTo:
		return int32(IntAttr(n, "to", 0))
	case ops.TypeValue:
		for _, a := range n.GetAttribute() {
			if a.GetName() == "value" && a.GetT() != nil {
				return a.GetT().GetDataType()
			}
		}
		return int32(TensorProto_FLOAT)
	case ops.TypeInt64:
		return int32(TensorProto_INT64)
	case ops.TypeBool:
		return int32(TensorProto_BOOL)
	}
	return 0
}

// ConstantValue returns the contents of an initializer (dense or sparse,
// densified) or of a Constant node's output. Other values give an error
// wrapping ErrNotConstant.
func (ix *Index) ConstantValue(name string) (*tensor.Tensor, error) {
	if t, ok := ix.inits[name]; ok {
		return DecodeTensor(t, ix.BaseDir)
	}
	if s, ok := ix.sparse[name]; ok {
		return ix.densify(name, s)
	}
	i, ok := ix.constNode[name]
	if !ok {
		return nil, fmt.Errorf("value %q: %w (not an initializer or Constant output)", name, ErrNotConstant)
	}
	n := ix.g.GetNode()[i]
	for _, a := range n.GetAttribute() {
		var t *tensor.Tensor
		switch a.GetName() {
		case "value":
			v, err := DecodeTensor(a.GetT(), ix.BaseDir)
			if err != nil {
				return nil, fmt.Errorf("constant %q: %w", name, err)
			}
			t = v
		case "sparse_value":
			return ix.densify(name, a.GetSparseTensor())
		case "value_float":
			t = tensor.FromFloat32s(name, []int64{}, []float32{a.GetF()})
		case "value_floats":
			t = tensor.FromFloat32s(name, []int64{int64(len(a.GetFloats()))}, a.GetFloats())
		case "value_int":
			t = tensor.FromInt64s("", []int64{}, []int64{a.GetI()})
		case "value_ints":
			t = tensor.FromInt64s("", []int64{int64(len(a.GetInts()))}, a.GetInts())
		case "value_string", "value_strings":
			return nil, fmt.Errorf("constant %q: string constants are not supported", name)
		default:
			continue
		}
		t.Name = name
		return t, nil
	}
	return nil, fmt.Errorf("constant %q: node %s has no value attribute", name, ix.NodeLabel(i))
}

// densify expands a sparse tensor: values [NNZ] at indices given either as
// [NNZ] linear positions or [NNZ, rank] coordinates.
func (ix *Index) densify(name string, s *SparseTensorProto) (*tensor.Tensor, error) {
	vals, err := DecodeTensor(s.GetValues(), ix.BaseDir)
	if err != nil {
		return nil, fmt.Errorf("sparse tensor %q values: %w", name, err)
	}
	idx, err := DecodeTensor(s.GetIndices(), ix.BaseDir)
	if err != nil {
		return nil, fmt.Errorf("sparse tensor %q indices: %w", name, err)
	}
	if idx.DType != tensor.Int64 {
		return nil, fmt.Errorf("sparse tensor %q: indices are %s, want int64", name, idx.DType)
	}
	dims := s.GetDims()
	total := int64(1)
	for _, d := range dims {
		if d < 0 || d != 0 && total > math.MaxInt64/8/d {
			return nil, fmt.Errorf("sparse tensor %q: bad dims %v", name, dims)
		}
		total *= d
	}
	nnz := vals.Elements()
	rank := int64(len(dims))
	linear := len(idx.Shape) == 1 && idx.Shape[0] == nnz
	coords := len(idx.Shape) == 2 && idx.Shape[0] == nnz && idx.Shape[1] == rank
	if !linear && !coords {
		return nil, fmt.Errorf("sparse tensor %q: indices shape %v, want [%d] or [%d,%d]", name, idx.Shape, nnz, nnz, rank)
	}
	size := int64(vals.DType.Size())
	out := &tensor.Tensor{Name: name, DType: vals.DType, Shape: slices.Clone(nonNil(dims)), Data: make([]byte, total*size)}
	at := func(i int64) int64 { return int64(binary.LittleEndian.Uint64(idx.Data[8*i:])) }
	for j := range nnz {
		var pos int64
		if linear {
			pos = at(j)
		} else {
			for r := range rank {
				c := at(j*rank + r)
				if c < 0 || c >= dims[r] {
					pos = -1
					break
				}
				pos = pos*dims[r] + c
			}
		}
		if pos < 0 || pos >= total {
			return nil, fmt.Errorf("sparse tensor %q: index of value %d lies outside shape %v", name, j, dims)
		}
		copy(out.Data[pos*size:(pos+1)*size], vals.Data[j*size:(j+1)*size])
	}
	return out, nil
}

// sourceNames is the set of names g defines without a node: its inputs, its
// initializers (dense and sparse) and "", the absent optional input.
func sourceNames(g *GraphProto) map[string]bool {
	defined := map[string]bool{"": true}
	for _, vi := range g.GetInput() {
		defined[vi.GetName()] = true
	}
	for _, t := range g.GetInitializer() {
		defined[t.GetName()] = true
	}
	for _, s := range g.GetSparseInitializer() {
		defined[s.GetValues().GetName()] = true
	}
	return defined
}
