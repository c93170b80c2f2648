package audit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"fp16audit/internal/batch"
	"fp16audit/internal/diagnose/training"
	"fp16audit/internal/execute/backward"
	"fp16audit/internal/grad"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
	"fp16audit/internal/tensor"
	"fp16audit/report"
)

// TrainConfig is the training side of an audit: the mode of the forward
// passes and, with a loss, the backward audit.
type TrainConfig struct {
	// Mode is rewrite.ModeEval (the default when "") or rewrite.ModeTrain.
	Mode string
	// Loss turns the backward audit on: a grad.Losses() name; "" none.
	Loss string
	// Target is the .npy or .npz file holding the targets of the first
	// batch (every loss but "output"), or the name of a graph input whose
	// values in the first batch are the targets (a language model's
	// input_ids, the default with LMShift).
	Target string
	// Output is the graph output the loss applies to; "" is the model's
	// only output.
	Output string
	// ClassAxis is cross-entropy's class axis: 1 (PyTorch's [N, C, d…]
	// logits), -1 (the last: a language model's [B, S, V]), or 0 to read
	// it from the target's shape.
	ClassAxis int
	// IgnoreIndex is the cross-entropy target value left out of the loss
	// and its mean; nil is PyTorch's -100.
	IgnoreIndex *int64
	// LMShift scores the logits at position t against target t+1, the
	// causal language model's loss (Hugging Face's labels=input_ids).
	LMShift bool
	// InitScale is the GradScaler's initial loss scale, a power of two;
	// 0 means DefaultInitScale.
	InitScale float64
	// Tolerance: a loss scale is clean when no parameter gradient loses
	// more than this share of its L2 norm to fp16 (mass lost); 0 means
	// DefaultGradMassTolerance.
	Tolerance float64
	// VerifyFixes verifies the backward's one-step fixes whenever the
	// initial scale overflows or loses mass (the replay's question): bf16
	// (not only when no fp16 scale is clean) and the failing modules kept
	// in fp32.
	VerifyFixes bool
	// ForwardFirst skips the backward when the forward already goes
	// NaN/Inf in fp32 or under the policy: the step failed before its
	// backward (the replay's question), and the report says so.
	ForwardFirst bool
}

// Defaults of the training audit: torch.amp's GradScaler starts at 2^16,
// and a scale is clean when no parameter gradient loses more than 1% of
// its norm (the same measure as the Python companion's telemetry and
// fp16audit scales).
const (
	DefaultInitScale         = 65536
	DefaultGradMassTolerance = 0.01
	// judgedMaxExp is the largest loss-scale exponent judged unless the
	// initial scale is larger: 2^24 is where a GradScaler that never saw
	// an overflow would be after 16000 clean steps. judgedMinExp is the
	// smallest: the GradScaler halves without a floor, and 2^-126 is
	// float32's smallest normal scale.
	judgedMaxExp = 24
	judgedMinExp = -126
)

// trainer is the training state of one audit.
type trainer struct {
	changes rewrite.ModeChanges
	// inputs and target are the tensors the backward runs on.
	inputs []*tensor.Tensor
	target *tensor.Tensor
	// shapes are the backward's shape facts, made once for every
	// backward graph of the audit.
	shapes *grad.Facts
	// sess is the backward's session, open until the training diagnosis
	// ends: its alternative rounding (bf16, where its points are the
	// policy's) verifies the bf16 fix without a session of its own.
	sess *backward.MassSession
}

