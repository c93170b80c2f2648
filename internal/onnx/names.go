package onnx

import (
	"fmt"
	"regexp"
	"strings"

	"fp16audit/internal/onnx/ops"
)

// Metadata keys the dynamo exporter (torch.onnx.export(dynamo=True)) writes
// on every node.
const (
	nameScopesKey     = "pkg.torch.onnx.name_scopes"
	classHierarchyKey = "pkg.torch.onnx.class_hierarchy"
	stackTraceKey     = "pkg.torch.onnx.stack_trace"
)

// ModulePath returns the PyTorch module a node was exported from, as the
// dotted path a user writes in model.get_submodule ("layer1.0.conv1"), or ""
// for the model itself and for nodes whose origin is unknown.
//
// The dynamo exporter records the module stack in the metadata entry
// pkg.torch.onnx.name_scopes, a Python list literal such as
//
//	['', 'layer1', 'layer1.0', 'layer1.0.conv1', 'convolution']
//
// that holds the qualified names of the enclosing modules followed by the
// FX node's own name. The last module entry is the path. The node's own
// name is recognized because pkg.torch.onnx.class_hierarchy, of the same
// length, ends with an op target ("aten.convolution.default"), or, without
// that entry, because it does not extend the module path before it; lists
// written without the node's name are read as they are. Double-quoted
// (JSON-style) lists are read too.
//
// The TorchScript exporter names nodes "/layer1/layer1.0/conv1/Conv": the
// module scopes joined by "/", then the op type. A scope that starts with
// the previous scope plus "." replaces that scope (a Sequential or
// ModuleList child is named "parent.index": /layer2/layer2.0/downsample/
// downsample.0/Conv is layer2.0.downsample.0), any other scope is appended
// with ".". A name without a leading "/" carries no scope.
func ModulePath(n *NodeProto) string {
	scopes, classes := torchScopes(n)
	if scopes != "" {
		if m := fusedConvModule(n, parseList(classes)); m != "" {
			return m
		}
		return pathFromScopes(parseList(scopes), parseList(classes))
	}
	return pathFromName(n.Name)
}

// ModuleClass returns the class of the PyTorch module ModulePath names,
// as the dynamo exporter records it in pkg.torch.onnx.class_hierarchy
// (its qualified name: "transformers.models.llama.modeling_llama.
// LlamaRMSNorm"), or "" where the node carries no class hierarchy (a
// TorchScript export) or belongs to the model itself.
func ModuleClass(n *NodeProto) string {
	scopes, classes := torchScopes(n)
	cs := parseList(classes)
	if scopes == "" || len(cs) == 0 {
		return ""
	}
	ss := parseList(scopes)
	if len(ss) != len(cs) {
		return ""
	}
	k := len(cs) - 1
	if isOpTarget(cs[k]) {
		k--
	}
	if k < 1 {
		return "" // the root module: the model itself
	}
	return cs[k]
}

// ClassMentions reports whether n's recorded class hierarchy mentions
// part anywhere, without reading it: a cheap test before ModuleClass.
func ClassMentions(n *NodeProto, part string) bool {
	_, classes := torchScopes(n)
	return strings.Contains(classes, part)
}

// SourceLine returns the line of Python the dynamo exporter recorded the
// node as coming from: the last line of its pkg.torch.onnx.stack_trace
// (the innermost frame's code, such as "variance =
// h.to(torch.float32).pow(2).mean(-1, keepdim=True)"), trimmed; "" where
// the node carries no stack trace.
func SourceLine(n *NodeProto) string {
	for _, e := range n.MetadataProps {
		if e.Key != stackTraceKey {
			continue
		}
		lines := strings.Split(strings.TrimRight(e.Value, " \n"), "\n")
		return strings.TrimSpace(lines[len(lines)-1])
	}
	return ""
}

// asksDtype is torch.finfo called on a tensor's dtype, as a dtype-aware
// mask fill writes it: torch.finfo(scores.dtype), finfo(x[0].dtype).
var asksDtype = regexp.MustCompile(`finfo\(\s*[A-Za-z_][\w.\[\]]*\.dtype\s*\)`)

