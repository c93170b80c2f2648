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

With capture="captures/" (or a fp16audit.Capture), the recorder also keeps
the failing step (fp16audit.capture): pass it the optimizer and the loss
function, and the batch at every step; call before_step between the
backward and the optimizer to capture before an update is applied (runs
without a GradScaler, loss spikes):

    with AmpRecorder("run.jsonl", scaler, model, optimizer=opt, loss_func=loss_func,
                     capture="captures/") as rec:
        for i, (xb, yb) in enumerate(loader):
            ...
            scaler.scale(loss).backward()
            rec.before_step(loss, batch=(xb, yb))     # optional
            scaler.step(opt)
            scaler.update()
            rec.step(loss, batch=(xb, yb))
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, TextIO, Tuple, Union

import torch
from torch import nn

from .capture import Capture, CaptureCore, CaptureEvent, CaptureStop
from .logfile import FP16_MAX, FP16_MIN_NORMAL, FP16_MIN_SUBNORMAL, LogWriter
from .telemetry import FULL, OFF, OVERFLOW, GradTelemetry, ModuleChoice

Batch = Any


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


def underflow_evidence(rows: List[Dict[str, Any]], tolerance: float = 0.01) -> Optional[Tuple[str, str]]:
    """The module of a full telemetry line whose parameter gradient fp16 does not hold, (name, what), or None.

    A gradient the hooks saw in fp32 and that fp16 would lose more than
    `tolerance` of its norm of; or, where that cannot be measured because
    the gradient arrived as fp16 values (autocast computed it in fp16, so
    what underflowed is zero already), one that is more than half zeros.
    """
    worst, what = None, None
    for r in rows:
        p = r.get("params")
        if not p:
            continue
        lost, nonzero, numel = p.get("lost_mass"), p.get("nonzero"), p.get("numel") or 0
        if lost is not None:
            score, text = lost / tolerance, "loses %.1f%% of its norm to fp16" % (100 * lost)
        elif nonzero is not None and numel:
            score, text = 2 * (1 - nonzero / numel), "is %.0f%% zeros" % (100 * (1 - nonzero / numel))
        else:
            continue
        if score > 1 and (worst is None or score > worst):
            worst, what = score, (r["name"], text)
    return what