// applyMode rewrites the loaded model into the configured mode; every
// later stage sees the rewritten model.
func (a *audit) applyMode() error {
	c := &a.cfg.Train
	if c.Mode == "" {
		c.Mode = rewrite.ModeEval
	}
	if !slices.Contains(rewrite.Modes(), c.Mode) {
		return &UsageError{Err: fmt.Errorf("mode %q: want eval (inference: BatchNorm running statistics, no dropout) or train (a training step's forward)", c.Mode)}
	}
	if c.Loss != "" && !slices.Contains(grad.Losses(), grad.Loss(c.Loss)) {
		var names []string
		for _, l := range grad.Losses() {
			names = append(names, string(l))
		}
		return &UsageError{Err: fmt.Errorf("loss %q: want one of %s", c.Loss, strings.Join(names, ", "))}
	}
	if c.Loss == "" && (c.Target != "" || c.Output != "") {
		return &UsageError{Err: errors.New("--target and --loss-output need --loss: name the loss the model is trained with (cross-entropy, bce, mse, l1, or output for a model that returns its loss)")}
	}
	if err := a.checkCrossEntropy(); err != nil {
		return err
	}
	if c.Loss != "" && c.Loss != string(grad.ModelOutput) && c.Target == "" {
		return &UsageError{Err: fmt.Errorf("--loss %s needs --target PATH: the targets of the first batch as .npy or .npz, or the name of the graph input that holds them (for a model that returns its loss use --loss output)", c.Loss)}
	}
	if c.InitScale == 0 {
		c.InitScale = DefaultInitScale
	}
	if _, exp := math.Frexp(c.InitScale); c.InitScale <= 0 || math.Ldexp(0.5, exp) != c.InitScale {
		return &UsageError{Err: fmt.Errorf("init scale %g: want a power of two such as 65536 (2^16), as a GradScaler's scales are", c.InitScale)}
	}
	if c.Tolerance == 0 {
		c.Tolerance = DefaultGradMassTolerance
	}
	if c.Tolerance < 0 || c.Tolerance >= 1 {
		return &UsageError{Err: fmt.Errorf("grad mass tolerance %g: want a share of the gradient norm in (0, 1), such as 0.01", c.Tolerance)}
	}
	proto, ch, err := rewrite.SetMode(a.model.Proto, c.Mode, a.cfg.Seed, a.model.Dir)
	if err != nil {
		return &ModelError{Path: a.cfg.ModelPath, Err: err}
	}
	if err := a.replaceModel(proto); err != nil {
		return err
	}
	a.train = &trainer{changes: ch}
	return nil
}

// replaceModel makes proto, a rewrite of the audit's model, the model the
// audit goes on with (the file and its folder stay the same).
func (a *audit) replaceModel(proto *onnx.ModelProto) error {
	ix, err := onnx.NewIndex(proto.Graph)
	if err != nil {
		return &ModelError{Path: a.cfg.ModelPath, Err: err}
	}
	ix.BaseDir = a.model.Dir
	m := *a.model
	m.Proto, m.Index = proto, ix
	a.model = &m
	return nil
}

// checkCrossEntropy checks the options that only cross-entropy reads and
// picks the default target of a language model's loss: the token ids it
// takes as input.
func (a *audit) checkCrossEntropy() error {
	c := &a.cfg.Train
	if c.Loss != string(grad.CrossEntropy) {
		if c.ClassAxis != 0 || c.IgnoreIndex != nil || c.LMShift {
			return &UsageError{Err: errors.New("--class-axis, --ignore-index and --lm-shift configure --loss cross-entropy")}
		}
		return nil
	}
	if c.ClassAxis != 0 && c.ClassAxis != 1 && c.ClassAxis != -1 {
		return &UsageError{Err: fmt.Errorf("class axis %d: want 1 (PyTorch's [N, C, d…] logits), last (a language model's [B, S, V] logits) or auto", c.ClassAxis)}
	}
	if c.LMShift && c.Target == "" {
		if slices.ContainsFunc(a.model.Index.GraphInputs(), func(vi *onnx.ValueInfoProto) bool { return vi.Name == lmTokens }) {
			c.Target = lmTokens
		} else {
			return &UsageError{Err: fmt.Errorf("--lm-shift needs --target: the model has no input named %s; name the graph input holding the token ids, or give the labels as .npy or .npz", lmTokens)}
		}
	}
	return nil
}

// lmTokens is the input Hugging Face's exports give the token ids.
const lmTokens = "input_ids"

// auditTraining runs the training diagnosis — and, with a loss, the
// backward audit — and adds its report and findings.
func (a *audit) auditTraining(ctx context.Context) error {
	c := a.cfg.Train
	f := a.trainingFacts()
	if c.Loss != "" && c.ForwardFirst && forwardFails(a.report) {
		a.report.Notes = append(a.report.Notes, "the backward was not run: the forward already goes NaN/Inf, so the step fails before its gradients")
	} else if c.Loss != "" {
		defer func() {
			if a.train.sess != nil {
				a.train.sess.Close()
				a.train.sess = nil
			}
		}()
		b, err := a.backward(ctx)
		if err != nil {
			return err
		}
		f.Backward = b
	}
	tr, findings, err := training.Run(ctx, f, a, a.cfg.Checks)
	if err != nil {
		return err
	}
	a.report.Training = tr
	a.report.Findings = append(a.report.Findings, findings...)
	return nil
}

