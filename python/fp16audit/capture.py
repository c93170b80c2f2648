"""The failing training step, captured: the trainer-neutral core.

A capture is a folder (docs/capture.md: `fp16audit.capture` version 1) that
holds one failing step's state: the model exported to ONNX at that step's
weights in train mode, the batch and the one before it, the loss, the
GradScaler's state, the optimizer's class, hyperparameters and state, the
RNG states and the training log so far. `fp16audit replay CAPTURE` reads it
with no torch, no model code and no GPU.

This module knows no trainer. A trainer's adapter (AmpRecorder for the
plain loop, Fp16AuditCallback for fastai, the Hugging Face, Lightning and
Accelerate adapters) owns a CaptureCore and calls it at two places of each
optimizer step:

- before_update(step, loss, inputs, target): after the backward, before the
  optimizer applies the update (fastai's before_step). The triggers that
  the loss decides (a non-finite loss, a loss spike, a pinned scale with a
  flat loss, a request) capture here, at the weights the step's forward
  and backward saw; without a GradScaler a non-finite loss or gradient is
  caught here, before the optimizer would write it into the weights.
- after_update(step, loss, inputs, target, skipped, scale_used, scale_after):
  after GradScaler.update() (fastai's after_step). A loss-scale collapse is
  known only here; the steps it is made of were skipped, so the weights are
  still those of the step. A trigger that fires here after an update that
  was applied is captured with step_applied true.

Both return a CaptureEvent when a capture was written (or failed to be);
the adapter writes the training log's capture line and stops the run when
event.stop is set (on_event="stop"), in its trainer's way. A capture that
fails warns and never raises into the training loop.

The previous batch is kept by reference, never copied: a step that
captures nothing costs a few comparisons.
"""

from __future__ import annotations

import collections
import copy
import hashlib
import json
import math
import os
import platform
import random
import shutil
import struct
import sys
import time
import warnings
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _safetensors

__all__ = ["Capture", "CaptureCore", "CaptureEvent", "CaptureStop", "CaptureError", "TRIGGERS", "FORMAT_NAME", "FORMAT_VERSION"]

FORMAT_NAME = "fp16audit.capture"
FORMAT_VERSION = "1.1"

#: The trigger kinds, as trigger.kind and the folder names spell them.
TRIGGERS = ("nonfinite-loss", "scale-collapse", "pinned-plateau", "loss-spike", "request")

_ON_EVENT = ("continue", "stop")


class CaptureError(RuntimeError):
    """A capture could not be written (the recorder turns it into a warning and a log line)."""


class CaptureStop(RuntimeError):
    """Raised into a plain training loop after a capture with on_event="stop": the run stops there, before the
    optimizer applies the step's update when the capture came before it. `event` is the CaptureEvent."""

    def __init__(self, event: "CaptureEvent") -> None:
        where = event.path if event.path else "no capture (%s)" % event.error
        super().__init__("fp16audit: %s at step %d: stopped (on_event='stop'); %s" % (event.trigger, event.step, where))
        self.event = event


class CaptureEvent:
    """One trigger that fired: its kind, the step, the folder written (None when the capture failed, with error)."""

    def __init__(self, trigger: str, step: int, detail: str, path: Optional[str], error: Optional[str], stop: bool,
                 before_update: bool) -> None:
        self.trigger, self.step, self.detail, self.path, self.error = trigger, step, detail, path, error
        self.stop = stop
        #: whether it was captured before the optimizer's update of the step
        self.before_update = before_update

    def log_line(self) -> Dict[str, Any]:
        """The training log's capture line (docs/capture.md, last section)."""
        line: Dict[str, Any] = {"kind": "capture", "step": self.step, "trigger": self.trigger}
        if self.path is not None:
            line["path"] = self.path
        else:
            line["error"] = self.error
        return line

    def __repr__(self) -> str:
        return "<CaptureEvent %s at step %d: %s>" % (self.trigger, self.step, self.path or "failed: %s" % self.error)


