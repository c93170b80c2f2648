package trainlog

import "fp16audit/checks"

// The checks of the training-log diagnosis (FP5xxx). Their IDs are stable;
// see package checks.
var (
	checkEarlyNaN = checks.Register(&checks.Check{ID: "FP5001", Title: "loss is nan early in training", Severity: checks.SevError, Doc: `The loss went NaN or Inf for good within the first epoch (or the first
--early-steps steps when the log does not say how long an epoch is), and
the loss scale did not collapse before it. This is a property of the
forward pass, not of the loss scaler: GradScaler only multiplies the loss
before backward and skips steps whose gradients overflow, so it cannot
turn a finite loss into NaN. (A scale that collapsed first, by backoffs of
finite losses, is chronic gradient overflow whenever the NaN comes:
FP5002. Non-finite losses the run went on from are FP5012.) The usual causes are an
activation above 65504 (fp16's max) under autocast, typically from raw
inputs (pixels in 0..255, unscaled tabular columns), oversized logits or a
mask constant like -1e9, or poisoned data. Export the model and a batch and
run 'fp16audit run model.onnx -i batch.npy': it names the overflowing node
and verifies a fix (normalized inputs, to_bf16(), modules kept in fp32).
Lowering init_scale does not fix it.`})

	checkGradOverflowNaN = checks.Register(&checks.Check{ID: "FP5002", Title: "nan after the loss scale collapsed", Severity: checks.SevError, Doc: `The loss went NaN for good after the loss scale collapsed, in the first
epoch or later: GradScaler backed off again and again on steps whose loss
was finite (each backoff halves the scale and silently skips the step;
--collapse-bits of fall, with as many halvings from such backoffs, in the
two growth intervals before the NaN), so the gradients overflowed fp16
even after being scaled down by many bits. Gradients growing that fast mean training
is diverging: the weights grow until the forward pass overflows too, and
the loss turns NaN. The loss scaler is the messenger, not the cause. Lower
the learning rate (or lengthen the warm-up of the one-cycle schedule), clip
gradients (fastai: GradientClip(max_norm=1.0); PyTorch: scaler.unscale_(opt)
then torch.nn.utils.clip_grad_norm_), or train with learn.to_bf16() on an
Ampere or newer GPU (fp32's range, no loss scaling), or in fp32. When the
log carries per-module gradient telemetry (python/: the fp16audit recorder
or fastai callback), the finding names the module whose scaled gradients
overflowed first: lower the learning rate there, clip it, or keep that
module in fp32.`})

	checkForwardOverflowNaN = checks.Register(&checks.Check{ID: "FP5003", Title: "nan with a healthy loss scale", Severity: checks.SevError, Doc: `The loss went NaN for good after the first epoch while the loss scale
was healthy (no collapse before it): the gradients fitted fp16, so the scaler saw nothing
wrong. The forward pass began to overflow: as the weights grew, an
activation crossed 65504 on some batch. Save a checkpoint from shortly
before the NaN step (fastai: SaveModelCallback(every_epoch=True)), export
it to ONNX together with the batch of that step, and audit it with
'fp16audit run model.onnx -i batch.npy' to find the overflowing op and a
verified fix (to_bf16(), or that module kept in fp32). Weight decay or a
normalization before the overflowing layer keeps the activations in range.`})

	checkLateNaN = checks.Register(&checks.Check{ID: "FP5004", Title: "nan mid-training, no scale history", Severity: checks.SevError, Doc: `The loss went NaN for good after the first epoch, but the log has no loss
scales, so fp16audit cannot tell a chronic gradient overflow (the scale
collapses first: lower the learning rate, clip gradients, to_bf16()) from a
forward overflow (the scale is healthy: audit a checkpoint from just before
with 'fp16audit run'). Record the scale with the callback in
examples/fastai_scales_callback.py and rerun the diagnosis.`})

	checkPlateauUnderflow = checks.Register(&checks.Check{ID: "FP5005", Title: "plateau above the fp32 baseline with skipped steps", Severity: checks.SevWarning, Doc: `The fp16 run ends above the fp32 baseline by more than the tolerance
(--plateau-tolerance, 3% by default) and the scale history shows why: many
skipped steps (every overflow skips an optimizer step silently) or a loss
scale pinned low, where small gradients underflow to zero in fp16 and stop
contributing. The scaler is stuck in a backoff loop, usually because some
gradients overflow whatever the scale (an Inf or NaN produced in the
backward of a few batches) while the rest need a large scale. Prefer
learn.to_bf16() (Ampere or newer): bf16 has fp32's range, needs no loss
scaling and skips nothing. Otherwise find the overflowing gradients (clip
them, or keep the module that produces them in fp32). With per-module
gradient telemetry in the log, the finding names the modules whose
gradients lose mass to fp16 at the scales the run used: more than
--lost-mass-tolerance (1%) of their L2 norm, ‖fp16(g·S)/S − g‖ / ‖g‖, the
measure the training audit uses (in a log without it, more than
--underflow-fraction of their nonzero elements flushed to zero).`})

	checkPlateauUnexplained = checks.Register(&checks.Check{ID: "FP5006", Title: "gap to the fp32 baseline not explained by the loss scale", Severity: checks.SevWarning, Doc: `The fp16 run ends above the fp32 baseline by more than the tolerance, but
the loss scale shows no sign of trouble: few skipped steps and no scale
pinned low. The gap does not come from the loss scaler. Check that both
runs used the same data, seed, schedule and number of steps (compare a
second fp32 seed to see the run-to-run spread); if the gap persists,
precision loss in the forward pass may be the cause: audit the model for
underflow (FP3001) with 'fp16audit run', or compare a learn.to_bf16() run.`})

	checkNoise = checks.Register(&checks.Check{ID: "FP5007", Title: "small gap to the fp32 baseline", Severity: checks.SevInfo, Doc: `The fp16 run ends slightly above the fp32 baseline, within the tolerance
(--plateau-tolerance, 3% by default), and the loss scale shows no sign of
underflow or skipped steps. This is the normal cost of fp16 rounding and
run-to-run noise; nothing needs fixing.`})

	checkWastedWarmup = checks.Register(&checks.Check{ID: "FP5008", Title: "initial loss scale too high", Severity: checks.SevInfo, Doc: `The first steps of the run were all skipped while GradScaler halved the
scale from its initial value (2^16 by default): the loss multiplied by
init_scale overflowed fp16 until the scale came down. Those steps did not
train. Starting at the scale that finally worked saves them:
learn.to_fp16(init_scale=...) in fastai, GradScaler(init_scale=...) in
PyTorch. This is the last knob to turn, and only for this waste: it is not
a fix for NaN, which comes from the forward pass or from diverging
gradients.`})

	checkSkipRate = checks.Register(&checks.Check{ID: "FP5009", Title: "many skipped steps", Severity: checks.SevWarning, Doc: `GradScaler skipped many optimizer steps: every backoff of the loss scale
is a step whose gradients held Inf or NaN and were thrown away silently.
A healthy scaler skips about one step per growth interval (2000 steps by
default) when it probes a higher scale; the threshold is the larger of
--skip-rate (1%) and two steps per growth interval. Warm-up skips at the
start are not counted. Frequent skips waste compute and slow training;
with a --baseline the diagnosis tells whether they cost accuracy.`})

	checkPinnedLow = checks.Register(&checks.Check{ID: "FP5010", Title: "loss scale pinned low", Severity: checks.SevWarning, Doc: `The loss scale sits at or below --low-scale (2^6 by default) and does
not come back up: either it did not grow for several growth intervals
(3 by default) while backoffs kept resetting it, or it fell by
--collapse-bits or more below where it settled after the warm-up (skipped
steps, non-finite losses: GradScaler's scale has no floor) and stayed
down to the end, for at least the final tenth of the run. GradScaler
regains one doubling per growth interval of clean steps (2000 by
default), so a scale many halvings down stays there for tens of
thousands of steps. At such a scale the small gradients fall below
fp16's smallest subnormal (2^-24) and become zero. Training may
plateau. learn.to_bf16() removes the problem; otherwise find the
gradients that overflow. With per-module gradient telemetry in the log,
the finding names the modules that lose gradient mass to fp16, as FP5005
does.`})

	checkRecoveredNaN = checks.Register(&checks.Check{ID: "FP5012", Title: "non-finite losses the run recovered from", Severity: checks.SevWarning, Doc: `Some losses were NaN or Inf, but the run went on: finite losses
followed them (the log does not end in a stretch of non-finite losses),
so this is not "the loss went NaN". GradScaler skipped those steps (the
gradients of a non-finite loss are non-finite at every scale): the
weights were left as they were, and the scale was halved once for each.
The batch of each such step is the suspect: a NaN or Inf in its data, a
value beyond fp16's 65504 (finite in fp32, infinite once autocast casts
it), or an activation close to fp16's limit that this batch pushed over.
In fp32 the same batch may well ruin the weights; the scaler saved the
run by skipping it. Look at those batches (a capture of the step holds
it: 'fp16audit replay' tells data from an overflowing op); drop or clean
bad samples, normalize inputs that reach 65504. The halvings stay: the
scale grows back one doubling per growth interval (2000 clean steps by
default), so many such steps pin it low (FP5010), where small gradients
underflow and the run may plateau (FP5005).`})

	checkMassLost = checks.Register(&checks.Check{ID: "FP5011", Title: "gradients lose mass to fp16", Severity: checks.SevWarning, Doc: `The Python companion's telemetry shows a module's gradient losing more
than --lost-mass-tolerance (1%) of its L2 norm to fp16 at the loss scales
the run used: ‖fp16(g·S)/S − g‖ / ‖g‖ for gradient g at scale S, pooled
over the fully measured lines, flushing to zero and the rounding of fp16's
subnormals together. It is the measure the training audit (fp16audit run
--loss) judges a backward pass by, so both say the same of a gradient.
That part of the gradient does not train the module. A larger loss scale
keeps it: when the scale is held low by gradients that overflow elsewhere
(FP5009, FP5010), find and clip those; otherwise train with
learn.to_bf16() (Ampere or newer), whose range holds small gradients
without scaling, or keep the module in fp32. The share of elements that
flush is no loss by itself (the tails of a confident softmax flush by the
thousand and cost nothing): logs that record only that share, written
before the companion recorded the mass, are not judged here.`})
)
