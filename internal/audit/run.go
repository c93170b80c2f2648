// Package audit runs one audit from end to end: it loads the model and its
// batches, plans the precision of every value under the policy, rewrites
// the graph into the fp32 reference and the emulated passes, executes them,
// diagnoses what they observed and assembles the report. Each of those
// steps is a package of its own (see docs/architecture.md); this package
// only wires them together, in one direction.
package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"fp16audit/checks"
	"fp16audit/internal/batch"
	"fp16audit/internal/diagnose"
	"fp16audit/internal/diagnose/evidence"
	"fp16audit/internal/diagnose/fix"
	"fp16audit/internal/diagnose/inputs"
	"fp16audit/internal/execute"
	"fp16audit/internal/lint"
	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
	"fp16audit/report"
)

// Optimization is the ONNX Runtime graph optimization level of every pass.
// Every pass runs without graph optimizations: fusions (Conv+BatchNorm
// folding, NCHWc kernels) change rounding and could merge the emulation's
// rounding Casts away, and the instrumented graphs block most of them
// anyway. So each node computes as written, as in PyTorch, and the fp32
// pass returns bit for bit what a plain run at the same level returns.
const Optimization = "none"

// Config is everything one audit needs. The command line fills it from flags;
// tests fill it directly.
type Config struct {
	ModelPath string
	// Inputs are the -i arguments: "name=path" or "path".
	Inputs []string
	// Shapes pins symbolic dimensions (--shape name=1x3x224x224).
	Shapes map[string][]int64
	// Seed and SyntheticBatches control generated inputs when Inputs is empty.
	Seed             int64
	SyntheticBatches int

	// Policy names the precision policy (precision.Policies); "" is
	// autocast-fp16.
	Policy string
	// Checks selects the checks that run; the zero value runs all.
	Checks checks.Selection
	// NoFixes skips the fix reruns (standardized inputs, keep-fp32).
	NoFixes bool
	// Passes chooses the what-if passes (--passes, see WhatIfPasses):
	// PassesAuto (or empty) runs each when its condition holds,
	// PassesAll every one that applies, PassesNone none, or a list of
	// their names.
	Passes     []string
	Thresholds evidence.Thresholds

	ORTLib  string
	Threads int
	Device  string
	// AutocastDevice is the device_type the user's torch.autocast runs
	// on, which the fix texts name; "" is "cuda".
	AutocastDevice string
	// Trainer names the trainer whose words the fix texts use
	// (words.Names: fastai, transformers, lightning, accelerate, torch);
	// "" is fastai.
	Trainer string
	// MaxMemory bounds the memory of the process while the passes run, in
	// bytes (--max-memory): a batch over it runs in parts of fewer
	// samples. 0 plans for execute.DefaultMemoryFraction of the available
	// memory.
	MaxMemory int64

	Progress execute.Progress

	// Train is the training side: the forward passes' mode and the
	// backward audit (train.go).
	Train TrainConfig
}

// audit is the state of one run.
type audit struct {
	cfg   Config
	model *onnx.Model
	up    *onnx.ModelProto // upcast: truly fp32
	// fwd is up with the values a selection ranks among its graph
	// outputs (selections.go): the graph every forward pass starts from.
	fwd *onnx.ModelProto
	// ref is fwd with NaN and ±Inf where PyTorch's ops make them
	// (rewrite.TorchNonFinite): the fp32 pass's graph; emulate makes the
	// other passes' the same way.
	ref *onnx.ModelProto
	// ranked are the values judged in place of the chosen outputs.
	ranked  []string
	policy  *precision.Policy
	static  *lint.Facts
	main    string // the policy's emulated pass ("" under fp32)
	specs   []batch.InputSpec
	batches []batch.Batch
	engine  *execute.Engine
	passes  map[string]*observe.PassResult
	// halfCast marks the model's own Cast-to-half nodes.
	halfCast map[int]bool
	report   *report.Report
	train    *trainer
	// lib is the ONNX Runtime library the passes run in.
	lib string
	// dropped are the roots whose epsilon the exporter dropped and the
	// audit put back (restoreEpsilons), droppedNote the report's note.
	dropped     []onnx.DroppedAdd
	droppedNote string
}

