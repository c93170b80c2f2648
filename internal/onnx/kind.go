package onnx

import (
	"slices"

	"google.golang.org/protobuf/proto"

	"fp16audit/internal/onnx/ops"
)

// Kind is what an ONNX value is: a tensor, or one of the containers ONNX
// has besides (sequences, maps, optionals), which carry tensors but are
// none. A container has no shape, cannot be cast or rounded, and holds
// no statistics of its own: the stages that act on values by type act on
// the tensors put into it and taken out of it.
type Kind uint8

const (
	// KindTensor: a tensor (dense or sparse); the zero value.
	KindTensor Kind = iota
	// KindSequence: a sequence of tensors.
	KindSequence
	// KindMap: a map, or a sequence of maps (ai.onnx.ml's ZipMap).
	KindMap
	// KindOptional: an optional tensor.
	KindOptional
	// KindOptionalSequence: an optional sequence.
	KindOptionalSequence
)

// String names the kind as ONNX's type strings do.
func (k Kind) String() string {
	switch k {
	case KindSequence:
		return "seq(tensor)"
	case KindMap:
		return "map"
	case KindOptional:
		return "optional(tensor)"
	case KindOptionalSequence:
		return "optional(seq(tensor))"
	}
	return "tensor"
}

// KindOf returns the kind a declared type describes; KindTensor for a
// tensor type and for no type at all.
func KindOf(t *TypeProto) Kind {
	switch {
	case t.GetSequenceType() != nil:
		if KindOf(t.GetSequenceType().GetElemType()) == KindMap {
			return KindMap
		}
		return KindSequence
	case t.GetMapType() != nil:
		return KindMap
	case t.GetOptionalType() != nil:
		switch KindOf(t.GetOptionalType().GetElemType()) {
		case KindTensor:
			return KindOptional
		case KindSequence:
			return KindOptionalSequence
		default:
			return KindMap
		}
	}
	return KindTensor
}

// containedElemType returns the element type of the tensors a container
// type holds (a map's values), 0 when not declared.
func containedElemType(t *TypeProto) int32 {
	switch {
	case t == nil:
		return 0
	case t.GetTensorType() != nil:
		return t.GetTensorType().GetElemType()
	case t.GetSparseTensorType() != nil:
		return t.GetSparseTensorType().GetElemType()
	case t.GetSequenceType() != nil:
		return containedElemType(t.GetSequenceType().GetElemType())
	case t.GetOptionalType() != nil:
		return containedElemType(t.GetOptionalType().GetElemType())
	case t.GetMapType() != nil:
		return containedElemType(t.GetMapType().GetValueType())
	}
	return 0
}

// Kinds returns the values of g that are not tensors, with their kinds:
// those g declares so (inputs, outputs, value_info), and the outputs of
// the nodes, visited in order (a topological order of g's nodes), that
// the op's entry in internal/onnx/ops (Holds) or, for If and Loop, the
// subgraph says are. Every value it leaves out is a tensor.
func Kinds(g *GraphProto, order []int) map[string]Kind {
	kinds := map[string]Kind{}
	for _, list := range [][]*ValueInfoProto{g.GetInput(), g.GetOutput(), g.GetValueInfo()} {
		for _, vi := range list {
			if k := KindOf(vi.GetType()); k != KindTensor && vi.GetName() != "" {
				kinds[vi.GetName()] = k
			}
		}
	}
	for _, i := range order {
		n := g.GetNode()[i]
		for k, out := range n.GetOutput() {
			if _, ok := kinds[out]; ok || out == "" {
				continue
			}
			if kd := nodeOutputKind(kinds, n, k); kd != KindTensor {
				kinds[out] = kd
			}
		}
	}
	return kinds
}

