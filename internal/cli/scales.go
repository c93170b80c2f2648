package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/render"
	"fp16audit/internal/trainlog"
	"fp16audit/internal/trainlog/logfile"
	"fp16audit/report"
)

// scalesOptions are the flags of `fp16audit scales`.
type scalesOptions struct {
	baseline string
	format   string
	output   string
	failOn   string
	columns  string
	tags     string
	series   string
	checks   string
	noColor  bool
	opt      trainlog.Options
}

func cmdScales(args []string, stdout, stderr io.Writer) int {
	o := scalesOptions{opt: trainlog.DefaultOptions}
	fs := newFlagSet("scales", "fp16audit scales RUN [--baseline FP32RUN] [flags]",
		"  fp16audit scales run.json --baseline fp32.json\n"+
			"  fp16audit scales run.jsonl                    # the Python companion's log, with gradient telemetry\n"+
			"  fp16audit scales metrics.csv --columns step=iteration,loss=train_loss,scale=loss_scale\n"+
			"  fp16audit scales runs/exp1 --tag loss=train/loss,scale=amp/scale   # TensorBoard\n"+
			"  fp16audit scales history.csv --baseline fp32/history.csv          # fastai CSVLogger\n"+
			"  fp16audit scales scales.npy --series scale\n"+
			"  fp16audit scales run.csv --format json --output diagnosis.json --fail-on warning\n"+
			"  fp16audit scales run.csv --baseline fp32.csv --format html --output scales.html\n"+
			"  fp16audit scales run.csv --format markdown >> \"$GITHUB_STEP_SUMMARY\"\n"+
			"  fp16audit scales run.csv --checks all,-FP5008,-FP5009   # no warm-up or skip-rate findings\n\n"+
			"RUN is the loss and GradScaler scale of every optimizer step (or every N steps), as\n"+
			"fp16audit's JSON or CSV, a CSV/TSV/JSON/JSON Lines table whose columns are recognised by\n"+
			"name, a plain list of numbers (.npy, JSON array, one per line), a TensorBoard event file or\n"+
			"log directory, fastai's history.csv, or the Python companion's log (python/README.md),\n"+
			"whose capture lines (docs/capture.md) are named with their 'fp16audit replay' command.\n"+
			"See docs/scales.md.", stdout)
	fs.StringVar(&o.baseline, "baseline", "", "log of the same training in fp32 (losses), to tell a plateau from noise")
	fs.StringVar(&o.columns, "columns", "", "name the columns (or JSON fields) of a table: step=COL,loss=COL,scale=COL,skipped=COL,epoch=COL")
	fs.StringVar(&o.tags, "tag", "", "choose TensorBoard scalar tags: loss=TAG,scale=TAG,skipped=TAG")
	fs.StringVar(&o.series, "series", "", "what a plain list of numbers holds: loss, scale, or fastai-scales (MixedPrecision.scales: unskipped steps only); default: scale when every value is a power of two, else loss")
	fs.StringVar(&o.format, "format", "text", "output format: "+strings.Join(render.Formats(report.KindScales), ", "))
	fs.StringVarP(&o.output, "output", "o", "", "write the report to FILE instead of stdout")
	fs.StringVar(&o.failOn, "fail-on", "error", "exit 1 when a finding reaches this severity: error, warning or never")
	fs.StringVar(&o.checks, "checks", "all", "checks to run: comma-separated IDs (FP5001...), prefixes such as FP50* and all, each optionally negated with -; later entries win; a check switched off cannot decide the verdict")
	fs.BoolVar(&o.noColor, "no-color", false, "text: no colours even on a terminal (as does a set NO_COLOR)")
	fs.Float64Var(&o.opt.PlateauTolerance, "plateau-tolerance", o.opt.PlateauTolerance, "relative gap of the final loss over the baseline's that counts as a plateau")
	fs.IntVar(&o.opt.EarlySteps, "early-steps", o.opt.EarlySteps, "a NaN within this many steps is early, when the log does not give epochs (else: the first epoch)")
	fs.Float64Var(&o.opt.SkipRate, "skip-rate", o.opt.SkipRate, "lowest skip rate reported as high (never below two skips per growth interval)")
	fs.Float64Var(&o.opt.LowScale, "low-scale", o.opt.LowScale, "a pinned scale at or below this is low")
	fs.IntVar(&o.opt.PinnedIntervals, "pinned-intervals", o.opt.PinnedIntervals, "growth intervals without growth that make a pinned scale")
	fs.Float64Var(&o.opt.CollapseBits, "collapse-bits", o.opt.CollapseBits, "fall of the scale, in powers of two, that makes a collapse before a NaN (with as many halvings on finite losses) or, to --low-scale, holds the scale down")
	fs.IntVar(&o.opt.WarmupSkips, "warmup-skips", o.opt.WarmupSkips, "skipped steps at the start reported as wasted warm-up")
	fs.Float64Var(&o.opt.LostMassTolerance, "lost-mass-tolerance", o.opt.LostMassTolerance, "with gradient telemetry: a module whose gradient loses this share of its mass (L2 norm) to fp16 is named")
	fs.Float64Var(&o.opt.UnderflowFraction, "underflow-fraction", o.opt.UnderflowFraction, "with gradient telemetry recorded before lost_mass: a module whose gradient loses this fraction of its nonzero elements to fp16 underflow is named")
	if done, code := parseFlags(fs, args, stderr); done {
		return code
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "fp16audit scales: "+format+"\nRun 'fp16audit scales --help' for usage.\n", a...)
		return exitUsage
	}
	if fs.NArg() != 1 {
		return usage("want exactly one RUN log argument, got %d", fs.NArg())
	}
	failOn, ok := failOnLevels[o.failOn]
	if !ok {
		return usage("--fail-on %q: want error, warning or never", o.failOn)
	}
	if !render.IsFormat(o.format, report.KindScales) {
		return usage("--format %q: want %s", o.format, strings.Join(render.Formats(report.KindScales), " or "))
	}
	switch {
	case !(o.opt.PlateauTolerance >= 0):
		return usage("--plateau-tolerance %g: want a fraction of zero or more, such as 0.03", o.opt.PlateauTolerance)
	case o.opt.EarlySteps < 0 || o.opt.PinnedIntervals < 1 || o.opt.WarmupSkips < 1:
		return usage("--early-steps, --pinned-intervals and --warmup-skips want positive numbers")
	case !(o.opt.SkipRate >= 0 && o.opt.SkipRate <= 1):
		return usage("--skip-rate %g: want a fraction between 0 and 1", o.opt.SkipRate)
	case !(o.opt.LowScale > 0) || !(o.opt.CollapseBits > 0):
		return usage("--low-scale and --collapse-bits want positive numbers")
	case !(o.opt.UnderflowFraction > 0 && o.opt.UnderflowFraction <= 1):
		return usage("--underflow-fraction %g: want a fraction above 0 and at most 1", o.opt.UnderflowFraction)
	case !(o.opt.LostMassTolerance > 0 && o.opt.LostMassTolerance <= 1):
		return usage("--lost-mass-tolerance %g: want a fraction above 0 and at most 1, such as 0.01", o.opt.LostMassTolerance)
	}
	sel, err := checks.ParseSelection(o.checks)
	if err != nil {
		return usage("--checks: %v", err)
	}
	o.opt.Checks = sel
	ropt := logfile.ReadOptions{Series: o.series}
	switch o.series {
	case "", logfile.SeriesLoss, logfile.SeriesScale, logfile.SeriesFastaiScales:
	default:
		return usage("--series %q: want %s, %s or %s", o.series, logfile.SeriesLoss, logfile.SeriesScale, logfile.SeriesFastaiScales)
	}
	cols, err := logfile.ParseMapping(o.columns)
	if err != nil {
		return usage("--columns: %v", err)
	}
	tags, err := logfile.ParseMapping(o.tags)
	if err != nil {
		return usage("--tag: %v", err)
	}
	// --tag and --columns name the same thing for two kinds of log; a
	// meaning given by both must agree.
	ropt.Columns = cols
	for k, v := range tags {
		if c, ok := cols[k]; ok && c != v {
			return usage("--columns %s=%s and --tag %s=%s disagree: give one", k, c, k, v)
		}
		ropt.Columns[k] = v
	}

	run, err := logfile.Read(fs.Arg(0), ropt)
	if err != nil {
		return logError(stderr, err)
	}
	var baseline *trainlog.Log
	if o.baseline != "" {
		// The baseline is the fp32 run: what it holds is its losses.
		bopt := ropt
		bopt.Baseline, bopt.Series = true, logfile.SeriesLoss
		if baseline, err = logfile.Read(o.baseline, bopt); err != nil {
			return logError(stderr, err)
		}
		if baseline.Losses == nil {
			fmt.Fprintf(stderr, "fp16audit scales: --baseline %s has no losses: want the loss of every step of the fp32 run\n", o.baseline)
			return exitUsage
		}
	}
	r, err := trainlog.Analyze(run, baseline, o.opt)
	if err != nil {
		// An analyzer that cannot read its facts is a failure of the
		// tool, not of the log: exit 3, as a run that fails.
		fmt.Fprintf(stderr, "fp16audit scales: %v\n", err)
		return exitModel
	}
	var topt render.TextOptions
	if o.output == "" {
		topt.Color, _ = terminalStyle(stdout, o.noColor)
	}
	if err := writeDocument(r, o.format, o.output, render.Options{Text: topt}, stdout); err != nil {
		fmt.Fprintf(stderr, "fp16audit scales: %v\n", err)
		return exitUsage
	}
	if failOn >= 0 && r.MaxSeverity() >= failOn {
		return exitFindings
	}
	return exitOK
}

// logError prints a log that could not be read; a malformed or missing log
// is an input error (exit 2).
func logError(stderr io.Writer, err error) int {
	var pe *logfile.ParseError
	switch {
	case errors.As(err, &pe):
		fmt.Fprintf(stderr, "fp16audit scales: %v\n", err)
	case errors.Is(err, os.ErrNotExist):
		fmt.Fprintf(stderr, "fp16audit scales: %v: want a training log (see fp16audit scales --help)\n", err)
	default:
		fmt.Fprintf(stderr, "fp16audit scales: read log: %v\n", err)
	}
	return exitUsage
}