// trainingFacts returns the facts of the training diagnosis, without a
// backward.
func (a *audit) trainingFacts() *training.Facts {
	return &training.Facts{Model: a.model, Policy: a.policy, Assign: a.static.Assign, Mode: a.cfg.Train.Mode,
		Changes: a.train.changes, Seed: a.cfg.Seed, FP32: a.passes[report.PassFP32], Trainer: a.cfg.Trainer, AutocastDevice: a.cfg.AutocastDevice}
}

// backward builds the backward graph with autocast's rounding and runs it
// in one session: once with the rounding off at scale 1 (the fp32
// reference, whose mass by exponent judges every scale), then emulated at
// the few scales the training facts ask to confirm.
func (a *audit) backward(ctx context.Context) (*training.Backward, error) {
	start := time.Now()
	c := a.cfg.Train
	if err := a.backwardInputs(); err != nil {
		return nil, err
	}
	initExp := exponent(c.InitScale)
	b := &training.Backward{Loss: grad.Loss(c.Loss), Target: c.Target, InitExp: initExp,
		MinExp: min(judgedMinExp, initExp), MaxExp: max(judgedMaxExp, initExp), Tolerance: c.Tolerance, VerifyFixes: c.VerifyFixes,
		Runs: map[int]*grad.Run{}}
	if len(a.batches) > 1 {
		a.report.Notes = append(a.report.Notes, fmt.Sprintf("the backward audit ran on the first of %d batches, the one its target belongs to", len(a.batches)))
	}
	r := a.rounding(a.static.Assign)
	res, sess, err := a.backwardSession(ctx, r, a.bf16Rounding(r))
	if err != nil {
		return nil, err
	}
	a.train.sess = sess
	// An interrupt stops the run in flight, and the audit before the next.
	defer sess.StopOn(ctx)()
	b.Res, b.Output = res, res.Output
	if b.Scored, err = a.scoredTargets(res); err != nil {
		return nil, err
	}
	if a.train.target != nil {
		b.Targets = a.train.target.Elements()
	}
	if b.FP32, err = sess.Run(0, false); err != nil {
		return nil, err
	}
	b.Count = 1
	if sess.HoldsForward() {
		if b.Saved, err = sess.RunSaved(false); err != nil {
			return nil, err
		}
		b.Count++
	}
	f := a.trainingFacts()
	f.Backward = b
	for {
		next := f.NextRuns()
		if len(next) == 0 {
			break
		}
		for _, e := range next {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			run := func(e int) (*grad.Run, error) { return sess.Run(e, true) }
			if f.MassesAt(e) {
				run = sess.RunSummarised
			}
			r, err := run(e)
			if err != nil {
				return nil, err
			}
			b.Runs[e] = r
			b.Count++
		}
	}
	b.Elapsed = time.Since(start).Seconds()
	return b, nil
}

// backwardSession builds the backward graph with the rounding r and opens
// its session, with alt as its alternative rounding (nil: none). The graph needs every value's shape on the backward's
// batch: the fp32 pass recorded them on its first batch, the same one,
// and the probe's forward run (a session and a run of its own, 40–100 ms
// of a ResNet-18's training audit) measures them only when that record
// falls short.
func (a *audit) backwardSession(ctx context.Context, r, alt *grad.Rounding) (*grad.Result, *backward.MassSession, error) {
	c := a.cfg.Train
	opt := a.engine.Session
	facts := a.train.shapes
	if fp32 := a.passes[report.PassFP32]; facts == nil && fp32 != nil {
		facts = backward.Known(a.up, a.train.inputs, fp32.Shapes)
	}
	if facts == nil {
		var err error
		if facts, err = backward.Probe(ctx, a.engine.Library, a.up, a.model.Path, a.train.inputs, opt); err != nil {
			return nil, nil, err
		}
	}
	a.train.shapes = facts
	res, err := grad.Build(a.up, facts, a.gradOptions(r))
	if err != nil {
		return nil, nil, &UsageError{Err: lossHint(err, c)}
	}
	if alt != nil && !res.HeldBy(alt) {
		// the bf16 fix then runs in a session of its own (BF16)
		alt = nil
	}
	sess, err := backward.NewMassSession(a.engine.Library, res, opt, a.model.Path, a.engine.Weights, a.train.inputs, a.train.target, alt)
	if err != nil {
		return nil, nil, err
	}
	return res, sess, nil
}

// gradOptions are the backward graph's options for the configured loss,
// with the rounding r (nil: none).
func (a *audit) gradOptions(r *grad.Rounding) grad.Options {
	c := a.cfg.Train
	return grad.Options{Loss: grad.Loss(c.Loss), Output: c.Output, TargetShape: targetShape(a.train.target),
		CrossEntropy: grad.CrossEntropyOptions{ClassAxis: c.ClassAxis, IgnoreIndex: c.IgnoreIndex, Shift: c.LMShift},
		Rounding:     r}
}