// SourceAsksDtype reports whether the line of Python n comes from (its
// dynamo stack trace's innermost frame, SourceLine) calls torch.finfo on
// a tensor's dtype: scores.masked_fill(mask, torch.finfo(scores.dtype).min)
// exports from an fp32 trace as float32's lowest value, indistinguishable
// in the graph from a hard-coded torch.finfo(torch.float32).min, but its
// line tells them apart. False where the node carries no stack trace (the
// TorchScript exporter's, a dynamo export converted to an older opset) or
// the line computes the number elsewhere.
func SourceAsksDtype(n *NodeProto) bool { return asksDtype.MatchString(SourceLine(n)) }

// SourceLines returns every line of Python in the dynamo exporter's stack
// trace of n, outermost call first: the model's own lines (where a module
// is called, with the arguments it is given) come before the library's.
func SourceLines(n *NodeProto) []string {
	var out []string
	for _, e := range n.MetadataProps {
		if e.Key != stackTraceKey {
			continue
		}
		for _, l := range strings.Split(e.Value, "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "File ") {
				out = append(out, l)
			}
		}
	}
	return out
}

// torchScopes returns the dynamo exporter's module stack and class
// hierarchy entries of n ("" where absent).
func torchScopes(n *NodeProto) (scopes, classes string) {
	for _, e := range n.MetadataProps {
		switch e.Key {
		case nameScopesKey:
			scopes = e.Value
		case classHierarchyKey:
			classes = e.Value
		}
	}
	return scopes, classes
}

// fusedConvModule is the layer's module of a Conv, ConvTranspose or Gemm
// into which the dynamo exporter's optimizer folded the BatchNorm after it
// (FusedBatchNorm). "" for any other node.
func fusedConvModule(n *NodeProto, classes []string) string {
	if !isFusable(n) || len(n.Input) < 2 {
		return ""
	}
	bn := false
	for _, c := range classes {
		bn = bn || strings.Contains(c, "batchnorm.BatchNorm")
	}
	if w, ok := strings.CutSuffix(n.Input[1], ".weight"); ok && bn && w != "" {
		return w
	}
	return ""
}

// isFusable reports whether n is a layer with a bias input (Conv,
// ConvTranspose, Gemm: ops.Op.BiasInput), into which the dynamo
// exporter's optimizer folds a BatchNorm after it.
func isFusable(n *NodeProto) bool {
	if !IsDefaultDomain(n.Domain) {
		return false
	}
	o := ops.Lookup(ops.Default, n.OpType)
	return o != nil && o.BiasInput > 0
}

// FusedBatchNorm reports whether n is a Conv, ConvTranspose or Gemm into
// which the dynamo exporter's optimizer folded the BatchNorm after it, and
// returns the BatchNorm's module and the layer's. The node carries the
// BatchNorm's metadata (its module stack ends at BatchNorm1d/2d) but
// computes the layer, and keeps the layer's weight, named "<layer
// module>.weight". torch 2.9.1 folds it even for a model exported in
// train() mode, whose BatchNorm normalizes with the batch's statistics:
// the export then computes the eval-mode forward.
func FusedBatchNorm(n *NodeProto) (bn, layer string, ok bool) {
	scopes, classes := torchScopes(n)
	if scopes == "" {
		return "", "", false
	}
	layer = fusedConvModule(n, parseList(classes))
	if layer == "" {
		return "", "", false
	}
	return pathFromScopes(parseList(scopes), parseList(classes)), layer, true
}

// foldedName matches the names the TorchScript exporter gives the weight
// and bias it computes by folding a BatchNorm into the Conv before it
// (torch 1.13 and 2.15, in eval mode, whatever do_constant_folding says).
var foldedName = regexp.MustCompile(`^onnx::Conv_\d+$`)

// FoldedByName reports whether Conv node n reads a weight and a bias the
// TorchScript exporter computed by folding the BatchNorm after it into
// the layer: initializers named onnx::Conv_<n> (the bias may come through
// an Identity, which the exporter adds where it deduplicates equal folded
// biases, the zeros of untrained layers). A sign, not a proof: any
// weight the exporter computes from others is named so.
func FoldedByName(n *NodeProto, ix *Index) bool {
	return n.OpType == "Conv" && IsDefaultDomain(n.Domain) && len(n.Input) >= 3 &&
		foldedName.MatchString(n.Input[1]) && foldedName.MatchString(n.Input[2]) && ix.IsInitializer(n.Input[1])
}

