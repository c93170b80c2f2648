package docgen

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"fp16audit/fixtures"
	"fp16audit/internal/batch"
)

// A verdict is one of package report's verdict identifiers.
type verdict struct {
	// Command is the command whose document carries it: "run" (the
	// forward verdict), "train" (the backward verdict of run --mode
	// train) or "scales".
	Command string
	// Const is the Go constant's name, ID its value, Doc its comment.
	Const, ID, Doc string
}

// page is the verdict's page, relative to the repository root.
func (v verdict) page() string { return fmt.Sprintf("%s/verdicts/%s/%s.md", Dir, v.Command, v.ID) }

// verdictGroups tells the const groups of package report that hold
// verdicts by the first words of their doc comment.
var verdictGroups = []struct{ prefix, command string }{
	{"Verdict identifiers of `fp16audit scales`", "scales"},
	{"Verdict identifiers", "run"},
	{"Backward verdicts", "train"},
}

// reportVerdicts reads the verdict constants from package report's
// source, in the order they are declared (the order each decision tree
// tests them).
func reportVerdicts() ([]verdict, error) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("report/*.go")
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
	p, err := doc.NewFromFiles(fset, files, "fp16audit/report", doc.PreserveAST)
	if err != nil {
		return nil, err
	}
	var out []verdict
	for _, g := range p.Consts {
		command := ""
		for _, vg := range verdictGroups {
			if strings.HasPrefix(g.Doc, vg.prefix) {
				command = vg.command
				break
			}
		}
		if command == "" {
			continue
		}
		for _, spec := range g.Decl.Specs {
			vs := spec.(*ast.ValueSpec)
			text := vs.Doc.Text()
			if text == "" {
				text = vs.Comment.Text()
			}
			for i, name := range vs.Names {
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return nil, fmt.Errorf("report: verdict %s is not a string literal", name.Name)
				}
				id, _ := strconv.Unquote(lit.Value)
				text = strings.TrimPrefix(flat(text), name.Name+": ")
				out = append(out, verdict{Command: command, Const: name.Name, ID: id, Doc: text})
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("report: no verdict constants found (a const group whose doc starts with %q)", verdictGroups[1].prefix)
	}
	return out, nil
}

// An example is the real report of a fixture that reaches a verdict.
type example struct {
	// Source says where the fixture comes from and who established its
	// outcome; Command is the command line as a user types it.
	Source, Command string
	// Text and HTML are the report as text and as the HTML page; JSON is
	// the document.
	Text, HTML []byte
	JSON       map[string]any
}

// candidate is an invocation that may reach a verdict.
type candidate struct {
	source string
	args   []string // fp16audit's arguments, without --format
	shown  string   // the command as the page shows it ("" = args)
	want   string   // the verdict its truth expects ("" = any)
	// replace rewrites temporary paths in the outputs.
	replace *strings.Replacer
}

// verdictPages writes a page per verdict and an index, and returns the
// examples it showed by verdict page, for the checks' pages.
func verdictPages(files Files) (map[string]*example, error) {
	vs, err := reportVerdicts()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "fp16audit-docgen-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	train, err := trainCandidates(tmp)
	if err != nil {
		return nil, err
	}
	scales, err := scalesCandidates()
	if err != nil {
		return nil, err
	}
	found := map[string]*example{}
	type result struct {
		ex  *example
		got string
	}
	// One candidate serves several verdicts' searches: run it once.
	ran := map[string]result{}
	for _, v := range vs {
		var cands []candidate
		switch v.Command {
		case "run":
			if cands, err = forwardCandidates(v.ID); err != nil {
				return nil, err
			}
		case "train":
			cands = train
		case "scales":
			cands = scales
		}
		for _, c := range cands {
			if c.want != "" && c.want != v.ID {
				continue
			}
			key := v.Command + "\x00" + strings.Join(c.args, "\x00")
			r, ok := ran[key]
			if !ok {
				ex, got, err := runCandidate(v.Command, c, tmp)
				if err != nil {
					return nil, err
				}
				r = result{ex, got}
				ran[key] = r
			}
			ex, got := r.ex, r.got
			if got == v.ID {
				found[v.page()] = ex
				break
			}
		}
		files[v.page()] = verdictPage(v, found[v.page()])
		if ex := found[v.page()]; ex != nil {
			files[strings.TrimSuffix(v.page(), ".md")+".html"] = ex.HTML
		}
	}
	files[Dir+"/verdicts/index.md"] = verdictIndex(vs, found)
	return found, nil
}

