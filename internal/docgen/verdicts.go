package docgen

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// A verdict is one of package report's verdict identifiers.
type verdict struct {
	// Command is the command whose document carries it: "run" (the
	// forward verdict), "train" (the backward verdict of run --mode
	// train), "scales" or "replay".
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
	{"Replay verdicts", "replay"},
}

// reportVerdicts reads the verdict constants from package report's
// source, in the order they are declared (the order each decision tree
// tests them).
func reportVerdicts() ([]verdict, error) {
	p, err := packageDoc("report")
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
	scales, err := scalesCandidates(tmp)
	if err != nil {
		return nil, err
	}
	replays, err := replayCandidates()
	if err != nil {
		return nil, err
	}
	found := map[string]*example{}
	missed := map[string][]miss{}
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
		case "replay":
			cands = replays
		}
		for _, c := range ordered(cands, v.Command+"/"+v.ID) {
			if !c.expects(v.ID) {
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
			if r.got == v.ID {
				found[v.page()] = r.ex
				break
			}
			if len(c.want) == 1 {
				// its truth expects this verdict and no other
				missed[v.page()] = append(missed[v.page()], miss(r))
			}
		}
		ex := found[v.page()]
		files[v.page()] = verdictPage(v, ex, missed[v.page()])
		if ex == nil && len(missed[v.page()]) > 0 {
			ex = missed[v.page()][0].ex
		}
		if ex != nil {
			files[strings.TrimSuffix(v.page(), ".md")+".html"] = ex.HTML
		}
	}
	files[Dir+"/verdicts/index.md"] = verdictIndex(vs, found, missed)
	return found, nil
}

// A miss is the report of a fixture whose truth expects a verdict that
// fp16audit does not reach on it, and the verdict it reaches instead.
type miss struct {
	ex  *example
	got string
}

// timings matches a document's measured durations (tool.timing's
// seconds, the backward's).
var timings = regexp.MustCompile(`"((?:[a-z_]+_)?seconds)": [-+0-9.eE]+`)

// runCandidate runs c and returns its example and the verdict it reached
// (the backward verdict for command train).
func runCandidate(command string, c candidate, tmp string) (*example, string, error) {
	jsonPath := filepath.Join(tmp, "report.json")
	args := append(slices.Clone(c.args), "--format", "json", "--output", jsonPath)
	if args[0] == "run" || args[0] == "replay" {
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
	return &example{Source: c.source, Command: shown, Simulated: c.simulated, Text: []byte(text), HTML: []byte(html), JSON: doc}, got, nil
}

// commands are the verdict kinds, in the order of the index.
var commands = []string{"run", "train", "scales", "replay"}

// commandTitles names each verdict kind on the pages.
var commandTitles = map[string]string{
	"run":    "Forward verdicts (`fp16audit run`)",
	"train":  "Backward verdicts (`fp16audit run --mode train --loss ...`)",
	"scales": "Training-log verdicts (`fp16audit scales`)",
	"replay": "Replay verdicts (`fp16audit replay CAPTURE`)",
}

// verdictPage is v's page: its doc, and the report of ex, or, where no
// fixture reaches v, the report of the first one whose truth expects it.
func verdictPage(v verdict, ex *example, missed []miss) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n", v.ID)
	fmt.Fprintf(&b, "%s: `%s` (Go: `report.%s`).\n\n", strings.SplitN(commandTitles[v.Command], " (", 2)[0], v.ID, v.Const)
	if v.Doc != "" {
		fmt.Fprintf(&b, "%s\n\n", strings.ToUpper(v.Doc[:1])+v.Doc[1:])
	}
	switch {
	case ex == nil && len(missed) == 0:
		b.WriteString("No fixture reaches this verdict yet, so this page shows no report.\n")
		return []byte(b.String())
	case ex == nil:
		m := missed[0]
		fmt.Fprintf(&b, "## A real case the audit misses\n\nNo fixture reaches this verdict yet. %s\n\n", capital(m.ex.Source))
		fmt.Fprintf(&b, "PyTorch's own run of it gives this verdict's class, but fp16audit says `%s`: the report below is what a user gets for it today, a known gap (the fixture's test records it and fails once the audit reaches the class).\n\n", m.got)
		ex = m.ex
	case ex.Simulated:
		fmt.Fprintf(&b, "## A report of a simulated log\n\nNo real training run among the fixtures reaches this verdict yet, so this page shows a simulated log: %s\n\n", sentence(ex.Source))
	default:
		fmt.Fprintf(&b, "## A real report\n\n%s\n\n", capital(ex.Source))
	}
	b.WriteString("The report is fp16audit's own output, regenerated from the fixture by `make docs-gen` (its durations set to zero, so that the page only changes when the outcome does).")
	if v.Command == "replay" {
		b.WriteString(" It is the binary's one-step replay: the continuations that verify clipping, a lower learning rate and fp32 over steps run in the training process, from `fp16audit.replay(capture, model=..., loader=...)`.")
	}
	b.WriteString("\n\n")
	if vt := verdictText(v.Command, ex.JSON); vt != "" {
		fmt.Fprintf(&b, "The verdict's text in this report: *%s*\n\n", strings.TrimSpace(vt))
	}
	// The verdict's block (the header, the verdict, its origin and
	// fixes) is a snippet section the guides include; the whole report
	// follows, folded.
	fmt.Fprintf(&b, "<!-- --8<-- [start:summary] -->\n%s<!-- --8<-- [end:summary] -->\n\n", fence("console", "$ "+ex.Command+"\n"+summary(v.Command, string(ex.Text))))
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

// capital starts s with a capital letter.
func capital(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// summary is a text report up to the end of its first block after the
// title (the verdict and where it starts, with the fixes in the forward
// and scales reports); a replay's runs on to the end of its fixes.
func summary(command, text string) string {
	lines := strings.Split(text, "\n")
	want := 2
	if command == "replay" {
		want = 3
	}
	blanks := 0
	for i, l := range lines {
		if strings.TrimSpace(l) == "" {
			if blanks++; blanks == want {
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

func verdictIndex(vs []verdict, found map[string]*example, missed map[string][]miss) []byte {
	var b strings.Builder
	b.WriteString("# Verdicts\n\n")
	b.WriteString("Every document fp16audit writes ends in one verdict, a stable identifier scripts may branch on. " +
		"Each decision tree tests its verdicts in the order listed; the first that holds wins. " +
		"Each page shows the report of a fixture that reaches the verdict, as text and as the HTML page: " +
		"a real PyTorch model, training run or capture whose outcome PyTorch recorded, or, where no real one reaches it yet, a simulated log (said on the page).\n")
	for _, command := range commands {
		fmt.Fprintf(&b, "\n## %s\n\n| verdict | example |\n|---|---|\n", commandTitles[command])
		for _, v := range vs {
			if v.Command != command {
				continue
			}
			ex := "none yet"
			if e := found[v.page()]; e != nil {
				ex = "`" + cell(e.Command) + "`"
				if e.Simulated {
					ex += " (simulated)"
				}
			} else if m := missed[v.page()]; len(m) > 0 {
				ex = fmt.Sprintf("none yet: the audit says %s on `%s`, whose truth is this verdict", m[0].got, cell(m[0].ex.Command))
			}
			fmt.Fprintf(&b, "| [%s](%s) | %s |\n", v.ID, rel(Dir+"/verdicts/index.md", v.page()), ex)
		}
	}
	return []byte(b.String())
}