func pathFromScopes(scopes, classes []string) string {
	for i, s := range scopes {
		// torch 2.1-era strict export qualified the root module as L['self'].
		s = strings.TrimPrefix(s, "L['self']")
		scopes[i] = strings.TrimPrefix(s, ".")
	}
	if k := len(scopes) - 1; k >= 1 {
		if len(classes) == len(scopes) {
			if isOpTarget(classes[k]) {
				scopes = scopes[:k]
			}
		} else if prev := lastNonEmpty(scopes[:k]); prev != "" && !strings.HasPrefix(scopes[k], prev+".") {
			scopes = scopes[:k]
		}
	}
	return lastNonEmpty(scopes)
}

// isOpTarget reports whether a class_hierarchy entry is the str() of an FX
// node target rather than a module class.
func isOpTarget(s string) bool {
	for _, p := range []string{"aten.", "prims.", "torch.ops.", "<"} {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

func lastNonEmpty(list []string) string {
	for i := len(list) - 1; i >= 0; i-- {
		if list[i] != "" {
			return list[i]
		}
	}
	return ""
}

// parseList reads a Python or JSON list of strings, quoted with ' or ".
// Unquoted items are taken as they stand, trimmed.
func parseList(s string) []string {
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(s, "[")
	s = strings.TrimSuffix(s, "]")
	var items []string
	for i := 0; i < len(s); {
		switch c := s[i]; {
		case c == ' ' || c == ',' || c == '\t' || c == '\n':
			i++
		case c == '\'' || c == '"':
			var b strings.Builder
			i++
			for i < len(s) && s[i] != c {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				b.WriteByte(s[i])
				i++
			}
			i++ // closing quote
			items = append(items, b.String())
		default:
			j := strings.IndexByte(s[i:], ',')
			if j < 0 {
				j = len(s) - i
			}
			items = append(items, strings.TrimSpace(s[i:i+j]))
			i += j
		}
	}
	return items
}

func pathFromName(name string) string {
	if !strings.HasPrefix(name, "/") {
		return ""
	}
	parts := strings.Split(name[1:], "/")
	var path []string
	for _, seg := range parts[:len(parts)-1] {
		switch {
		case seg == "":
		case len(path) > 0 && strings.HasPrefix(seg, path[len(path)-1]+"."):
			// A container's child ("layer1.0" under "layer1", "downsample.0"
			// under "downsample") carries its parent's attribute name.
			path[len(path)-1] = seg
		default:
			path = append(path, seg)
		}
	}
	return strings.Join(path, ".")
}

// NodeName is how fp16audit names node i of g in reports: its ONNX name, or
// op_type#i when the exporter left it unnamed.
func NodeName(g *GraphProto, i int) string { return nodeName(g.GetNode()[i], i) }

func nodeName(n *NodeProto, i int) string {
	if n.GetName() != "" {
		return n.GetName()
	}
	return fmt.Sprintf("%s#%d", n.GetOpType(), i)
}

// inputSpecKind is the metadata key torch's dynamo exporter gives the
// value info of every initializer it lifted from the module: PARAMETER,
// BUFFER or CONSTANT_TENSOR (torch.export's graph signature).
const inputSpecKind = "pkg.torch.export.graph_signature.InputSpec.kind"

// TorchParameters returns the kind torch's dynamo exporter marks each
// lifted initializer of g with ("PARAMETER" for an nn.Parameter, "BUFFER"
// for a registered buffer such as BatchNorm's running statistics or
// RoPE's inv_freq, "CONSTANT_TENSOR"), and whether g carries those marks
// at all. Without them (TorchScript exports, other producers) every float
// initializer may be a parameter. With them, a parameter the exporter kept
// as it was is marked; one it folded into a new initializer (a Linear's
// weight transposed for its MatMul) is not, and neither are the constants
// it lifted (a Pow's exponent, an epsilon).
func TorchParameters(g *GraphProto) (kinds map[string]string, marked bool) {
	kinds = map[string]string{}
	for _, vi := range g.GetValueInfo() {
		for _, p := range vi.GetMetadataProps() {
			if p.GetKey() == inputSpecKind {
				marked = true
				kinds[vi.GetName()] = p.GetValue()
			}
		}
	}
	return kinds, marked
}

// FromDynamo reports whether g was written by the dynamo exporter
// (torch.onnx.export(dynamo=True), torch 2.x's default): its nodes carry
// the module stack in pkg.torch.onnx.name_scopes.
func FromDynamo(g *GraphProto) bool {
	for _, n := range g.GetNode() {
		for _, e := range n.MetadataProps {
			if e.Key == nameScopesKey {
				return true
			}
		}
	}
	return false
}