// lossHint adds to a backward graph's error the flags that would answer
// it.
func lossHint(err error, c TrainConfig) error {
	switch {
	case errors.Is(err, grad.ErrLossOutput):
		return fmt.Errorf("%w (--loss-output NAME)", err)
	case errors.Is(err, grad.ErrTargetShape) && c.Loss == string(grad.CrossEntropy):
		return fmt.Errorf("%w; --class-axis 1 or last says which axis holds the classes, --lm-shift scores each position against the next target (a language model's labels)", err)
	}
	return err
}

// scoredTargets checks the target against the loss built and counts the
// targets the loss averages over: a class index out of range, or a target
// with nothing left to score, is refused before any run.
func (a *audit) scoredTargets(res *grad.Result) (int64, error) {
	c := a.cfg.Train
	if a.train.target == nil {
		return 0, nil
	}
	n, err := res.ScoredTargets(a.train.target)
	if err != nil {
		return 0, &UsageError{Err: fmt.Errorf("target %s: %w", c.Target, err)}
	}
	if n == 0 {
		what := fmt.Sprintf("every target is the ignored index %d", res.CrossEntropy.IgnoreIndex)
		if c.LMShift {
			what += " or the first of its sequence"
		}
		return 0, &UsageError{Err: fmt.Errorf("target %s: %s: the loss has nothing to score (PyTorch's loss is NaN); pass other labels or --ignore-index", c.Target, what)}
	}
	return n, nil
}

// backwardInputs picks the first batch and reads the target.
func (a *audit) backwardInputs() error {
	c := a.cfg.Train
	a.train.inputs = a.batches[0].Inputs
	if c.Loss == string(grad.ModelOutput) {
		return nil
	}
	if i := slices.IndexFunc(a.train.inputs, func(x *tensor.Tensor) bool { return x.Name == c.Target }); i >= 0 {
		t, err := targetOf(c.Target, a.train.inputs[i], grad.Loss(c.Loss))
		if err != nil {
			return &UsageError{Err: err}
		}
		a.train.target = t
		return nil
	}
	t, err := readTarget(c.Target, grad.Loss(c.Loss))
	if err != nil {
		return &UsageError{Err: err}
	}
	a.train.target = t
	return nil
}

// readTarget reads a loss target from a .npy file or an .npz archive (its
// only array, or the one named "target"), as int64 class indices for
// cross-entropy and as float32 otherwise.
func readTarget(path string, loss grad.Loss) (*tensor.Tensor, error) {
	var t *tensor.Tensor
	switch strings.ToLower(filepath.Ext(path)) {
	case ".npy":
		x, err := batch.ReadNPY(path)
		if err != nil {
			return nil, fmt.Errorf("target: %w", err)
		}
		t = x
	case ".npz":
		ts, err := batch.ReadNPZ(path)
		if err != nil {
			return nil, fmt.Errorf("target: %w", err)
		}
		var names []string
		for _, x := range ts {
			names = append(names, x.Name)
			if x.Name == "target" {
				t = x
			}
		}
		if t == nil && len(ts) == 1 {
			t = ts[0]
		}
		if t == nil {
			return nil, fmt.Errorf("target %s: holds %s; want one array, or one named \"target\"", path, strings.Join(names, ", "))
		}
	default:
		return nil, fmt.Errorf("target %s: want a .npy or .npz file (np.save(\"target.npy\", yb.cpu().numpy())) or the name of a graph input", path)
	}
	return targetOf(path, t, loss)
}

// targetOf converts a target read from path (a file or a graph input) to
// what the loss takes: int64 class indices for cross-entropy, float32
// otherwise.
func targetOf(path string, t *tensor.Tensor, loss grad.Loss) (*tensor.Tensor, error) {
	if loss == grad.CrossEntropy {
		return classIndices(path, t)
	}
	v, err := t.Float32s()
	if err != nil {
		return nil, fmt.Errorf("target %s: %w; want numbers for the %s loss", path, err, loss)
	}
	return tensor.FromFloat32s("target", t.Shape, v), nil
}