// Run audits one model: it loads the model and its batches, runs the fp32
// reference and the emulated passes through ONNX Runtime, diagnoses the
// result and verifies the fixes. Errors are *UsageError (bad inputs or
// flags), *ModelError (the model cannot be loaded or run) or
// *onnxrt.LibraryNotFoundError.
func Run(ctx context.Context, cfg Config) (*report.Report, error) {
	a, err := run(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return a.report, nil
}

// run is Run, returning the audit's state with its report.
func run(ctx context.Context, cfg Config) (*audit, error) {
	return runThen(ctx, cfg, nil)
}

// runThen is run, with then called on the finished audit while its
// engine and shared weights are still open (the replay's forward of the
// previous batch runs there, as one more run of the same audit).
func runThen(ctx context.Context, cfg Config, then func(context.Context, *audit) error) (*audit, error) {
	start := time.Now()
	if cfg.Policy == "" {
		cfg.Policy = precision.DefaultPolicy
	}
	if cfg.Thresholds == (evidence.Thresholds{}) {
		cfg.Thresholds = evidence.DefaultThresholds
	}
	// Thresholds set before the output tolerances existed keep the
	// defaults for them: a tolerance of 0 would fail every pass.
	if cfg.Thresholds.OutputTolFP16 == 0 {
		cfg.Thresholds.OutputTolFP16 = evidence.DefaultThresholds.OutputTolFP16
	}
	if cfg.Thresholds.OutputTolBF16 == 0 {
		cfg.Thresholds.OutputTolBF16 = evidence.DefaultThresholds.OutputTolBF16
	}
	if err := CheckPasses(cfg.Passes); err != nil {
		return nil, &UsageError{Err: err}
	}
	if cfg.MaxMemory < 0 {
		return nil, &UsageError{Err: fmt.Errorf("max memory: want a positive size, got %d", cfg.MaxMemory)}
	}
	policy, err := precision.PolicyByName(cfg.Policy)
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	m, err := onnx.Load(cfg.ModelPath)
	if err != nil {
		return nil, &ModelError{Path: cfg.ModelPath, Err: err}
	}
	if err := m.Flatten(); err != nil {
		return nil, &ModelError{Path: cfg.ModelPath, Err: err}
	}
	a := &audit{cfg: cfg, model: m, policy: policy, passes: map[string]*observe.PassResult{}}
	if err := a.applyMode(); err != nil {
		return nil, err
	}
	if err := a.restoreEpsilons(); err != nil {
		return nil, err
	}
	m = a.model
	a.specs = batch.Specs(m.Proto.Graph, m.Index)
	batches, notes, err := batch.Load(a.specs, batch.Options{
		Args: cfg.Inputs, Shapes: cfg.Shapes, Seed: cfg.Seed, SyntheticBatches: cfg.SyntheticBatches,
	})
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	a.batches = batches
	lib, err := onnxrt.FindLibrary(cfg.ORTLib)
	if err != nil {
		return nil, err
	}
	if err := onnxrt.Init(lib); err != nil {
		return nil, err
	}
	a.lib = lib
	device := cfg.Device
	if device == "" {
		device = "cpu"
	}
	a.report = newReport(m, policy, device, cfg.Threads, batches)
	if a.droppedNote != "" {
		a.report.Notes = append(a.report.Notes, a.droppedNote)
	}
	if len(m.Inlined) > 0 {
		a.report.Notes = append(a.report.Notes, fmt.Sprintf("the calls of %d local function(s) were expanded into the graph (%s): each op inside is placed by the policy and reported as <call>/<node>",
			len(m.Inlined), strings.Join(limitList(m.Inlined, 6), ", ")))
	}
	for _, n := range notes {
		if n.Input != "" {
			a.report.Notes = append(a.report.Notes, fmt.Sprintf("input %q: %s", n.Input, n.Text))
		} else {
			a.report.Notes = append(a.report.Notes, n.Text)
		}
	}
	if err := a.plan(device); err != nil {
		return nil, &ModelError{Path: cfg.ModelPath, Err: err}
	}
	// One load per audit: every session from here on (the passes, the
	// what-if passes, the fix reruns, the backward) shares these weights.
	if err := a.engine.Share(a.up.Graph, a.fwd.Graph); err != nil {
		return nil, err
	}
	defer a.engine.Close()
	loaded := time.Since(start)
	// The scan of the constants (the dynamic checks read it; on a large
	// model it reads every weight) runs beside the passes.
	go func() { _, _ = a.static.Constants() }()
	if err := a.runMainPasses(ctx); err != nil {
		return nil, a.runError(err)
	}
	facts := &evidence.Facts{Static: a.static, HalfCasts: a.halfCast,
		Inputs: inputs.Analyze(a.specs, a.batches, m.Index, cfg.Thresholds.ColumnScale), Passes: a.passes, Main: a.main,
		Values: a.engine.Observe, Thresholds: cfg.Thresholds, Ranked: a.ranked, AutocastDevice: cfg.AutocastDevice, Trainer: cfg.Trainer}
	d, err := diagnose.Run(ctx, facts, a, a.batches, diagnose.Options{Checks: cfg.Checks, NoFixes: cfg.NoFixes})
	if err != nil {
		return nil, a.runError(err)
	}
	a.report.Inputs = inputReports(facts.Inputs)
	a.report.Nodes = a.nodeReports()
	a.report.Summary = summarize(a.report, facts)
	a.report.Verdict, a.report.VerdictText = d.Verdict, d.VerdictText
	a.report.Origins, a.report.Fixes, a.report.Findings = d.Origins, d.Fixes, d.Findings
	a.report.OutputAgreement = d.OutputAgreement
	a.report.Blocks = blockReports(m.Proto.Graph, m.Index, a.report.Nodes, a.main, a.report.Origins, facts.Masked)
	a.report.Notes = append(a.report.Notes, d.Notes...)
	if err := a.auditTraining(ctx); err != nil {
		return nil, a.runError(err)
	}
	if then != nil {
		if err := then(ctx, a); err != nil {
			return nil, a.runError(err)
		}
	}
	a.report.Tool.ElapsedSecs = time.Since(start).Seconds()
	a.report.Tool.Timing = a.timing(loaded)
	return a, nil
}

// timing says where the audit's time went: loading (up to the plan), each
// run of the engine with its sessions, the backward.
func (a *audit) timing(loaded time.Duration) *report.Timing {
	t := &report.Timing{LoadSecs: loaded.Seconds(), Runs: []report.RunTiming{}}
	for _, r := range a.engine.Timings() {
		t.Runs = append(t.Runs, report.RunTiming{Passes: r.Passes, Secs: r.Total.Seconds(), SessionSecs: r.Sessions.Seconds(), Sessions: r.Created})
		t.SessionSecs += r.Sessions.Seconds()
		t.Sessions += r.Created
	}
	if tr := a.report.Training; tr != nil && tr.Backward != nil {
		t.BackwardSecs = tr.Backward.ElapsedSecs
	}
	return t
}

// runError classifies an error of the passes: a cancelled context stays
// itself, a memory refusal is a usage error, anything else is the model's.
func (a *audit) runError(err error) error {
	var be *execute.BudgetError
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.As(err, &be):
		return &UsageError{Err: be.Err}
	case IsUsage(err):
		return err
	}
	return &ModelError{Path: a.cfg.ModelPath, Err: err}
}

