package replay

import (
	"io"

	"fp16audit/internal/render/markup"
	"fp16audit/report"
)

// Markdown writes the replay as GitHub-flavoured Markdown: the capture,
// the verdict and its culprit, the fixes in the words of the trainer
// that made the capture and in PyTorch's, the continuations and the
// timeline's sparklines.
func Markdown(w io.Writer, r *report.ReplayReport) error {
	p := markup.NewWriter(w, false)
	c := r.Capture
	p.Printf("## fp16audit replay — %s\n\n", markup.MDCode(c.Path))
	p.Printf("%s  \n%s\n\n", markup.MDText(captureLine(c)), markup.MDText(runLine(c)))
	badge, _ := verdictBadge(r.Verdict)
	p.Printf("**%s %s** — %s\n\n", badge, r.Verdict, markup.MDText(r.VerdictText))
	if cu := r.Culprit; cu != nil {
		p.Printf("- culprit: %s\n", markup.MDText(culpritLine(cu)))
		if len(cu.Earlier) > 0 {
			p.Printf("- logged before: %s\n", markup.MDText(earlierText(cu.Earlier)))
		}
	}
	if d := r.Data; d != nil && len(d.Samples) > 0 {
		p.Printf("- samples (index in the failing batch): %s\n", int64List(d.Samples))
	}
	if g := r.Gradient; g != nil {
		p.Printf("- scales: %s\n", markup.MDText(gradientScales(g)))
	}
	if u := r.Underflow; u != nil && len(u.Modules) > 0 {
		p.Printf("\n| module | parameter | gradient norm lost at 2^%d |\n|---|---|---:|\n", u.ScaleExp)
		for _, m := range u.Modules {
			p.Printf("| %s | %s | %.1f%% |\n", markup.MDCode(m.Module), markup.MDCode(m.Parameter), 100*m.LostMass)
		}
	}
	if len(r.Fixes) > 0 {
		label, _ := fixWords(r.Capture, r.Fixes[0])
		p.Printf("\n| fix | verified | holds | what | %s | PyTorch |\n|---|---|---|---|---|---|\n", markup.MDText(label))
		for _, f := range r.Fixes {
			mark, _ := fixMark(f)
			_, words := fixWords(r.Capture, f)
			torch := ""
			if torchToo(f, words) {
				torch = markup.MDCode(f.Torch)
			}
			p.Printf("| %s | %s | %s | %s | %s | %s |\n", f.Kind, verifiedText(f), mark, markup.MDText(f.Summary), markup.MDCode(words), torch)
		}
	}
	if co := r.Continuations; co != nil {
		p.Printf("\n%d steps from the captured state on %s (%s); the run as it was %s.\n\n", co.Steps, markup.MDText(co.Device), markup.MDText(co.Batches), reproducedText(co.Reproduced))
		p.Printf("| fix | precision | outcome | final loss | vs fp32 | losses |\n|---|---|---|---:|---:|---|\n")
		for _, x := range co.Runs {
			p.Printf("| %s | %s | %s | %s | %s | %s |\n", x.Fix, x.Precision, x.Outcome, optNum(x.Final), relCell(x.RelToFP32), markup.Spark(x.Losses, 30))
		}
	}
	if t := r.Timeline; t != nil && len(t.Steps) > 0 {
		p.Printf("\nsteps %d to %d (%d skipped): loss `%s`, log2 scale `%s`\n", t.Steps[0], t.Steps[len(t.Steps)-1], countTrue(t.Skipped),
			markup.Spark(t.Loss, 50), markup.Spark(log2s(t.Scale), 50))
	}
	if len(r.Notes) > 0 {
		p.Printf("\n")
		for _, n := range r.Notes {
			p.Printf("> %s\n", markup.MDText(n))
		}
	}
	return p.Err()
}
