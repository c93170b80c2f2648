package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"

	"github.com/spf13/pflag"

	"fp16audit/checks"
	"fp16audit/internal/audit"
	"fp16audit/internal/batch"
	"fp16audit/internal/diagnose/evidence"
	"fp16audit/internal/diagnose/words"
	"fp16audit/internal/execute"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/precision"
	"fp16audit/internal/render"
	"fp16audit/report"
)

// Exit codes, as documented in docs/reference/cli.md.
const (
	exitOK       = 0 // nothing at or above --fail-on
	exitFindings = 1 // findings at or above --fail-on
	exitUsage    = 2 // usage or input error
	exitModel    = 3 // the model could not be loaded or run
)

const usageText = `fp16audit audits an exported ONNX model for fp16 mixed-precision failures.

Usage:
  fp16audit run MODEL [flags]    run the model on sample batches and report every node
  fp16audit lint MODEL...        find fp16 hazards without running the model (pre-commit, CI)
  fp16audit checks               list the checks with their IDs, severities and policies
  fp16audit explain ID           print what a check detects and how to fix it
  fp16audit render REPORT.json   re-render a saved JSON report as html, markdown or text
  fp16audit scales RUN [flags]   diagnose a training run from its loss and loss-scale log
  fp16audit replay CAPTURE       replay a captured failing training step: what happened, which fix holds
  fp16audit version              print fp16audit's and ONNX Runtime's versions
  fp16audit help [COMMAND]       show help

Run 'fp16audit COMMAND --help' for a command's flags and an example.
`

// Main runs the command line and returns the process exit code. A panic
// below it is an internal error: the user gets a short message asking for
// a bug report and exit code 3, not a stack trace.
func Main(args []string, stdout, stderr io.Writer) (code int) {
	defer func() {
		if p := recover(); p != nil {
			code = internalError(stderr, args, p)
		}
	}()
	if panicHook != nil {
		panicHook(args)
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return exitUsage
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:], stdout, stderr)
	case "lint":
		return cmdLint(args[1:], stdout, stderr)
	case "checks":
		return cmdChecks(args[1:], stdout, stderr)
	case "explain":
		return cmdExplain(args[1:], stdout, stderr)
	case "render":
		return cmdRender(args[1:], stdout, stderr)
	case "scales":
		return cmdScales(args[1:], stdout, stderr)
	case "replay":
		return cmdReplay(args[1:], stdout, stderr)
	case "version", "--version":
		return cmdVersion(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		if len(args) > 1 {
			return Main([]string{args[1], "--help"}, stdout, stderr)
		}
		fmt.Fprint(stdout, usageText)
		return exitOK
	}
	fmt.Fprintf(stderr, "fp16audit: unknown command %q\n\n%s", args[0], usageText)
	return exitUsage
}

// panicHook, when set (by tests only), runs at the start of Main.
var panicHook func(args []string)

