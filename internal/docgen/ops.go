package docgen

import (
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"

	"fp16audit/internal/onnx/ops"
)

// packageDoc reads the doc of the package in dir (relative to the
// module's root, where docgen runs), its tests left out.
func packageDoc(dir string) (*doc.Package, error) {
	fset := token.NewFileSet()
	names, err := filepath.Glob(dir + "/*.go")
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return doc.NewFromFiles(fset, files, "fp16audit/"+dir, doc.PreserveAST)
}

// constNames reads the names and doc comments of the constants of each
// named type in internal/onnx/ops's source, in declaration order (the
// order iota numbers them).
func constNames() (map[string][][2]string, error) {
	p, err := packageDoc("internal/onnx/ops")
	if err != nil {
		return nil, err
	}
	out := map[string][][2]string{}
	for _, t := range p.Types {
		for _, g := range t.Consts {
			for _, spec := range g.Decl.Specs {
				vs := spec.(*ast.ValueSpec)
				text := strings.Join(strings.Fields(vs.Doc.Text()), " ")
				for _, n := range vs.Names {
					out[t.Name] = append(out[t.Name], [2]string{n.Name, text})
				}
			}
		}
	}
	return out, nil
}

// opsPage writes the operator registry: every entry of internal/onnx/ops
// with its autocast list, output types, rules and roles.
func opsPage(files Files) error {
	consts, err := constNames()
	if err != nil {
		return err
	}
	name := func(typ string, i int) string {
		if l := consts[typ]; i >= 0 && i < len(l) {
			return l[i][0]
		}
		return fmt.Sprintf("%s(%d)", typ, i)
	}
	autocast := map[string]string{"Follow": "follows inputs", "Lower": "**fp16**", "FP32": "fp32", "Promote": "promote"}
	var b strings.Builder
	all := ops.All()
	b.WriteString("# Operator registry\n\n")
	fmt.Fprintf(&b, "What fp16audit knows about each of the %d ONNX operators it has an entry for (`internal/onnx/ops`, one entry per op in the file of its family). "+
		"Every stage asks this registry instead of keeping lists of its own; an op without an entry is reported by FP4002 (ops of unknown precision) "+
		"and the backward audit stops at an op without a gradient rule (FP6009). "+
		"To add an operator, see [Architecture](../architecture.md#where-new-things-go).\n\n", len(all))
	b.WriteString("## Legend\n\n**Autocast list** (PyTorch's CUDA autocast, per the op's aten counterpart):\n\n")
	for _, c := range consts["Autocast"] {
		fmt.Fprintf(&b, "- `%s` (%s): %s\n", c[0], autocast[c[0]], strings.TrimPrefix(c[1], c[0]+": "))
	}
	b.WriteString("\n**Output type**:\n\n")
	for _, c := range consts["Type"] {
		fmt.Fprintf(&b, "- `%s`: %s\n", c[0], strings.TrimPrefix(c[1], c[0]+": "))
	}
	b.WriteString("\n**Roles** (what the analyses that follow a value read):\n\n")
	for _, c := range consts["Role"] {
		if c[1] != "" {
			fmt.Fprintf(&b, "- `%s`: %s\n", c[0], c[1])
		} else {
			fmt.Fprintf(&b, "- `%s`: as above\n", c[0])
		}
	}
	b.WriteString("\nThe shape rule is what `internal/onnx/shapes` applies (none: the memory plan asks ONNX Runtime); " +
		"the gradient rule what `internal/grad/vjp` emits (`-`: no gradient flows; none: the backward audit stops there). " +
		"Flags: `random` draws random numbers, `epsilon` has an epsilon attribute, `subgraphs` runs graphs of its own, " +
		"`data-shaped` has outputs shaped by input values, `half: fp16` computes in fp16 under `model.half()` whatever it is fed, " +
		"`half: fp32` stays fp32 under fastai's `model.half()`, `chooses` is a data-dependent selection, `gathers` reads at chosen indices, " +
		"`fill` is what a PyTorch fill exports as, `holds` says what its outputs are when they are not tensors (sequences, optionals, maps; " +
		"`input`: what its first input is; `element`: what is inside its first input), which are never rounded, cast or observed themselves.\n\n")
	b.WriteString("## Operators\n\n| op | domain | autocast | output type | shape rule | gradient rule | roles | flags |\n|---|---|---|---|---|---|---|---|\n")
	for _, o := range all {
		dom := o.Domain
		if dom == "" {
			dom = "ai.onnx"
		}
		var roles []string
		for i := range consts["Role"] {
			if o.Role&(1<<i) != 0 {
				roles = append(roles, name("Role", i))
			}
		}
		var flags []string
		for _, f := range []struct {
			on   bool
			name string
		}{{o.Random, "random"}, {o.Epsilon, "epsilon"}, {o.Subgraphs, "subgraphs"}, {o.DataShaped, "data-shaped"},
			{o.HalfWeights, "half: fp16"}, {o.HalfFP32, "half: fp32"}, {o.Chooses != nil, "chooses"}, {o.GathersAt != 0, "gathers"},
			{o.NonFloat, "non-float"}, {o.FloatFactory, "float factory"}} {
			if f.on {
				flags = append(flags, f.name)
			}
		}
		if o.Fill != "" {
			flags = append(flags, "fill: "+o.Fill)
		}
		if o.Holds != ops.HoldsTensors {
			flags = append(flags, "holds: "+strings.ToLower(strings.TrimPrefix(name("Holds", int(o.Holds)), "Holds")))
		}
		typ := name("Type", int(o.Type))
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", o.Name, dom, autocast[name("Autocast", int(o.Autocast))],
			strings.TrimPrefix(typ, "Type"), cell(orDash(o.Shape, "none")), cell(orDash(o.Grad, "none")), strings.Join(roles, ", "), cell(strings.Join(flags, ", ")))
	}
	files[Dir+"/ops.md"] = []byte(b.String())
	return nil
}

// orDash is s, or none when s is empty.
func orDash(s, none string) string {
	if s == "" {
		return none
	}
	return s
}
