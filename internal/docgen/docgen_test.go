package docgen

import (
	"bytes"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"fp16audit/internal/onnxrt"
)

var update = flag.Bool("update", false, "rewrite the generated pages under docs/reference/")

// toRoot makes the repository root the test's working directory.
func toRoot(t *testing.T) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(root)
}

// TestGenerated generates every reference page and compares it with the
// committed one: a check, verdict, command, flag, field or operator that
// changed without `make docs-gen` fails here, and so does a page left
// under docs/reference/ that nothing generates. With -update it writes
// the pages and removes the stale ones. It also holds the JSON schemas to
// the real reports the verdict pages show: every key of those documents
// is a property the schema declares where it occurs.
func TestGenerated(t *testing.T) {
	if _, err := onnxrt.FindLibrary(""); err != nil && os.Getenv("CI") == "" {
		t.Skipf("ONNX Runtime is not installed (make ort); CI requires it: %v", err)
	}
	toRoot(t)
	files, examples, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	schemaHolds(t, examples)
	var committed []string
	err = filepath.WalkDir(Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		committed = append(committed, filepath.ToSlash(p))
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if *update {
		for _, p := range committed {
			if _, ok := files[p]; !ok {
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, p := range files.Paths() {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, files[p], 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	for _, p := range committed {
		if _, ok := files[p]; !ok {
			t.Errorf("%s is not generated any more: remove it (make docs-gen)", p)
		}
	}
	for _, p := range files.Paths() {
		got, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("%s is missing: make docs-gen writes it", p)
			continue
		}
		if !bytes.Equal(got, files[p]) {
			t.Errorf("%s is stale: make docs-gen rewrites it from the code (first difference at line %d)", p, firstDiff(got, files[p]))
		}
	}
}

// firstDiff is the 1-based line where a and b first differ.
func firstDiff(a, b []byte) int {
	la, lb := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return i + 1
		}
	}
	return min(len(la), len(lb)) + 1
}

// TestDocuments: every type of package report with a Kind method (a
// report.Document) has its schema in documents.
func TestDocuments(t *testing.T) {
	toRoot(t)
	names, err := filepath.Glob("report/*.go")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), n, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Name.Name != "Kind" || fd.Recv == nil {
				continue
			}
			recv := fd.Recv.List[0].Type
			if s, ok := recv.(*ast.StarExpr); ok {
				recv = s.X
			}
			kinds = append(kinds, recv.(*ast.Ident).Name)
		}
	}
	if len(kinds) == 0 {
		t.Fatal("no report.Document found in report/")
	}
	var have []string
	for _, d := range documents {
		have = append(have, d.Type.Name())
	}
	for _, k := range kinds {
		if !slices.Contains(have, k) {
			t.Errorf("report.%s is a document without a JSON schema page: add it to documents", k)
		}
	}
}

// schemaHolds checks every key of the examples' documents against the
// schema of their kind.
func schemaHolds(t *testing.T, examples map[string]*example) {
	t.Helper()
	docs, err := fieldDocs()
	if err != nil {
		t.Fatal(err)
	}
	// the document each kind of verdict page shows
	kinds := map[string]string{"run": "report", "train": "report", "scales": "scales", "replay": "replay"}
	for page, e := range examples {
		command := strings.Split(strings.TrimPrefix(page, Dir+"/verdicts/"), "/")[0]
		i := slices.IndexFunc(documents, func(d document) bool { return d.Name == kinds[command] })
		if i < 0 {
			t.Fatalf("%s: no document for verdicts of %q", page, command)
		}
		d := documents[i]
		g := &schemaGen{docs: docs, defs: map[string]any{"float": float}}
		root := g.object(d.Type)
		checkKeys(t, page, "", e.JSON, root, g.defs)
	}
}

// checkKeys walks a decoded document beside its schema.
func checkKeys(t *testing.T, page, at string, v any, s any, defs map[string]any) {
	m, _ := s.(map[string]any)
	if ref, ok := m["$ref"].(string); ok {
		if ref == "#/$defs/float" {
			return
		}
		m, _ = defs[strings.TrimPrefix(ref, "#/$defs/")].(map[string]any)
	}
	if alts, ok := m["anyOf"].([]any); ok {
		m, _ = alts[0].(map[string]any)
		checkKeys(t, page, at, v, m, defs)
		return
	}
	switch v := v.(type) {
	case map[string]any:
		if props, ok := m["properties"].(map[string]any); ok {
			for k, x := range v {
				ps, ok := props[k]
				if !ok {
					t.Errorf("%s: %s.%s is in the report but not in the schema", page, at, k)
					continue
				}
				checkKeys(t, page, at+"."+k, x, ps, defs)
			}
		} else if ap, ok := m["additionalProperties"]; ok {
			for k, x := range v {
				checkKeys(t, page, at+"."+k, x, ap, defs)
			}
		}
	case []any:
		if items, ok := m["items"]; ok {
			for _, x := range v {
				checkKeys(t, page, at+"[]", x, items, defs)
			}
		}
	}
}
