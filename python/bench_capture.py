"""Measure what an armed capture costs per step, and what writing one costs.

    <python with torch 2.x> python/bench_capture.py [--steps 200] [--big-params 100e6] [--keep DIR]

1. Per step, with nothing captured: the same training loop (a 6-layer
   MLP, CPU autocast fp16 with torch.amp.GradScaler("cpu"), Adam) with
   the recorder alone and with the recorder and an armed capture, each
   run three times interleaved; the median step time of each and the
   ratio. The capture keeps the previous batch by reference and counts a
   few numbers per step: its cost should be noise.
2. Writing one capture of a model of about --big-params parameters (a
   stack of square Linear layers trained one step with Adam, so the
   optimizer holds its two moments): the seconds the write takes, split
   into the export and the rest, and the folder's size by file.

Timings depend on the machine and its load: print `uptime` beside them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from fp16audit import AmpRecorder, Capture  # noqa: E402
from fp16audit import capture as capture_mod  # noqa: E402


def loop(steps, armed, tmp, width=512):
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(width, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cpu")
    x = torch.randn(128, width)
    y = torch.randint(0, 10, (128,))
    loss_fn = nn.CrossEntropyLoss()
    kw = {}
    if armed:
        kw = dict(optimizer=opt, loss_func=loss_fn, capture=Capture(os.path.join(tmp, "caps")))
    times = []
    with AmpRecorder(os.path.join(tmp, "run-%d.jsonl" % armed), scaler, model, every=100, **kw) as rec:
        for _ in range(steps):
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = loss_fn(model(x).float(), y)
            scaler.scale(loss).backward()
            if armed:
                rec.before_step(loss, batch=(x, y))
            scaler.step(opt)
            scaler.update()
            rec.step(loss, batch=(x, y) if armed else None)
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        if armed and rec.captures:
            raise SystemExit("the benchmark's loop captured %s: it must capture nothing" % rec.captures)
    return statistics.median(times[10:])


def per_step(steps):
    tmp = tempfile.mkdtemp(prefix="fp16audit-bench-")
    try:
        res = {False: [], True: []}
        for _ in range(3):
            for armed in (False, True):
                res[armed].append(loop(steps, armed, tmp))
        base, armed = statistics.median(res[False]), statistics.median(res[True])
        print("per step (median of 3 runs of %d steps): recorder %.2f ms, recorder + armed capture %.2f ms: %+.1f%%" % (
            steps, 1e3 * base, 1e3 * armed, 100 * (armed / base - 1)))
        print("  runs: recorder %s ms; armed %s ms" % (
            ", ".join("%.2f" % (1e3 * t) for t in res[False]), ", ".join("%.2f" % (1e3 * t) for t in res[True])))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def big_write(params, exporter, keep=None):
    width = 2048
    n = max(1, int(round(params / (width * width + width))))
    torch.manual_seed(0)
    layers = []
    for _ in range(n):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(8, width)
    y = torch.randn(8, width)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    total = sum(p.numel() for p in model.parameters())
    tmp = keep or tempfile.mkdtemp(prefix="fp16audit-bench-")
    try:
        core = capture_mod.CaptureCore(Capture(os.path.join(tmp, "caps"), exporter=exporter), model=model, optimizer=opt,
                                       scaler=torch.amp.GradScaler("cpu"), loss_func=nn.MSELoss(), policy="autocast-fp16")
        export_time = []
        import importlib

        audit_mod = importlib.import_module("fp16audit.audit")

        orig = audit_mod._export

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                export_time.append(time.perf_counter() - t0)

        audit_mod._export = timed
        try:
            core.request()
            t0 = time.perf_counter()
            ev = core.before_update(0, loss.detach(), x, y, scale=65536.0)
            wall = time.perf_counter() - t0
        finally:
            audit_mod._export = orig
        if ev is None or ev.path is None:
            raise SystemExit("the capture failed: %s" % (ev and ev.error))
        sizes = {}
        for root, _, files in os.walk(ev.path):
            for f in files:
                p = os.path.join(root, f)
                sizes[os.path.relpath(p, ev.path)] = os.path.getsize(p)
        mb = sum(sizes.values()) / 1e6
        print("capture of a %.1f M-parameter model (%d Linear %dx%d, Adam; exporter %s): written in %.1f s (export %.1f s, the rest "
              "%.1f s); %.0f MB" % (total / 1e6, n, width, width, exporter, wall, sum(export_time), wall - sum(export_time), mb))
        for f, s in sorted(sizes.items(), key=lambda kv: -kv[1])[:6]:
            print("  %-32s %8.1f MB" % (f, s / 1e6))
        if keep:
            print("kept: %s (FP16AUDIT_BENCH_CAPTURE=%s go test -run '^$' -bench Replay ./internal/audit/)" % (ev.path, ev.path))
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--big-params", type=float, default=100e6)
    ap.add_argument("--exporter", default="auto", choices=["auto", "dynamo", "torchscript"])
    ap.add_argument("--skip-steps", action="store_true")
    ap.add_argument("--keep", default=None, help="write the large capture under this folder and keep it (for BenchmarkReplay)")
    a = ap.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    print("torch %s, %d threads" % (torch.__version__, torch.get_num_threads()))
    if not a.skip_steps:
        per_step(a.steps)
    if a.big_params > 0:
        big_write(a.big_params, a.exporter, a.keep)


if __name__ == "__main__":
    main()
