"""The fp16audit training log: JSON Lines, written one line per event.

The format is specified in docs/log-format.md (the training log format); this module
is its reference writer and reader. Every line is strict JSON (RFC 8259), so
any JSON parser reads it: non-finite floats, which JSON has no token for, are
written as the strings "NaN", "Infinity" and "-Infinity".
"""

from __future__ import annotations

import datetime
import json
import math
import os
from typing import Any, Dict, List, Optional, TextIO, Union

FORMAT_NAME = "fp16audit.trainlog"
FORMAT_VERSION = 1

# IEEE 754 binary16 facts the telemetry is measured against.
FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0**-14
FP16_MIN_SUBNORMAL = 2.0**-24

_NONFINITE_NAMES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def encode_float(x: Optional[float]) -> Union[float, str, None]:
    """A float as the log stores it: a JSON number, or one of the strings NaN, Infinity, -Infinity; None stays None."""
    if x is None:
        return None
    x = float(x)
    if math.isfinite(x):
        return x
    if math.isnan(x):
        return "NaN"
    return "Infinity" if x > 0 else "-Infinity"


def decode_float(v: Union[float, int, str, None]) -> Optional[float]:
    """The inverse of encode_float; also accepts what other writers produce: null (None) and float('nan') from bare tokens."""
    if v is None:
        return None
    if isinstance(v, str):
        try:
            return _NONFINITE_NAMES[v]
        except KeyError:
            raise ValueError(f"want a number or one of NaN, Infinity, -Infinity, found string {v!r}") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"want a number, found {type(v).__name__} {v!r}")
    return float(v)


def _utc_now():
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class LogWriter:
    """Writes one log: a header, then step, telemetry and end lines.

    `dest` is a path (opened line-buffered, so every finished line reaches
    the operating system: a run that dies mid-training leaves a readable log)
    or an open text file, which the writer does not close.
    """

    def __init__(self, dest: Union[str, "os.PathLike[str]", TextIO]) -> None:
        if hasattr(dest, "write"):
            self._f, self._own = dest, False
            self.path = getattr(dest, "name", None)
        else:
            self._f, self._own = open(dest, "w", encoding="utf-8", buffering=1), True
            self.path = str(dest)
        self._wrote_header = False

    def _line(self, obj):
        # allow_nan=False: a stray non-finite float must fail here, not
        # produce a line that strict JSON readers reject.
        self._f.write(json.dumps(obj, allow_nan=False, separators=(",", ":")) + "\n")

    def header(self, *, source: str, grad_scaler: Optional[Dict[str, Any]], steps_per_epoch: Optional[int] = None,
               telemetry: Optional[Dict[str, Any]] = None, **extra: Any) -> None:
        """Write the header; `grad_scaler` is a dict (see scaler_config) or None for a run without loss scaling."""
        if self._wrote_header:
            raise RuntimeError("the header was already written")
        obj = {
            "kind": "header",
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "source": source,
            "created": _utc_now(),
            "grad_scaler": grad_scaler,
            "steps_per_epoch": steps_per_epoch,
            "telemetry": telemetry,
        }
        for k, v in extra.items():
            obj.setdefault(k, v)
        self._line(obj)
        self._wrote_header = True

    def step(self, *, step: int, loss: Optional[float], scale: Optional[float], scale_used: Optional[float], skipped: bool,
             epoch: Optional[int] = None, iter: Optional[int] = None) -> None:
        """Write the step line of one optimizer step (docs/log-format.md, "step")."""
        self._need_header()
        self._line({
            "kind": "step",
            "step": int(step),
            "epoch": None if epoch is None else int(epoch),
            "iter": None if iter is None else int(iter),
            "loss": encode_float(loss),
            "scale": encode_float(scale),
            "scale_used": encode_float(scale_used),
            "skipped": bool(skipped),
        })

    def telemetry(self, *, step: int, reasons: List[str], measured: str, scale_used: Optional[float],
                  modules: List[Dict[str, Any]]) -> None:
        """Write the telemetry line of the step just written; `modules` as GradTelemetry.collect() returns them."""
        self._need_header()
        def first(which):
            return next((m["name"] for m in modules if m.get(which) and m[which]["nonfinite"] > 0), None)

        self._line({
            "kind": "telemetry",
            "step": int(step),
            "reasons": list(reasons),
            "measured": measured,
            "scale_used": encode_float(scale_used),
            "first_nonfinite_output": first("output"),
            "first_nonfinite_params": first("params"),
            "modules": [_encode_module(m) for m in modules],
        })

    def capture(self, line: Dict[str, Any]) -> None:
        """Write a capture line (docs/capture.md): the folder written for the step just logged, or the error."""
        self._need_header()
        self._line(dict(line))

    def end(self, *, steps: int, skipped: int, telemetry_lines: int) -> None:
        """Write the end line of a finished run."""
        self._need_header()
        self._line({"kind": "end", "steps": int(steps), "skipped": int(skipped), "telemetry_lines": int(telemetry_lines)})

    def close(self) -> None:
        """Close a file the writer opened; flush one it was given."""
        if self._own and not self._f.closed:
            self._f.close()
        elif not self._own:
            self._f.flush()

    def _need_header(self):
        if not self._wrote_header:
            raise RuntimeError("write the header first")


