"""Turn an fp16audit JSON Lines log into the JSON or CSV forms `fp16audit scales` reads.

    python -m fp16audit.convert run.jsonl run.json   # {"losses": [...], "scales": [...], ...}
    python -m fp16audit.convert run.jsonl run.csv    # step,epoch,loss,scale
    fp16audit-convert run.jsonl run.json             # the same, once installed

Both keep one entry per optimizer step with the scale read after update(),
the convention of docs/scales.md; the telemetry lines have no place in
those forms and are dropped. Converting needs no torch.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from typing import List, Optional

from .logfile import TrainLog, read_log


def _scaler(log):
    gs = log.header.get("grad_scaler")
    if not gs or not gs.get("enabled"):
        return None
    return {k: gs[k] for k in ("init_scale", "growth_factor", "backoff_factor", "growth_interval") if k in gs}


def _check_consecutive(log):
    for i, s in enumerate(log.steps):
        if s["step"] != i:
            raise ValueError(f"{log.path}: step line {i} has step {s['step']}: the JSON and CSV forms need every step from 0")


def to_scales_json(log: TrainLog, out: str) -> None:
    """Write the JSON form: losses, scales (when the run had a scaler), steps_per_epoch, grad_scaler."""
    _check_consecutive(log)
    obj = {"losses": [math.nan if s["loss"] is None else s["loss"] for s in log.steps]}
    gs = _scaler(log)
    if gs is not None:
        obj["scales"] = [s["scale"] for s in log.steps]
        obj["grad_scaler"] = gs
    if log.header.get("steps_per_epoch"):
        obj["steps_per_epoch"] = log.header["steps_per_epoch"]
    with open(out, "w", encoding="utf-8") as f:
        # fp16audit reads the bare NaN/Infinity tokens Python writes.
        json.dump(obj, f, allow_nan=True)


def _csv_float(x):
    if x is None or math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)


def to_csv(log: TrainLog, out: str) -> None:
    """Write the CSV form: step, epoch (when known), loss, scale (when the run had a scaler)."""
    _check_consecutive(log)
    has_scale = _scaler(log) is not None
    has_epoch = all(s.get("epoch") is not None for s in log.steps) and bool(log.steps)
    cols = ["step"] + (["epoch"] if has_epoch else []) + ["loss"] + (["scale"] if has_scale else [])
    with open(out, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for s in log.steps:
            row = [s["step"]]
            if has_epoch:
                row.append(s["epoch"])
            row.append(_csv_float(s["loss"]))
            if has_scale:
                row.append(_csv_float(s["scale"]))
            w.writerow(row)


def main(argv: Optional[List[str]] = None) -> int:
    """The command line: python -m fp16audit.convert LOG.jsonl OUT.json|OUT.csv (or fp16audit-convert); returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or not argv[1].lower().endswith((".json", ".csv")):
        print("usage: python -m fp16audit.convert LOG.jsonl OUT.json|OUT.csv", file=sys.stderr)
        return 2
    src, dst = argv
    try:
        log = read_log(src)
        (to_csv if dst.lower().endswith(".csv") else to_scales_json)(log, dst)
    except (OSError, ValueError) as e:
        print(f"fp16audit.convert: {e}", file=sys.stderr)
        return 1
    print(f"{dst}: {len(log.steps)} steps from {src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
