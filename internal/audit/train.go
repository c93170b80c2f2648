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
	"fp16audit/internal/diagnose"
	"fp16audit/internal/diagnose/training"
	"fp16audit/internal/execute/backward"
	"fp16audit/internal/grad"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/internal/rewrite"
	"fp16audit/internal/tensor"
)

// TrainConfig is the training side of an audit: the mode of the forward
// passes and, with a loss, the backward audit.
type TrainConfig struct {
	// Mode is rewrite.ModeEval (the default when "") or rewrite.ModeTrain.
	Mode string
	// Loss turns the backward audit on: a grad.Losses() name; "" none.
	Loss string
	// Target is the .npy or .npz file holding the targets of the first
	// batch (every loss but "output").
	Target string
	// Output is the graph output the loss applies to; "" is the model's
	// only output.
	Output string
	// InitScale is the GradScaler's initial loss scale, a power of two;
	// 0 means DefaultInitScale.
	InitScale float64
	// UnderflowFraction: a gradient flushing more than this fraction of
	// its nonzero elements to zero underflows; 0 means
	// DefaultGradUnderflowFraction.
	UnderflowFraction float64
}

// Defaults of the training audit: torch.amp's GradScaler starts at 2^16,
// and PyTorch's fp16 experiment (fixtures/torch/train) calls a gradient
// flushed when more than 1% of it is.
const (
	DefaultInitScale             = 65536
	DefaultGradUnderflowFraction = 0.01
	// sweepMaxExp is the largest loss-scale exponent searched unless the
	// initial scale is larger: 2^24 is where a GradScaler that never saw
	// an overflow would be after 16000 clean steps.
	sweepMaxExp = 24
)

// trainer is the training state of one audit.
type trainer struct {
	changes rewrite.ModeChanges
	// inputs and target are the tensors the backward runs on.
	inputs []*tensor.Tensor
	target *tensor.Tensor
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
	if c.Loss != "" && c.Loss != string(grad.ModelOutput) && c.Target == "" {
		return &UsageError{Err: fmt.Errorf("--loss %s needs --target PATH: the targets of the first batch as .npy or .npz (for a model that returns its loss use --loss output)", c.Loss)}
	}
	if c.InitScale == 0 {
		c.InitScale = DefaultInitScale
	}
	if _, exp := math.Frexp(c.InitScale); c.InitScale <= 0 || math.Ldexp(0.5, exp) != c.InitScale {
		return &UsageError{Err: fmt.Errorf("init scale %g: want a power of two such as 65536 (2^16), as a GradScaler's scales are", c.InitScale)}
	}
	if c.UnderflowFraction == 0 {
		c.UnderflowFraction = DefaultGradUnderflowFraction
	}
	if c.UnderflowFraction < 0 || c.UnderflowFraction >= 1 {
		return &UsageError{Err: fmt.Errorf("grad underflow fraction %g: want a fraction in (0, 1), such as 0.01", c.UnderflowFraction)}
	}
	proto, ch, err := rewrite.SetMode(a.model.Proto, c.Mode, a.cfg.Seed, a.model.Dir)
	if err != nil {
		return &ModelError{Path: a.cfg.ModelPath, Err: err}
	}
	ix, err := onnx.NewIndex(proto.Graph)
	if err != nil {
		return &ModelError{Path: a.cfg.ModelPath, Err: err}
	}
	ix.BaseDir = a.model.Dir
	m := *a.model
	m.Proto, m.Index = proto, ix
	a.model = &m
	a.train = &trainer{changes: ch}
	return nil
}

