package onnx

import (
	"regexp"
	"strings"
)

// fxNodeKey is the metadata entry in which the dynamo exporter records the
// FX node (torch.export's graph) a node was translated from:
//
//	%sqrt : [num_users=1] = call_function[target=torch.ops.aten.sqrt.default](args = (%add_24,), kwargs = {})
const fxNodeKey = "pkg.torch.onnx.fx_node"

// FXNode is the FX node a dynamo export's node came from: its name
// ("sqrt", without the %), its target ("torch.ops.aten.sqrt.default") and
// its positional arguments as written ("%add_24" for another FX node's
// value, "2" or "[-1]" for a literal).
type FXNode struct {
	Name, Target string
	Args         []string
}

var fxRecord = regexp.MustCompile(`^%(\S+) : .*?= call_function\[target=([^\]]+)\]\(args = \((.*)\), kwargs = `)

// FXRecord returns the FX node n was translated from, and whether n
// carries one (nodes of other exporters do not).
func FXRecord(n *NodeProto) (FXNode, bool) {
	for _, e := range n.GetMetadataProps() {
		if e.GetKey() != fxNodeKey {
			continue
		}
		m := fxRecord.FindStringSubmatch(e.GetValue())
		if m == nil {
			return FXNode{}, false
		}
		return FXNode{Name: m[1], Target: m[2], Args: splitArgs(m[3])}, true
	}
	return FXNode{}, false
}

// splitArgs splits an FX argument tuple's text at its top-level commas.
func splitArgs(s string) []string {
	var out []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(', '[', '{':
			depth++
		case ')', ']', '}':
			depth--
		case ',':
			if depth == 0 {
				if a := strings.TrimSpace(s[start:i]); a != "" {
					out = append(out, a)
				}
				start = i + 1
			}
		}
	}
	if a := strings.TrimSpace(s[start:]); a != "" {
		out = append(out, a)
	}
	return out
}

// DroppedAdd is a square root whose PyTorch op read a sum the export no
// longer computes: torch.onnx.export's optimizer (onnxscript, measured with
// torch 2.9.1) folds x + c into x when c is so small that the sum rounds to
// x in float32 for most x (an epsilon of 1e-8 or less: BERT's sqrt(var +
// 1e-12) is exported as sqrt(var)), which changes the value only where x
// is 0, the row of a zero pad embedding.
type DroppedAdd struct {
	// Name is the Sqrt's name in reports (NodeName), Module its module
	// path; Radicand the value it reads in the export.
	Name, Module, Radicand string
	// FXArg is the sum its FX node read ("add_24"); Source the line of
	// Python it came from ("" where not recorded).
	FXArg, Source string
}

// DroppedAdds returns the square roots of a dynamo export whose FX node
// (torch.sqrt or torch.rsqrt) read an aten.add's output (FX names those
// "add", "add_1" …) while the export feeds them a value no Add computes:
// the addition was folded away. Empty for other exporters' graphs.
func DroppedAdds(g *GraphProto, ix *Index) []DroppedAdd {
	var out []DroppedAdd
	for i, n := range g.GetNode() {
		if n.GetOpType() != "Sqrt" || !IsDefaultDomain(n.GetDomain()) || len(n.GetInput()) != 1 {
			continue
		}
		fx, ok := FXRecord(n)
		if !ok || len(fx.Args) == 0 || (fx.Target != "torch.ops.aten.sqrt.default" && fx.Target != "torch.ops.aten.rsqrt.default") {
			continue
		}
		arg, ok := strings.CutPrefix(fx.Args[0], "%")
		if !ok || !isFXAddName(arg) {
			continue
		}
		p := ix.Producer(n.GetInput()[0])
		if p < 0 {
			continue
		}
		pn := g.GetNode()[p]
		if pn.GetOpType() == "Add" || pn.GetOpType() == "Sum" {
			continue // the sum is there (merged with an equal one, perhaps)
		}
		if pfx, ok := FXRecord(pn); !ok || pfx.Name == arg {
			continue
		}
		out = append(out, DroppedAdd{Name: nodeName(n, i), Module: ModulePath(n), Radicand: n.GetInput()[0], FXArg: arg, Source: SourceLine(n)})
	}
	return out
}

// isFXAddName reports whether an FX node name is one torch.export gives
// an aten.add: "add" or "add_<n>".
func isFXAddName(s string) bool {
	rest, ok := strings.CutPrefix(s, "add")
	if !ok {
		return false
	}
	if rest == "" {
		return true
	}
	digits, ok := strings.CutPrefix(rest, "_")
	if !ok || digits == "" {
		return false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// ScopeMetadata returns copies of the entries of n's metadata that place
// it in the PyTorch model (module stack, class hierarchy, source line),
// for a node fp16audit adds beside it: it is then reported in n's module.
// The FX record is left out: the new node was not translated from it.
func ScopeMetadata(n *NodeProto) []*StringStringEntryProto {
	var out []*StringStringEntryProto
	for _, e := range n.GetMetadataProps() {
		switch e.GetKey() {
		case nameScopesKey, classHierarchyKey, stackTraceKey:
			out = append(out, &StringStringEntryProto{Key: e.GetKey(), Value: e.GetValue()})
		}
	}
	return out
}
