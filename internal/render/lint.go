package render

import (
	"fmt"
	"io"

	"fp16audit/checks"
	"fp16audit/report"
)

// lintText writes one line per finding, "PATH: SEVERITY ID: MESSAGE", as
// compilers do, then a summary line per model.
func lintText(w io.Writer, r *report.LintReport) error {
	ew := &errWriter{w: w}
	for _, m := range r.Models {
		if m.Error != "" {
			ew.printf("%s: not linted: %s\n", m.Path, m.Error)
			continue
		}
		var n [3]int
		for _, f := range m.Findings {
			n[f.Severity]++
			ew.printf("%s: %s %s: %s\n", m.Path, f.Severity, f.Check, f.Message)
		}
		ew.printf("%s: %s, %s, %d info (policy %s", m.Path, plural(n[checks.SevError], "error"), plural(n[checks.SevWarning], "warning"), n[checks.SevInfo], m.Policy)
		if m.Checks != "all" {
			ew.printf(", checks %s", m.Checks)
		}
		if m.Config != "" {
			ew.printf(", config %s", m.Config)
		}
		ew.printf(")\n")
	}
	return ew.err
}

// lintSARIF writes the lint findings as a SARIF log whose rules are every
// static check.
func lintSARIF(w io.Writer, r *report.LintReport) error {
	in := sarifInput{Tool: r.Tool.Name, Version: r.Tool.Version, Rules: r.Rules}
	for _, m := range r.Models {
		in.Models = append(in.Models, sarifModel{Path: m.Path, Findings: m.Findings, Err: m.Error})
	}
	return writeSARIF(w, in)
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