// auditTraining runs the training diagnosis — and, with a loss, the
// backward audit — and adds its report and findings.
func (a *audit) auditTraining(ctx context.Context) error {
	c := a.cfg.Train
	f := &training.Facts{Model: a.model, Policy: a.policy, Assign: a.static.Assign, Mode: c.Mode,
		Changes: a.train.changes, Seed: a.cfg.Seed, FP32: a.passes[diagnose.PassFP32]}
	if c.Loss != "" {
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

// backward builds the backward graph with autocast's rounding and without
// any, and runs them: the rounded one at the scales a sweep needs, the
// fp32 one once at scale 1.
func (a *audit) backward(ctx context.Context) (*training.Backward, error) {
	start := time.Now()
	c := a.cfg.Train
	if err := a.backwardInputs(); err != nil {
		return nil, err
	}
	initExp := exponent(c.InitScale)
	b := &training.Backward{Loss: grad.Loss(c.Loss), Target: c.Target, InitExp: initExp,
		MinExp: min(0, initExp), MaxExp: max(sweepMaxExp, initExp), UnderflowFraction: c.UnderflowFraction}
	if len(a.batches) > 1 {
		a.report.Notes = append(a.report.Notes, fmt.Sprintf("the backward audit ran on the first of %d batches, the one its target belongs to", len(a.batches)))
	}
	opt := a.engine.Session
	facts, err := backward.Probe(a.up, a.train.inputs, opt)
	if err != nil {
		return nil, err
	}
	build := func(r *grad.Rounding) (*grad.Result, error) {
		res, err := grad.Build(a.up, facts, grad.Options{Loss: b.Loss, Output: c.Output, TargetShape: targetShape(a.train.target),
			Rounding: r, Summaries: true})
		if err != nil && c.Output == "" && len(a.up.Graph.Output) > 1 {
			var names []string
			for _, o := range a.up.Graph.Output {
				names = append(names, o.Name)
			}
			return nil, &UsageError{Err: fmt.Errorf("the model has %d outputs (%s): name the one the loss applies to with --loss-output", len(names), strings.Join(names, ", "))}
		}
		if err != nil {
			return nil, &UsageError{Err: err}
		}
		return res, nil
	}
	rounding := grad.AutocastRounding(a.up.Graph, a.static.Assign)
	if b.Res, err = build(rounding); err != nil {
		return nil, err
	}
	b.Output = b.Res.Output
	res32, err := build(nil)
	if err != nil {
		return nil, err
	}
	sc32, err := backward.NewScanner(res32, opt, a.train.inputs, a.train.target)
	if err != nil {
		return nil, err
	}
	defer sc32.Close()
	defer sc32.StopOn(ctx)()
	if b.FP32, err = sc32.Scan(0); err != nil {
		return nil, err
	}
	sc, err := backward.NewScanner(b.Res, opt, a.train.inputs, a.train.target)
	if err != nil {
		return nil, err
	}
	defer sc.Close()
	defer sc.StopOn(ctx)()
	if len(rounding.Values) == 0 && len(rounding.Inputs) == 0 {
		// Nothing is held in 16 bits (the fp32 policy): one run says so.
		s, err := sc.Scan(initExp)
		if err != nil {
			return nil, err
		}
		b.Scans = map[int]*grad.Scan{initExp: s}
	} else if b.Scans, err = backward.Sweep(func(e int) (*grad.Scan, error) {
		// An interrupt stops the run in flight (StopOn) and the sweep
		// before the next.
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return sc.Scan(e)
	}, b.MinExp, b.MaxExp, []int{initExp}, training.Flags(c.UnderflowFraction, b.FP32)); err != nil {
		return nil, err
	}
	b.Runs = len(b.Scans) + 1
	b.Elapsed = time.Since(start).Seconds()
	return b, nil
}

// backwardInputs picks the first batch and reads the target.
func (a *audit) backwardInputs() error {
	c := a.cfg.Train
	a.train.inputs = a.batches[0].Inputs
	if c.Loss == string(grad.ModelOutput) {
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
		return nil, fmt.Errorf("target %s: want a .npy or .npz file (np.save(\"target.npy\", yb.cpu().numpy()))", path)
	}
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
		if x != float32(math.Trunc(float64(x))) || x < 0 {
			return nil, fmt.Errorf("target %s: element %d is %g; cross-entropy wants class indices (whole numbers ≥ 0), not probabilities or one-hot rows", path, i, x)
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

// BF16 runs the backward with the bf16 policy's rounding at scale 1 (the
// fix training.Run verifies: learn.to_bf16() trains without loss scaling);
// ctx ending stops its run.
func (a *audit) BF16(ctx context.Context) (*grad.Result, *grad.Scan, error) {
	pol, err := precision.PolicyByName("autocast-bf16")
	if err != nil {
		return nil, nil, err
	}
	if defaultOpset(a.up) < 13 {
		return nil, nil, fmt.Errorf("the model imports opset %d; emulating bf16 needs Cast to bfloat16 (opset 13)", defaultOpset(a.up))
	}
	asg := precision.Assign(pol, a.model.Proto.Graph, a.static.Order, a.model.Index.ElemType)
	facts, err := backward.Probe(a.up, a.train.inputs, a.engine.Session)
	if err != nil {
		return nil, nil, err
	}
	res, err := grad.Build(a.up, facts, grad.Options{Loss: grad.Loss(a.cfg.Train.Loss), Output: a.cfg.Train.Output,
		TargetShape: targetShape(a.train.target), Rounding: grad.AutocastRounding(a.up.Graph, asg), Summaries: true})
	if err != nil {
		return nil, nil, err
	}
	sc, err := backward.NewScanner(res, a.engine.Session, a.train.inputs, a.train.target)
	if err != nil {
		return nil, nil, err
	}
	defer sc.Close()
	defer sc.StopOn(ctx)()
	s, err := sc.Scan(0)
	return res, s, err
}