// classIndices converts a cross-entropy target to int64 class indices; a
// float target must hold whole numbers.
func classIndices(path string, t *tensor.Tensor) (*tensor.Tensor, error) {
	if t.DType == tensor.Int64 {
		return t, nil
	}
	v, err := t.Float32s()
	if err != nil {
		return nil, fmt.Errorf("target %s: %w; want class indices for cross-entropy", path, err)
	}
	out := make([]int64, len(v))
	for i, x := range v {
		// a negative index can be the ignored one; the range is checked
		// against the logits once the loss is built
		if x != float32(math.Trunc(float64(x))) {
			return nil, fmt.Errorf("target %s: element %d is %g; cross-entropy wants class indices (whole numbers), not probabilities or one-hot rows", path, i, x)
		}
		out[i] = int64(x)
	}
	return tensor.FromInt64s("target", t.Shape, out), nil
}

func targetShape(t *tensor.Tensor) []int64 {
	if t == nil {
		return nil
	}
	return t.Shape
}

// exponent returns log2 of a power of two.
func exponent(x float64) int {
	_, e := math.Frexp(x)
	return e - 1
}

// rounding is the backward's rounding under the assignment asg: the
// gradients autocast holds in 16 bits and, so that the backward
// differentiates at the values autocast saved for it, the forward values
// it holds in 16 bits (grad.Forward).
func (a *audit) rounding(asg *precision.Assignment) *grad.Rounding {
	r := grad.AutocastRounding(a.up.Graph, asg)
	r.Forward = &grad.Forward{Orig: a.model.Proto.Graph, Assign: asg}
	return r
}

// bf16Rounding is the bf16 policy's rounding of the backward when it
// holds gradients at the same points as r (the policy's), so that the
// backward's session runs it too; nil when it does not (another policy's
// lists, a model below opset 13).
func (a *audit) bf16Rounding(r *grad.Rounding) *grad.Rounding {
	if defaultOpset(a.up) < 13 || a.policy.Name == "autocast-bf16" {
		return nil
	}
	pol, err := precision.PolicyByName("autocast-bf16")
	if err != nil {
		return nil
	}
	asg := precision.Assign(pol, a.model.Proto.Graph, a.static.Order, a.model.Index.ElemType)
	b := a.rounding(asg)
	if !backward.SameSites(r, b) {
		return nil
	}
	return b
}

// BF16 runs the backward with the bf16 policy's rounding at scale 1 (the
// fix training.Run verifies: learn.to_bf16() trains without loss scaling)
// and its reference, the backward at the values the bf16 forward saved
// — in the backward's own session where it holds the bf16 rounding —;
// ctx ending stops its runs.
func (a *audit) BF16(ctx context.Context) (run, ref *grad.Run, err error) {
	if s := a.train.sess; s != nil && s.HasAlt() {
		defer s.StopOn(ctx)()
		if run, err = s.RunAlt(0); err != nil || !s.HoldsForward() {
			return run, nil, err
		}
		ref, err = s.RunSaved(true)
		return run, ref, err
	}
	pol, err := precision.PolicyByName("autocast-bf16")
	if err != nil {
		return nil, nil, err
	}
	if defaultOpset(a.up) < 13 {
		return nil, nil, fmt.Errorf("the model imports opset %d; emulating bf16 needs Cast to bfloat16 (opset 13)", defaultOpset(a.up))
	}
	asg := precision.Assign(pol, a.model.Proto.Graph, a.static.Order, a.model.Index.ElemType)
	return a.fixRuns(ctx, asg, 0)
}

// KeepFP32 runs the backward at scale 2^exp with the nodes keep computing
// in fp32 under the policy, forward and backward (the fix training.Run
// verifies for the modules whose gradients fail), and its reference;
// ctx ending stops its runs.
func (a *audit) KeepFP32(ctx context.Context, keep map[int]bool, exp int) (run, ref *grad.Run, err error) {
	asg := precision.AssignKeepFP32(a.policy, a.model.Proto.Graph, a.static.Order, a.model.Index.ElemType, keep)
	return a.fixRuns(ctx, asg, exp)
}

// fixRuns runs, in a session of its own, the backward under the
// assignment asg at scale 2^exp and, where its forward holds values in 16
// bits, the backward at the values that forward saved (the fix's
// reference).
func (a *audit) fixRuns(ctx context.Context, asg *precision.Assignment, exp int) (run, ref *grad.Run, err error) {
	_, sess, err := a.backwardSession(ctx, a.rounding(asg), nil)
	if err != nil {
		return nil, nil, err
	}
	defer sess.Close()
	defer sess.StopOn(ctx)()
	if run, err = sess.Run(exp, true); err != nil || !sess.HoldsForward() {
		return run, nil, err
	}
	ref, err = sess.RunSaved(false)
	return run, ref, err
}