class Capture:
    """What to capture, when, and what then: the `capture=` argument of the recorders.

    directory: the folder the captures go to (one sub-folder per event,
    step-<step>-<trigger>); it is created when the first capture is
    written. on_event: "continue" (training goes on) or "stop" (the run
    stops at the captured step; before the optimizer's update when the
    capture came before it).

    Triggers (None switches one off):

    - nonfinite_loss: the first step whose loss is NaN or Inf.
    - backoffs_in_a_row: a loss-scale collapse at its onset, this many
      GradScaler backoffs (skipped steps) in a row once the scaler has
      settled (the backoffs before the first applied step are its warm-up
      and do not count).
    - scale_floor: a collapse by depth, a backoff that takes the scale
      below this floor.
    - plateau_steps and flat: a pinned scale with a flat loss: for the
      last plateau_steps steps the scale has not grown, the loss is flat
      (the mean of the window's last quarter is not below its first
      quarter's by more than the share `flat`), and the recorder's
      gradient telemetry shows a module whose gradient fp16 does not hold
      (it loses more than 1% of its norm, or, where that cannot be
      measured because the gradient arrived in fp16, more than half of
      its elements are zero). Without telemetry this trigger never fires:
      a flat loss alone is also what a converged run looks like.
    - spike_factor: a loss more than this many times the largest loss of
      the run so far (Megatron-LM's check), counted once spike_after
      finite losses are known.
    - request: always on: CaptureCore.request() (the recorders'
      capture_now()) captures the next step.

    max_captures bounds the folders one run writes; each trigger kind
    captures once. exporter is the ONNX exporter of fp16audit.audit
    ("auto", "dynamo", "torchscript").
    """

    def __init__(self, directory: Union[str, "os.PathLike[str]"] = "captures", *, on_event: str = "continue",
                 nonfinite_loss: bool = True, backoffs_in_a_row: Optional[int] = 3, scale_floor: Optional[float] = 1.0,
                 plateau_steps: Optional[int] = 200, flat: float = 0.01, spike_factor: Optional[float] = 10.0,
                 spike_after: int = 10, max_captures: int = 4, exporter: str = "auto") -> None:
        if on_event not in _ON_EVENT:
            raise ValueError("Capture: on_event=%r; want 'continue' or 'stop'" % (on_event,))
        if backoffs_in_a_row is not None and int(backoffs_in_a_row) < 1:
            raise ValueError("Capture: backoffs_in_a_row=%r; want a positive count or None" % (backoffs_in_a_row,))
        if scale_floor is not None and not float(scale_floor) > 0:
            raise ValueError("Capture: scale_floor=%r; want a positive scale or None" % (scale_floor,))
        if plateau_steps is not None and int(plateau_steps) < 8:
            raise ValueError("Capture: plateau_steps=%r; want at least 8 steps, or None" % (plateau_steps,))
        if not 0 <= flat < 1:
            raise ValueError("Capture: flat=%r; want a share of the loss in [0, 1), such as 0.01" % (flat,))
        if spike_factor is not None and not float(spike_factor) > 1:
            raise ValueError("Capture: spike_factor=%r; want a factor above 1, such as 10, or None" % (spike_factor,))
        if int(max_captures) < 1:
            raise ValueError("Capture: max_captures=%r; want at least 1" % (max_captures,))
        if exporter not in ("auto", "dynamo", "torchscript"):
            raise ValueError("Capture: exporter=%r; want 'auto', 'dynamo' or 'torchscript'" % (exporter,))
        self.directory = os.fspath(directory)
        self.on_event = on_event
        self.nonfinite_loss = bool(nonfinite_loss)
        self.backoffs_in_a_row = None if backoffs_in_a_row is None else int(backoffs_in_a_row)
        self.scale_floor = None if scale_floor is None else float(scale_floor)
        self.plateau_steps = None if plateau_steps is None else int(plateau_steps)
        self.flat = float(flat)
        self.spike_factor = None if spike_factor is None else float(spike_factor)
        self.spike_after = int(spike_after)
        self.max_captures = int(max_captures)
        self.exporter = exporter

    @classmethod
    def of(cls, value: Union["Capture", str, "os.PathLike[str]", None]) -> Optional["Capture"]:
        """The Capture a recorder's `capture=` argument stands for: a Capture, a folder (the defaults), or None."""
        if value is None or value is False:
            return None
        if isinstance(value, Capture):
            return value
        if isinstance(value, (str, os.PathLike)):
            return cls(value)
        raise TypeError("capture=%r: want a folder (str or path), a fp16audit.Capture, or None" % (value,))

    def __repr__(self) -> str:
        return "Capture(%r, on_event=%r)" % (self.directory, self.on_event)


# -- what the loss is, in fp16audit's words ------------------------------------

# torch.nn.functional losses by function name, as --loss names them.
_FUNCTIONS = {"cross_entropy": "cross-entropy", "binary_cross_entropy_with_logits": "bce", "mse_loss": "mse", "l1_loss": "l1"}


#: The keys of a loss given as a description rather than a loss module:
#: the manifest's loss entry without its value.
LOSS_KEYS = ("function", "name", "class_axis", "ignore_index", "lm_shift", "output")


def loss_entry(loss_func: Any, value: Optional[float]) -> Dict[str, Any]:
    """The manifest's loss entry for a loss module or function (fastai's flat losses through their .func), or for a
    description of the loss (a mapping of LOSS_KEYS): a trainer's adapter describes a loss the model computes itself
    (a Hugging Face model given labels)."""
    from .audit import LOSSES, _loss_name

    entry: Dict[str, Any] = {"value": _encode(value), "function": None, "name": None, "class_axis": None,
                             "ignore_index": None, "lm_shift": False, "output": None}
    if loss_func is None:
        return entry
    if isinstance(loss_func, Mapping):
        unknown = sorted(set(loss_func) - set(LOSS_KEYS))
        if unknown or loss_func.get("name") not in LOSSES + (None,):
            raise ValueError("capture: the loss %r: want a loss module or function, or a mapping of %s whose name is one of %s" % (
                dict(loss_func), ", ".join(LOSS_KEYS), ", ".join(LOSSES)))
        entry.update(loss_func)
        return entry
    inner = getattr(loss_func, "func", None)  # fastai's BaseLoss wraps a torch loss
    # a function has a __name__ (F.cross_entropy), a module instance its class
    entry["function"] = getattr(loss_func, "__name__", None) or type(loss_func).__name__
    name = _FUNCTIONS.get(getattr(loss_func, "__name__", ""))
    if name is None:
        for cand in (loss_func, inner):
            if cand is None or isinstance(cand, str):
                continue
            try:
                name = _loss_name(cand)[0]
            except ValueError:
                name = None
            if name:
                break
            name = _FUNCTIONS.get(getattr(cand, "__name__", ""))
            if name:
                break
    entry["name"] = name
    if name == "cross-entropy":
        axis = getattr(loss_func, "axis", None)
        # fastai's CrossEntropyLossFlat moves `axis` (default -1) last and
        # flattens the rest; torch's CrossEntropyLoss reads classes on axis 1.
        entry["class_axis"] = "last" if axis == -1 else ("1" if axis in (None, 1) else str(axis))
        src = inner if inner is not None else loss_func
        ii = getattr(src, "ignore_index", None)
        entry["ignore_index"] = int(ii) if isinstance(ii, int) else -100
    return entry


