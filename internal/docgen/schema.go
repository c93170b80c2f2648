package docgen

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"go/ast"
	"reflect"
	"sort"
	"strings"

	"fp16audit/report"
)

// A document is one kind of JSON document fp16audit writes.
type document struct {
	// Name is the schema file's stem, Command the command that writes
	// the document, Version its schema version string.
	Name, Command, Version string
	Type                   reflect.Type
}

// documents are the types of package report that implement
// report.Document, and the training audit, which has a version of its
// own inside the audit's document; TestDocuments holds this list to the
// package's source.
var documents = []document{
	{"report", "fp16audit run", report.ReportSchema, reflect.TypeFor[report.Report]()},
	{"training", "fp16audit run --mode train (the report's \"training\" field)", report.TrainingSchema, reflect.TypeFor[report.TrainingReport]()},
	{"lint", "fp16audit lint", report.LintSchema, reflect.TypeFor[report.LintReport]()},
	{"scales", "fp16audit scales", report.ScalesSchema, reflect.TypeFor[report.ScalesReport]()},
	{"replay", "fp16audit replay", report.ReplaySchema, reflect.TypeFor[report.ReplayReport]()},
}

// fieldDocs reads the doc comments of the struct fields and types of
// packages report and checks: by "Type.Field", and by "Type".
func fieldDocs() (map[string]string, error) {
	out := map[string]string{}
	for _, dir := range []string{"report", "checks"} {
		p, err := packageDoc(dir)
		if err != nil {
			return nil, err
		}
		for _, t := range p.Types {
			out[t.Name] = flat(t.Doc)
			for _, spec := range t.Decl.Specs {
				st, ok := spec.(*ast.TypeSpec).Type.(*ast.StructType)
				if !ok {
					continue
				}
				for _, f := range st.Fields.List {
					text := f.Doc.Text()
					if text == "" {
						text = f.Comment.Text()
					}
					for _, n := range f.Names {
						out[t.Name+"."+n.Name] = flat(text)
					}
				}
			}
		}
	}
	return out, nil
}

// flat joins a comment's lines into one.
func flat(s string) string { return strings.Join(strings.Fields(s), " ") }

// schemaGen builds JSON Schemas (draft 2020-12) from Go types as
// encoding/json and package report's non-finite floats write them.
type schemaGen struct {
	docs map[string]string
	defs map[string]any
}

var textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()

// float is how every document writes a float: a number, or one of the
// strings of NaN and ±Inf (report.NonFinite*).
var float = map[string]any{"oneOf": []any{
	map[string]any{"type": "number"},
	map[string]any{"enum": []any{report.NonFiniteNaN, report.NonFinitePosInf, report.NonFiniteNegInf}},
}}

func (g *schemaGen) of(t reflect.Type) any {
	if t.Implements(textMarshaler) || reflect.PointerTo(t).Implements(textMarshaler) {
		return map[string]any{"type": "string"}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return map[string]any{"anyOf": []any{g.of(t.Elem()), map[string]any{"type": "null"}}}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"$ref": "#/$defs/float"}
	case reflect.Slice, reflect.Array:
		return map[string]any{"type": []any{"array", "null"}, "items": g.of(t.Elem())}
	case reflect.Map:
		return map[string]any{"type": []any{"object", "null"}, "additionalProperties": g.of(t.Elem())}
	case reflect.Interface:
		return map[string]any{}
	case reflect.Struct:
		name := t.Name()
		if _, ok := g.defs[name]; !ok {
			g.defs[name] = nil // a recursive type refers to itself
			g.defs[name] = g.object(t)
		}
		return map[string]any{"$ref": "#/$defs/" + name}
	}
	panic(fmt.Sprintf("docgen: no JSON schema for %s", t))
}

