package replay

import (
	"fmt"
	"math"
	"strings"

	"fp16audit/internal/capture"
	"fp16audit/report"
)

// ContinuationsFormat is the "format" of the continuations file the
// Python package writes (fp16audit.replay(..., model=..., loader=...)).
const ContinuationsFormat = "fp16audit.continuations"

// closeToFP32 is how far above the fp32 continuation's final loss a fix
// may end and still count as training like fp32.
const closeToFP32 = 0.05

// Continuations are the short runs the Python package made from the
// captured state, in the user's process and on the user's device.
type Continuations struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	// Manifest is the sha256 of the capture's manifest.json they ran from.
	Manifest string `json:"manifest_sha256"`
	Steps    int    `json:"steps"`
	Device   string `json:"device"`
	Batches  string `json:"batches"`
	Runs     []Run  `json:"runs"`
}

// Run is one continuation: a fix (or the run as it was, "as-run") over
// Steps steps.
type Run struct {
	Fix       string          `json:"fix"`
	Precision string          `json:"precision"`
	Scaler    bool            `json:"scaler"`
	ClipNorm  *float64        `json:"clip_norm"`
	LR        *float64        `json:"lr"`
	Losses    []capture.Float `json:"losses"`
	Skipped   []bool          `json:"skipped"`
	Error     string          `json:"error"`
}

// Check says what is wrong with c for the capture whose manifest has
// the sha256 manifest.
func (c *Continuations) Check(manifest string) error {
	if c.Format != ContinuationsFormat {
		return fmt.Errorf("format %q: want %q, as fp16audit.replay writes it", c.Format, ContinuationsFormat)
	}
	if c.Version != 1 {
		return fmt.Errorf("version %d: this fp16audit reads version 1; upgrade fp16audit", c.Version)
	}
	if manifest != "" && !strings.EqualFold(c.Manifest, manifest) {
		return fmt.Errorf("they ran from another capture (manifest sha256 %s, this capture's is %s)", short(c.Manifest), short(manifest))
	}
	for _, r := range c.Runs {
		if r.Error == "" && len(r.Losses) == 0 {
			return fmt.Errorf("run %q holds no losses", r.Fix)
		}
	}
	return nil
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12] + "…"
	}
	return h
}

// Judge adds the continuations to r: each run's outcome and its gap to
// the fp32 run, and the fixes they verify.
func Judge(r *report.ReplayReport, c *Continuations) {
	cr := &report.ContinuationsReport{Steps: c.Steps, Device: c.Device, Batches: c.Batches, Runs: []report.ContinuationRun{}}
	var fp32 *report.ContinuationRun
	for _, run := range c.Runs {
		cr.Runs = append(cr.Runs, judgeRun(run))
	}
	for i := range cr.Runs {
		if cr.Runs[i].Fix == report.FixFP32 {
			fp32 = &cr.Runs[i]
		}
	}
	for i := range cr.Runs {
		x := &cr.Runs[i]
		if fp32 != nil && fp32.Final != nil && x.Final != nil && x != fp32 {
			rel := (*x.Final - *fp32.Final) / math.Max(math.Abs(*fp32.Final), 1e-30)
			x.RelToFP32 = &rel
		}
		if x.Fix == "as-run" {
			cr.Reproduced = x.Outcome == "diverged" || x.NonFinite > 0 || (x.RelToFP32 != nil && *x.RelToFP32 > closeToFP32)
		}
	}
	r.Continuations = cr
	w := phrasesFor(r.Capture.Trainer, r.Capture.AutocastDevice, r.Capture.Policy)
	for _, x := range cr.Runs {
		if x.Fix == "as-run" {
			continue
		}
		works := x.Error == "" && x.Outcome != "diverged"
		if works && x.Fix != report.FixFP32 && fp32 != nil && fp32.Outcome != "diverged" {
			works = x.RelToFP32 != nil && *x.RelToFP32 <= closeToFP32
		}
		f := report.ReplayFix{Kind: x.Fix, Verified: report.VerifiedContinuation, Works: &works, Summary: runSummary(x, c.Steps, fp32),
			ClipNorm: x.ClipNorm, LR: x.LR}
		w.set(&f, nil)
		replaced := false
		for i, old := range r.Fixes {
			if old.Kind == f.Kind && old.Verified == "" {
				f.Modules = old.Modules
				r.Fixes[i] = f
				replaced = true
				break
			}
		}
		if !replaced {
			r.Fixes = append(r.Fixes, f)
		}
	}
}

func judgeRun(run Run) report.ContinuationRun {
	x := report.ContinuationRun{Fix: run.Fix, Precision: run.Precision, Scaler: run.Scaler, ClipNorm: run.ClipNorm, LR: run.LR,
		Losses: make([]float64, len(run.Losses)), Skipped: run.Skipped, Error: run.Error}
	if x.Skipped == nil {
		x.Skipped = []bool{}
	}
	for i, l := range run.Losses {
		x.Losses[i] = float64(l)
		if math.IsNaN(x.Losses[i]) || math.IsInf(x.Losses[i], 0) {
			x.NonFinite++
		}
	}
	n := len(x.Losses)
	switch {
	case run.Error != "" || n == 0:
		x.Outcome = "diverged"
	case x.NonFinite == 0:
		x.Outcome = "finite"
	case finite(x.Losses[n-1]):
		x.Outcome = "recovered"
	default:
		x.Outcome = "diverged"
	}
	if x.Outcome != "diverged" {
		w := max(1, min(10, n/5))
		sum, k := 0.0, 0
		for _, l := range x.Losses[n-w:] {
			if finite(l) {
				sum += l
				k++
			}
		}
		if k > 0 {
			v := sum / float64(k)
			x.Final = &v
		}
	}
	return x
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

func runSummary(x report.ContinuationRun, steps int, fp32 *report.ContinuationRun) string {
	what := map[string]string{report.FixFP32: "fp32", report.FixBF16: "bf16", report.FixClip: "fp16 with clipping",
		report.FixLowerLR: "fp16 with a tenth of the learning rate"}[x.Fix]
	if what == "" {
		what = x.Fix
	}
	if x.Fix == report.FixClip && x.ClipNorm != nil {
		what += fmt.Sprintf(" at max_norm %.3g", *x.ClipNorm)
	}
	head := fmt.Sprintf("%d steps of %s from the captured state", steps, what)
	if x.Error != "" {
		return head + " failed to run: " + x.Error
	}
	var kept string
	switch x.Outcome {
	case "finite":
		kept = "kept the loss finite"
	case "recovered":
		kept = fmt.Sprintf("recovered: %d non-finite step(s) skipped, the loss finite at the end", x.NonFinite)
	default:
		kept = fmt.Sprintf("diverged: the loss is non-finite at the end (%d non-finite steps)", x.NonFinite)
	}
	gap := ""
	switch {
	case x.Fix == report.FixFP32 && x.Final != nil:
		gap = fmt.Sprintf(", ending at a loss of %.4g", *x.Final)
	case x.RelToFP32 != nil && fp32 != nil && fp32.Final != nil:
		gap = fmt.Sprintf(", ending %s fp32's loss (%.4g against %.4g)", relText(*x.RelToFP32), *x.Final, *fp32.Final)
	case fp32 != nil && fp32.Outcome == "diverged":
		gap = "; fp32 diverged too"
	}
	return head + " " + kept + gap
}

func relText(rel float64) string {
	switch {
	case math.Abs(rel) < 0.0005:
		return "at"
	case rel > 0:
		return fmt.Sprintf("%.1f%% above", 100*rel)
	}
	return fmt.Sprintf("%.1f%% below", -100*rel)
}
