"""Recording a plain PyTorch mixed-precision loop.

    scaler = torch.cuda.amp.GradScaler()
    with AmpRecorder("run.jsonl", scaler, model, every=100, steps_per_epoch=len(loader)) as rec:
        for epoch in range(epochs):
            for i, (xb, yb) in enumerate(loader):
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = loss_func(model(xb), yb)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                rec.step(loss, epoch=epoch, iter=i)
                opt.zero_grad(set_to_none=True)
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, TextIO, Union

import torch
from torch import nn

from .logfile import FP16_MAX, FP16_MIN_NORMAL, FP16_MIN_SUBNORMAL, LogWriter
from .telemetry import FULL, OFF, OVERFLOW, GradTelemetry, ModuleChoice


def scaler_config(scaler: Any) -> Optional[Dict[str, Any]]:
    """The header's grad_scaler entry: None without a scaler, {"enabled": false} for a disabled one."""
    if scaler is None:
        return None
    if not scaler.is_enabled():
        return {"enabled": False, "class": type(scaler).__name__}
    return {
        "enabled": True,
        "class": type(scaler).__name__,
        # Read before the first step, get_scale() is the initial scale
        # (GradScaler returns init_scale until its first scale() call).
        "init_scale": float(scaler.get_scale()),
        "growth_factor": float(scaler.get_growth_factor()),
        "backoff_factor": float(scaler.get_backoff_factor()),
        "growth_interval": int(scaler.get_growth_interval()),
    }


def _loss_value(loss):
    if loss is None:
        return None
    if isinstance(loss, torch.Tensor):
        return float(loss.detach().float().item())
    return float(loss)


class AmpRecorder:
    """Writes the fp16audit log of a training run, one step line per optimizer step.

    Create it before the first step and call step() once per optimizer step,
    after scaler.update(). `scaler` is a torch.cuda.amp.GradScaler (or
    anything with its get_scale/is_enabled/get_*_factor methods, such as
    EmulatedGradScaler); None or a disabled scaler records losses only.

    With a `model`, per-module gradient telemetry (GradTelemetry, `modules`
    chooses the modules) is measured in full and written every `every`
    steps (0: never), and, with on_skipped, written for every skipped step.
    Since a skip is known only after the backward pass, on_skipped makes
    the hooks measure the overflow part (Inf/NaN counts, max |x|) on every
    other step. Extra keyword arguments go into the header.
    """

    def __init__(self, path: Union[str, "os.PathLike[str]", TextIO], scaler: Any = None, model: Optional[nn.Module] = None, *,
                 every: int = 100, on_skipped: bool = True, steps_per_epoch: Optional[int] = None,
                 modules: ModuleChoice = None, source: str = "torch", **header_extra: Any) -> None:
        if every is None or every < 0:
            raise ValueError("every must be 0 (no interval telemetry) or a positive number of steps")
        self.every = int(every)
        self.on_skipped = bool(on_skipped)
        self._scaler = scaler if scaler is not None and scaler.is_enabled() else None
        self._scale = float(self._scaler.get_scale()) if self._scaler is not None else None
        self.telemetry = GradTelemetry(model, modules) if model is not None else None
        self._watch = None
        if self.telemetry is not None and self._scaler is not None and hasattr(self._scaler, "watch"):
            # EmulatedGradScaler: an activation gradient out of fp16 range
            # counts as an overflow, as it would under autocast on a GPU.
            self._watch = self._scaler.watch(self.telemetry.overflowed)
        tele_header = None
        if self.telemetry is not None:
            tele_header = {
                "every": self.every,
                "on_skipped": self.on_skipped,
                "fp16_max": FP16_MAX,
                "fp16_min_normal": FP16_MIN_NORMAL,
                "fp16_min_subnormal": FP16_MIN_SUBNORMAL,
                "modules": [{"name": n, "type": type(m).__name__} for n, m in self.telemetry.watched],
            }
        header_extra.setdefault("torch_version", torch.__version__)
        try:
            self._writer = LogWriter(path)
            self._writer.header(source=source, grad_scaler=scaler_config(scaler), steps_per_epoch=steps_per_epoch,
                                telemetry=tele_header, **header_extra)
        except BaseException:
            self.detach()
            raise
        self.path = self._writer.path
        self.steps = 0
        self.skipped = 0
        self.telemetry_lines = 0
        self._closed = False
        self._arm()

    def _arm(self):
        # What the hooks measure during the coming step (number self.steps).
        if self.telemetry is None:
            return
        if self.every and self.steps % self.every == 0:
            self.telemetry.level = FULL
        elif self.on_skipped:
            self.telemetry.level = OVERFLOW
        else:
            self.telemetry.level = OFF

    def step(self, loss: Union[torch.Tensor, float, None], *, epoch: Optional[int] = None, iter: Optional[int] = None,
             skipped: Optional[bool] = None) -> bool:
        """Record one optimizer step, after scaler.update(); returns whether it was skipped.

        A step counts as skipped when the scale went down in update() (a
        backoff: GradScaler found Inf/NaN and did not call optimizer.step),
        or when the caller passes skipped=True because it knows better
        (fastai's CancelStepException).
        """
        if self._closed:
            raise RuntimeError("the recorder is closed")
        used = after = None
        was_skipped = bool(skipped)
        if self._scaler is not None:
            used = self._scale
            after = float(self._scaler.get_scale())
            if after < used:
                was_skipped = True
            self._scale = after
        n = self.steps
        self._writer.step(step=n, loss=_loss_value(loss), scale=after, scale_used=used, skipped=was_skipped,
                          epoch=epoch, iter=iter)
        if self.telemetry is not None:
            level = self.telemetry.level
            reasons = []
            if was_skipped and self.on_skipped:
                reasons.append("skipped")
            if level == FULL:
                reasons.append("interval")
            if reasons:
                self._writer.telemetry(step=n, reasons=reasons, measured=level, scale_used=used,
                                       modules=self.telemetry.collect())
                self.telemetry_lines += 1
            self.telemetry.reset()
        self.steps += 1
        self.skipped += was_skipped
        self._arm()
        return was_skipped

    def close(self) -> None:
        """Write the end line, detach the hooks and close the file; a log without an end line is from a run that stopped early."""
        if self._closed:
            return
        self._closed = True
        try:
            self._writer.end(steps=self.steps, skipped=self.skipped, telemetry_lines=self.telemetry_lines)
        finally:
            self.detach()
            self._writer.close()

    def detach(self) -> None:
        """Remove the hooks and the scaler watch without ending the log."""
        if self._watch is not None:
            self._watch.remove()
            self._watch = None
        if self.telemetry is not None:
            self.telemetry.remove()

    def __enter__(self) -> AmpRecorder:
        return self

    def abort(self) -> None:
        """Stop without an end line, as for a run that failed: detach the hooks and close the file."""
        if self._closed:
            return
        self._closed = True
        self.detach()
        self._writer.close()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        # A run that raised gets no end line: readers tell it from a
        # finished one.
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False
