package onnx

import (
	"fmt"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	"fp16audit/internal/onnx/ops"
)

// maxInlineDepth bounds how deep local functions may call each other: a
// function that calls itself, directly or not, is refused rather than
// expanded forever.
const maxInlineDepth = 32

// InlineFunctions expands every call of one of m's local functions
// (m.Functions: torch.onnx.export(export_modules_as_functions=...), or a
// hand-built model) into the function's nodes, in m's main graph, so that
// each op inside is placed by the policy, observed and differentiated as
// if it had been exported flat. The nodes of a call named "blk" are named
// "blk/<node>" and its internal values "blk/<value>"; a call the
// TorchScript exporter named after its module ("/blocks/blocks.1/Block")
// names them "/blocks/blocks.1/Block.<node>", so that they belong to that
// module (the function's own node names carry no module). The call's inputs and
// outputs keep their names. An attribute a function body reads from its
// caller (ref_attr_name) takes the call's value, or the function's
// default. It returns the names of the functions inlined (sorted, each
// once); m is changed in place and keeps its Functions (ONNX Runtime
// ignores the unused ones).
func InlineFunctions(m *ModelProto) ([]string, error) {
	if len(m.GetFunctions()) == 0 {
		return nil, nil
	}
	funcs := map[string]*FunctionProto{}
	for _, f := range m.Functions {
		funcs[functionKey(f.GetDomain(), f.GetName(), f.GetOverload())] = f
	}
	used := map[string]bool{}
	nodes, err := inlineNodes(m.Graph.GetNode(), funcs, used, 0)
	if err != nil {
		return nil, err
	}
	m.Graph.Node = nodes
	var names []string
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) > 0 {
		if err := mergeOpsets(m, funcs, used); err != nil {
			return nil, err
		}
	}
	return names, nil
}

func functionKey(domain, name, overload string) string {
	return domain + "\x00" + name + "\x00" + overload
}

// inlineNodes returns nodes with every call of a function in funcs
// replaced by the function's body, recursively (the body's nodes carry
// their call's name in theirs).
func inlineNodes(nodes []*NodeProto, funcs map[string]*FunctionProto, used map[string]bool, depth int) ([]*NodeProto, error) {
	var out []*NodeProto
	for i, n := range nodes {
		f, ok := funcs[functionKey(n.GetDomain(), n.GetOpType(), n.GetOverload())]
		if !ok {
			out = append(out, n)
			continue
		}
		if depth >= maxInlineDepth {
			return nil, fmt.Errorf("local function %s calls functions more than %d deep (a function that calls itself?); export the model without export_modules_as_functions", functionLabel(f), maxInlineDepth)
		}
		used[functionLabel(f)] = true
		call := n.GetName()
		if call == "" {
			call = fmt.Sprintf("%s_%d", n.GetOpType(), i)
		}
		body, err := expandCall(n, f, call)
		if err != nil {
			return nil, err
		}
		body, err = inlineNodes(body, funcs, used, depth+1)
		if err != nil {
			return nil, err
		}
		out = append(out, body...)
	}
	return out, nil
}

func functionLabel(f *FunctionProto) string {
	if f.GetDomain() == "" {
		return f.GetName()
	}
	return f.GetDomain() + "::" + f.GetName()
}