def _encode(x: Optional[float]) -> Union[float, str, None]:
    from .logfile import encode_float

    return encode_float(x)


# -- the state of the run ------------------------------------------------------

def _torch():
    import torch

    return torch


def _finite(x: Optional[float]) -> bool:
    return x is not None and math.isfinite(x)


def _float(loss: Any) -> Optional[float]:
    if loss is None:
        return None
    torch = _torch()
    if isinstance(loss, torch.Tensor):
        return float(loss.detach().float().item())
    return float(loss)


def _model_device(model) -> Any:
    torch = _torch()
    for t in list(model.parameters()) + list(model.buffers()):
        return t.device
    return torch.device("cpu")


def _scaler_state(scaler: Any, scale_used: Optional[float]) -> Optional[Dict[str, Any]]:
    """The manifest's grad_scaler entry; the scale is the one the failing step's backward used."""
    if scaler is None:
        return None
    try:
        enabled = bool(scaler.is_enabled())
    except Exception:  # noqa: BLE001 - anything scaler-like
        enabled = True
    out: Dict[str, Any] = {"enabled": enabled, "class": type(scaler).__name__}
    if not enabled:
        return out
    state = {}
    try:
        state = scaler.state_dict() or {}
    except Exception:  # noqa: BLE001
        pass
    init = getattr(scaler, "_init_scale", None)
    out.update({
        "scale": _encode(scale_used if scale_used is not None else float(scaler.get_scale())),
        "growth_tracker": int(state.get("_growth_tracker", 0)),
        "init_scale": float(init) if init is not None else None,
        "growth_factor": float(scaler.get_growth_factor()),
        "backoff_factor": float(scaler.get_backoff_factor()),
        "growth_interval": int(scaler.get_growth_interval()),
    })
    return out


