// Package lint renders the report of `fp16audit lint` (report.LintReport)
// as text, one line per finding as compilers write them, and as SARIF for
// code-scanning services. It imports only report, checks and markup.
package lint

import (
	"fmt"
	"io"

	"fp16audit/checks"
	"fp16audit/internal/render/markup"
	"fp16audit/report"
)

// Text writes one line per finding, "PATH: SEVERITY ID: MESSAGE", as
// compilers do, then a summary line per model.
func Text(w io.Writer, r *report.LintReport) error {
	ew := markup.NewWriter(w, false)
	for _, m := range r.Models {
		if m.Error != "" {
			ew.Printf("%s: not linted: %s\n", m.Path, m.Error)
			continue
		}
		var n [3]int
		for _, f := range m.Findings {
			n[f.Severity]++
			ew.Printf("%s: %s %s: %s\n", m.Path, f.Severity, f.Check, f.Message)
		}
		ew.Printf("%s: %s, %s, %d info (policy %s", m.Path, plural(n[checks.SevError], "error"), plural(n[checks.SevWarning], "warning"), n[checks.SevInfo], m.Policy)
		if m.Checks != "all" {
			ew.Printf(", checks %s", m.Checks)
		}
		if m.Config != "" {
			ew.Printf(", config %s", m.Config)
		}
		ew.Printf(")\n")
	}
	return ew.Err()
}

// SARIF writes the lint findings as a SARIF log whose rules are every
// static check.
func SARIF(w io.Writer, r *report.LintReport) error {
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
