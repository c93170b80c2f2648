package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"fp16audit/internal/batch"
	"fp16audit/internal/capture"
	"fp16audit/internal/diagnose"
	"fp16audit/internal/diagnose/evidence"
	"fp16audit/internal/diagnose/inputs"
	"fp16audit/internal/diagnose/replay"
	"fp16audit/internal/execute"
	"fp16audit/internal/observe"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
	"fp16audit/report"
)

// ReplayConfig is one replay of a captured training step (`fp16audit
// replay`).
type ReplayConfig struct {
	// Capture is the capture folder.
	Capture string
	ORTLib  string
	Threads int
	Device  string
	// MaxMemory bounds the process while the passes run (see Config).
	MaxMemory int64
	Progress  execute.Progress
	// NoFixes skips the forward's fix reruns.
	NoFixes bool
	// Tolerance is the backward's lost-mass tolerance (0: the default).
	Tolerance float64
	// Continuations is the continuations file the Python package wrote
	// from this capture ("" none): its runs verify the fixes that need
	// steps.
	Continuations string
	// From is an earlier replay of the same capture (its JSON): the
	// one-step replay is read from it instead of run again, and the
	// continuations are judged onto it.
	From string
}

// Replay replays a captured step: the training audit of the failing batch
// at the captured weights and loss scale under the run's policy (the
// forward in fp32, in the policy's precision and in bf16, the backward at
// that scale), the previous batch's forward at the same weights when the
// forward fails, and the diagnosis of what happened. Errors are
// *UsageError (a capture refused, bad flags), *ModelError or
// *onnxrt.LibraryNotFoundError.
func Replay(ctx context.Context, rc ReplayConfig) (*report.ReplayReport, error) {
	start := time.Now()
	// The weights' sha256 runs beside the audit, which reads them too;
	// nothing is reported before it agrees with the manifest.
	c, err := capture.Start(rc.Capture)
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	verified := func() error {
		if err := c.Verify(); err != nil {
			return &UsageError{Err: err}
		}
		return nil
	}
	sum, err := fileSHA256(filepath.Join(rc.Capture, capture.ManifestFile))
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	conts, err := readContinuations(rc.Continuations, sum)
	if err != nil {
		return nil, err
	}
	if rc.From != "" {
		if err := verified(); err != nil {
			return nil, err
		}
		r, err := readReplay(rc.From, c)
		if err != nil {
			return nil, err
		}
		if conts != nil {
			replay.Judge(r, conts)
		}
		return r, nil
	}
	m := c.Manifest
	cfg, in, err := replayConfig(rc, c)
	if err != nil {
		return nil, err
	}
	// The log is read beside the audit.
	type logRead struct {
		log *capture.Log
		err error
	}
	logc := make(chan logRead, 1)
	go func() {
		l, err := c.ReadLog()
		logc <- logRead{l, err}
	}()
	// Where the forward fails, the previous batch's forward at the same
	// weights tells the data from the weights: the fp32 and the policy's
	// passes over it, one more run of the same audit.
	var previous func(context.Context, *audit) error
	if prev := m.Batches.Previous; prev != nil {
		previous = func(ctx context.Context, a *audit) error {
			if !forwardFails(a.report) {
				return nil
			}
			p, err := a.forwardOf(ctx, c.Path(prev.Inputs))
			if err != nil {
				return fmt.Errorf("the previous batch: %w", err)
			}
			in.Previous = p
			return nil
		}
	}
	a, err := runThen(ctx, cfg, previous)
	lr := <-logc
	if err != nil {
		return nil, err
	}
	in.Audit = a.report
	if in.Failing, err = batch.ReadNPZ(c.Path(m.Batches.Failing.Inputs)); err != nil {
		return nil, &UsageError{Err: err}
	}
	if in.Log, err = lr.log, lr.err; err != nil {
		return nil, &UsageError{Err: err}
	}
	if in.State, err = c.StateShapes(); err != nil {
		return nil, &UsageError{Err: fmt.Errorf("capture %s: %w", rc.Capture, err)}
	}
	in.Model = a.model.Index
	if err := verified(); err != nil {
		return nil, err
	}
	r := replay.Diagnose(in)
	r.Capture.ManifestSHA256 = sum
	r.Tool.ElapsedSecs = time.Since(start).Seconds()
	if conts != nil {
		replay.Judge(r, conts)
	}
	return r, nil
}