// internalError reports a recovered panic p and returns its exit code. The
// stack goes to stderr only when FP16AUDIT_DEBUG is set, for the render.
func internalError(stderr io.Writer, args []string, p any) int {
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = a
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`*?[]{}()<>|&;#~") {
			quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	fmt.Fprintf(stderr, "fp16audit: internal error: %v\n"+
		"This is a bug in fp16audit. Please report it with this command line (and, if you can, the model):\n"+
		"  fp16audit %s\n"+
		"Rerun with FP16AUDIT_DEBUG=1 to print the stack trace for the render.\n", p, strings.Join(quoted, " "))
	if os.Getenv("FP16AUDIT_DEBUG") != "" {
		stderr.Write(debug.Stack())
	}
	return exitModel
}

// newFlagSet returns a flag set whose --help prints the usage line, the
// flags with their defaults, and an example.
func newFlagSet(name, usage, example string, stdout io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SortFlags = false
	fs.SetOutput(stdout)
	fs.Usage = func() {
		fmt.Fprintf(stdout, "Usage:\n  %s\n\nFlags:\n%s\nExample:\n%s\n", usage, fs.FlagUsages(), example)
	}
	return fs
}

// parseFlags parses args; it returns done=true with the exit code when the
// command must stop (help shown or a usage error).
func parseFlags(fs *pflag.FlagSet, args []string, stderr io.Writer) (done bool, code int) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return true, exitOK
		}
		fmt.Fprintf(stderr, "fp16audit %s: %v\nRun 'fp16audit %s --help' for usage.\n", fs.Name(), err, fs.Name())
		return true, exitUsage
	}
	return false, 0
}

// runOptions are the flags of `fp16audit run`.
type runOptions struct {
	inputs  []string
	shapes  []string
	seed    int64
	batches int
	format  string
	output  string
	ortLib  string
	threads int
	device  string
	// autocastDevice is the device_type the fix texts name.
	autocastDevice string
	// trainer names the trainer whose words the fix texts use.
	trainer string
	maxMem  string

	policy      string
	checks      string
	failOn      string
	onlyFlagged bool
	noColor     bool
	noFixes     bool
	progress    string
	passes      []string
	thresholds  evidence.Thresholds
	train       trainFlags
}

func cmdRun(args []string, stdout, stderr io.Writer) int {
	var o runOptions
	fs := newFlagSet("run", "fp16audit run MODEL [flags]",
		"  fp16audit run model.onnx -i input=batch.npy --format json --output render.json\n"+
			"  fp16audit run model.onnx -i x.npy --mode train --loss cross-entropy --target y.npy\n"+
			"  fp16audit run llama.onnx -i input_ids=ids.npy --loss cross-entropy --lm-shift --target labels.npy\n"+
			"  fp16audit run model.onnx -i batch.npz --trainer transformers   # fixes in the Hugging Face Trainer's words (bf16=True, ...)", stdout)
	fs.StringArrayVarP(&o.inputs, "input", "i", nil, "batch for an input: NAME=PATH or PATH (in input order); PATH is .npy, .npz, .pb or a folder (repeatable)")
	fs.StringArrayVar(&o.shapes, "shape", nil, "fix a symbolic dimension of an input: NAME=1x3x224x224 (repeatable)")
	fs.Int64Var(&o.seed, "seed", 1, "seed for synthetic inputs when no -i is given, and for Dropout masks in --mode train")
	fs.IntVar(&o.batches, "synthetic-batches", 1, "number of synthetic batches when no -i is given")
	fs.StringVar(&o.policy, "policy", precision.DefaultPolicy, "precision policy: "+policyNames())
	fs.StringVar(&o.checks, "checks", "all", "report only these checks: comma-separated IDs, prefixes such as FP3* and all, each optionally negated with -; later entries win")
	fs.StringVar(&o.failOn, "fail-on", "error", "exit 1 when a finding reaches this severity: error, warning or never")
	fs.StringVar(&o.format, "format", "text", "output format: "+strings.Join(render.Formats(report.KindAudit), ", "))
	fs.BoolVar(&o.onlyFlagged, "only-flagged", false, "text: list only nodes with NaN/Inf in some pass")
	fs.BoolVar(&o.noColor, "no-color", false, "text: no colours even on a terminal (as does a set NO_COLOR)")
	fs.BoolVar(&o.noFixes, "no-fixes", false, "skip the fix reruns (standardized inputs, keep-fp32 search)")
	fs.StringVar(&o.progress, "progress", "auto", "progress on stderr: auto (a bar when stderr is a terminal), bar, json (a JSON line per finished batch of a pass, for programs such as the Python package), none")
	fs.StringSliceVar(&o.passes, "passes", []string{audit.PassesAuto}, "what-if passes beyond fp32 and the policy's: auto (each when needed: bf16 when the fp16 pass fails, as-written when the policy's pass fails and the model casts to half itself), all, none, or names ("+strings.Join(audit.WhatIfPasses(), ", ")+")")
	o.thresholds = evidence.DefaultThresholds
	fs.Float64Var(&o.thresholds.HeadroomBits, "headroom-bits", o.thresholds.HeadroomBits, "warn (FP2004) when a value held in fp16 has less fp32 headroom than this, in bits")
	fs.Float64Var(&o.thresholds.UnderflowFraction, "underflow-fraction", o.thresholds.UnderflowFraction, "warn (FP3001) when more than this fraction of a value's nonzero elements flush to zero in fp16")
	fs.Float64Var(&o.thresholds.ColumnScale, "column-scale", o.thresholds.ColumnScale, "flag tabular columns (FP1004) whose |mean| or std exceeds this")
	fs.IntVar(&o.thresholds.FixIterations, "fix-iterations", o.thresholds.FixIterations, "most reruns of the keep-fp32 fix search")
	fs.Var(toleranceFlag{&o.thresholds}, "output-tolerance", "fail (FP2006) a pass whose graph outputs are finite but whose worst sample differs from fp32 by more than this relative L2 error, per format: fp16=F,bf16=F (either alone)")
	o.train.register(fs)
	fs.StringVarP(&o.output, "output", "o", "", "write the report to FILE instead of stdout")
	fs.StringVar(&o.ortLib, "ort-lib", "", "path to libonnxruntime.so (default: $ONNXRUNTIME_LIB, then .ort/ from 'make ort', then system folders)")
	fs.IntVar(&o.threads, "threads", 0, "ONNX Runtime intra-op threads (0: ONNX Runtime's default, one per core)")
	fs.StringVar(&o.device, "device", "cpu", "execution provider: cpu or cuda")
	fs.StringVar(&o.autocastDevice, "autocast-device", "cuda", "the device_type the model trains with under torch.autocast (cuda, cpu, mps, xpu, ...), as the fixes name it")
	fs.StringVar(&o.trainer, "trainer", words.Default, "the trainer whose words the fixes use: "+strings.Join(words.Names(), ", ")+" (bf16 is learn.to_bf16(), bf16=True, precision=\"bf16-mixed\", Accelerator(mixed_precision=\"bf16\"), torch.autocast(dtype=torch.bfloat16))")
	fs.StringVar(&o.maxMem, "max-memory", "", fmt.Sprintf("memory the audit may take, the process as a whole, e.g. 512M or 4G; above it each batch runs in parts of fewer samples, and a model whose weights do not fit runs in blocks of consecutive layers (default %.0f%% of available memory)", 100*execute.DefaultMemoryFraction))
	if done, code := parseFlags(fs, args, stderr); done {
		return code
	}
	if code := applyRunConfig(fs, &o, stderr); code >= 0 {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "fp16audit run: want exactly one MODEL argument, got %d\nRun 'fp16audit run --help' for usage.\n", fs.NArg())
		return exitUsage
	}
	failOn, ok := failOnLevels[o.failOn]
	if !ok {
		fmt.Fprintf(stderr, "fp16audit run: --fail-on %q: want error, warning or never\n", o.failOn)
		return exitUsage
	}
	if !render.IsFormat(o.format, report.KindAudit) {
		fmt.Fprintf(stderr, "fp16audit run: --format %q: want one of %s\n", o.format, strings.Join(render.Formats(report.KindAudit), ", "))
		return exitUsage
	}
	if !deviceType.MatchString(o.autocastDevice) {
		fmt.Fprintf(stderr, "fp16audit run: --autocast-device %q: want a torch device type such as cuda, cpu, mps or xpu\n", o.autocastDevice)
		return exitUsage
	}
	if _, ok := words.Lookup(o.trainer); !ok {
		fmt.Fprintf(stderr, "fp16audit run: --trainer %q: want one of %s\n", o.trainer, strings.Join(words.Names(), ", "))
		return exitUsage
	}
	shapes := map[string][]int64{}
	for _, s := range o.shapes {
		name, dims, err := batch.ParseShape(s)
		if err != nil {
			fmt.Fprintf(stderr, "fp16audit run: --shape %q: %v\n", s, err)
			return exitUsage
		}
		shapes[name] = dims
	}
	var maxMem int64
	if o.maxMem != "" {
		var err error
		if maxMem, err = execute.ParseSize(o.maxMem); err != nil {
			fmt.Fprintf(stderr, "fp16audit run: --max-memory: %v\n", err)
			return exitUsage
		}
	}
	sel, _ := checks.ParseSelection(o.checks) // checked by applyRunConfig
	train, err := o.train.config()
	if err != nil {
		fmt.Fprintf(stderr, "fp16audit run: %v\n", err)
		return exitUsage
	}
	cfg := audit.Config{Checks: sel, Train: train,
		ModelPath: fs.Arg(0), Inputs: o.inputs, Shapes: shapes, Seed: o.seed, SyntheticBatches: o.batches,
		ORTLib: o.ortLib, Threads: o.threads, Device: o.device, AutocastDevice: o.autocastDevice, Trainer: o.trainer, MaxMemory: maxMem,
		Policy: o.policy, NoFixes: o.noFixes, Passes: o.passes, Thresholds: o.thresholds,
	}
	if err := audit.CheckPasses(o.passes); err != nil {
		fmt.Fprintf(stderr, "fp16audit run: %v\n", err)
		return exitUsage
	}
	bar, progress, err := progressFor(o.progress, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "fp16audit run: %v\n", err)
		return exitUsage
	}
	cfg.Progress = progress
	ctx, stop := interruptible(stderr)
	defer stop()
	r, err := audit.Run(ctx, cfg)
	bar.done()
	if err != nil {
		return reportError(stderr, err)
	}
	topt := render.TextOptions{OnlyFlagged: o.onlyFlagged}
	if o.output == "" {
		topt.Color, topt.Width = terminalStyle(stdout, o.noColor)
	}
	if err := writeDocument(r, o.format, o.output, render.Options{Text: topt}, stdout); err != nil {
		fmt.Fprintf(stderr, "fp16audit run: %v\n", err)
		return exitUsage
	}
	if failOn >= 0 && r.MaxSeverity() >= failOn {
		return exitFindings
	}
	return exitOK
}

// failOnLevels maps --fail-on to the lowest severity that fails; -1 never.
var failOnLevels = map[string]checks.Severity{"error": checks.SevError, "warning": checks.SevWarning, "never": -1}

// deviceType is the shape of a torch device type (--autocast-device).
var deviceType = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

func policyNames() string {
	var names []string
	for _, p := range precision.Policies() {
		names = append(names, p.Name)
	}
	return strings.Join(names, ", ")
}

// reportError prints err for the user and returns its exit code.
func reportError(stderr io.Writer, err error) int {
	var libErr *onnxrt.LibraryNotFoundError
	switch {
	case audit.IsUsage(err):
		fmt.Fprintf(stderr, "fp16audit: %v\n", err)
		return exitUsage
	case errors.As(err, &libErr):
		fmt.Fprintf(stderr, "fp16audit: %v\n", err)
		return exitModel
	case errors.Is(err, context.Canceled):
		fmt.Fprintln(stderr, "fp16audit: interrupted; no report written")
		return exitModel
	}
	fmt.Fprintf(stderr, "fp16audit: %v\n", err)
	return exitModel
}

// writeDocument renders doc in format to path, or to stdout when path is "":
// every command writes its result through here.
func writeDocument(doc report.Document, format, path string, ropt render.Options, stdout io.Writer) error {
	f, err := render.New(format, doc.Kind(), ropt)
	if err != nil {
		return err
	}
	return writeOutput(path, stdout, func(w io.Writer) error { return f.Render(w, doc) })
}

// writeOutput renders to path (atomically: a temporary file in the same
// folder, renamed into place, so an interrupted run never leaves half a
// report) or, when path is "", to stdout.
func writeOutput(path string, stdout io.Writer, render func(io.Writer) error) error {
	if path == "" {
		return render(stdout)
	}
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		// A device or a pipe (/dev/null, /dev/stdout, a FIFO) is written in
		// place: renaming a file over it would replace the device itself.
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		err = render(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		return nil
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	addPending(f.Name())
	defer dropPending(f.Name())
	defer os.Remove(f.Name())
	err = render(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// CreateTemp makes the file private; a report is an ordinary file.
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func cmdVersion(args []string, stdout, stderr io.Writer) int {
	var ortLib string
	fs := newFlagSet("version", "fp16audit version [--ort-lib PATH]", "  fp16audit version", stdout)
	fs.StringVar(&ortLib, "ort-lib", "", "path to libonnxruntime.so")
	if done, code := parseFlags(fs, args, stderr); done {
		return code
	}
	fmt.Fprintf(stdout, "fp16audit %s\n", report.Version)
	lib, err := onnxrt.Locate(ortLib)
	if err == nil {
		err = onnxrt.Init(lib.Path)
	}
	if err != nil {
		fmt.Fprintf(stdout, "ONNX Runtime: not available (%v)\n", strings.SplitN(err.Error(), "\n", 2)[0])
		return exitOK
	}
	fmt.Fprintf(stdout, "ONNX Runtime %s (%s, from %s)\n", onnxrt.Version(), lib.Path, lib.From)
	return exitOK
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