def _grads_finite(model: nn.Module) -> bool:
    """Whether every gradient of the model is finite: one reduction per tensor and one host sync."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return True
    foreach = getattr(torch, "_foreach_norm", None)
    norms = foreach(grads) if foreach is not None else [g.norm() for g in grads]
    return bool(torch.isfinite(torch.stack([n.float().to(norms[0].device) for n in norms])).all())


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

    capture (a folder or a fp16audit.Capture) keeps the failing step's
    state (fp16audit.capture, docs/capture.md); it needs the model, and
    takes the optimizer (its class, hyperparameters and state go into the
    capture), the loss function (the replay's loss), policy (fp16audit's
    --policy: autocast-fp16 by default with an enabled scaler, to be given
    without one), autocast_device (torch.autocast's device_type: the
    model's device by default) and n_inp (how many leading elements of a
    tuple batch are inputs; the next one is the target). A capture that
    fails warns; with on_event="stop" the recorder raises CaptureStop.
    """

    def __init__(self, path: Union[str, "os.PathLike[str]", TextIO], scaler: Any = None, model: Optional[nn.Module] = None, *,
                 every: int = 100, on_skipped: bool = True, steps_per_epoch: Optional[int] = None,
                 modules: ModuleChoice = None, source: str = "torch", capture: Union[Capture, str, "os.PathLike[str]", None] = None,
                 optimizer: Any = None, loss_func: Any = None, policy: Optional[str] = None,
                 autocast_device: Optional[str] = None, n_inp: int = 1, telemetry: bool = True, **header_extra: Any) -> None:
        if every is None or every < 0:
            raise ValueError("every must be 0 (no interval telemetry) or a positive number of steps")
        cap = Capture.of(capture)
        if cap is not None and model is None:
            raise ValueError("AmpRecorder: capture needs the model (AmpRecorder(path, scaler, model, capture=...))")
        if cap is not None and policy is None:
            if scaler is None or not scaler.is_enabled():
                raise ValueError("AmpRecorder: capture without an enabled GradScaler: say which precision the run trains in, "
                                 "policy='autocast-bf16' (torch.autocast with bfloat16) or policy='fp32'")
            policy = "autocast-fp16"
        self.n_inp = int(n_inp)
        self.every = int(every)
        self.on_skipped = bool(on_skipped)
        self._scaler = scaler if scaler is not None and scaler.is_enabled() else None
        self._scale = float(self._scaler.get_scale()) if self._scaler is not None else None
        self.telemetry = GradTelemetry(model, modules) if model is not None and telemetry else None
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
        self.capture: Optional[CaptureCore] = None
        if cap is not None:
            self.capture = CaptureCore(cap, model=model, optimizer=optimizer, scaler=scaler, loss_func=loss_func, policy=policy,
                                       autocast_device=autocast_device, trainer=header_extra.get("trainer", source),
                                       log_path=self.path if isinstance(self.path, str) else None)
        self._pending: List[CaptureEvent] = []
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

    @property
    def captures(self) -> List[CaptureEvent]:
        """The captures written (or failed) so far, in order."""
        return list(self.capture.events) if self.capture is not None else []

    def capture_now(self) -> None:
        """Capture the next step (trigger "request")."""
        if self.capture is None:
            raise RuntimeError("the recorder has no capture: create it with capture='captures/'")
        self.capture.request()

    def split_batch(self, batch: Batch) -> Tuple[Any, Any]:
        """(inputs, target) of a batch: a tuple's first n_inp elements are the inputs and the next one the target; a dict
        or a tensor is all inputs (a dict's labels key is the target)."""
        if isinstance(batch, (tuple, list)):
            items = list(batch)
            xs = tuple(items[:self.n_inp])
            return (xs[0] if len(xs) == 1 else xs), (items[self.n_inp] if len(items) > self.n_inp else None)
        return batch, None

    def before_step(self, loss: Union[torch.Tensor, float, None], batch: Batch = None, *, inputs: Any = None,
                    target: Any = None, epoch: Optional[int] = None, iter: Optional[int] = None) -> None:
        """Between the backward and the optimizer: the triggers the loss decides capture here, before the update.

        Without a GradScaler a non-finite loss or gradient is captured here
        and, with on_event="stop", CaptureStop is raised before the
        optimizer could write it into the weights.
        """
        if self._closed:
            raise RuntimeError("the recorder is closed")
        if self.capture is None:
            return
        if batch is not None:
            inputs, target = self.split_batch(batch)
        grads_finite = None
        if self._scaler is None and self.capture.capture.nonfinite_loss:
            grads_finite = _grads_finite(self.capture.model)
        ev = self.capture.before_update(self.steps, loss, inputs, target, epoch=epoch, iter=iter, scale=self._scale,
                                        grads_finite=grads_finite)
        if ev is None:
            return
        if ev.stop:
            # the run ends here, before the update: the step's line says it was not applied
            self._writer.step(step=self.steps, loss=_loss_value(loss), scale=self._scale, scale_used=self._scale, skipped=True,
                              epoch=epoch, iter=iter)
            self._writer.capture(ev.log_line())
            self.steps += 1
            self.skipped += 1
            raise CaptureStop(ev)
        self._pending.append(ev)

    def step(self, loss: Union[torch.Tensor, float, None], *, epoch: Optional[int] = None, iter: Optional[int] = None,
             skipped: Optional[bool] = None, batch: Batch = None, inputs: Any = None, target: Any = None) -> bool:
        """Record one optimizer step, after scaler.update(); returns whether it was skipped.

        A step counts as skipped when the scale went down in update() (a
        backoff: GradScaler found Inf/NaN and did not call optimizer.step),
        or when the caller passes skipped=True because it knows better
        (fastai's CancelStepException). With a capture, pass the step's
        batch (or inputs and target); a capture with on_event="stop" raises
        CaptureStop after the step's lines are written.
        """
        if self._closed:
            raise RuntimeError("the recorder is closed")
        if batch is not None:
            inputs, target = self.split_batch(batch)
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
                rows = self.telemetry.collect()
                self._writer.telemetry(step=n, reasons=reasons, measured=level, scale_used=used, modules=rows)
                self.telemetry_lines += 1
                if self.capture is not None and level == FULL:
                    self.capture.telemetry(underflow_evidence(rows))
            self.telemetry.reset()
        events, self._pending = self._pending, []
        if self.capture is not None:
            ev = self.capture.after_update(n, loss, inputs, target, skipped=was_skipped, scale_used=used, scale_after=after,
                                           epoch=epoch, iter=iter)
            if ev is not None:
                events.append(ev)
        for ev in events:
            self._writer.capture(ev.log_line())
        self.steps += 1
        self.skipped += was_skipped
        self._arm()
        stop = next((ev for ev in events if ev.stop), None)
        if stop is not None:
            raise CaptureStop(stop)
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