// plan builds the upcast graph and the policy's precision of every value,
// and sets up the engine that runs the passes.
func (a *audit) plan(device string) error {
	g := a.model.Proto.Graph
	up, halfCasts, err := rewrite.Upcast(a.model.Proto, a.model.Dir)
	if err != nil {
		return err
	}
	a.up = up
	upIdx, err := onnx.NewIndex(up.Graph)
	if err != nil {
		return err
	}
	var kinds map[string]execute.OutputKind
	a.fwd, a.ranked, kinds = judgedOutputs(up, a.model.Index, upIdx)
	a.ref = rewrite.TorchNonFinite(a.fwd)
	a.static = lint.NewFacts(a.model, a.policy)
	a.static.Dropped = a.dropped // the file's, as exported
	a.halfCast = map[int]bool{}
	for _, i := range halfCasts {
		// A cast to the type the model is stored in follows the policy
		// (precision.Storage): it is not the model's own half cast.
		if n := g.Node[i]; a.static.Storage == 0 || onnx.FindAttr(n, "to").GetI() != int64(a.static.Storage) {
			a.halfCast[i] = true
		}
	}
	var names []string
	for _, ni := range a.static.Order {
		// Constants are known without running, and their scalar outputs
		// could not come back through onnxruntime_go (rank-0 outputs).
		if n := g.Node[ni]; n.OpType == "Constant" && onnx.IsDefaultDomain(n.Domain) {
			continue
		}
		for _, o := range g.Node[ni].Output {
			// a sequence or an optional holds no statistics of its own:
			// the tensors taken out of it are observed
			if t := upIdx.ElemType(o); o != "" && upIdx.Tensor(o) && (onnx.IsFloatType(t) || t == 0) {
				names = append(names, o)
			}
		}
	}
	if a.policy.Lower != precision.FP32 {
		a.main = a.policy.Lower.String()
	}
	if note := storageNote(a.model, a.static.Storage, a.policy); note != "" {
		a.report.Notes = append(a.report.Notes, note)
	}
	if unknown := a.static.Assign.Unknown; len(unknown) > 0 {
		var labels []string
		for _, i := range unknown {
			labels = append(labels, onnx.NodeName(g, i)+" ("+opName(g.Node[i])+")")
		}
		a.report.Notes = append(a.report.Notes, fmt.Sprintf("%d node(s) of unknown precision were emulated as following their inputs: %s",
			len(labels), strings.Join(limitList(labels, 10), ", ")))
	}
	a.engine = &execute.Engine{
		Library: a.lib,
		Inputs:  batch.Names(a.specs),
		Session: onnxrt.SessionOptions{Threads: a.cfg.Threads, Device: device, ExternalDataDir: a.model.Dir, Optimization: Optimization},
		Order:   a.static.Order, Nodes: len(g.Node),
		Observe: names, ElemType: upIdx.ElemType, Contents: upIdx.Contents(),
		MaxMemory: a.cfg.MaxMemory, Progress: a.cfg.Progress, ModelFile: a.model.Path,
		Outputs: kinds,
	}
	return nil
}

