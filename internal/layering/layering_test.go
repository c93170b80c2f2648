package layering

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// module is the module path of go.mod; a package's import path is the
// module path and its folder.
const module = "fp16audit"

// testStage is the stage of the packages only tests import.
const testStage = "test"

// root returns the repository root: the folder above this package's
// holding go.mod.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("repository root %s: %v", dir, err)
	}
	return dir
}

// doc is what the test reads from docs/architecture.md.
type doc struct {
	// stage maps each package (import path) of the stage table to its
	// stage.
	stage map[string]string
	// imports maps each stage to the stages its packages may import
	// besides their own; all is set for "every stage".
	imports map[string][]string
	all     map[string]bool
	// only maps what few packages may do (`import "C"`, an import path, a
	// call pkg.Func) to the packages allowed it.
	only map[string][]string
}

// backticked finds the code spans of a Markdown table cell.
var backticked = regexp.MustCompile("`([^`]+)`")

// table returns the body rows of the Markdown table whose header row is
// header (cells compared without surrounding spaces), each split into its
// cells.
func table(t *testing.T, md, name string, header ...string) [][]string {
	t.Helper()
	lines := strings.Split(md, "\n")
	for i, l := range lines {
		if !slices.Equal(cells(l), header) {
			continue
		}
		var rows [][]string
		for _, r := range lines[i+2:] {
			if !strings.HasPrefix(strings.TrimSpace(r), "|") {
				break
			}
			rows = append(rows, cells(r))
		}
		return rows
	}
	t.Fatalf("docs/architecture.md has no %s table (header | %s |)", name, strings.Join(header, " | "))
	return nil
}

// cells splits a Markdown table row into its trimmed cells; nil for a
// line that is no row.
func cells(line string) []string {
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, "|") || !strings.HasSuffix(line, "|") || len(line) < 2 {
		return nil
	}
	var out []string
	for _, c := range strings.Split(line[1:len(line)-1], "|") {
		out = append(out, strings.TrimSpace(c))
	}
	return out
}

// readDoc parses the three tables of docs/architecture.md.
func readDoc(t *testing.T, dir string) *doc {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	d := &doc{stage: map[string]string{}, imports: map[string][]string{}, all: map[string]bool{}, only: map[string][]string{}}
	for _, row := range table(t, md, "stage", "stage", "package", "what it knows", "entry point") {
		if len(row) < 2 {
			t.Fatalf("stage table row %q: want a stage and its packages", row)
		}
		for _, m := range backticked.FindAllStringSubmatch(row[1], -1) {
			p := module + "/" + m[1]
			if s, ok := d.stage[p]; ok && s != row[0] {
				t.Errorf("stage table: %s is listed in stages %s and %s", m[1], s, row[0])
			}
			d.stage[p] = row[0]
		}
	}
	for _, row := range table(t, md, "import", "stage", "may import (besides its own stage)") {
		if len(row) < 2 {
			t.Fatalf("import table row %q: want a stage and the stages it may import", row)
		}
		switch v := strings.TrimSuffix(row[1], "."); {
		case v == "—" || v == "-" || v == "nothing":
		case strings.HasPrefix(v, "every stage"):
			d.all[row[0]] = true
		default:
			for _, s := range strings.Split(v, ",") {
				d.imports[row[0]] = append(d.imports[row[0]], strings.TrimSpace(s))
			}
		}
		if _, ok := d.imports[row[0]]; !ok {
			d.imports[row[0]] = nil
		}
	}
	for _, row := range table(t, md, "capability", "what", "only in") {
		if len(row) < 2 {
			t.Fatalf("capability table row %q: want what and the packages", row)
		}
		what := backticked.FindStringSubmatch(row[0])
		if what == nil {
			t.Fatalf("capability table row %q: the first cell names what in `code`", row)
		}
		// The cell names packages of the stage table in code spans; other
		// code spans in it (a function named in passing) are prose.
		var pkgs []string
		for _, m := range backticked.FindAllStringSubmatch(row[1], -1) {
			if _, ok := d.stage[module+"/"+m[1]]; ok {
				pkgs = append(pkgs, module+"/"+m[1])
			}
		}
		if len(pkgs) == 0 {
			t.Errorf("capability table row %q names no package of the stage table", row)
		}
		d.only[what[1]] = pkgs
	}
	return d
}

// file is one parsed Go file of a package.
type file struct {
	path string
	test bool
	f    *ast.File
}

