package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"fp16audit/checks"
	"fp16audit/internal/diagnose"
	"fp16audit/internal/lint"
	"fp16audit/internal/trainlog"
)

var checksFormats = []string{"text", "json", "markdown"}

// checkJSON is one check in `fp16audit checks --format json`.
type checkJSON struct {
	ID       string          `json:"id"`
	Title    string          `json:"title"`
	Severity checks.Severity `json:"severity"`
	Policies []string        `json:"policies"`
	Static   bool            `json:"static"`
	Doc      string          `json:"doc"`
}

func cmdChecks(args []string, stdout, stderr io.Writer) int {
	var format, spec string
	fs := newFlagSet("checks", "fp16audit checks [flags]", "  fp16audit checks --checks FP4*", stdout)
	fs.StringVar(&spec, "checks", "all", "list only these checks (same syntax as lint and run)")
	fs.StringVar(&format, "format", "text", "output format: "+strings.Join(checksFormats, ", "))
	if done, code := parseFlags(fs, args, stderr); done {
		return code
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "fp16audit checks: unexpected argument %q; run 'fp16audit explain %s' for one check\n", fs.Arg(0), fs.Arg(0))
		return exitUsage
	}
	if !slices.Contains(checksFormats, format) {
		fmt.Fprintf(stderr, "fp16audit checks: --format %q: want one of %s\n", format, strings.Join(checksFormats, ", "))
		return exitUsage
	}
	sel, err := checks.ParseSelection(spec)
	if err != nil {
		fmt.Fprintf(stderr, "fp16audit checks: --checks: %v\n", err)
		return exitUsage
	}
	var list []*checks.Check
	for _, c := range checks.All() {
		if sel.Enabled(c.ID) {
			list = append(list, c)
		}
	}
	switch format {
	case "json":
		out := []checkJSON{}
		for _, c := range list {
			out = append(out, checkJSON{ID: c.ID, Title: c.Title, Severity: c.Severity, Policies: policiesOf(c), Static: isStatic(c.ID), Doc: c.Doc})
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintf(stderr, "fp16audit checks: %v\n", err)
			return exitUsage
		}
	case "markdown":
		fmt.Fprint(stdout, checksMarkdown(list))
	default:
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "ID\tSEVERITY\tCOMMAND\tPOLICIES\tTITLE\n")
		for _, c := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.ID, c.Severity, commandOf(c.ID), strings.Join(policiesOf(c), ","), c.Title)
		}
		tw.Flush()
		fmt.Fprintln(stdout, "\nRun 'fp16audit explain ID' for what a check detects and how to fix it.")
	}
	return exitOK
}

func cmdExplain(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("explain", "fp16audit explain ID...", "  fp16audit explain FP4004", stdout)
	if done, code := parseFlags(fs, args, stderr); done {
		return code
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "fp16audit explain: want a check ID such as FP4004; run 'fp16audit checks' for the list")
		return exitUsage
	}
	for i, id := range fs.Args() {
		c, ok := checks.Lookup(strings.ToUpper(id))
		if !ok {
			fmt.Fprintf(stderr, "fp16audit explain: no check %q; run 'fp16audit checks' for the list\n", id)
			return exitUsage
		}
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		fmt.Fprintf(stdout, "%s: %s\n", c.ID, c.Title)
		fmt.Fprintf(stdout, "default severity: %s   reported by: fp16audit %s   policies: %s\n\n%s\n",
			c.Severity, commandOf(c.ID), strings.Join(policiesOf(c), ", "), strings.TrimSpace(c.Doc))
	}
	return exitOK
}

// isStatic reports whether lint runs the check.
func isStatic(id string) bool {
	return slices.ContainsFunc(lint.Analyzers(), func(a *lint.Analyzer) bool { return a.Check.ID == id })
}

// isDynamic reports whether run's diagnosis runs the check.
func isDynamic(id string) bool {
	return slices.ContainsFunc(diagnose.Analyzers(), func(a *diagnose.Analyzer) bool { return a.Check.ID == id })
}

// isScales reports whether the training-log diagnosis runs the check.
func isScales(id string) bool {
	return slices.ContainsFunc(trainlog.Analyzers(), func(a *trainlog.Analyzer) bool { return a.Check.ID == id })
}

// commandOf names the commands that report a check: lint for the static
// checks, scales for the training-log diagnosis (FP5xxx), run for the rest.
// A static check the dynamic audit runs too (FP4002, FP4004) is reported by
// both.
func commandOf(id string) string {
	switch {
	case isStatic(id) && isDynamic(id):
		return "lint, run"
	case isStatic(id):
		return "lint"
	case isScales(id):
		return "scales"
	}
	return "run"
}

func policiesOf(c *checks.Check) []string {
	if len(c.Policies) == 0 {
		return []string{"all"}
	}
	return c.Policies
}

// checksMarkdown documents checks for docs/lint.md: a table, then each
// check's doc text.
func checksMarkdown(list []*checks.Check) string {
	var b strings.Builder
	b.WriteString(checksTable(list, ""))
	for _, c := range list {
		fmt.Fprintf(&b, "\n### %s\n\n**%s** (default severity %s)\n\n%s\n", c.ID, c.Title, c.Severity, strings.TrimSpace(c.Doc))
	}
	return b.String()
}

// checksTable is the Markdown table of list: ID (linked to its section in
// the document at docs, "" for the same document), severity, command,
// policies and title.
func checksTable(list []*checks.Check, docs string) string {
	var b strings.Builder
	b.WriteString("| ID | default severity | reported by | policies | title |\n|---|---|---|---|---|\n")
	for _, c := range list {
		fmt.Fprintf(&b, "| [%s](%s#%s) | %s | `fp16audit %s` | %s | %s |\n", c.ID, docs, strings.ToLower(c.ID), c.Severity,
			strings.ReplaceAll(commandOf(c.ID), ", ", "`, `fp16audit "), strings.Join(policiesOf(c), ", "), c.Title)
	}
	return b.String()
}
