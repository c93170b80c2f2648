"""Make the companion logs that internal/trainlog's tests read.

    /usr/bin/python3 internal/trainlog/testdata/companion/make_logs.py [NAME...]

needs torch (Debian's python3-torch 1.13 on a CPU is enough) and numpy, and
writes, next to this script:

- gradient_overflow_nan.jsonl: the Python companion's log (fp16audit.trainlog
  v1, with per-module gradient telemetry) of a plain AMP loop whose scale
  collapses and whose loss then turns Inf, because the gradients of one
  module, `planted`, overflow fp16 step after step;
- gradient_overflow_nan.losses.npy, gradient_overflow_nan.scales.npy: the
  same run's losses and scales as plain lists saved with np.save;
- underflow_mass.jsonl: a run at a scale pinned low (2^4) where one
  module's gradient really loses mass to fp16 and another's only flushes
  the tails of a confident softmax; underflow_mass.truth.json holds the
  mass each loses, computed from autograd's gradients with torch's own
  fp16 cast in float64, independently of the companion's hooks.

`make_logs.py NAME...` writes only the named logs. gradient_overflow_nan.jsonl
was written before the companion recorded the mass lost (sumsq,
lost_sumsq, lost_mass) and is kept as it was: the tests read it as the
older logs people have; rewriting it adds those fields and changes nothing
else.

The model is first -> ReLU -> planted -> ReLU -> head. head's weights start
300 times too large and, from step 200, its learning rate grows by 8% a step
(its own parameter group: a schedule far too aggressive for it). head
multiplies the gradient it sends back into planted by its weights, so as
they grow, planted's gradients (its weight gradient, and at times its output
gradient) leave fp16's range: GradScaler backs off again and again and the
scale collapses. Then head's output itself passes 65504 in the forward pass
and the loss is Inf.

On a CPU, EmulatedGradScaler decides overflows as a GPU would (python/
README.md): a scaled gradient out of fp16 range. The forward pass is fp32
on a CPU, so forward hooks round every Linear's output to fp16 and back, as
autocast holds it; that is what makes the loss Inf once head's output
overflows. The run is deterministic (fixed seeds, one thread): rerunning
the script rewrites the same logs, except the header's creation time.
"""

import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "..", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from fp16audit import AmpRecorder, EmulatedGradScaler, read_log  # noqa: E402

STEPS = 400
STEPS_PER_EPOCH = 20
RAMP_FROM = 200
NONFINITE_TAIL = 20


def round_to_fp16(module, inputs, output):
    # autocast holds a Linear's output in fp16: beyond 65504 it is Inf.
    return output.half().float()


def model_with_planted_module():
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("first", nn.Linear(8, 32))
    model.add_module("act1", nn.ReLU())
    model.add_module("planted", nn.Linear(32, 32))
    model.add_module("act2", nn.ReLU())
    model.add_module("head", nn.Linear(32, 1))
    with torch.no_grad():
        model.head.weight.mul_(300.0)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.register_forward_hook(round_to_fp16)
    return model