// tree maps the import path of every package folder of the repository to
// its files.
func tree(t *testing.T, dir string) map[string][]file {
	t.Helper()
	fset := token.NewFileSet()
	pkgs := map[string][]file{}
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := e.Name()
		if e.IsDir() {
			if path != dir && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, filepath.Dir(path))
		if err != nil {
			return err
		}
		p := module
		if rel != "." {
			p += "/" + filepath.ToSlash(rel)
		}
		pkgs[p] = append(pkgs[p], file{path: path, test: strings.HasSuffix(name, "_test.go"), f: f})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

func short(p string) string { return strings.TrimPrefix(p, module+"/") }

// imports returns the import paths of f.
func imports(f *ast.File) []string {
	var out []string
	for _, s := range f.Imports {
		p, _ := strconv.Unquote(s.Path.Value)
		out = append(out, p)
	}
	return out
}

// calls returns the package-qualified calls pkg.Func in f, pkg being the
// last element of the import path (or the name it is imported as).
func calls(f *ast.File) []string {
	names := map[string]string{} // the name in f → the last path element
	for _, s := range f.Imports {
		p, _ := strconv.Unquote(s.Path.Value)
		last := p[strings.LastIndex(p, "/")+1:]
		local := last
		if s.Name != nil {
			local = s.Name.Name
		}
		names[local] = last
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		c, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if sel, ok := c.Fun.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok {
				if pkg, ok := names[id.Name]; ok {
					out = append(out, pkg+"."+sel.Sel.Name)
				}
			}
		}
		return true
	})
	return out
}

// TestEveryPackageMapped: the stage table lists every package of the tree
// and no package that is not there, and every stage has a row in the
// import table.
func TestEveryPackageMapped(t *testing.T) {
	dir := root(t)
	d, pkgs := readDoc(t, dir), tree(t, dir)
	for p := range pkgs {
		if _, ok := d.stage[p]; !ok {
			t.Errorf("package %s is missing from the stage table of docs/architecture.md", short(p))
		}
	}
	for p, s := range d.stage {
		if _, ok := pkgs[p]; !ok {
			t.Errorf("the stage table lists %s (stage %s), which is not a package of the tree", short(p), s)
		}
		if _, ok := d.imports[s]; !ok && !d.all[s] {
			t.Errorf("stage %s (of %s) has no row in the import table", s, short(p))
		}
	}
	for s, allowed := range d.imports {
		for _, a := range allowed {
			if _, ok := d.imports[a]; !ok && !d.all[a] {
				t.Errorf("import table: stage %s may import %q, which is no stage", s, a)
			}
		}
	}
}

// TestImportsFollowStages: a package's non-test files import only packages
// of its own stage and of the stages the import table allows it; only
// tests and test packages import test packages.
func TestImportsFollowStages(t *testing.T) {
	dir := root(t)
	d, pkgs := readDoc(t, dir), tree(t, dir)
	for p, files := range pkgs {
		from, ok := d.stage[p]
		if !ok {
			continue // TestEveryPackageMapped says so
		}
		bad := map[string]bool{}
		for _, f := range files {
			for _, imp := range imports(f.f) {
				to, ok := d.stage[imp]
				if !ok || imp == p {
					continue // not of the project
				}
				var err string
				switch {
				case to == testStage && from != testStage && !f.test:
					err = fmt.Sprintf("%s imports %s, which only tests may import", short(p), short(imp))
				case f.test || to == from || d.all[from] || slices.Contains(d.imports[from], to):
				default:
					err = fmt.Sprintf("%s (stage %s) imports %s (stage %s); stage %s may import %s", short(p), from, short(imp), to, from, allowedText(d, from))
				}
				if err != "" && !bad[err] {
					bad[err] = true
					t.Error(err + " (" + filepath.Base(f.path) + ")")
				}
			}
		}
	}
}

func allowedText(d *doc, stage string) string {
	if len(d.imports[stage]) == 0 {
		return "no other stage"
	}
	return "only " + strings.Join(d.imports[stage], ", ")
}

// TestOnlyNamedPackages: cgo, the ONNX Runtime bindings and the session
// constructors are used, outside tests, only by the packages the
// capability table names.
func TestOnlyNamedPackages(t *testing.T) {
	dir := root(t)
	d, pkgs := readDoc(t, dir), tree(t, dir)
	if len(d.only) == 0 {
		t.Fatal("the capability table is empty")
	}
	used := map[string]bool{}
	for p, files := range pkgs {
		for _, f := range files {
			if f.test {
				continue
			}
			var does []string
			for _, imp := range imports(f.f) {
				if imp == "C" {
					does = append(does, `import "C"`)
				}
				does = append(does, imp)
			}
			does = append(does, calls(f.f)...)
			for _, what := range does {
				allowed, listed := d.only[what]
				if !listed {
					continue
				}
				used[what] = true
				if !slices.Contains(allowed, p) {
					t.Errorf("%s uses %s (%s); the capability table allows it only in %s",
						short(p), what, filepath.Base(f.path), strings.Join(shorts(allowed), ", "))
				}
			}
		}
	}
	for what := range d.only {
		if !used[what] {
			t.Errorf("the capability table names %s, which no package uses: a stale row", what)
		}
	}
}

func shorts(ps []string) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = short(p)
	}
	return out
}