def _rng_states() -> Dict[str, Any]:
    """Python's, NumPy's and torch's generators as JSON (byte tensors as lists of integers)."""
    torch = _torch()
    version, internal, gauss = random.getstate()
    out: Dict[str, Any] = {"python": {"version": version, "state": list(internal), "gauss": gauss}}
    try:
        import numpy as np

        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        out["numpy"] = {"bit_generator": name, "state": [int(k) for k in keys], "pos": int(pos),
                        "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    except Exception:  # noqa: BLE001 - numpy's legacy state is optional
        out["numpy"] = None
    out["torch"] = torch.get_rng_state().tolist()
    cuda = None
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            cuda = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    except Exception:  # noqa: BLE001
        cuda = None
    out["cuda"] = cuda
    return out


def _device_entry(device) -> Dict[str, Any]:
    torch = _torch()
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        return {"type": "cuda", "name": torch.cuda.get_device_name(idx), "bf16_supported": bool(torch.cuda.is_bf16_supported())}
    return {"type": device.type, "name": platform.processor() or platform.machine() or device.type, "bf16_supported": True}


def _versions(extra: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    from . import __version__

    torch = _torch()
    out: Dict[str, Any] = {"fp16audit": __version__, "torch": torch.__version__, "python": platform.python_version(), "fastai": None}
    fastai = sys.modules.get("fastai")
    if fastai is not None:
        out["fastai"] = getattr(fastai, "__version__", None)
    try:
        import numpy as np

        out["numpy"] = np.__version__
    except ImportError:  # pragma: no cover - numpy comes with torch
        pass
    out.update(extra or {})
    return out


def _param_names(model) -> Dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def _optimizer_entry(optimizer, model) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(optimizer.json's content, the tensors of optimizer.safetensors) for a torch.optim optimizer or fastai's Optimizer."""
    torch = _torch()
    names = _param_names(model)
    tensors: Dict[str, Any] = {}
    cls = type(optimizer)
    doc: Dict[str, Any] = {"class": cls.__name__, "module": cls.__module__, "param_groups": [], "state": {}}

    def plain(v):
        if isinstance(v, torch.Tensor):
            return float(v.item()) if v.numel() == 1 else v.tolist()
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        if isinstance(v, float):
            return _encode(v)
        if v is None or isinstance(v, (bool, int, str)):
            return v
        return repr(v)

    def keep_state(key, pstate):
        kept = {}
        for k, v in pstate.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                tname = "%s.%s" % (key, k)
                tensors[tname] = v
                kept[k] = {"tensor": tname}
            elif isinstance(v, torch.Tensor):
                kept[k] = {"scalar": plain(v), "dtype": str(v.dtype).replace("torch.", "")}
            else:
                kept[k] = plain(v)
        return kept

    if hasattr(optimizer, "hypers") and hasattr(optimizer, "param_lists"):
        # fastai's Optimizer: hyperparameters per group in .hypers, state
        # per parameter in .state (a dict keyed by the parameter)
        doc["kind"] = "fastai"
        for i, (ps, h) in enumerate(zip(optimizer.param_lists, optimizer.hypers)):
            doc["param_groups"].append({"hyper": {k: plain(v) for k, v in h.items()}, "params": [names.get(id(p)) for p in ps]})
        for p, name in ((p, names.get(id(p))) for ps in optimizer.param_lists for p in ps):
            st = optimizer.state.get(p) if hasattr(optimizer.state, "get") else None
            if st:
                doc["state"][name] = keep_state(name, st)
        lr = optimizer.hypers[0].get("lr") if optimizer.hypers else None
    else:
        doc["kind"] = "torch"
        for g in optimizer.param_groups:
            doc["param_groups"].append({"hyper": {k: plain(v) for k, v in g.items() if k != "params"},
                                        "params": [names.get(id(p)) for p in g["params"]]})
        for p, st in optimizer.state.items():
            name = names.get(id(p))
            if name is not None and st:
                doc["state"][name] = keep_state(name, st)
        lr = optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
    doc["lr"] = plain(lr)
    return doc, tensors


_OBSERVER = "_fp16audit_observer"

# The module attributes that hold hooks, keyed by the hook's handle id.
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks", "_forward_hooks_with_kwargs",
               "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called", "_state_dict_hooks", "_load_state_dict_pre_hooks")


def observer(hook: Any) -> Any:
    """Mark a module hook as one of fp16audit's observers (the gradient telemetry's, a trainer adapter's loss hook):
    the capture's copy of the model leaves it out. An observer watches the run; it is no part of the model, may hold
    what cannot be copied (an open log), and must not fire while the copy is exported."""
    setattr(hook, _OBSERVER, True)
    return hook


def _is_observer(hook: Any) -> bool:
    return bool(getattr(getattr(hook, "__func__", hook), _OBSERVER, False))


def _cpu_copy(model):
    """A deep copy of the model on the CPU, its parameters and buffers copied straight to the host (never a second
    copy on the model's device), without fp16audit's observer hooks (the model's own hooks stay)."""
    torch = _torch()
    memo: Dict[int, Any] = {}
    for p in model.parameters():
        if id(p) not in memo:
            memo[id(p)] = torch.nn.Parameter(p.detach().to("cpu", copy=True), requires_grad=p.requires_grad)
    for b in model.buffers():
        if id(b) not in memo:
            memo[id(b)] = b.detach().to("cpu", copy=True)
    for m in model.modules():
        hooks = [getattr(m, a, None) for a in _HOOK_DICTS]
        own = {k for d in hooks if isinstance(d, dict) for k, v in d.items() if _is_observer(v)}
        if not own:
            continue
        for d in hooks:
            if isinstance(d, dict):
                # the copy's dict, without the observers; the hooks kept are the model's own, shared as a function hook is
                memo[id(d)] = type(d)((k, v) for k, v in d.items() if k not in own)
    return copy.deepcopy(model, memo)


def _hash_file(path: str) -> Tuple[int, str]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 22)
            if not b:
                break
            h.update(b)
            n += len(b)
    return n, h.hexdigest()


def _npz(f, arrays: Mapping[str, Any]) -> None:
    import numpy as np

    np.savez(f, **arrays)


def _arrays(names: Sequence[str], tensors: Sequence[Any]) -> Dict[str, Any]:
    torch = _torch()
    out = {}
    for name, t in zip(names, tensors):
        a = t.detach().to("cpu")
        if a.dtype == torch.bfloat16:
            a = a.float()
        out[name] = a.numpy()
    return out


def _unique_folder(base: str, name: str) -> str:
    path = os.path.join(base, name)
    k = 2
    while os.path.lexists(path):
        path = os.path.join(base, "%s-%d" % (name, k))
        k += 1
    return path


class _Steps:
    """What the triggers remember of the run: a few numbers, never a tensor."""

    def __init__(self, window: int) -> None:
        self.max_loss: Optional[float] = None
        self.finite_losses = 0
        self.settled = False  # the scaler has applied a step (its warm-up is over)
        self.in_a_row = 0
        # the step since which the scale has not grown (None: in warm-up),
        # the latest losses, and the telemetry's latest evidence of
        # gradients fp16 does not hold: (module, what)
        self.since_growth: Optional[int] = None
        self.losses: Deque[float] = collections.deque(maxlen=max(window, 1))
        self.underflow: Optional[Tuple[str, str]] = None


class CaptureCore:
    """The trainer-neutral capture: triggers, state and the folder writer (see the module docstring).

    model: the module being trained (read, never changed: the export runs
    on a CPU copy). optimizer: a torch.optim optimizer or fastai's
    Optimizer (None: the capture holds no optimizer state). scaler: the
    GradScaler (None or disabled: a run without loss scaling). loss_func:
    the loss, for the replay's --loss. policy: fp16audit's --policy of the
    run; autocast_device: torch.autocast's device_type. trainer: who
    trains ("torch", "fastai", ...). log_path: the training log, copied
    into each capture. versions: extra entries of the manifest's versions.
    """

    def __init__(self, capture: Capture, *, model, optimizer=None, scaler=None, loss_func=None, policy: str,
                 autocast_device: Optional[str] = None, trainer: str = "torch", log_path: Optional[str] = None,
                 versions: Optional[Mapping[str, Any]] = None) -> None:
        from .audit import POLICIES

        if policy not in POLICIES:
            raise ValueError("capture: policy=%r; want one of %s" % (policy, ", ".join(POLICIES)))
        self.capture = capture
        self.model, self.optimizer, self.loss_func = model, optimizer, loss_func
        self.scaler = scaler if scaler is not None and _enabled(scaler) else None
        self._scaler_obj = scaler
        self.policy = policy
        self.autocast_device = autocast_device or _model_device(model).type
        self.trainer, self.log_path, self.versions = trainer, log_path, dict(versions or {})
        self.events: List[CaptureEvent] = []
        self._fired: set = set()
        self._st = _Steps(capture.plateau_steps or 1)
        self._requested = False
        self._prev: Optional[Tuple[int, Any, Any]] = None
        self._cur: Optional[Tuple[int, Any, Any]] = None
        self._checked_step: Optional[int] = None

    # -- the adapters' calls ---------------------------------------------------

    def request(self) -> None:
        """Capture the next step the core sees (trigger "request")."""
        self._requested = True

    def before_update(self, step: int, loss: Any, inputs: Any, target: Any = None, *, epoch: Optional[int] = None,
                      iter: Optional[int] = None, scale: Optional[float] = None,
                      grads_finite: Optional[bool] = None) -> Optional[CaptureEvent]:
        """After the backward, before the optimizer's update: the loss triggers capture at the step's own weights.

        scale is the loss scale the step's backward used (None: the
        scaler's current one). grads_finite, when the adapter knows it,
        False catches a non-finite gradient of a run without a scaler
        before the optimizer applies it.
        """
        self._remember(step, inputs, target)
        value = _float(loss)
        if scale is None and self.scaler is not None:
            scale = float(self.scaler.get_scale())
        fired = self._loss_trigger(step, value, scale)
        if fired is None and self.scaler is None and grads_finite is False and "nonfinite-loss" not in self._fired and self.capture.nonfinite_loss:
            fired = ("nonfinite-loss", "the loss is %s but a gradient is NaN/Inf: stopped before the optimizer applies it" % _fmt(value))
        self._checked_step = step
        self._account_loss(step, value)
        if fired is None:
            return None
        return self._fire(fired, step, value, scale, epoch, iter, step_applied=False, before_update=True)

    def after_update(self, step: int, loss: Any, inputs: Any = None, target: Any = None, *, skipped: bool,
                     scale_used: Optional[float], scale_after: Optional[float], epoch: Optional[int] = None,
                     iter: Optional[int] = None) -> Optional[CaptureEvent]:
        """After GradScaler.update(): the scale triggers (and the loss ones when before_update did not run this step)."""
        if inputs is not None or self._cur is None or self._cur[0] != step:
            self._remember(step, inputs, target)
        value = _float(loss)
        fired = None
        if self._checked_step != step:
            fired = self._loss_trigger(step, value, scale_used)
            self._account_loss(step, value)
        scale_fired = self._scale_trigger(step, skipped, scale_used, scale_after)
        self._checked_step = None
        if fired is None:
            fired = scale_fired
        if fired is None:
            return None
        if self._cur is None or self._cur[1] is None:
            return self._failed(fired, step, "the adapter gave no batch for this step (pass batch= to the recorder's step())")
        return self._fire(fired, step, value, scale_used, epoch, iter, step_applied=not skipped, before_update=False)

    # -- triggers ------------------------------------------------------------------

    def _remember(self, step, inputs, target):
        if self._cur is not None and self._cur[0] == step:
            if inputs is not None:
                self._cur = (step, inputs, target)
            return
        self._prev = self._cur
        self._cur = (step, inputs, target)

    def _can(self, kind: str) -> bool:
        return kind not in self._fired and len(self.events) < self.capture.max_captures

    def _loss_trigger(self, step, value, scale):
        c, st = self.capture, self._st
        if self._requested and self._can("request"):
            self._requested = False
            return ("request", "captured on request")
        if value is not None and not math.isfinite(value):
            if c.nonfinite_loss and self._can("nonfinite-loss"):
                return ("nonfinite-loss", "the loss is %s%s" % (_fmt(value), " at loss scale %s" % _fmt(scale) if scale is not None else ""))
            return None
        if (c.spike_factor is not None and value is not None and st.max_loss is not None and st.finite_losses >= c.spike_after
                and self._can("loss-spike") and abs(value) > c.spike_factor * abs(st.max_loss)):
            return ("loss-spike", "the loss %s is %.3g times the largest loss of the run so far (%s; threshold %g times)" % (
                _fmt(value), abs(value) / max(abs(st.max_loss), 1e-300), _fmt(st.max_loss), c.spike_factor))
        plateau = self._plateau(step)
        if plateau is not None:
            return plateau
        return None

    def _account_loss(self, step, value):
        st = self._st
        if _finite(value):
            st.finite_losses += 1
            st.max_loss = value if st.max_loss is None else max(st.max_loss, value)
            st.losses.append(value)

    def _plateau(self, step):
        c, st = self.capture, self._st
        w = c.plateau_steps
        if w is None or st.underflow is None or st.since_growth is None or step - st.since_growth < w:
            return None
        if not self._can("pinned-plateau") or len(st.losses) < w:
            return None
        q = max(w // 4, 1)
        vals = list(st.losses)
        first = sum(vals[:q]) / q
        last = sum(vals[-q:]) / q
        if not last >= (1 - c.flat) * first:
            return None
        module, what = st.underflow
        return ("pinned-plateau", "the scale has not grown for %d steps and the loss is flat (mean %.4g over the last %d steps, %.4g over "
                "the first %d of the last %d), while %s's gradient %s (telemetry)" % (step - st.since_growth, last, q, first, q, w, module, what))

    def telemetry(self, evidence: Optional[Tuple[str, str]]) -> None:
        """The latest full telemetry's evidence of a gradient fp16 does not hold, (module, what), or None: the
        pinned-plateau trigger needs it."""
        self._st.underflow = evidence

    def _scale_trigger(self, step, skipped, used, after):
        c, st = self.capture, self._st
        if self.scaler is None or used is None or after is None:
            return None
        fired = None
        if after > used or (st.since_growth is None and not skipped):
            # the scale grew (or the warm-up ended): the pinned stretch
            # restarts with the next step, the first at the new scale
            st.since_growth = step + 1
            st.losses.clear()
        if not skipped:
            st.settled = True
            st.in_a_row = 0
        elif st.settled:
            st.in_a_row += 1
            if c.backoffs_in_a_row is not None and st.in_a_row >= c.backoffs_in_a_row and self._can("scale-collapse"):
                fired = ("scale-collapse", "%d backoffs in a row: scale %s -> %s" % (
                    st.in_a_row, _fmt(used * (1 / self._backoff()) ** (st.in_a_row - 1)), _fmt(after)))
        if fired is None and skipped and c.scale_floor is not None and after < c.scale_floor and self._can("scale-collapse"):
            fired = ("scale-collapse", "the scale fell to %s, below the floor %s" % (_fmt(after), _fmt(c.scale_floor)))
        return fired

    def _backoff(self) -> float:
        try:
            return float(self.scaler.get_backoff_factor())
        except Exception:  # noqa: BLE001
            return 0.5

    # -- writing -------------------------------------------------------------------

    def _failed(self, fired, step, error):
        kind, detail = fired
        self._fired.add(kind)
        ev = CaptureEvent(kind, step, detail, None, error, self.capture.on_event == "stop", False)
        self.events.append(ev)
        warnings.warn("fp16audit: %s at step %d: no capture written: %s" % (kind, step, error), RuntimeWarning, stacklevel=3)
        return ev

    def _fire(self, fired, step, value, scale, epoch, iter, step_applied, before_update):
        kind, detail = fired
        self._fired.add(kind)
        path, error = None, None
        # a large model takes seconds to export and write: say why the run pauses
        print("fp16audit: step %d: %s (%s): capturing the step into %s" % (step, kind, detail, self.capture.directory),
              file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            path = self.write(kind, step, detail, value, scale, epoch, iter, step_applied)
            print("fp16audit: captured in %.1f s: %s (replay it: fp16audit replay %s)" % (time.monotonic() - t0, path, path),
                  file=sys.stderr, flush=True)
        except Exception as e:  # noqa: BLE001 - a capture never breaks the run
            error = "%s: %s" % (type(e).__name__, e)
            warnings.warn("fp16audit: %s at step %d: the capture failed (%s); training goes on%s" % (
                kind, step, error, "" if self.capture.on_event == "continue" else " to the stop you asked for"), RuntimeWarning, stacklevel=3)
        ev = CaptureEvent(kind, step, detail, path, error, self.capture.on_event == "stop", before_update)
        self.events.append(ev)
        return ev

    def write(self, trigger: str, step: int, detail: str, loss: Optional[float], scale: Optional[float],
              epoch: Optional[int] = None, iter: Optional[int] = None, step_applied: bool = False) -> str:
        """Write the capture folder of the current step now; returns its path (as the directory was given)."""
        if self._cur is None or self._cur[1] is None:
            raise CaptureError("no batch for step %d: the adapter must pass the step's inputs" % step)
        base = self.capture.directory
        os.makedirs(base, exist_ok=True)
        final = _unique_folder(base, "step-%06d-%s" % (step, trigger))
        tmp = os.path.join(base, ".%s.tmp-%d" % (os.path.basename(final), os.getpid()))
        shutil.rmtree(tmp, ignore_errors=True)
        os.mkdir(tmp)
        try:
            manifest = self._write_into(tmp, trigger, step, detail, loss, scale, epoch, iter, step_applied)
            _put_json(tmp, "manifest.json", manifest, None)
            _fsync_dir(tmp)
            os.rename(tmp, final)
            _fsync_dir(base)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def _write_into(self, tmp, trigger, step, detail, loss, scale, epoch, iter, step_applied) -> Dict[str, Any]:
        from ._trainers import _rng_kept, exportable

        # The model is exported from a CPU copy, as the audit exports a
        # trainer's model (exportable): a PEFT model's base model, with the
        # forward its class defines (Accelerate's autocast wrapper would be
        # traced into the graph) and transformers' key-value cache off. Its
        # train-mode forward draws dropout masks: every random state is put
        # back, so the run goes on as it would have without the capture
        # (state/rng.json holds them as they were before).
        with _rng_kept(), exportable(_cpu_copy(self.model)) as em:
            return self._write_model(tmp, em, trigger, step, detail, loss, scale, epoch, iter, step_applied)

    def _write_model(self, tmp, em, trigger, step, detail, loss, scale, epoch, iter, step_applied) -> Dict[str, Any]:
        from . import _axes
        from .audit import _arrange_dict, _export, _input_names, _outputs

        torch = _torch()
        files: Dict[str, Dict[str, Any]] = {}
        _, inputs, target = self._cur
        xs, t, keys = _batch_parts(inputs, target)
        if keys is not None:
            xs, t2, keys = _arrange_dict(em, xs, keys, 0)
            t = t if t is not None else t2
        names = _input_names(em, len(xs), keys)
        os.mkdir(os.path.join(tmp, "state"))
        _put(tmp, "state/model.safetensors", files, lambda f: _safetensors.write(f, self.model.state_dict()), stream=True)
        opt_doc = None
        if self.optimizer is not None:
            opt_doc, opt_tensors = _optimizer_entry(self.optimizer, self.model)
            _put(tmp, "state/optimizer.safetensors", files, lambda f: _safetensors.write(f, opt_tensors), stream=True)
            opt_doc["tensors"] = "state/optimizer.safetensors"
            _put_json(tmp, "state/optimizer.json", opt_doc, files)
        _put_json(tmp, "state/rng.json", _rng_states(), files)
        # the batches
        _put(tmp, "batch.npz", files, lambda f: _npz(f, _arrays(names, xs)))
        if t is not None:
            _put(tmp, "target.npy", files, lambda f: _npy(f, t))
        previous = None
        if self._prev is not None and self._prev[1] is not None:
            pxs, pt, pkeys = _batch_parts(self._prev[1], self._prev[2])
            if pkeys is not None:
                pxs, pt2, pkeys = _arrange_dict(em, pxs, pkeys, 0)
                pt = pt if pt is not None else pt2
            if len(pxs) == len(xs):
                os.mkdir(os.path.join(tmp, "previous"))
                _put(tmp, "previous/batch.npz", files, lambda f: _npz(f, _arrays(names, pxs)))
                previous = {"inputs": "previous/batch.npz", "target": None, "step": self._prev[0]}
                if pt is not None:
                    _put(tmp, "previous/target.npy", files, lambda f: _npy(f, pt))
                    previous["target"] = "previous/target.npy"
        # the log so far
        log = None
        if self.log_path and os.path.isfile(self.log_path):
            _put(tmp, "log.jsonl", files, lambda f: _copy_into(self.log_path, f), stream=True)
            log = "log.jsonl"
        # the model, exported at these weights in train mode
        em.train()
        args = [x.detach().to("cpu") for x in xs]
        if any(a.is_floating_point() and a.dtype != torch.float32 for a in args):
            args = [a.float() if a.is_floating_point() else a for a in args]
        # the batch axis of each input as audit() finds it (an LSTM's (h0, c0)
        # holds the batch on axis 1), so the capture replays other batches too
        outputs = _outputs(em, args)
        out_names = [n for n, _ in outputs]
        axes = _axes.plan(em, names, [(args, t, None)], outputs, t, run=lambda ys: [o for _, o in _outputs(em, ys)])
        exporter, _why = _export(em, args, names, out_names, os.path.join(tmp, "model.onnx"), self.capture.exporter, True, axes.dynamic)
        _share_weights(tmp, "model.onnx", "state/model.safetensors")
        for fn in sorted(os.listdir(tmp)):
            p = os.path.join(tmp, fn)
            if os.path.isfile(p) and fn not in files and fn != "manifest.json":
                n, h = _hash_file(p)
                files[fn] = {"bytes": n, "sha256": h}
        n_params = sum(p.numel() for p in self.model.parameters())
        manifest = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "created": _utc_now(),
            "trigger": {"kind": trigger, "step": int(step), "epoch": epoch, "iter": iter, "detail": detail},
            "loss": loss_entry(self.loss_func, loss),
            "precision": {"policy": self.policy, "autocast_device": self.autocast_device,
                          "dtype": {"autocast-fp16": "float16", "autocast-bf16": "bfloat16", "half": "float16"}.get(self.policy, "float32")},
            "grad_scaler": _scaler_state(self._scaler_obj, scale),
            "step_applied": bool(step_applied),
            "optimizer": None if opt_doc is None else {"class": opt_doc["class"], "lr": opt_doc["lr"], "state": "state/optimizer.json"},
            "model": {"path": "model.onnx", "class": type(self.model).__name__, "exporter": exporter, "mode": "train",
                      "inputs": list(names), "outputs": list(out_names), "parameters": int(n_params),
                      "state": "state/model.safetensors"},
            "batches": {"failing": {"inputs": "batch.npz", "target": "target.npy" if t is not None else None}, "previous": previous},
            "log": log,
            "rng": "state/rng.json",
            "trainer": self.trainer,
            "versions": _versions(self.versions),
            "device": _device_entry(_model_device(self.model)),
            "files": files,
        }
        return manifest


def _enabled(scaler) -> bool:
    try:
        return bool(scaler.is_enabled())
    except Exception:  # noqa: BLE001
        return True


def _fmt(x: Optional[float]) -> str:
    if x is None:
        return "?"
    if not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Inf" if x > 0 else "-Inf")
    if x != 0 and abs(x) == 2.0 ** round(math.log2(abs(x))) and abs(math.log2(abs(x))) >= 4:
        return "2^%d" % round(math.log2(abs(x)))
    return "%.4g" % x


def _batch_parts(inputs, target) -> Tuple[List[Any], Optional[Any], Optional[List[str]]]:
    """(input tensors, target, dict keys) of one step's batch, as fp16audit.audit splits a batch."""
    from .audit import _plain, _split

    torch = _torch()
    if isinstance(inputs, Mapping):
        xs, t, keys = _split(inputs, None)
    elif isinstance(inputs, (tuple, list)):
        xs, t, keys = _split(tuple(inputs), len(inputs))
    else:
        xs, t, keys = _split(inputs, None)
    if isinstance(target, (tuple, list)):
        target = target[0] if len(target) == 1 else None
    if target is not None and isinstance(target, torch.Tensor):
        t = _plain(target)
    return xs, t, keys


def _npy(f, t) -> None:
    import numpy as np

    torch = _torch()
    a = t.detach().to("cpu")
    if a.dtype == torch.bfloat16:
        a = a.float()
    np.save(f, a.numpy(), allow_pickle=False)


def _copy_into(src: str, f) -> None:
    with open(src, "rb") as s:
        shutil.copyfileobj(s, f)


class _Hashing:
    """A binary file written front to back that hashes what goes through it (no second read of a large file)."""

    def __init__(self, f) -> None:
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def write(self, b) -> int:
        m = memoryview(b).cast("B")
        self.h.update(m)
        self.n += m.nbytes
        return self.f.write(m)


def _put(tmp: str, rel: str, files: Dict[str, Dict[str, Any]], write: Callable[[Any], Any], stream: bool = False) -> None:
    """Write one file of the capture, flushed to the disk, and note its size and sha256: hashed as it is written when
    the writer goes front to back (stream), else read back (numpy's zip writer seeks)."""
    path = os.path.join(tmp, *rel.split("/"))
    with open(path, "wb") as f:
        if stream:
            hf = _Hashing(f)
            write(hf)
        else:
            write(f)
        f.flush()
        os.fsync(f.fileno())
    if stream:
        files[rel] = {"bytes": hf.n, "sha256": hf.h.hexdigest()}
        return
    n, h = _hash_file(path)
    files[rel] = {"bytes": n, "sha256": h}


def _put_json(tmp: str, rel: str, obj: Any, files: Optional[Dict[str, Dict[str, Any]]]) -> None:
    data = (json.dumps(obj, indent=1, allow_nan=False) + "\n").encode("utf-8")
    sink: Dict[str, Dict[str, Any]] = {} if files is None else files
    _put(tmp, rel, sink, lambda f: f.write(data), stream=True)


# ONNX TensorProto data types by safetensors dtype.
_ONNX_TYPES = {"F32": 1, "U8": 2, "I8": 3, "I16": 5, "I32": 6, "I64": 7, "BOOL": 9, "F16": 10, "F64": 11, "BF16": 16}
# Initializers smaller than this stay inline: pointing into the state saves little and costs ONNX Runtime a read each.
_SHARE_MIN_BYTES = 1024


def _share_weights(tmp: str, model_rel: str, state_rel: str) -> None:
    """Hold each weight once: an initializer of the exported model whose bytes are those of a tensor of the state
    (the layout the exporter kept: not a weight it transposed or folded) becomes external data pointing into the
    state's safetensors file, whose data is raw little-endian at known offsets; the other initializers the exporter
    wrote to external data are written again, alone, into the model's data file. Without the onnx package the model
    is left as exported (the weights are then held twice)."""
    try:
        import onnx
        from onnx import numpy_helper  # noqa: F401 - part of the package check
    except ImportError:
        return
    import numpy as np

    mpath = os.path.join(tmp, model_rel)
    spath = os.path.join(tmp, *state_rel.split("/"))
    with open(spath, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
    base = 8 + n
    # the state's tensors by (ONNX type, byte length): where their bytes lie
    by_size: Dict[Tuple[int, int], List[Tuple[str, int]]] = {}
    for name, e in header.items():
        if name == "__metadata__" or e["dtype"] not in _ONNX_TYPES:
            continue
        begin, end = e["data_offsets"]
        if end - begin >= _SHARE_MIN_BYTES:
            by_size.setdefault((_ONNX_TYPES[e["dtype"]], end - begin), []).append((name, base + begin))
    if not by_size:
        return
    model = onnx.load(mpath, load_external_data=False)
    folder = os.path.dirname(mpath)
    state = np.memmap(spath, dtype=np.uint8, mode="r")
    ext_files = set()

    def data_of(t) -> Optional[bytes]:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            return t.raw_data if t.HasField("raw_data") else None
        kv = {e.key: e.value for e in t.external_data}
        ext_files.add(kv["location"])
        with open(os.path.join(folder, kv["location"]), "rb") as f:
            f.seek(int(kv.get("offset", 0)))
            return f.read(int(kv["length"])) if "length" in kv else f.read()

    kept: List[Tuple[Any, bytes]] = []
    shared = 0
    for t in model.graph.initializer:
        data = data_of(t)
        if data is None:
            continue
        match = None
        cands = by_size.get((t.data_type, len(data)), [])
        # the parameter of the same name first; a renamed one by its bytes
        # (a few sampled bytes before all of them)
        got = np.frombuffer(data, dtype=np.uint8)
        probe = np.unique(np.linspace(0, len(data) - 1, 64).astype(np.int64))
        for name, at in sorted(cands, key=lambda c: c[0] != t.name):
            have = state[at:at + len(data)]
            if np.array_equal(have[probe], got[probe]) and np.array_equal(have, got):
                match = at
                break
        if match is not None:
            del t.external_data[:]
            t.ClearField("raw_data")
            t.data_location = onnx.TensorProto.EXTERNAL
            for k, v in (("location", state_rel), ("offset", str(match)), ("length", str(len(data)))):
                t.external_data.add(key=k, value=v)
            shared += 1
        elif t.data_location == onnx.TensorProto.EXTERNAL:
            kept.append((t, data))
    del state
    if not shared:
        return
    data_rel = model_rel + ".data"
    if kept:
        with open(os.path.join(folder, data_rel + ".tmp"), "wb") as f:
            off = 0
            for t, data in kept:
                pad = -off % 64
                f.write(b"\0" * pad)
                off += pad
                del t.external_data[:]
                for k, v in (("location", data_rel), ("offset", str(off)), ("length", str(len(data)))):
                    t.external_data.add(key=k, value=v)
                f.write(data)
                off += len(data)
    for loc in ext_files:
        os.remove(os.path.join(folder, loc))
    if kept:
        os.rename(os.path.join(folder, data_rel + ".tmp"), os.path.join(folder, data_rel))
    with open(mpath, "wb") as f:
        f.write(model.SerializeToString())


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _utc_now() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")

