"""Measure what the recorder and its telemetry cost per training step.

    /usr/bin/python3 python/bench_telemetry.py [--steps 60] [--device cpu]

Trains a small CNN with the plain AMP recipe five ways and prints the
median step time of each: no recorder; the recorder without telemetry;
telemetry every 100 steps only (on_skipped=False: the hooks idle between);
telemetry every 100 steps and at skipped steps (the default: the overflow
part measured on every step); full telemetry written every step. On a CPU
the scaler is EmulatedGradScaler and the telemetry casts fp32 gradients to
fp16; on CUDA it is torch.cuda.amp.GradScaler under autocast.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from fp16audit import AmpRecorder, EmulatedGradScaler  # noqa: E402


def make_model():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.Conv2d(64, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )


def run(mode, steps, device, out):
    torch.manual_seed(0)
    model = make_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cuda = device == "cuda"
    scaler = torch.cuda.amp.GradScaler() if cuda else EmulatedGradScaler()
    x = torch.randn(64, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    rec = None
    if mode != "none":
        every = 1 if mode == "every-step" else 100
        rec = AmpRecorder(out, scaler, None if mode == "no-telemetry" else model, every=every,
                          on_skipped=mode != "interval-only")
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        with torch.autocast(device, dtype=torch.float16 if cuda else torch.bfloat16, enabled=cuda):
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if rec is not None:
            rec.step(loss)
        else:
            loss.item()  # the recorder reads the loss; so does any loop that logs it
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    if rec is not None:
        rec.close()
    return statistics.median(times[5:])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        base = None
        for mode in ("none", "no-telemetry", "interval-only", "every-100", "every-step"):
            t = run(mode, args.steps, args.device, os.path.join(d, "bench.jsonl"))
            base = base or t
            print(f"{mode:13s} {t * 1e3:8.2f} ms/step  {100 * (t / base - 1):+6.1f}%")


if __name__ == "__main__":
    main()