func opName(n *onnx.NodeProto) string {
	if !onnx.IsDefaultDomain(n.Domain) {
		return n.Domain + "::" + n.OpType
	}
	return n.OpType
}

func limitList(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(append([]string(nil), s[:n]...), fmt.Sprintf("and %d more", len(s)-n))
}

// runMainPasses runs the fp32 reference and the policy's emulated pass,
// with the what-if passes --passes asks for, side by side in one session,
// batch by batch and, when the memory budget asks for it, in parts of a
// batch; then, in a session of their own, the what-if passes whose
// condition the results meet (--passes auto).
func (a *audit) runMainPasses(ctx context.Context) error {
	passes := []execute.Pass{{Name: report.PassFP32, Model: a.ref}}
	if a.main == report.PassBF16 && !castsToBF16(a.fwd) {
		return &UsageError{Err: fmt.Errorf("policy %s: the model imports ONNX opset %d, and emulating bf16 needs Cast to bfloat16 (opset 13); use an fp16 policy or re-export with opset_version >= 13", a.policy.Name, defaultOpset(a.fwd))}
	}
	if a.main != "" {
		passes = append(passes, execute.Pass{Name: a.main, Model: a.emulate(a.fwd, a.static.Assign), Ref: report.PassFP32})
	}
	var later []whatIf
	for _, w := range whatIfPasses {
		why := w.applies(a)
		switch mode := passMode(a.cfg.Passes, w.name); {
		case why != "":
			if slices.Contains(a.cfg.Passes, w.name) || (!w.quiet && a.main == report.PassFP16) {
				a.report.Notes = append(a.report.Notes, fmt.Sprintf("no %s pass: %s", w.name, why))
			}
		case mode == passAsked:
			passes = append(passes, w.pass(a, report.PassFP32))
		case mode == passAuto:
			later = append(later, w)
		}
	}
	if err := a.runPasses(ctx, passes); err != nil {
		return err
	}
	for _, w := range later {
		if !w.wanted(a) {
			continue
		}
		// In its own session the pass has no fp32 values to compare with
		// element by element (its statistics are complete); the fp32 pass
		// runs beside it for its graph outputs alone, which the pass's
		// outputs (and the bf16 fix) are judged by.
		p := w.pass(a, "")
		p.OutputRef = report.PassFP32
		if err := a.runPasses(ctx, []execute.Pass{{Name: report.PassFP32, Model: a.ref, OutputsOnly: true}, p}); err != nil {
			return err
		}
		a.report.Notes = append(a.report.Notes, fmt.Sprintf("the %s pass ran because %s (--passes %s runs it beside the others, --passes none never)", w.name, w.because, w.name))
	}
	return nil
}

// runPasses runs passes over the batches in one session and records
// their results.
func (a *audit) runPasses(ctx context.Context, passes []execute.Pass) error {
	results, plan, err := a.engine.Run(ctx, passes, a.batches)
	if err != nil {
		return err
	}
	for _, n := range a.engine.Notes() {
		if !slices.Contains(a.report.Notes, n) {
			a.report.Notes = append(a.report.Notes, n)
		}
	}
	if n := plan.Note(); n != "" && !slices.Contains(a.report.Notes, n) {
		a.report.Notes = append(a.report.Notes, n)
	}
	for i, r := range results {
		if passes[i].OutputsOnly {
			continue // a reference for outputs, already run in full
		}
		a.report.Passes = append(a.report.Passes, r.Name)
		a.passes[r.Name] = r
	}
	return nil
}