// expandCall returns f's body for the call n, its values renamed: f's
// inputs and outputs to the call's, the others prefixed with call.
func expandCall(n *NodeProto, f *FunctionProto, call string) ([]*NodeProto, error) {
	if len(n.GetInput()) > len(f.GetInput()) || len(n.GetOutput()) > len(f.GetOutput()) {
		return nil, fmt.Errorf("node %q calls local function %s with %d inputs and %d outputs; the function takes %d and gives %d",
			n.GetName(), functionLabel(f), len(n.GetInput()), len(n.GetOutput()), len(f.GetInput()), len(f.GetOutput()))
	}
	rename := map[string]string{}
	for k, v := range f.GetInput() {
		rename[v] = "" // an optional input the call leaves out
		if k < len(n.GetInput()) {
			rename[v] = n.GetInput()[k]
		}
	}
	for k, v := range f.GetOutput() {
		if k < len(n.GetOutput()) && n.GetOutput()[k] != "" {
			rename[v] = n.GetOutput()[k]
		} else {
			rename[v] = call + "/" + v // an output the call does not use
		}
	}
	name := func(v string) string {
		if v == "" {
			return ""
		}
		if r, ok := rename[v]; ok {
			return r
		}
		return call + "/" + v
	}
	given := map[string]*AttributeProto{}
	for _, a := range f.GetAttributeProto() {
		given[a.GetName()] = a
	}
	for _, a := range n.GetAttribute() {
		given[a.GetName()] = a
	}
	var out []*NodeProto
	for j, b := range f.GetNode() {
		c := CloneNode(b)
		inner := b.GetName()
		if inner == "" {
			inner = fmt.Sprintf("%s_%d", b.GetOpType(), j)
		}
		c.Name = innerName(call, inner)
		for k, v := range c.Input {
			c.Input[k] = name(v)
		}
		for k, v := range c.Output {
			c.Output[k] = name(v)
		}
		c.Name = layerName(c, call, inner, c.Name)
		c.Attribute = nil
		for _, a := range b.GetAttribute() {
			if ref := a.GetRefAttrName(); ref != "" {
				v, ok := given[ref]
				if !ok {
					continue // neither the call nor the function sets it: the op's default
				}
				cp := proto.Clone(v).(*AttributeProto)
				cp.Name, cp.RefAttrName = a.GetName(), ""
				c.Attribute = append(c.Attribute, cp)
				continue
			}
			if a.GetType() == AttributeProto_GRAPH || a.GetType() == AttributeProto_GRAPHS {
				return nil, fmt.Errorf("local function %s holds a subgraph (node %q): fp16audit cannot inline it; export the model without export_modules_as_functions", functionLabel(f), inner)
			}
			c.Attribute = append(c.Attribute, a)
		}
		if len(c.MetadataProps) == 0 {
			c.MetadataProps = n.GetMetadataProps()
		}
		out = append(out, c)
	}
	return out, nil
}

// mergeOpsets adds to m the opsets the inlined functions import and m
// does not; a domain both import at different versions cannot be inlined.
func mergeOpsets(m *ModelProto, funcs map[string]*FunctionProto, used map[string]bool) error {
	have := map[string]int64{}
	for _, o := range m.GetOpsetImport() {
		have[normDomain(o.GetDomain())] = o.GetVersion()
	}
	for _, f := range funcs {
		if !used[functionLabel(f)] {
			continue
		}
		for _, o := range f.GetOpsetImport() {
			d := normDomain(o.GetDomain())
			v, ok := have[d]
			switch {
			case !ok:
				m.OpsetImport = append(m.OpsetImport, &OperatorSetIdProto{Domain: o.GetDomain(), Version: o.GetVersion()})
				have[d] = o.GetVersion()
			case v != o.GetVersion():
				return fmt.Errorf("local function %s imports opset %s %d, the model %d: fp16audit cannot inline it; export the model without export_modules_as_functions", functionLabel(f), domainLabel(d), o.GetVersion(), v)
			}
		}
	}
	return nil
}

func normDomain(d string) string {
	if d == "ai.onnx" {
		return ""
	}
	return d
}

func domainLabel(d string) string {
	if d == "" {
		return "ai.onnx"
	}
	return strings.TrimSpace(d)
}

// innerName names node inner of the call named call.
func innerName(call, inner string) string {
	if i := strings.LastIndex(call, "/"); strings.HasPrefix(call, "/") && i > 0 && i < len(call)-1 {
		return call + "." + inner
	}
	return call + "/" + inner
}

// layerName is the name of an inlined layer (ops.Linear: MatMul, Gemm,
// Conv, ConvTranspose) whose weight is a parameter of a module inside the
// call's ("blocks.1.fc2.weight" in a call of blocks.1): "/blocks/blocks.1/
// fc2/Block.<node>", so that the layer takes its own module path, as
// exported flat, where a TorchScript function's body names none. Other
// nodes keep name.
func layerName(n *NodeProto, call, inner, name string) string {
	i := strings.LastIndex(call, "/")
	if !strings.HasPrefix(call, "/") || i <= 0 || len(n.GetInput()) < 2 {
		return name
	}
	if !ops.Lookup(ops.Default, n.GetOpType()).Is(ops.Linear) {
		return name
	}
	w, ok := strings.CutSuffix(n.GetInput()[1], ".weight")
	mod := pathFromName(call)
	if !ok || mod == "" || !strings.HasPrefix(w, mod+".") {
		return name
	}
	rel := strings.Split(strings.TrimPrefix(w, mod+"."), ".")
	return call[:i] + "/" + strings.Join(rel, "/") + "/" + call[i+1:] + "." + inner
}
