"""fp16audit for Accelerate: the preflight of a custom loop, and its loss log.

    from fp16audit.accelerate import preflight, recorder

    accelerator = Accelerator(mixed_precision="fp16")
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    preflight(accelerator, model, loader)       # raises PreflightFailed when fp16 will give NaN
    with recorder(accelerator, "run.jsonl") as rec:
        for batch in loader:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step(); optimizer.zero_grad()
            rec.step(loss)                       # fp16audit scales reads the log

preflight audits two training batches (the loader's dataset's first
samples through its collate_fn; the run's data order and random states are
left as they were) under the Accelerator's mixed precision: "fp16" is
torch.autocast in fp16 with its GradScaler, "bf16" autocast in bf16, "no"
what "fp16" would do. Its fixes are in Accelerate's words
(Accelerator(mixed_precision="bf16"), GradScalerKwargs, ...). Accelerate
1.16 enables fp16's autocast and GradScaler only on an accelerator: on a
CPU, Accelerator(mixed_precision="fp16") trains in fp32, and the audit
says what fp16 does on a GPU.

With capture="captures/" (or a fp16audit.Capture) the recorder also keeps
the failing step (docs/capture.md), for `fp16audit replay`, as
AmpRecorder does in a plain loop: give it the optimizer and the loss, and
the batch at every step; rec.before_step() between the backward and
optimizer.step() captures before an update is applied:

    with recorder(accelerator, "run.jsonl", model, capture="captures/", optimizer=optimizer,
                  loss_func=loss_func) as rec:
        for batch in loader:
            ...
            accelerator.backward(loss)
            rec.before_step(loss, batch=batch)
            optimizer.step(); optimizer.zero_grad()
            rec.step(loss, batch=batch)          # raises CaptureStop with on_event="stop"

`import fp16audit` does not import this module (nor accelerate).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from accelerate import Accelerator

from ._trainers import PreflightFailed, decide, draw_batches, run_preflight
from .audit import Report

__all__ = ["preflight", "recorder", "accelerator_policy", "capture_policy", "PreflightFailed"]


def accelerator_policy(accelerator: Accelerator) -> Tuple[str, Optional[float], str]:
    """The policy an Accelerator trains under: (policy, init_scale, note)."""
    mp = str(accelerator.mixed_precision)
    scaler = getattr(accelerator, "scaler", None)
    if mp == "fp16":
        init = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else None
        note = ""
        if scaler is None:
            note = ('on this %s the Accelerator trains mixed_precision="fp16" in fp32 (autocast and the GradScaler are enabled only '
                    'on an accelerator): the audit says what fp16 does on a GPU' % accelerator.device.type.upper())
        return "autocast-fp16", init, note
    if mp == "bf16":
        return "autocast-bf16", None, ""
    return "autocast-fp16", None, 'the Accelerator\'s mixed_precision is %r: audited as mixed_precision="fp16" would train it' % mp


def capture_policy(accelerator: Accelerator) -> str:
    """The policy an Accelerator's run really trains under, for its capture
    (what the replay emulates): mixed_precision="fp16" is autocast-fp16
    where it holds a GradScaler and fp32 where it holds none (a CPU: no
    autocast either); "bf16" is autocast-bf16 where its autocast is on."""
    mp = str(accelerator.mixed_precision)
    scaler = getattr(accelerator, "scaler", None)
    if mp == "fp16" and scaler is not None and scaler.is_enabled():
        return "autocast-fp16"
    if mp == "bf16" and getattr(accelerator, "native_amp", False):
        return "autocast-bf16"
    if mp in ("fp16", "bf16", "no"):
        return "fp32"
    raise ValueError("fp16audit.accelerate: mixed_precision=%r has no fp16audit policy to replay a capture under; record "
                     "without capture=" % mp)


def preflight(accelerator: Accelerator, model: Any, dataloader: Any = None, *, batches: Optional[Sequence[Any]] = None,
              n_batches: int = 2, warn: bool = False, policy: Optional[str] = None, n_inp: Optional[int] = None,
              **audit_kwargs: Any) -> Report:
    """Audit model on n_batches of dataloader (or the given batches) under
    the accelerator's mixed precision; raise PreflightFailed when fp16 will
    give NaN (warn=True warns instead). Returns the Report. The model may
    be the one accelerator.prepare() returned: the audit exports the
    module inside, with the forward its class defines. Other keyword
    arguments go to fp16audit.audit (loss, target, max_memory, exporter,
    progress, fixes, ...)."""
    pol, init_scale, note = accelerator_policy(accelerator)
    notes = [note]
    if policy:
        pol, notes = policy, ["audited under policy=%r as asked" % policy]
    if batches is None:
        if dataloader is None:
            raise TypeError("fp16audit.accelerate.preflight: pass the training dataloader, or batches=[...]")
        batches = draw_batches(dataloader, n_batches)
    inner = accelerator.unwrap_model(model, keep_fp32_wrapper=True)
    device = accelerator.device.type
    r = run_preflight(inner, list(batches)[:n_batches], trainer="accelerate", policy=pol, notes=notes, n_inp=n_inp,
                      init_scale=init_scale, device_type=device if device != "cpu" else "cuda", audit_kwargs=audit_kwargs)
    stop = decide(r, warn)
    if stop is not None:
        raise stop
    return r


def recorder(accelerator: Accelerator, path: Any, model: Any = None, *, capture: Any = None, optimizer: Any = None,
             loss_func: Any = None, **kwargs: Any) -> Any:
    """An fp16audit.AmpRecorder over the accelerator's GradScaler (None in
    bf16, fp32 and for fp16 on a CPU: losses only): call rec.step(loss)
    after each optimizer.step(). model and the keyword arguments are
    AmpRecorder's (per-module gradient telemetry, every, n_inp, ...).

    capture (a folder or a fp16audit.Capture) keeps the failing step: it
    needs the model, and takes the optimizer (the one prepare() returned,
    or the torch optimizer inside it) and the loss function; the policy
    and the autocast device are the accelerator's (capture_policy). Pass
    the batch to rec.step (and rec.before_step) at every step."""
    from .recorder import AmpRecorder

    kwargs.setdefault("source", "accelerate")
    kwargs.setdefault("mixed_precision", str(accelerator.mixed_precision))
    inner = accelerator.unwrap_model(model, keep_fp32_wrapper=True) if model is not None else None
    if capture is not None:
        kwargs.setdefault("policy", capture_policy(accelerator))
        kwargs.setdefault("autocast_device", accelerator.device.type)
        # prepare() wraps the optimizer in an AcceleratedOptimizer: the
        # capture keeps the torch optimizer's class and state
        kwargs.update(capture=capture, optimizer=getattr(optimizer, "optimizer", optimizer), loss_func=loss_func)
    return AmpRecorder(path, getattr(accelerator, "scaler", None), inner, **kwargs)