// Rerun runs one extra emulated pass (a fix being verified), its graph
// outputs compared with fp32's, or the fp32 reference on some samples, and
// returns its results.
func (a *audit) Rerun(ctx context.Context, r fix.Rerun) (*observe.PassResult, error) {
	if r.Reference {
		m := a.ref
		if len(r.Epsilon) > 0 {
			var err error
			if m, err = rewrite.AddEpsilon(a.fwd, r.Epsilon); err != nil {
				return nil, err
			}
			m = rewrite.TorchNonFinite(m)
		}
		res, _, err := a.engine.Run(ctx, []execute.Pass{{Name: r.Name, Model: m}}, r.Batches)
		if err != nil {
			return nil, err
		}
		return res[0], nil
	}
	up := a.fwd
	if len(r.Clamp) > 0 {
		var err error
		if up, err = rewrite.ClampConstants(up, r.Clamp, a.model.Dir); err != nil {
			return nil, err
		}
	}
	// The fp32 pass runs beside the fix for its graph outputs alone: a fix
	// works only when the outputs agree with fp32's on the same inputs
	// (standardized ones, for that fix).
	res, _, err := a.engine.Run(ctx, []execute.Pass{{Name: report.PassFP32, Model: a.ref, OutputsOnly: true},
		{Name: r.Name, Model: a.emulate(up, r.Assign), OutputRef: report.PassFP32}}, r.Batches)
	if err != nil {
		return nil, err
	}
	return res[1], nil
}

// emulate returns the emulated pass of assignment as over up (fwd or a
// copy of it), with NaN and ±Inf where PyTorch's ops make them.
func (a *audit) emulate(up *onnx.ModelProto, as *precision.Assignment) *onnx.ModelProto {
	return rewrite.TorchNonFinite(rewrite.Emulate(up, a.model.Proto.Graph, as))
}

// defaultOpset returns the version of the default ONNX domain m imports.
func defaultOpset(m *onnx.ModelProto) int64 {
	for _, o := range m.OpsetImport {
		if onnx.IsDefaultDomain(o.Domain) {
			return o.Version
		}
	}
	return 0
}

// castsToBF16 reports whether m's opset has Cast to bfloat16 (opset 13).
func castsToBF16(m *onnx.ModelProto) bool { return defaultOpset(m) >= 13 }

// IsUsage reports whether err is a usage or input error (exit code 2).
func IsUsage(err error) bool {
	var u *UsageError
	return errors.As(err, &u)
}

// storageNote says how a model with half weights or inputs is audited: a
// model stored in half (precision.Storage) as its checkpoint loaded in
// fp32 under autocast, converted by model.half() under half; half tensors
// in an fp32 model stay half under every policy.
func storageNote(m *onnx.Model, storage int32, p *precision.Policy) string {
	half := halfSources(m)
	if len(half) == 0 {
		return ""
	}
	list := strings.Join(limitList(half, 5), ", ")
	if storage == 0 {
		return fmt.Sprintf("the model stores %s in half precision beside fp32 weights: they stay half under every policy, as user code made them", list)
	}
	name := precision.PrecisionOf(storage).String()
	how := fmt.Sprintf("policy %s runs the checkpoint loaded in fp32 (model.float(), which autocast and GradScaler need)", p.Name)
	if p.Params == precision.FP16 {
		how = "policy half runs the checkpoint converted with model.half(): it answers whether this checkpoint runs in fp16"
	}
	return fmt.Sprintf("the model is stored in %s (%s; exported after model.%s()): %s, and its casts to %s follow that dtype; an audit of training wants the fp32 export",
		name, list, map[string]string{"fp16": "half", "bf16": "bfloat16"}[name], how, name)
}

// halfSources lists the graph inputs and initializers the model stores in
// FLOAT16 or BFLOAT16.
func halfSources(m *onnx.Model) []string {
	var out []string
	weights := 0
	for _, t := range m.Proto.Graph.Initializer {
		if onnx.IsHalfType(t.DataType) {
			weights++
		}
	}
	if weights > 0 {
		out = append(out, fmt.Sprintf("%d weight(s)", weights))
	}
	for _, vi := range m.Index.GraphInputs() {
		if onnx.IsHalfType(vi.GetType().GetTensorType().GetElemType()) {
			out = append(out, fmt.Sprintf("input %q", vi.Name))
		}
	}
	return out
}
