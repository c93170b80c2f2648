package audit

import (
	"fmt"
	"io"
	"strings"

	"fp16audit/internal/render/markup"
	"fp16audit/report"
)

// MarkdownLimit is the most bytes Markdown writes. GitHub refuses comments
// over 65 536 characters; the margin leaves room for a CI job's own text.
const MarkdownLimit = 60000

// Markdown writes r as GitHub-flavoured Markdown for a pull-request comment
// or a CI job summary: the verdict, the origins, the verified fixes, the
// findings and the flagged nodes. Table rows that would take the document
// over MarkdownLimit are cut, and a note says how many.
func Markdown(w io.Writer, r *report.Report) error {
	var b strings.Builder
	marks := map[string]string{"ok": "✅", "caution": "⚠️", "fail": "❌"}
	outcomes := headline(r)
	if len(outcomes) == 1 {
		fmt.Fprintf(&b, "## fp16audit: %s `%s`\n\n", marks[outcomes[0].Mood], r.Verdict)
		fmt.Fprintf(&b, "**%s**\n\n", markup.MDText(r.VerdictText))
	} else {
		var title []string
		for _, o := range outcomes {
			title = append(title, fmt.Sprintf("%s %s `%s`", marks[o.Mood], o.Label, o.Verdict))
		}
		fmt.Fprintf(&b, "## fp16audit: %s\n\n", strings.Join(title, " · "))
		for _, o := range outcomes {
			fmt.Fprintf(&b, "**%s%s:** %s\n\n", strings.ToUpper(o.Label[:1]), o.Label[1:], markup.MDText(o.Text))
		}
	}
	fmt.Fprintf(&b, "Model %s: %d nodes, producer %s %s, opsets %s. Policy `%s`, passes %s, %d batch(es), ONNX Runtime %s on %s, fp16audit %s.\n",
		markup.MDCode(r.Model.Path), r.Model.NodeCount, markup.MDText(r.Model.Producer), markup.MDText(r.Model.ProducerVersion), markup.MDText(opsetString(r.Model.Opsets)),
		r.Policy, markup.MDText(strings.Join(r.Passes, ", ")), len(r.Batches), markup.MDText(r.Tool.ORTVersion), markup.MDText(r.Tool.Device), markup.MDText(r.Tool.Version))
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "\n> **Note:** %s\n", markup.MDText(n))
	}

	if len(r.Origins) > 0 {
		b.WriteString("\n### Origin\n\n")
		b.WriteString("| pass | where | op | module | precision | cause | fp32 max \\|x\\| | headroom (fp16 max 65504) | non-finite | reached |\n")
		b.WriteString("|---|---|---|---|---|---|--:|--:|--:|---|\n")
		for _, o := range r.Origins {
			reached := fmt.Sprintf("%d node(s); graph outputs: %s", len(o.Affected), markup.MDCodeList(o.AffectedOutputs))
			if len(o.WrongOutputs) > 0 {
				reached += "; finite but wrong: " + markup.MDCodeList(o.WrongOutputs)
			}
			cause := originCauseShort(r, o, markup.MDCode)
			if why := originWhy(o); why != "" {
				cause += "; " + markup.MDText(why)
			}
			where, op, module, prec, mag := markup.MDCode(o.Node), markup.MDText(o.OpType), markup.MDCode(moduleOrModel(o.Module)), markup.MDText(precisionLabel(o.Precision, o.Provenance, true)), originMagnitude(r, o)
			switch {
			case originCause(o) == report.CauseInput:
				where, op, module, prec = "input "+markup.MDCode(o.Input), "", "", ""
			case atInput(o):
				where, op, module = "input "+markup.MDCode(o.Input), "", ""
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |\n", markup.MDText(o.Pass), where, op, module,
				prec, cause, markup.MDText(mag), headroomText(o.HeadroomBits), o.NonFinite, reached)
		}
	}

	if len(r.Fixes) > 0 {
		b.WriteString("\n### Fixes, verified by rerun\n\n")
		b.WriteString("| fix | result | non-finite values before → after | what to do |\n|---|---|--:|---|\n")
		for _, f := range r.Fixes {
			res := "❌ does not work"
			if f.Works {
				res = "✅ works"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %d → %d | %s |\n", f.Kind, res, f.NonFiniteBefore, f.NonFiniteAfter, markup.MDText(f.Summary))
		}
		for _, f := range r.Fixes {
			for _, n := range f.Normalize {
				if n.Fastai == "" && n.Torch == "" {
					continue
				}
				fmt.Fprintf(&b, "\nStandardize input %s (mean %s, std %s):\n", markup.MDCode(n.Input), floats(n.Mean), floats(n.Std))
				if n.Fastai != "" {
					fmt.Fprintf(&b, "\n```python\n# fastai\n%s\n```\n", n.Fastai)
				}
				if n.Torch != "" {
					fmt.Fprintf(&b, "\n```python\n# PyTorch\n%s\n```\n", n.Torch)
				}
			}
			if f.Kind == report.FixKeepFP32 && len(f.Modules) > 0 {
				fmt.Fprintf(&b, "\nModules to keep in fp32: %s (ONNX nodes for `node_block_list`: %s).\n", markup.MDCodeList(f.Modules), markup.MDCodeList(f.Nodes))
			}
		}
	}

	if rows := agreements(r); len(rows) > 0 {
		b.WriteString("\n### Outputs against fp32\n\n")
		b.WriteString("| pass | output | outcome | worst sample (relative L2 error) | where | all samples | max \\|error\\| / max \\|fp32\\| | top-1 | NaN/Inf |\n")
		b.WriteString("|---|---|---|--:|---|--:|--:|--:|--:|\n")
		for _, a := range rows {
			outcome := a.Outcome
			if a.Bad {
				outcome = "**" + outcome + "**"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", markup.MDText(a.Pass), markup.MDCode(a.Output), outcome,
				markup.MDText(a.Worst), a.Where, markup.MDText(a.Overall), markup.MDText(a.MaxRel), a.Top1, a.NonFinite)
		}
	}

	trainingMarkdown(&b, r.Training)
	blocksMarkdown(&b, r, b.Len()+MarkdownLimit/6)
	// The two tables share what is left; findings may use at most half so
	// the flagged nodes always show.
	const reserve = 600
	if len(r.Findings) > 0 {
		b.WriteString("\n### Findings\n\n")
		head := "| severity | check | message |\n|---|---|---|\n"
		var rows []string
		for _, f := range r.Findings {
			rows = append(rows, fmt.Sprintf("| %s | %s | %s |\n", f.Severity, f.Check, markup.MDText(f.Message)))
		}
		budget := b.Len() + (MarkdownLimit-b.Len()-2*reserve)/2
		writeRows(&b, head, rows, budget, "findings")
	}

	passes := emulatedPasses(r)
	var flagged []report.NodeReport
	for _, n := range r.Nodes {
		if n.Flagged {
			flagged = append(flagged, n)
		}
	}
	fmt.Fprintf(&b, "\n### Flagged nodes (%d of %d)\n\n", len(flagged), len(r.Nodes))
	if len(flagged) == 0 {
		b.WriteString("No node produced NaN or Inf in any pass.\n")
	} else {
		var head strings.Builder
		head.WriteString("| # | node | op | module | prec | output | fp32 max \\|x\\| | headroom |")
		for _, p := range passes {
			fmt.Fprintf(&head, " %s max \\|x\\| | %s NaN/Inf |", p, p)
		}
		head.WriteString("\n|--:|---|---|---|---|---|--:|--:|" + strings.Repeat("--:|--:|", len(passes)) + "\n")
		var rows []string
		for _, n := range flagged {
			for _, o := range n.Outputs {
				rows = append(rows, markdownNodeRow(n, o, passes))
			}
			if len(n.Outputs) == 0 {
				rows = append(rows, markdownNodeRow(n, report.ValueReport{Name: "-"}, passes))
			}
		}
		writeRows(&b, head.String(), rows, MarkdownLimit-reserve, "flagged node rows")
	}
	if h := headroomSummary(r.Summary); h != "" {
		fmt.Fprintf(&b, "\n%s.\n", markup.MDText(strings.ToUpper(h[:1])+h[1:]))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeRows writes a table's head and as many rows as keep b within
// budget bytes, then a note naming what was cut.
func writeRows(b *strings.Builder, head string, rows []string, budget int, what string) {
	b.WriteString(head)
	for i, row := range rows {
		if b.Len()+len(row) > budget {
			fmt.Fprintf(b, "\n_%d of %d %s cut to keep this under %d characters; `fp16audit render REPORT.json --format html` shows them all._\n",
				len(rows)-i, len(rows), what, MarkdownLimit)
			return
		}
		b.WriteString(row)
	}
}

func markdownNodeRow(n report.NodeReport, o report.ValueReport, passes []string) string {
	var b strings.Builder
	name := n.Name
	if name == "" {
		name = fmt.Sprintf("%s#%d", n.OpType, n.Index)
	}
	fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s |", n.Index, markup.MDCode(shorten(name, 80)), markup.MDText(n.OpType), markup.MDCode(moduleOrModel(n.Module)),
		markup.MDText(precisionLabel(n.Precision, n.Provenance, false)), markup.MDCode(shorten(o.Name, 60)))
	if ref, ok := o.Stats[report.PassFP32]; ok {
		head := ref.HeadroomBits
		if !heldInHalf(n.Precision) {
			head = nil // a value held in fp32 has no headroom to lose
		}
		fmt.Fprintf(&b, " %s | %s |", formatOpt(ref.MaxAbs), headroomText(head))
	} else {
		b.WriteString(" | |")
	}
	for _, p := range passes {
		if s, ok := o.Stats[p]; ok {
			nf := fmt.Sprint(s.NonFinite())
			if s.NonFinite() > 0 {
				nf = "**" + nf + "**"
			}
			fmt.Fprintf(&b, " %s | %s |", formatOpt(s.MaxAbs), nf)
		} else {
			b.WriteString(" | |")
		}
	}
	b.WriteString("\n")
	return b.String()
}

// emulatedPasses are the report's passes other than the fp32 reference.
func emulatedPasses(r *report.Report) []string {
	var ps []string
	for _, p := range r.Passes {
		if p != report.PassFP32 {
			ps = append(ps, p)
		}
	}
	return ps
}