// forwardCandidates lists the fixtures whose recorded outcome is verdict
// id: first the real PyTorch exports whose truth.json (PyTorch's own
// outcome under autocast-fp16, fixtures/torch/oracle.py) says so, then
// the generated fixtures (fixtures.All) that expect it.
func forwardCandidates(id string) ([]candidate, error) {
	truths, err := filepath.Glob("fixtures/torch/cases*/*/truth.json")
	if err != nil {
		return nil, err
	}
	sort.Strings(truths)
	var out []candidate
	for _, p := range truths {
		var truth struct {
			Title    string `json:"title"`
			MadeWith struct {
				Torch    string `json:"torch"`
				Exporter string `json:"exporter"`
			} `json:"made_with"`
			Model    struct{ File string } `json:"model"`
			Policies map[string]struct {
				Verdict string `json:"verdict"`
			} `json:"policies"`
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, &truth); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		dir := filepath.Dir(p)
		if truth.Policies["autocast-fp16"].Verdict != id || truth.Model.File == "" {
			continue
		}
		if fi, err := os.Stat(filepath.Join(dir, "batches")); err != nil || !fi.IsDir() {
			continue
		}
		out = append(out, candidate{
			source: fmt.Sprintf("`%s`: %s, exported by %s under torch %s; PyTorch's own outcome under autocast fp16 (`%s`) is %s.",
				dir, truth.Title, truth.MadeWith.Exporter, truth.MadeWith.Torch, p, id),
			args: []string{"run", filepath.Join(dir, truth.Model.File), "-i", filepath.Join(dir, "batches")},
			want: id,
		})
	}
	for _, f := range fixtures.All() {
		for _, b := range f.Batches {
			if b.Expect.Verdict != id || f.ExternalData != "" {
				continue
			}
			out = append(out, candidate{
				source: fmt.Sprintf("`fixtures/models/%s.onnx`, a model the fixture generator builds (`fixtures/`): %s The batch: %s",
					f.Name, sentence(f.Doc), sentence(b.Doc)),
				args: []string{"run", "fixtures/models/" + f.Name + ".onnx", "-i", "fixtures/batches/" + b.Name + ".npy"},
				want: id,
			})
		}
	}
	return out, nil
}

// trainCandidates lists the training fixtures (fixtures/torch/train,
// PyTorch's autograd recorded beside each in manifest.json) in train
// mode with their loss, at GradScaler's default initial scale and at a
// low one (2^8); the batch and targets are written as .npy files to tmp.
func trainCandidates(tmp string) ([]candidate, error) {
	const dir = "fixtures/torch/train"
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return nil, err
	}
	var manifest struct {
		Fixtures []struct {
			Name, Model, Data, Loss, Target, Note, Output string
			Inputs                                        []struct{ Key, Name string }
			ClassAxis                                     *int `json:"class_axis"`
			Shift                                         bool
			IgnoreIndex                                   *int `json:"ignore_index"`
		}
	}
	if err := json.Unmarshal(b, &manifest); err != nil {
		return nil, fmt.Errorf("%s/manifest.json: %w", dir, err)
	}
	var out []candidate
	for _, init := range []string{"", "256"} {
		for _, f := range manifest.Fixtures {
			arrays, err := batch.ReadNPZ(filepath.Join(dir, f.Data))
			if err != nil {
				return nil, err
			}
			write := func(key, name string) (string, error) {
				for _, a := range arrays {
					if a.Name == key {
						data, err := batch.EncodeNPY(a)
						if err != nil {
							return "", err
						}
						p := filepath.Join(tmp, f.Name+"_"+name+".npy")
						return p, os.WriteFile(p, data, 0o644)
					}
				}
				return "", fmt.Errorf("%s/%s: no array %q", dir, f.Data, key)
			}
			args := []string{"run", filepath.Join(dir, f.Model)}
			for _, in := range f.Inputs {
				p, err := write(in.Key, in.Name)
				if err != nil {
					return nil, err
				}
				args = append(args, "-i", in.Name+"="+p)
			}
			target, err := write(f.Target, "target")
			if err != nil {
				return nil, err
			}
			args = append(args, "--mode", "train", "--loss", f.Loss, "--target", target, "--loss-output", f.Output)
			if f.ClassAxis != nil && *f.ClassAxis == -1 {
				args = append(args, "--class-axis", "last")
			} else if f.ClassAxis != nil {
				args = append(args, "--class-axis", strconv.Itoa(*f.ClassAxis))
			}
			if f.Shift {
				args = append(args, "--lm-shift")
			}
			if f.IgnoreIndex != nil && *f.IgnoreIndex != -100 {
				args = append(args, "--ignore-index", strconv.Itoa(*f.IgnoreIndex))
			}
			if init != "" {
				args = append(args, "--init-scale", init)
			}
			out = append(out, candidate{
				source: fmt.Sprintf("`%s/%s` with the batch and targets of `%s/%s`: %s PyTorch's autograd for it is recorded in `%s/manifest.json`.",
					dir, f.Model, dir, f.Data, sentence(f.Note), dir),
				args:    args,
				replace: strings.NewReplacer(tmp+string(filepath.Separator), ""),
			})
		}
	}
	return out, nil
}

