package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"fp16audit/internal/audit"
	"fp16audit/internal/grad"
	"fp16audit/internal/rewrite"
)

// trainFlags are the flags of the training audit (`fp16audit run --mode
// train --loss ...`).
type trainFlags struct {
	mode, loss, target, output, initScale string
	tolerance                             float64
	// fraction is the flag --lost-mass-tolerance replaced; it is refused
	// with a message naming the new one.
	fraction    float64
	classAxis   string
	ignoreIndex int64
	lmShift     bool
	fs          *pflag.FlagSet
}

func (t *trainFlags) register(fs *pflag.FlagSet) {
	var losses []string
	for _, l := range grad.Losses() {
		losses = append(losses, string(l))
	}
	fs.StringVar(&t.mode, "mode", rewrite.ModeEval, "forward mode: eval (inference: BatchNorm running statistics, no dropout) or train (a training step: BatchNorm batch statistics, dropout)")
	fs.StringVar(&t.loss, "loss", "", "audit the backward pass for this loss: "+strings.Join(losses, ", ")+" (output: the model returns its loss)")
	fs.StringVar(&t.target, "target", "", "the first batch's targets for --loss: .npy or .npz, or the name of a graph input holding them (with --lm-shift: input_ids)")
	fs.StringVar(&t.output, "loss-output", "", "the graph output the loss applies to (default: the only output)")
	fs.StringVar(&t.classAxis, "class-axis", "auto", "cross-entropy's class axis: 1 (PyTorch's [N, C, d…] logits, [N, d…] targets), last (a language model's [B, S, V] logits, [B, S] targets) or auto (the one the target's shape fits)")
	fs.Int64Var(&t.ignoreIndex, "ignore-index", grad.DefaultIgnoreIndex, "cross-entropy: targets equal to this are left out of the loss and its mean (PyTorch's ignore_index)")
	fs.BoolVar(&t.lmShift, "lm-shift", false, "cross-entropy of a causal language model: the logits at position t are scored against target t+1 (logits[:, :-1] against labels[:, 1:]); the target is the unshifted token ids")
	fs.StringVar(&t.initScale, "init-scale", "65536", "the GradScaler's initial loss scale, a power of two: 65536, 2^16 or 2**16")
	fs.Float64Var(&t.tolerance, "lost-mass-tolerance", audit.DefaultGradMassTolerance, "a loss scale is clean when no parameter gradient loses more than this share of its L2 norm to fp16 (mass lost; FP6007, FP6008)")
	fs.Float64Var(&t.fraction, "grad-underflow-fraction", 0, "replaced by --lost-mass-tolerance")
	_ = fs.MarkHidden("grad-underflow-fraction")
	t.fs = fs
}

// config turns the flags into the audit's TrainConfig.
func (t *trainFlags) config() (audit.TrainConfig, error) {
	if f := t.fs.Lookup("grad-underflow-fraction"); f != nil && f.Changed {
		return audit.TrainConfig{}, fmt.Errorf("--grad-underflow-fraction is gone: the backward is judged by the share of a parameter gradient's L2 norm fp16 loses, not by the fraction of elements flushed; pass --lost-mass-tolerance %g instead", t.fraction)
	}
	scale, err := parseScale(t.initScale)
	if err != nil {
		return audit.TrainConfig{}, fmt.Errorf("--init-scale: %w", err)
	}
	axis, err := parseClassAxis(t.classAxis)
	if err != nil {
		return audit.TrainConfig{}, fmt.Errorf("--class-axis: %w", err)
	}
	c := audit.TrainConfig{Mode: t.mode, Loss: t.loss, Target: t.target, Output: t.output,
		ClassAxis: axis, LMShift: t.lmShift, InitScale: scale, Tolerance: t.tolerance}
	if f := t.fs.Lookup("ignore-index"); f != nil && f.Changed {
		c.IgnoreIndex = &t.ignoreIndex
	}
	return c, nil
}

// parseClassAxis reads --class-axis: auto (0), 1, or last (-1).
func parseClassAxis(s string) (int, error) {
	switch strings.TrimSpace(s) {
	case "auto", "":
		return 0, nil
	case "1":
		return 1, nil
	case "last", "-1":
		return -1, nil
	}
	return 0, fmt.Errorf("%q: want 1 (PyTorch's [N, C, d…] logits), last (a language model's [B, S, V] logits) or auto", s)
}

// parseScale reads a loss scale written as a number (65536) or a power of
// two (2^16, 2**16, 2.**16).
func parseScale(s string) (float64, error) {
	s = strings.TrimSpace(s)
	for _, sep := range []string{"**", "^"} {
		if base, exp, ok := strings.Cut(s, sep); ok {
			if b, err := strconv.ParseFloat(base, 64); err != nil || b != 2 {
				return 0, fmt.Errorf("%q: want a power of two such as 2^16", s)
			}
			e, err := strconv.Atoi(exp)
			if err != nil || e < -30 || e > 60 {
				return 0, fmt.Errorf("%q: want an exponent between -30 and 60", s)
			}
			return math.Ldexp(1, e), nil
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: want a number such as 65536 or 2^16", s)
	}
	return v, nil
}