// object is a struct's schema: its JSON fields, those without omitempty
// required, each with its Go doc comment.
func (g *schemaGen) object(t reflect.Type) map[string]any {
	props := map[string]any{}
	var required []string
	var add func(t reflect.Type)
	add = func(t reflect.Type) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
				add(f.Type)
				continue
			}
			if name == "" {
				name = f.Name
			}
			s := g.of(f.Type)
			if m, ok := s.(map[string]any); ok {
				if d := g.docs[t.Name()+"."+f.Name]; d != "" {
					m = cloneMap(m)
					m["description"] = d
					s = m
				}
			}
			props[name] = s
			if !strings.Contains(opts, "omitempty") {
				required = append(required, name)
			}
		}
	}
	add(t)
	sort.Strings(required)
	o := map[string]any{"type": "object", "properties": props, "required": required}
	if d := g.docs[t.Name()]; d != "" {
		o["description"] = d
	}
	return o
}

func cloneMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// schemaOf is the JSON Schema of one document.
func schemaOf(d document, docs map[string]string) ([]byte, error) {
	g := &schemaGen{docs: docs, defs: map[string]any{"float": float}}
	root := g.object(d.Type)
	props := root["properties"].(map[string]any)
	if s, ok := props["schema"].(map[string]any); ok {
		s = cloneMap(s)
		s["description"] = fmt.Sprintf("The schema version; this page describes %s. A version changes only when a field is removed or changes meaning; new fields may appear within a version.", d.Version)
		props["schema"] = s
	}
	root["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	root["title"] = fmt.Sprintf("%s (%s)", d.Version, d.Command)
	root["$defs"] = g.defs
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(root); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// schemaPages writes each document's JSON Schema and a page that shows it.
func schemaPages(files Files) error {
	docs, err := fieldDocs()
	if err != nil {
		return err
	}
	var ix strings.Builder
	ix.WriteString("# JSON documents\n\n")
	ix.WriteString("`--format json` writes one of these documents; `fp16audit render` reads them back. " +
		"Each names its schema version in its `schema` field. NaN and ±Inf, which JSON lacks, are written as the strings " +
		"`\"" + report.NonFiniteNaN + "\"`, `\"" + report.NonFinitePosInf + "\"` and `\"" + report.NonFiniteNegInf + "\"` in any float field. " +
		"The schemas below are generated from the Go types of package `report` (a Go program can decode a document into them), " +
		"their descriptions from the types' doc comments.\n\n| document | written by | schema version | JSON Schema |\n|---|---|---|---|\n")
	for _, d := range documents {
		s, err := schemaOf(d, docs)
		if err != nil {
			return err
		}
		file := Dir + "/schemas/" + d.Name + ".schema.json"
		page := Dir + "/schemas/" + d.Name + ".md"
		files[file] = s
		fmt.Fprintf(&ix, "| [%s](%s) | `%s` | `%s` | [%s](%s) |\n", d.Name, rel(Dir+"/schemas/index.md", page), d.Command, d.Version,
			d.Name+".schema.json", rel(Dir+"/schemas/index.md", file))
		var b strings.Builder
		fmt.Fprintf(&b, "# %s document (`%s`)\n\nWritten by `%s --format json`. [Download the JSON Schema](%s).\n\n", d.Name, d.Version, d.Command, d.Name+".schema.json")
		fmt.Fprintf(&b, "## Fields of `%s`\n\n%s\n", d.Type.Name(), fieldTable(d.Type, docs))
		b.WriteString("\n## The schema\n\n")
		b.WriteString(fence("json", string(s)))
		files[page] = []byte(b.String())
	}
	files[Dir+"/schemas/index.md"] = []byte(ix.String())
	return nil
}

// fieldTable lists the top-level fields of a document with their docs.
func fieldTable(t reflect.Type, docs map[string]string) string {
	var b strings.Builder
	b.WriteString("| field | type | description |\n|---|---|---|\n")
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		ft := strings.ReplaceAll(f.Type.String(), "report.", "")
		fmt.Fprintf(&b, "| `%s` | `%s` | %s |\n", name, cell(ft), cell(docs[t.Name()+"."+f.Name]))
	}
	return b.String()
}