// replayConfig is the training audit of the captured step: its model,
// its failing batch and target, the run's policy and loss, and the
// captured scale as the initial one.
func replayConfig(rc ReplayConfig, c *capture.Capture) (Config, replay.Input, error) {
	m := c.Manifest
	in := replay.Input{Capture: c, Path: rc.Capture}
	if _, err := precision.PolicyByName(m.Precision.Policy); err != nil {
		return Config{}, in, &UsageError{Err: fmt.Errorf("capture %s: precision.policy: %w", rc.Capture, err)}
	}
	cfg := Config{
		ModelPath: c.Path(m.Model.Path), Inputs: []string{c.Path(m.Batches.Failing.Inputs)}, Policy: m.Precision.Policy,
		// the step's own audit words its fixes as the replay's are: in
		// the words of the trainer that made the capture
		Trainer:        replay.TrainerRow(m.Trainer),
		AutocastDevice: m.Precision.AutocastDevice, ORTLib: rc.ORTLib, Threads: rc.Threads, Device: rc.Device,
		MaxMemory: rc.MaxMemory, Progress: rc.Progress, NoFixes: rc.NoFixes, Passes: []string{PassesAuto},
	}
	if cfg.AutocastDevice == "" {
		cfg.AutocastDevice = "cuda"
	}
	// bf16 is asked where the step fails: the forward's bf16 pass runs
	// when the policy's forward fails (PassesAuto), the bf16 backward
	// when the captured scale fails (VerifyFixes), with the failing
	// modules kept in fp32.
	scale := 1.0
	if s, ok := m.Scale(); ok {
		scale = s
	}
	exp, note := scaleExponent(scale)
	in.ScaleExp, in.ScaleNote = &exp, note
	cfg.Train = TrainConfig{Mode: "train", InitScale: math.Ldexp(1, exp), Tolerance: rc.Tolerance, VerifyFixes: true, ForwardFirst: true}
	if m.Loss.Name == nil || *m.Loss.Name == "" {
		return cfg, in, nil
	}
	t := &cfg.Train
	t.Loss = *m.Loss.Name
	if tg := m.Batches.Failing.Target; tg != nil {
		t.Target = c.Path(*tg)
	} else if t.Loss != "output" {
		return Config{}, in, &UsageError{Err: fmt.Errorf("capture %s: the loss %s needs the failing batch's target, and the capture holds none (batches.failing.target); capture again with the target passed to the recorder", rc.Capture, t.Loss)}
	}
	if m.Loss.Output != nil {
		t.Output = *m.Loss.Output
	}
	if t.Loss == "cross-entropy" {
		if a := m.Loss.ClassAxis; a != nil {
			switch *a {
			case "1":
				t.ClassAxis = 1
			case "last", "-1":
				t.ClassAxis = -1
			}
		}
		t.IgnoreIndex = m.Loss.IgnoreIndex
		t.LMShift = m.Loss.LMShift
	}
	return cfg, in, nil
}

// scaleExponent is the exponent of the captured loss scale: GradScaler's
// scales are powers of two from its default init_scale; another one is
// read as the power of two below it, said in the note.
func scaleExponent(s float64) (int, string) {
	if !(s > 0) || math.IsInf(s, 0) {
		return 0, fmt.Sprintf("the captured scale %g is not a positive number: the backward is replayed at scale 1", s)
	}
	frac, e := math.Frexp(s)
	exp := e - 1
	if frac == 0.5 {
		return exp, ""
	}
	return exp, fmt.Sprintf("the captured scale %g is not a power of two: the backward is replayed at 2^%d, the power of two below it", s, exp)
}