// nodeOutputKind returns the kind of output k of n from its op's entry
// in internal/onnx/ops (Holds) and its first input's kind; for If and
// Loop, from the declared outputs of the subgraph that makes it.
func nodeOutputKind(kinds map[string]Kind, n *NodeProto, k int) Kind {
	in := KindTensor
	if len(n.GetInput()) > 0 {
		in = kinds[n.GetInput()[0]]
	}
	o := ops.Lookup(n.GetDomain(), n.GetOpType())
	if o == nil {
		return KindTensor
	}
	if o.Subgraphs {
		return subgraphOutputKind(n, k)
	}
	switch o.Holds {
	case ops.HoldsSequences:
		return KindSequence
	case ops.HoldsOptionals:
		switch in {
		case KindSequence:
			return KindOptionalSequence
		case KindMap:
			return KindMap
		}
		return KindOptional
	case ops.HoldsMaps:
		return KindMap
	case ops.HoldsInput:
		return in
	case ops.HoldsElement:
		switch in {
		case KindOptionalSequence, KindSequence:
			return KindSequence
		case KindMap:
			return KindMap
		}
	}
	return KindTensor
}

// subgraphOutputKind is the kind of output k of a node running
// subgraphs, as its subgraph declares it: If's branches output what the
// node does; a Loop body's outputs after its condition are the node's
// outputs (its scan outputs stack tensors); Scan's outputs are tensors.
func subgraphOutputKind(n *NodeProto, k int) Kind {
	var g *GraphProto
	off := 0
	switch n.GetOpType() {
	case "If":
		g = FindAttr(n, "then_branch").GetG()
	case "Loop":
		g, off = FindAttr(n, "body").GetG(), 1
	default:
		return KindTensor
	}
	if g == nil || k+off >= len(g.GetOutput()) {
		return KindTensor
	}
	return KindOf(g.GetOutput()[k+off].GetType())
}

// Contents returns, for every container value of the indexed graph, the
// tensors it holds: the float tensors the node that made it took in (a
// SplitToSequence's input, a SequenceConstruct's, the tensor a
// SequenceInsert adds) and, for a container it took in, what that one
// holds, in input order. A container made from nothing (SequenceEmpty) or
// by a subgraph holds none the graph shows. The list may hold more than
// the container (a SequenceErase's erased tensor): a container counts as
// holding NaN/Inf where one of its tensors does.
func (ix *Index) Contents() map[string][]string {
	out := map[string][]string{}
	for _, i := range ix.order {
		n := ix.g.GetNode()[i]
		for _, o := range n.GetOutput() {
			if o == "" || ix.Tensor(o) {
				continue
			}
			var held []string
			add := func(vs ...string) {
				for _, v := range vs {
					if !slices.Contains(held, v) {
						held = append(held, v)
					}
				}
			}
			for _, in := range n.GetInput() {
				switch {
				case in == "":
				case !ix.Tensor(in):
					add(out[in]...)
				case IsFloatType(ix.ElemType(in)):
					add(in)
				}
			}
			out[o] = held
		}
	}
	return out
}

// HalfContainer reports whether vi declares a container (a sequence, an
// optional, a map) of FLOAT16 or BFLOAT16 tensors.
func HalfContainer(vi *ValueInfoProto) bool {
	return KindOf(vi.GetType()) != KindTensor && IsHalfType(containedElemType(vi.GetType()))
}

// WithContainedElemType returns vi, a container, declared with its tensors
// of element type elem; vi itself is not changed.
func WithContainedElemType(vi *ValueInfoProto, elem int32) *ValueInfoProto {
	out := proto.Clone(vi).(*ValueInfoProto)
	var set func(t *TypeProto)
	set = func(t *TypeProto) {
		switch {
		case t == nil:
		case t.GetTensorType() != nil:
			t.GetTensorType().ElemType = elem
		case t.GetSparseTensorType() != nil:
			t.GetSparseTensorType().ElemType = elem
		case t.GetSequenceType() != nil:
			set(t.GetSequenceType().GetElemType())
		case t.GetOptionalType() != nil:
			set(t.GetOptionalType().GetElemType())
		case t.GetMapType() != nil:
			set(t.GetMapType().GetValueType())
		}
	}
	set(out.GetType())
	return out
}
