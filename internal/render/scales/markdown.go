package scales

import (
	"fmt"
	"io"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/render/markup"
	"fp16audit/report"
)

// Markdown writes the training-log diagnosis as GitHub-flavoured
// Markdown for a CI job summary or a pull-request comment: the verdict and
// fix, the logs read, the history as sparklines, the scale reconstruction,
// the loss, the findings, what could not be derived and the notes.
func Markdown(w io.Writer, r *report.ScalesReport) error {
	var b strings.Builder
	mark := "✅"
	switch r.MaxSeverity() {
	case checks.SevError:
		mark = "❌"
	case checks.SevWarning:
		mark = "⚠️"
	}
	fmt.Fprintf(&b, "## fp16audit scales: %s `%s`\n\n", mark, r.Verdict)
	fmt.Fprintf(&b, "**%s**\n", markup.MDText(r.VerdictText))
	if r.Fix != "" {
		fmt.Fprintf(&b, "\n**Fix:** %s\n", markup.MDText(r.Fix))
	}
	if lines := captureLines(r); len(lines) > 0 {
		b.WriteString("\n**Captures:**\n\n")
		for _, l := range lines {
			fmt.Fprintf(&b, "- %s\n", markup.MDText(l))
		}
	}
	fmt.Fprintf(&b, "\nLog %s: %s.", markup.MDCode(r.Run.Path), markup.MDText(describeRun(r.Run)))
	if bl := r.Baseline; bl != nil {
		fmt.Fprintf(&b, " fp32 baseline %s: %s.", markup.MDCode(bl.Path), markup.MDText(describeRun(*bl)))
	}
	if g := r.GradScaler; g != nil {
		fmt.Fprintf(&b, " GradScaler: %s.", markup.MDText(scalerText(g)))
	}
	if selected(r) {
		fmt.Fprintf(&b, " Checks: %s.", markup.MDCode(r.Checks))
	}
	b.WriteString("\n")

	// The sparklines are plain text; a code block keeps their columns.
	if lines := historyLines(r, "!"); len(lines) > 0 {
		fmt.Fprintf(&b, "\n```text\n%s\n```\n", strings.Join(lines, "\n"))
	}
	if rows := scaleRows(r); len(rows) > 0 {
		b.WriteString("\n### Scale history\n\n| | |\n|---|---|\n")
		for _, row := range rows {
			fmt.Fprintf(&b, "| %s | %s |\n", row[0], markup.MDText(row[1]))
		}
		if parts := epochParts(r); len(parts) > 0 {
			fmt.Fprintf(&b, "| skipped per epoch | %s |\n", markup.MDText(strings.Join(parts, ", ")))
		}
	}
	if r.Losses != nil || r.Comparison != nil {
		b.WriteString("\n### Loss\n\n")
		if l := r.Losses; l != nil {
			fmt.Fprintf(&b, "%s.\n", markup.MDText(upperFirst(lossSummary(r.Run, l))))
		}
		if c := r.Comparison; c != nil {
			fmt.Fprintf(&b, "\nAgainst the fp32 baseline: %s.\n", markup.MDText(comparisonText(c)))
		}
	}
	if len(r.Findings) > 0 {
		b.WriteString("\n### Findings\n\n| severity | check | message |\n|---|---|---|\n")
		for _, f := range r.Findings {
			fmt.Fprintf(&b, "| %s | %s | %s |\n", f.Severity, f.Check, markup.MDText(f.Message))
		}
	}
	if len(r.NotDerived) > 0 {
		b.WriteString("\n### Not derived\n\n")
		for _, s := range r.NotDerived {
			fmt.Fprintf(&b, "- %s\n", markup.MDText(s))
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "\n> **Note:** %s\n", markup.MDText(n))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