def gradient_overflow_nan(path):
    torch.set_num_threads(1)
    model = model_with_planted_module()
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)) for _ in range(STEPS_PER_EPOCH)]
    head = list(model.head.parameters())
    rest = [p for n, p in model.named_parameters() if not n.startswith("head.")]
    opt = torch.optim.SGD([{"params": rest}, {"params": head}], lr=1e-4)
    scaler = EmulatedGradScaler(growth_interval=20)
    nonfinite = 0
    with AmpRecorder(path, scaler, model, every=10, steps_per_epoch=STEPS_PER_EPOCH) as rec:
        for step in range(STEPS):
            if step >= RAMP_FROM:
                opt.param_groups[1]["lr"] *= 1.08
            xb, yb = data[step % len(data)]
            loss = nn.functional.mse_loss(model(xb), yb)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            rec.step(loss, epoch=step // STEPS_PER_EPOCH, iter=step % STEPS_PER_EPOCH)
            opt.zero_grad(set_to_none=True)
            if not math.isfinite(loss.item()):
                nonfinite += 1
                if nonfinite == NONFINITE_TAIL:
                    break
    return read_log(path)


MASS_STEPS = 40
MASS_EVERY = 5
MASS_SCALE = 2.0**4


def lost_sums(scaled):
    """Σ x² and Σ (fp16(x) − x)² of a scaled gradient over the elements fp16 holds finite, in float64."""
    x = scaled.detach().double().flatten()
    x = x[x.abs() < 65520]
    d = x.half().double() - x
    return float((x * x).sum()), float((d * d).sum())


def underflow_mass(path):
    """A classifier trained at a loss scale pinned at 2^4 (growth_interval beyond the run).

    first's weights are 10^6 times too small (and frozen), so quiet (a Linear without
    bias) sees tiny activations and its weight gradient is tiny too: at 2^4
    it lies in fp16's subnormal range and loses mass to rounding and
    flushing. head's bias makes the logits confident (class 9 by 30), so
    most of its output gradient, the softmax tails of e^-30, flushes to
    zero, while the entries that hold the gradient's mass (the true class
    and class 9, near ±1) do not.
    """
    torch.set_num_threads(1)
    torch.manual_seed(2)
    model = nn.Sequential()
    model.add_module("first", nn.Linear(8, 32))
    model.add_module("act", nn.ReLU())
    model.add_module("quiet", nn.Linear(32, 32, bias=False))
    model.add_module("head", nn.Linear(32, 10))
    with torch.no_grad():
        model.first.weight.mul_(1e-6)
        model.first.bias.mul_(1e-6)
        model.head.bias.zero_()
        model.head.bias[9] = 30.0
    # Frozen, so that training does not lift the activations.
    model.first.requires_grad_(False)
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(64, 8, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(8)]
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = EmulatedGradScaler(init_scale=MASS_SCALE, growth_interval=10 * MASS_STEPS)
    pooled = {"quiet/params": [0.0, 0.0], "head/output": [0.0, 0.0]}
    with AmpRecorder(path, scaler, model, every=MASS_EVERY, steps_per_epoch=len(data)) as rec:
        for step in range(MASS_STEPS):
            xb, yb = data[step % len(data)]
            logits = model(xb)
            logits.retain_grad()
            loss = nn.functional.cross_entropy(logits, yb)
            scaler.scale(loss).backward()
            if step % MASS_EVERY == 0:
                # The truth, from autograd's scaled gradients, each step's
                # sums divided by the square of its scale.
                s2 = scaler.get_scale() ** 2
                for key, grad in (("quiet/params", model.quiet.weight.grad), ("head/output", logits.grad)):
                    q, lost = lost_sums(grad)
                    pooled[key][0] += q / s2
                    pooled[key][1] += lost / s2
            scaler.step(opt)
            scaler.update()
            rec.step(loss, epoch=step // len(data), iter=step % len(data))
            opt.zero_grad(set_to_none=True)
    truth = {k: math.sqrt(lost / q) for k, (q, lost) in pooled.items()}
    with open(os.path.join(HERE, "underflow_mass.truth.json"), "w", encoding="utf-8") as f:
        json.dump({"lost_mass": truth, "scale": MASS_SCALE}, f, indent=1, sort_keys=True)
        f.write("\n")
    return read_log(path), truth


def main(names):
    if not names or "gradient_overflow_nan" in names:
        path = os.path.join(HERE, "gradient_overflow_nan.jsonl")
        log = gradient_overflow_nan(path)
        np.save(os.path.join(HERE, "gradient_overflow_nan.losses.npy"), np.array(log.losses(), dtype=np.float32))
        np.save(os.path.join(HERE, "gradient_overflow_nan.scales.npy"), np.array(log.scales(), dtype=np.float64))
        skipped = sum(s["skipped"] for s in log.steps)
        first_nan = next(s["step"] for s in log.steps if not math.isfinite(s["loss"]))
        print(f"{path}: {len(log.steps)} steps, {skipped} skipped, first non-finite loss at step {first_nan}, "
              f"{len(log.telemetry)} telemetry lines")
    if not names or "underflow_mass" in names:
        path = os.path.join(HERE, "underflow_mass.jsonl")
        log, truth = underflow_mass(path)
        print(f"{path}: {len(log.steps)} steps, {len(log.telemetry)} telemetry lines; mass lost {truth}")


if __name__ == "__main__":
    main(sys.argv[1:])