// sentence ends s with a full stop.
func sentence(s string) string {
	s = strings.TrimSpace(s)
	if s != "" && !strings.HasSuffix(s, ".") {
		s += "."
	}
	return s
}

// scalesCandidates lists the training logs of the scales diagnosis's
// tests (internal/trainlog/testdata), alone and beside the fp32
// baseline.
func scalesCandidates() ([]candidate, error) {
	const dir = "internal/trainlog/testdata"
	logs, err := filepath.Glob(dir + "/*.json")
	if err != nil {
		return nil, err
	}
	sort.Strings(logs)
	var out []candidate
	for _, base := range []string{"", dir + "/baseline_fp32.json"} {
		for _, l := range logs {
			if strings.HasPrefix(filepath.Base(l), "baseline") {
				continue
			}
			args := []string{"scales", l}
			if base != "" {
				args = append(args, "--baseline", base)
			}
			out = append(out, candidate{
				source: fmt.Sprintf("`%s`, a training log of the scales diagnosis's tests (`%s`: loss and GradScaler scale of every step, simulated as GradScaler updates the scale)", l, dir),
				args:   args,
			})
		}
	}
	return out, nil
}

// timings matches a document's measured durations (tool.timing's
// seconds, the backward's).
var timings = regexp.MustCompile(`"((?:[a-z_]+_)?seconds)": [-+0-9.eE]+`)

// runCandidate runs c and returns its example and the verdict it reached
// (the backward verdict for command train).
func runCandidate(command string, c candidate, tmp string) (*example, string, error) {
	jsonPath := filepath.Join(tmp, "report.json")
	args := append(slices.Clone(c.args), "--format", "json", "--output", jsonPath)
	if args[0] == "run" {
		// one thread: the same sums in the same order on every machine
		args = append(args, "--threads", "1")
	}
	if _, _, err := run([]int{0, 1}, args...); err != nil {
		return nil, "", err
	}
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		return nil, "", err
	}
	// Where the time went differs from run to run; the pages show zero so
	// that a fresh generation equals the committed one.
	data = timings.ReplaceAll(data, []byte(`"${1}": 0`))
	if err := os.WriteFile(jsonPath, data, 0o644); err != nil {
		return nil, "", err
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, "", err
	}
	got, _ := doc["verdict"].(string)
	if command == "train" {
		got = ""
		if t, ok := doc["training"].(map[string]any); ok {
			if b, ok := t["backward"].(map[string]any); ok {
				got, _ = b["verdict"].(string)
			}
		}
	}
	text, _, err := run([]int{0}, "render", jsonPath, "--format", "text")
	if err != nil {
		return nil, "", err
	}
	html, _, err := run([]int{0}, "render", jsonPath, "--format", "html")
	if err != nil {
		return nil, "", err
	}
	shown := c.shown
	if shown == "" {
		shown = "fp16audit " + strings.Join(c.args, " ")
	}
	if c.replace != nil {
		text, html, shown = c.replace.Replace(text), c.replace.Replace(html), c.replace.Replace(shown)
	}
	return &example{Source: c.source, Command: shown, Text: []byte(text), HTML: []byte(html), JSON: doc}, got, nil
}

// commandTitles names each verdict kind on the pages.
var commandTitles = map[string]string{
	"run":    "Forward verdicts (`fp16audit run`)",
	"train":  "Backward verdicts (`fp16audit run --mode train --loss ...`)",
	"scales": "Training-log verdicts (`fp16audit scales`)",
}

