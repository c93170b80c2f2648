package cli

import (
	"fmt"
	"io"
	"strings"

	"fp16audit/internal/audit"
	"fp16audit/internal/execute"
	"fp16audit/internal/render"
	"fp16audit/report"
)

// replayOptions are the flags of `fp16audit replay`.
type replayOptions struct {
	format, output, ortLib, device, maxMem, progress string
	continuations, from                              string
	threads                                          int
	tolerance                                        float64
	noFixes, noColor                                 bool
}

func cmdReplay(args []string, stdout, stderr io.Writer) int {
	var o replayOptions
	fs := newFlagSet("replay", "fp16audit replay CAPTURE [flags]",
		"  fp16audit replay captures/step-000412-scale-collapse\n"+
			"  fp16audit replay captures/step-000045-nonfinite-loss --format html --output replay.html\n"+
			"  fp16audit replay CAPTURE --format json -o replay.json && \\\n"+
			"    fp16audit replay CAPTURE --from replay.json --continuations continuations.json\n\n"+
			"CAPTURE is a folder the Python recorder wrote when a training step failed\n"+
			"(AmpRecorder(..., capture=\"captures/\"), Fp16AuditCallback(capture=...); docs/capture.md).\n"+
			"The replay runs that step's train-mode forward and scaled backward at the captured weights\n"+
			"and loss scale, in fp32, in the run's precision (emulated) and in bf16, and says what\n"+
			"happened: the data, a forward overflow, a gradient overflow, underflow, or not reproduced.\n"+
			"It needs neither torch nor the model's code nor a GPU. fp16audit.replay() in Python adds\n"+
			"the continuations (--continuations) that verify clipping, a lower learning rate, bf16 and\n"+
			"fp32 over steps. Exit status: 0 not reproduced, 1 a failure reproduced, 2 a refused\n"+
			"capture or bad flags, 3 a model that does not run. See docs/replay.md.", stdout)
	fs.StringVar(&o.format, "format", "text", "output format: "+strings.Join(render.Formats(report.KindReplay), ", "))
	fs.StringVarP(&o.output, "output", "o", "", "write the report to FILE instead of stdout")
	fs.StringVar(&o.continuations, "continuations", "", "the continuations fp16audit.replay() ran from this capture (JSON): they verify the fixes that need steps")
	fs.StringVar(&o.from, "from", "", "an earlier replay of this capture (its JSON): judge --continuations onto it instead of replaying again")
	fs.Float64Var(&o.tolerance, "lost-mass-tolerance", audit.DefaultGradMassTolerance, "a loss scale is clean when no parameter gradient loses more than this share of its L2 norm to fp16")
	fs.BoolVar(&o.noFixes, "no-fixes", false, "skip the forward's fix reruns (keep-fp32 search)")
	fs.BoolVar(&o.noColor, "no-color", false, "text: no colours even on a terminal (as does a set NO_COLOR)")
	fs.StringVar(&o.progress, "progress", "auto", "progress on stderr: auto, bar, json or none")
	fs.StringVar(&o.ortLib, "ort-lib", "", "path to libonnxruntime.so (default: $ONNXRUNTIME_LIB, then .ort/, then system folders)")
	fs.IntVar(&o.threads, "threads", 0, "ONNX Runtime intra-op threads (0: one per core)")
	fs.StringVar(&o.device, "device", "cpu", "execution provider: cpu or cuda")
	fs.StringVar(&o.maxMem, "max-memory", "", "memory the replay may take, e.g. 4G (as fp16audit run's --max-memory)")
	if done, code := parseFlags(fs, args, stderr); done {
		return code
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "fp16audit replay: "+format+"\nRun 'fp16audit replay --help' for usage.\n", a...)
		return exitUsage
	}
	if fs.NArg() != 1 {
		return usage("want exactly one CAPTURE folder, got %d", fs.NArg())
	}
	if !render.IsFormat(o.format, report.KindReplay) {
		return usage("--format %q: want %s", o.format, strings.Join(render.Formats(report.KindReplay), ", "))
	}
	if !(o.tolerance > 0 && o.tolerance < 1) {
		return usage("--lost-mass-tolerance %g: want a share of the gradient norm in (0, 1), such as 0.01", o.tolerance)
	}
	if o.from != "" && o.continuations == "" {
		return usage("--from judges --continuations onto an earlier replay: give --continuations too")
	}
	rc := audit.ReplayConfig{Capture: fs.Arg(0), ORTLib: o.ortLib, Threads: o.threads, Device: o.device, NoFixes: o.noFixes,
		Tolerance: o.tolerance, Continuations: o.continuations, From: o.from}
	if o.maxMem != "" {
		var err error
		if rc.MaxMemory, err = execute.ParseSize(o.maxMem); err != nil {
			return usage("--max-memory: %v", err)
		}
	}
	bar, progress, err := progressFor(o.progress, stderr)
	if err != nil {
		return usage("%v", err)
	}
	rc.Progress = progress
	ctx, stop := interruptible(stderr)
	defer stop()
	r, err := audit.Replay(ctx, rc)
	bar.done()
	if err != nil {
		return reportError(stderr, err)
	}
	topt := render.TextOptions{}
	if o.output == "" {
		topt.Color, topt.Width = terminalStyle(stdout, o.noColor)
	}
	if err := writeDocument(r, o.format, o.output, render.Options{Text: topt}, stdout); err != nil {
		fmt.Fprintf(stderr, "fp16audit replay: %v\n", err)
		return exitUsage
	}
	if r.Verdict == report.ReplayNotReproduced {
		return exitOK
	}
	return exitFindings
}
