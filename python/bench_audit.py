"""What fp16audit.audit() costs on real architectures, and where the time goes.

    .venv-py/bin/python python/bench_audit.py                      # torch 1.13, torchvision 0.14
    <torch-2 virtualenv>/bin/python python/bench_audit.py          # torch 2.x (make bench runs both)
    python/bench_audit.py --models resnet18,vit_b_16 --json out.json

For each torchvision architecture of a fixed set (random init from a fixed
seed, eval mode, 10 classes), one audit of two batches of 2 images at
224x224 under autocast-fp16, timed in three parts: the export (audit.py's
_export), the binary (its _run_binary: every pass, the fixes' reruns),
and the rest (drawing the batches, running the model once for its
outputs, writing the .npz files, reading the report). Then a second
audit of the same model under autocast-bf16, which reuses the export
while the weights are unchanged. Beside them, PyTorch's own forward on
the same batches in fp32 and, where torch has CPU fp16 kernels (2.x), in
CPU autocast fp16: the ratio audit / forward is the cost of asking.

The first audit of the process pays the exporter's imports; a small
model is audited once before the timed ones, and its time is printed
apart. Timings on a shared machine move with its load: the load
average is printed beside them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torchvision  # noqa: E402

import fp16audit  # noqa: E402

audit_mod = importlib.import_module("fp16audit.audit")

# In torchvision 0.14 (Debian's, beside torch 1.13) and 0.29 (torch 2.15)
# alike: residual CNNs, depthwise/inverted-residual CNNs with
# squeeze-excitation, a regnet, a dense CNN, a ConvNeXt, a ViT and a Swin.
ARCHS = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0",
         "regnet_y_400mf", "shufflenet_v2_x1_0", "squeezenet1_1", "mnasnet1_0", "densenet121", "convnext_tiny",
         "vit_b_16", "swin_t"]


class Timer:
    """Wraps the functions of audit.py that export the model (_export_into;
    _export in the versions before it) and run the binary (_run_binary) to
    add up their time."""

    def __init__(self):
        self.t: Dict[str, float] = {}
        self.export = "_export_into" if hasattr(audit_mod, "_export_into") else "_export"
        for name in (self.export, "_run_binary"):
            self._wrap(name)

    def _wrap(self, name):
        real = getattr(audit_mod, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                self.t[name] = self.t.get(name, 0.0) + time.perf_counter() - t0

        setattr(audit_mod, name, timed)

    def audit(self, model, batches, policy):
        self.t.clear()
        t0 = time.perf_counter()
        r = fp16audit.audit(model, iter(batches), n_batches=len(batches), policy=policy, progress=False)
        total = time.perf_counter() - t0
        export, binary = self.t.get(self.export, 0.0), self.t.get("_run_binary", 0.0)
        return r, {"total": total, "export": export, "binary": binary, "rest": total - export - binary}


def forward_time(model, batches, fp16: bool) -> Dict[str, float]:
    """PyTorch's own forward on the batches: fp32, and CPU autocast fp16 where torch has it and it is asked for."""
    out = {}
    with torch.no_grad():
        model(batches[0])  # warm
        t0 = time.perf_counter()
        for x in batches:
            model(x)
        out["fp32"] = time.perf_counter() - t0
        if fp16 and int(torch.__version__.split(".")[0]) >= 2:
            with torch.autocast("cpu", dtype=torch.float16):
                model(batches[0])
                t0 = time.perf_counter()
                for x in batches:
                    model(x)
            out["fp16"] = time.perf_counter() - t0
    return out


def build(arch: str):
    torch.manual_seed(0)
    return getattr(torchvision.models, arch)(num_classes=10).eval()


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(ARCHS), help="torchvision architectures, comma-separated")
    ap.add_argument("--batch", type=int, default=2, help="images per batch (two batches)")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--no-fp16-forward", action="store_true",
                    help="time PyTorch's forward in fp32 only (CPU fp16 kernels are ~10x slower: the fp16 forward dominates the run)")
    a = ap.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    timer = Timer()
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(a.batch, 3, a.size, a.size, generator=g) for _ in range(2)]
    t0 = time.perf_counter()
    small = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2))
    timer.audit(small.eval(), batches[:1], "autocast-fp16")
    warm = time.perf_counter() - t0
    print("torch %s, torchvision %s, %d threads; load average %s; first audit of the process (imports) %.2f s" % (
        torch.__version__, torchvision.__version__, torch.get_num_threads(), " ".join("%.2f" % x for x in os.getloadavg()), warm))
    print("%-20s %-10s %7s %7s %7s %7s %6s | %7s %7s | %7s %7s | %s" % (
        "model", "exporter", "audit", "export", "binary", "rest", "share", "again", "export", "fp32", "fp16", "verdict"))
    rows = []
    for arch in a.models.split(","):
        model = build(arch)
        fwd = forward_time(model, batches, not a.no_fp16_forward)
        r, t = timer.audit(model, batches, "autocast-fp16")
        r2, t2 = timer.audit(model, batches, "autocast-bf16")
        row: Dict[str, Any] = {"model": arch, "exporter": r.exporter, "verdict": r.verdict, "first": t, "second": t2,
                               "forward": fwd, "load": os.getloadavg()[0]}
        rows.append(row)
        print("%-20s %-10s %7.2f %7.2f %7.2f %7.2f %5.0f%% | %7.2f %7.2f | %7.2f %7s | %s" % (
            arch, r.exporter, t["total"], t["export"], t["binary"], t["rest"], 100 * t["export"] / t["total"],
            t2["total"], t2["export"], fwd["fp32"], "%.2f" % fwd["fp16"] if "fp16" in fwd else "-", r.verdict), flush=True)
    med = statistics.median(x["first"]["total"] for x in rows)
    share = statistics.median(x["first"]["export"] / x["first"]["total"] for x in rows)
    again = statistics.median(x["second"]["total"] for x in rows)
    fwd = statistics.median(x["forward"]["fp32"] + x["forward"].get("fp16", 0.0) for x in rows)
    print("median audit %.2f s (export %.0f%% of it), a second audit of the same weights %.2f s; PyTorch's own forward %.2f s "
          "(fp32%s); load average now %s" % (med, 100 * share, again, fwd, " + CPU autocast fp16" if rows and "fp16" in rows[0]["forward"] else "",
                                             " ".join("%.2f" % x for x in os.getloadavg())))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"torch": torch.__version__, "torchvision": torchvision.__version__, "rows": rows,
                       "median_audit_s": med, "median_export_share": share, "median_second_audit_s": again}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