func verdictPage(v verdict, ex *example) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n", v.ID)
	fmt.Fprintf(&b, "%s: `%s` (Go: `report.%s`).\n\n", strings.SplitN(commandTitles[v.Command], " (", 2)[0], v.ID, v.Const)
	if v.Doc != "" {
		fmt.Fprintf(&b, "%s\n\n", strings.ToUpper(v.Doc[:1])+v.Doc[1:])
	}
	if ex == nil {
		b.WriteString("No fixture reaches this verdict yet, so this page shows no report.\n")
		return []byte(b.String())
	}
	fmt.Fprintf(&b, "## A real report\n\n%s\n\n", ex.Source)
	b.WriteString("The report is fp16audit's own output, regenerated from the fixture by `make docs-gen` (its durations set to zero, so that the page only changes when the outcome does).\n\n")
	if vt := verdictText(v.Command, ex.JSON); vt != "" {
		fmt.Fprintf(&b, "The verdict's text in this report: *%s*\n\n", strings.TrimSpace(vt))
	}
	// The verdict's block (the header, the verdict, its origin and
	// fixes) is a snippet section the guides include; the whole report
	// follows, folded.
	fmt.Fprintf(&b, "<!-- --8<-- [start:summary] -->\n%s<!-- --8<-- [end:summary] -->\n\n", fence("console", "$ "+ex.Command+"\n"+summary(string(ex.Text))))
	b.WriteString("??? example \"The whole report\"\n\n")
	for _, l := range strings.Split(fence("console", "$ "+ex.Command+"\n"+string(ex.Text)), "\n") {
		if l != "" {
			l = "    " + l
		}
		b.WriteString(l + "\n")
	}
	page := strings.TrimSuffix(filepath.Base(v.page()), ".md") + ".html"
	fmt.Fprintf(&b, "\n### The HTML report\n\nThe same document as `--format html` writes it ([open it on its own](%s)):\n\n", page)
	fmt.Fprintf(&b, "<iframe class=\"fp16audit-report\" src=\"../%s\" title=\"HTML report: %s\" loading=\"lazy\"></iframe>\n", page, v.ID)
	if ids := findingIDs(ex.JSON); len(ids) > 0 {
		b.WriteString("\n### Its findings' checks\n\n")
		for _, id := range ids {
			fmt.Fprintf(&b, "- [%s](%s)\n", id, rel(v.page(), Dir+"/checks/"+id+".md"))
		}
	}
	return []byte(b.String())
}

// summary is a text report up to the end of its first block after the
// title: the verdict, where it starts and the fixes.
func summary(text string) string {
	lines := strings.Split(text, "\n")
	blanks := 0
	for i, l := range lines {
		if strings.TrimSpace(l) == "" {
			if blanks++; blanks == 2 {
				return strings.Join(lines[:i], "\n") + "\n"
			}
		}
	}
	return text
}

// verdictText is the document's verdict_text (the backward's for train).
func verdictText(command string, doc map[string]any) string {
	if command == "train" {
		if t, ok := doc["training"].(map[string]any); ok {
			if b, ok := t["backward"].(map[string]any); ok {
				s, _ := b["verdict_text"].(string)
				return s
			}
		}
		return ""
	}
	s, _ := doc["verdict_text"].(string)
	return s
}

// findingIDs lists the checks of a document's findings, the training
// audit's included, sorted and once each.
func findingIDs(doc map[string]any) []string {
	seen := map[string]bool{}
	var walk func(any)
	walk = func(x any) {
		switch x := x.(type) {
		case map[string]any:
			if fs, ok := x["findings"].([]any); ok {
				for _, f := range fs {
					if m, ok := f.(map[string]any); ok {
						if id, ok := m["check"].(string); ok {
							seen[id] = true
						}
					}
				}
			}
			for _, v := range x {
				walk(v)
			}
		case []any:
			for _, v := range x {
				walk(v)
			}
		}
	}
	walk(doc)
	out := make([]string, 0, len(seen))
	for id := range seen {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

func verdictIndex(vs []verdict, found map[string]*example) []byte {
	var b strings.Builder
	b.WriteString("# Verdicts\n\n")
	b.WriteString("Every document fp16audit writes ends in one verdict, a stable identifier scripts may branch on. " +
		"Each decision tree tests its verdicts in the order listed; the first that holds wins. " +
		"Each page shows the real report of a fixture that reaches the verdict, as text and as the HTML page.\n")
	for _, command := range []string{"run", "train", "scales"} {
		fmt.Fprintf(&b, "\n## %s\n\n| verdict | example |\n|---|---|\n", commandTitles[command])
		for _, v := range vs {
			if v.Command != command {
				continue
			}
			ex := "none yet"
			if e := found[v.page()]; e != nil {
				ex = "`" + cell(e.Command) + "`"
			}
			fmt.Fprintf(&b, "| [%s](%s) | %s |\n", v.ID, rel(Dir+"/verdicts/index.md", v.page()), ex)
		}
	}
	return []byte(b.String())
}