_GRAD_FLOATS = ("max_abs", "underflow_fraction", "sumsq", "lost_sumsq", "lost_mass")


def _encode_module(m):
    out = dict(m)
    for which in ("output", "params", "forward"):
        g = out.get(which)
        if g is not None:
            out[which] = {k: (encode_float(v) if k in _GRAD_FLOATS else v) for k, v in g.items()}
    if "weight_max_abs" in out:
        out["weight_max_abs"] = encode_float(out["weight_max_abs"])
    return out


class TrainLog:
    """A log read back: the header dict, the step and telemetry dicts in file order, the end dict or None."""

    def __init__(self, header: Dict[str, Any], steps: List[Dict[str, Any]], telemetry: List[Dict[str, Any]],
                 end: Optional[Dict[str, Any]], path: Optional[str] = None,
                 captures: Optional[List[Dict[str, Any]]] = None) -> None:
        self.header, self.steps, self.telemetry, self.end, self.path = header, steps, telemetry, end, path
        #: the capture lines (docs/capture.md), in file order
        self.captures = list(captures or [])

    def losses(self) -> List[Optional[float]]:
        """The loss of every step, in order (None where not recorded)."""
        return [s["loss"] for s in self.steps]

    def scales(self) -> List[Optional[float]]:
        """The scale after every step's update(), in order (None without scaling)."""
        return [s["scale"] for s in self.steps]


class LogFormatError(ValueError):
    """A malformed log; the message names the file and the line."""


def read_log(path: Union[str, "os.PathLike[str]"]) -> TrainLog:
    """Read a log written by LogWriter (or by anyone following the format); floats come back as Python floats."""
    header, steps, tele, end, captures = None, [], [], None, []
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue

            def fail(msg):
                raise LogFormatError(f"{path}:{lineno}: {msg}")

            try:
                # json.loads also takes the bare NaN/Infinity tokens that
                # Python's json module writes by default.
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                fail(f"invalid JSON: {e.msg}")
            if not isinstance(obj, dict):
                fail(f"want a JSON object, found {type(obj).__name__}")
            kind = obj.get("kind")
            if header is None:
                if kind != "header" or obj.get("format") != FORMAT_NAME:
                    fail(f'want the header line {{"kind": "header", "format": "{FORMAT_NAME}", ...}} first, found kind {kind!r}')
                if obj.get("version") != FORMAT_VERSION:
                    fail(f"want format version {FORMAT_VERSION}, found {obj.get('version')!r}")
                header = obj
                continue
            try:
                if kind == "step":
                    for k in ("loss", "scale", "scale_used"):
                        obj[k] = decode_float(obj.get(k))
                    steps.append(obj)
                elif kind == "telemetry":
                    obj["scale_used"] = decode_float(obj.get("scale_used"))
                    for m in obj.get("modules", []):
                        for which in ("output", "params", "forward"):
                            g = m.get(which)
                            if g is not None:
                                for k in _GRAD_FLOATS:
                                    if k in g or which != "forward":
                                        g[k] = decode_float(g.get(k))
                        if "weight_max_abs" in m:
                            m["weight_max_abs"] = decode_float(m["weight_max_abs"])
                    tele.append(obj)
                elif kind == "end":
                    end = obj
                elif kind == "capture":
                    captures.append(obj)
                elif kind == "header":
                    fail("a second header line")
                # Other kinds are ignored: version 1 may gain kinds.
            except ValueError as e:
                if isinstance(e, LogFormatError):
                    raise
                fail(str(e))
    if header is None:
        raise LogFormatError(f"{path}: empty log: want a header line first")
    return TrainLog(header, steps, tele, end, str(path), captures)
