"""What the trainer adapters share: drawing batches without touching the
run, the preflight's decision and message, and the raw-loss log.

Each trainer's module (fp16audit.transformers, fp16audit.lightning,
fp16audit.accelerate, and fastai's fp16audit.fastai) maps its trainer's
events and settings onto this and onto fp16audit.audit(); none of them
decides a verdict or words a fix: the binary does both, in the trainer's
words (`fp16audit run --trainer NAME`).
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence

from .audit import AuditFailure, Report, _cache_off, audit

__all__ = ["PreflightFailed", "draw_batches", "run_preflight", "LossLog", "policy_for_weights", "exportable", "base_model",
           "update_will_be_skipped", "CaptureHandle"]


class PreflightFailed(AuditFailure):
    """The preflight found that the run will fail under its mixed precision
    and stopped it before its first step; `report` is the audit."""

    def __init__(self, report: Report, message: str):
        AssertionError.__init__(self, message)
        self.report = report


def _torch():
    import torch

    return torch


@contextlib.contextmanager
def _rng_kept() -> Iterator[None]:
    """Put back every random state a collator or sampler may draw from, so
    that the run trains on the batches and masks it would have without the
    preflight."""
    torch = _torch()
    state = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    py = random.getstate()
    np_state = None
    np = sys.modules.get("numpy")
    if np is not None:
        np_state = np.random.get_state()
    try:
        yield
    finally:
        torch.set_rng_state(state)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(py)
        if np_state is not None:
            np.random.set_state(np_state)


def draw_batches(loader: Any, n: int, batch_size: Optional[int] = None) -> List[Any]:
    """Up to n training batches of loader, made the way it makes them (its
    dataset's first samples through its collate_fn) without iterating the
    loader itself: its sampler, its workers and the trainer's wrappers
    (Accelerate's DataLoaderShard, Lightning's CombinedLoader) are left
    untouched, and every random state is put back, so the run that follows
    sees the same data in the same order."""
    dataset = getattr(loader, "dataset", None)
    collate = getattr(loader, "collate_fn", None)
    bs = batch_size or getattr(loader, "batch_size", None)
    if bs is None:
        sampler = getattr(loader, "batch_sampler", None)
        bs = getattr(sampler, "batch_size", None)
    if dataset is None or collate is None or not bs:
        raise TypeError("fp16audit: cannot draw batches from a %s: want a torch DataLoader (with a dataset, a collate_fn and a "
                        "batch size); pass batches=... instead" % type(loader).__name__)
    out: List[Any] = []
    with _rng_kept():
        if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
            total = len(dataset)
            for b in range(n):
                idx = range(b * bs, min((b + 1) * bs, total))
                if len(idx) == 0:
                    break
                out.append(collate([dataset[i] for i in idx]))
        else:  # an IterableDataset: its first samples, from a fresh iterator
            it = iter(dataset)
            for _ in range(n):
                samples = [s for _, s in zip(range(bs), it)]
                if not samples:
                    break
                out.append(collate(samples))
    if not out:
        raise ValueError("fp16audit: the training DataLoader's dataset is empty: nothing to audit")
    return out


def base_model(model: Any) -> Any:
    """The module to export: a PEFT model's base model, which holds the
    LoRA layers PEFT put in place (their paths are getattr-able on it:
    model.layers.0.self_attn.q_proj.lora_A.default); the model itself
    otherwise. torch.export cannot take PeftModel's forward as it stands."""
    get = getattr(model, "get_base_model", None)
    if callable(get) and type(model).__module__.startswith("peft."):
        return get()
    return model


@contextlib.contextmanager
def exportable(model: Any) -> Iterator[Any]:
    """The model as the audit exports it, put back afterwards: a PEFT
    model's base model (base_model), with the forward its class defines
    (Accelerate's prepare(), and so the Hugging Face Trainer on a GPU,
    wraps model.forward in autocast, which an export would trace into the
    graph), and a Hugging Face model's key-value cache off (an export
    cannot return transformers' DynamicCache)."""
    m = base_model(model)
    saved = []
    for obj in {id(model): model, id(m): m}.values():
        d = getattr(obj, "__dict__", {})
        if "_original_forward" in d and "forward" in d:
            saved.append((obj, d["forward"]))
            d["forward"] = d["_original_forward"]
    try:
        with _cache_off(m):
            yield m
    finally:
        for obj, fwd in saved:
            obj.__dict__["forward"] = fwd


class _Batches:
    """Batches already drawn, which audit() iterates as it would a DataLoader."""

    def __init__(self, items: Sequence[Any]):
        self.items = list(items)

    def __iter__(self):
        return iter(self.items)


def policy_for_weights(model: Any) -> Optional[str]:
    """'half' when the model's trainable floating-point weights are all
    float16 (a model loaded with from_pretrained(dtype=torch.float16) or
    .half()'d and trained without autocast), None otherwise."""
    torch = _torch()
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if dtypes and dtypes <= {torch.float16}:
        return "half"
    return None


def message(report: Report) -> str:
    """The preflight's message: the verdict, then each verified fix."""
    msg = "fp16audit: %s — %s" % (report.verdict, report.verdict_text)
    fixes = [f["summary"] for f in report.working_fixes]
    if fixes:
        msg += "\n  verified fix: " + "\n  verified fix: ".join(fixes)
    return msg


def run_preflight(model: Any, batches: Sequence[Any], *, trainer: str, policy: str, notes: Sequence[str] = (),
                  n_inp: Optional[int] = None, init_scale: Optional[float] = None, device_type: str = "cuda",
                  audit_kwargs: Optional[Dict[str, Any]] = None) -> Report:
    """Audit model on batches under policy, the fixes in trainer's words."""
    kwargs = dict(audit_kwargs or {})
    extra = list(kwargs.pop("extra_args", ()))
    if "--trainer" not in extra:
        extra += ["--trainer", trainer]
    kwargs.setdefault("init_scale", init_scale)
    kwargs.setdefault("device_type", device_type)
    kwargs.setdefault("policy", policy)
    with exportable(model) as m:
        return audit(m, _Batches(batches), n_batches=len(batches), n_inp=n_inp, extra_args=extra,
                     _notes=[n for n in notes if n], **kwargs)


def decide(report: Report, warn: bool) -> Optional[PreflightFailed]:
    """None when the run may go on; otherwise warns (warn=True) and returns
    None, or returns the PreflightFailed that stops it."""
    if report.ok:
        return None
    msg = message(report)
    if warn:
        warnings.warn(msg, stacklevel=3)
        return None
    return PreflightFailed(report, msg)


def default_log(folder: Optional[str], name: str = "fp16audit-log.jsonl") -> Optional[str]:
    """A new log path in folder (the trainer's output or logging folder),
    never an existing file: fp16audit-log.jsonl, then -1, -2, ..."""
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    base, ext = os.path.splitext(name)
    path = os.path.join(folder, name)
    k = 1
    while os.path.exists(path):
        path = os.path.join(folder, "%s-%d%s" % (base, k, ext))
        k += 1
    return path


class LossLog:
    """The raw loss of every optimizer step in fp16audit's log format
    (fp16audit.AmpRecorder: `fp16audit scales` reads it), whatever the
    trainer's own logging shows: the Hugging Face Trainer's
    logging_nan_inf_filter replaces a NaN or Inf loss by the running mean
    in its logs, while this log keeps it. Losses of a step's micro-batches
    (gradient accumulation) are averaged; one NaN makes the step's NaN.

    With capture (a folder or a fp16audit.Capture) the same recorder keeps
    the failing step (fp16audit.capture, docs/capture.md): model,
    optimizer (the torch optimizer itself, not a trainer's wrapper),
    loss_func (a loss module, or a description of the loss the model
    computes: capture.LOSS_KEYS), policy (what the run trains under) and
    autocast_device go to the capture; telemetry and every are the
    recorder's per-module gradient telemetry (the pinned-plateau trigger
    and the culprit's logged growth need it).
    """

    def __init__(self, path: str, scaler: Any, source: str, *, model: Any = None, capture: Any = None, optimizer: Any = None,
                 loss_func: Any = None, policy: Optional[str] = None, autocast_device: Optional[str] = None,
                 telemetry: bool = False, every: int = 100, n_inp: int = 1, **header: Any):
        from .recorder import AmpRecorder

        kw: Dict[str, Any] = {}
        if capture is not None:
            kw = dict(capture=capture, optimizer=optimizer, loss_func=loss_func, policy=policy, autocast_device=autocast_device)
        watched = model if (capture is not None or telemetry) else None
        self.recorder = AmpRecorder(path, scaler, watched, source=source, telemetry=telemetry, every=every if telemetry else 0,
                                    n_inp=n_inp, **kw, **header)
        self.path = self.recorder.path
        self._losses: List[float] = []

    def add(self, loss: Any) -> None:
        """Keep one micro-batch's loss (a tensor or a number)."""
        if loss is None:
            return
        torch = _torch()
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                return
            loss = loss.detach().float().item()
        self._losses.append(float(loss))

    def _loss(self) -> Optional[float]:
        return sum(self._losses) / len(self._losses) if self._losses else None

    @property
    def capturing(self) -> bool:
        """Whether a capture is armed."""
        return self.recorder.capture is not None

    def before_step(self, inputs: Any, target: Any = None, *, epoch: Optional[int] = None, iter: Optional[int] = None) -> None:
        """Between the backward and the optimizer step: the capture's loss triggers, at the step's weights. With
        on_event="stop" it raises fp16audit.CaptureStop after writing the step's lines (the adapter stops the run)."""
        if not self.capturing:
            return
        try:
            self.recorder.before_step(self._loss(), inputs=inputs, target=target, epoch=epoch, iter=iter)
        except BaseException:
            self._losses = []
            raise

    def step(self, epoch: Optional[int] = None, iter: Optional[int] = None, *, inputs: Any = None, target: Any = None) -> Optional[float]:
        """Write the step's line (after the optimizer step and the scaler's
        update); returns the loss written. With a capture, inputs and
        target are the step's batch; CaptureStop is raised as in
        before_step."""
        loss = self._loss()
        self._losses = []
        self.recorder.step(loss, epoch=epoch, iter=iter, inputs=inputs, target=target)
        return loss

    def capture_now(self) -> None:
        """Capture the next step (trigger "request")."""
        self.recorder.capture_now()

    @property
    def captures(self) -> List[Any]:
        """The captures written (or failed) so far (fp16audit.capture.CaptureEvent)."""
        return self.recorder.captures

    def close(self) -> None:
        self.recorder.close()

    def abort(self) -> None:
        """Close the log without its end line: the run stopped early."""
        self.recorder.abort()


def update_will_be_skipped(scaler: Any, model: Any) -> bool:
    """Whether the optimizer step about to run will be skipped by an
    enabled GradScaler: the model's gradients hold Inf/NaN. A capture that
    stops the run before the update may then let the trainer finish the
    step in its own way, since no update will be applied."""
    from .recorder import _grads_finite

    try:
        enabled = scaler is not None and bool(scaler.is_enabled())
    except Exception:  # noqa: BLE001 - anything scaler-like
        enabled = scaler is not None
    return enabled and not _grads_finite(model)


class CaptureHandle:
    """What a trainer callback offers of its captures: the list of those
    written in the latest run, and a request to capture the next step. The
    callback holds its LossLog in `loss_log` (None before the run opens it)
    and the captures of a run whose log is closed in `_captures`."""

    loss_log: Optional[LossLog]
    _captures: List[Any]

    @property
    def captures(self) -> List[Any]:
        """The captures written (or failed) in the latest run, in order (fp16audit.capture.CaptureEvent)."""
        return self.loss_log.captures if self.loss_log is not None else self._captures

    def capture_now(self) -> None:
        """Capture the next optimizer step (trigger "request")."""
        if self.loss_log is None or not self.loss_log.capturing:
            raise RuntimeError(f"{type(self).__name__}: no capture is armed (pass capture='captures/' and call this during "
                               "training)")
        self.loss_log.capture_now()
