package docgen

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// checkJSON is a check as `fp16audit checks --format json` lists it.
type checkJSON struct {
	ID, Title, Severity, Doc string
	Policies                 []string
}

// reportedBy reads the commands off `fp16audit explain`'s header line.
var reportedBy = regexp.MustCompile(`reported by: (.*?)\s{2,}policies:`)

// checkPages writes a page per check of `fp16audit checks` (the text
// `fp16audit explain` prints, and the verdict pages whose report shows a
// finding of it) and the index of all checks.
func checkPages(files Files, examples map[string]*example) error {
	out, _, err := run([]int{0}, "checks", "--format", "json")
	if err != nil {
		return err
	}
	var list []checkJSON
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return fmt.Errorf("fp16audit checks --format json: %w", err)
	}
	seenIn := map[string][]string{}
	var pages []string
	for p := range examples {
		pages = append(pages, p)
	}
	sort.Strings(pages)
	for _, p := range pages {
		for _, id := range findingIDs(examples[p].JSON) {
			seenIn[id] = append(seenIn[id], p)
		}
	}
	index := Dir + "/checks/index.md"
	var ix strings.Builder
	ix.WriteString("# Checks\n\n")
	ix.WriteString("Every finding names the check that made it: a stable ID, never reused (FP1xxx input data, FP2xxx forward overflow, " +
		"FP3xxx underflow, FP4xxx static graph hazards, FP5xxx training logs, FP6xxx the training audit). " +
		"`fp16audit checks` lists them, `fp16audit explain ID` prints a page below, and `--checks` selects them (`all,-FP3*`).\n\n")
	ix.WriteString("| ID | default severity | reported by | policies | title |\n|---|---|---|---|---|\n")
	for _, c := range list {
		text, _, err := run([]int{0}, "explain", c.ID)
		if err != nil {
			return err
		}
		by := "fp16audit run"
		if m := reportedBy.FindStringSubmatch(text); m != nil {
			by = m[1]
		}
		cmds := "`" + strings.ReplaceAll(by, ", ", "`, `fp16audit ") + "`"
		page := Dir + "/checks/" + c.ID + ".md"
		fmt.Fprintf(&ix, "| [%s](%s) | %s | %s | %s | %s |\n", c.ID, rel(index, page), c.Severity, cmds, cell(strings.Join(c.Policies, ", ")), cell(c.Title))
		var b strings.Builder
		fmt.Fprintf(&b, "# %s: %s\n\n", c.ID, c.Title)
		fmt.Fprintf(&b, "| default severity | reported by | policies |\n|---|---|---|\n| %s | %s | %s |\n\n", c.Severity, cmds, cell(strings.Join(c.Policies, ", ")))
		b.WriteString(fence("text", "$ fp16audit explain "+c.ID+"\n"+text))
		if ps := seenIn[c.ID]; len(ps) > 0 {
			b.WriteString("\n## In a real report\n\nA finding of this check appears in the report of these verdict pages:\n\n")
			for _, p := range ps {
				id := strings.TrimSuffix(p[strings.LastIndex(p, "/")+1:], ".md")
				kind := p[len(Dir+"/verdicts/"):strings.LastIndex(p, "/")]
				fmt.Fprintf(&b, "- [%s](%s) (%s)\n", id, rel(page, p), kind)
			}
		}
		b.WriteString("\nSelect or silence it with `--checks` (`--checks all,-" + c.ID + "`); see [all checks](index.md).\n")
		files[page] = []byte(b.String())
	}
	files[index] = []byte(ix.String())
	return nil
}