// forwardOf runs the audit's forward passes (fp32 and the policy's) over
// the batch at path, at the audit's weights, in the audit's engine, and
// returns their diagnosis without fixes: the origins and each node's
// statistics.
func (a *audit) forwardOf(ctx context.Context, path string) (*report.Report, error) {
	bs, _, err := batch.Load(a.specs, batch.Options{Args: []string{path}, Shapes: a.cfg.Shapes})
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	passes := []execute.Pass{{Name: report.PassFP32, Model: a.fwd}}
	if a.main != "" {
		passes = append(passes, execute.Pass{Name: a.main, Model: rewrite.Emulate(a.fwd, a.model.Proto.Graph, a.static.Assign), Ref: report.PassFP32})
	}
	results, _, err := a.engine.Run(ctx, passes, bs)
	if err != nil {
		return nil, err
	}
	o := &audit{cfg: a.cfg, model: a.model, up: a.up, fwd: a.fwd, ranked: a.ranked, policy: a.policy, static: a.static,
		main: a.main, specs: a.specs, batches: bs, engine: a.engine, passes: map[string]*observe.PassResult{},
		halfCast: a.halfCast, report: &report.Report{}, lib: a.lib}
	for _, r := range results {
		o.report.Passes = append(o.report.Passes, r.Name)
		o.passes[r.Name] = r
	}
	facts := &evidence.Facts{Static: a.static, HalfCasts: a.halfCast,
		Inputs: inputs.Analyze(a.specs, bs, a.model.Index, a.cfg.Thresholds.ColumnScale), Passes: o.passes, Main: a.main,
		Values: a.engine.Observe, Thresholds: a.cfg.Thresholds, Ranked: a.ranked, AutocastDevice: a.cfg.AutocastDevice}
	d, err := diagnose.Run(ctx, facts, o, bs, diagnose.Options{Checks: a.cfg.Checks, NoFixes: true})
	if err != nil {
		return nil, err
	}
	o.report.Origins = d.Origins
	o.report.Nodes = o.nodeReports()
	return o.report, nil
}

// forwardFails says whether the forward of a report goes non-finite in
// fp32 or under the policy: then the previous batch tells the data from
// the weights.
func forwardFails(r *report.Report) bool {
	return slices.ContainsFunc(r.Origins, func(o report.Origin) bool {
		return o.Cause != report.CausePrecision && o.Pass != report.PassBF16
	})
}

func fileSHA256(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:]), nil
}

// readContinuations reads the continuations file (nil for "").
func readContinuations(path, manifest string) (*replay.Continuations, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &UsageError{Err: fmt.Errorf("continuations: %w", err)}
	}
	var c replay.Continuations
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, &UsageError{Err: fmt.Errorf("continuations %s: %w", path, err)}
	}
	if err := c.Check(manifest); err != nil {
		return nil, &UsageError{Err: fmt.Errorf("continuations %s: %w", path, err)}
	}
	return &c, nil
}

// readReplay reads an earlier replay of capture c.
func readReplay(path string, c *capture.Capture) (*report.ReplayReport, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &UsageError{Err: fmt.Errorf("--from: %w", err)}
	}
	var r report.ReplayReport
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, &UsageError{Err: fmt.Errorf("--from %s: %w", path, err)}
	}
	if r.Schema != report.ReplaySchema {
		return nil, &UsageError{Err: fmt.Errorf("--from %s: schema %s: want %s, a replay's JSON (fp16audit replay --format json)", path, strconv.Quote(r.Schema), report.ReplaySchema)}
	}
	if r.Capture.Step != c.Manifest.Trigger.Step || r.Capture.Trigger != c.Manifest.Trigger.Kind {
		return nil, &UsageError{Err: errors.New("--from " + path + ": it replays another capture (step " + strconv.Itoa(r.Capture.Step) + ", " + r.Capture.Trigger + ")")}
	}
	return &r, nil
}
