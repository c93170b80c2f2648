"""A CPU stand-in for torch.cuda.amp.GradScaler.

torch 1.13's GradScaler works only on CUDA (on a machine without it, it
warns and disables itself), and on a CPU nothing overflows anyway: the
backward pass runs in fp32. EmulatedGradScaler follows GradScaler's
documented behaviour so that recorders, callbacks and tests can run the real
control flow on a CPU:

- scale(outputs) multiplies by the current scale;
- unscale_(optimizer) divides the gradients of the optimizer's parameters by
  the scale and notes whether any of them overflowed;
- step(optimizer) unscales (if not done yet) and calls optimizer.step() only
  when nothing overflowed;
- update() multiplies the scale by backoff_factor after a step that
  overflowed, and by growth_factor after growth_interval clean steps in a
  row; the scale is a float32, as GradScaler keeps it.

What counts as "overflowed" is where the emulation comes in. A gradient
overflows when, before unscaling, it holds Inf/NaN, or (with half_check) it
does once cast to float16: that is the scaled gradient out of fp16 range,
which is what an fp16 GEMM would have produced on a GPU. Checks registered
with watch() are asked too; GradTelemetry.overflowed is one: under autocast
an Inf in an fp16 activation gradient flows on into the parameter gradients,
and watching the telemetry reproduces that.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch

Outputs = Union[torch.Tensor, List[torch.Tensor], Tuple[torch.Tensor, ...]]


def _f32(x):
    return struct.unpack("f", struct.pack("f", float(x)))[0]


class _Watch:
    def __init__(self, owner, check):
        self._owner, self.check = owner, check

    def remove(self) -> None:
        """Stop asking this check."""
        if self in self._owner._watches:
            self._owner._watches.remove(self)


class EmulatedGradScaler:
    """GradScaler's interface and update rule, on any device; see the module docstring."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True, half_check: bool = True) -> None:
        # The same argument checks as GradScaler: a scaler that cannot back
        # off or grow would make skipped steps invisible in the scale history.
        if not growth_factor > 1.0:
            raise ValueError("growth_factor should be > 1")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError("backoff_factor should be in (0, 1)")
        if not (isinstance(growth_interval, int) and growth_interval > 0):
            raise ValueError("growth_interval should be a positive integer")
        self._enabled = bool(enabled)
        self._init_scale = _f32(init_scale)
        self._scale = self._init_scale
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = growth_interval
        self._growth_tracker = 0
        self.half_check = half_check
        # id(optimizer) -> {"found_inf": bool, "stepped": bool}, since the last update()
        self._per_opt = {}
        self._watches = []

    def is_enabled(self) -> bool:
        """As GradScaler.is_enabled."""
        return self._enabled

    def get_scale(self) -> float:
        """The current scale (1.0 when disabled), as GradScaler.get_scale."""
        return self._scale if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        """As GradScaler.get_growth_factor."""
        return self._growth_factor

    def get_backoff_factor(self) -> float:
        """As GradScaler.get_backoff_factor."""
        return self._backoff_factor

    def get_growth_interval(self) -> int:
        """As GradScaler.get_growth_interval."""
        return self._growth_interval

    def watch(self, check: Callable[[], bool]) -> _Watch:
        """Also count a step as overflowed when check() returns True at unscale time; returns a handle with remove()."""
        w = _Watch(self, check)
        self._watches.append(w)
        return w

    def scale(self, outputs: Outputs) -> Outputs:
        """Multiply by the current scale, as GradScaler.scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            return outputs * self._scale
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise ValueError("outputs must be a Tensor or a list or tuple of Tensors")

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the optimizer's gradients by the scale and note whether any overflowed, as GradScaler.unscale_."""
        if not self._enabled:
            return
        state = self._per_opt.get(id(optimizer))
        if state is not None:
            if state["stepped"]:
                raise RuntimeError("unscale_() is being called after step().")
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        found = False
        inv = 1.0 / self._scale if self._scale != 0 else float("inf")
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    g = p.grad
                    if not bool(torch.isfinite(g).all()):
                        found = True
                    elif self.half_check and g.dtype != torch.float16 and not bool(torch.isfinite(g.to(torch.float16)).all()):
                        found = True
                    g.mul_(inv)
        for w in list(self._watches):
            if w.check():
                found = True
        self._per_opt[id(optimizer)] = {"found_inf": found, "stepped": False}

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Optional[Any]:
        """Unscale if not done yet and call optimizer.step() unless something overflowed, as GradScaler.step."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        state = self._per_opt.get(id(optimizer))
        if state is not None and state["stepped"]:
            raise RuntimeError("step() has already been called since the last update().")
        if state is None:
            self.unscale_(optimizer)
            state = self._per_opt[id(optimizer)]
        state["stepped"] = True
        if state["found_inf"]:
            return None
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale: Optional[float] = None) -> None:
        """Back off after an overflow, grow after growth_interval clean steps, as GradScaler.update."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = _f32(new_scale)
        else:
            if not self._per_opt:
                raise RuntimeError("No inf checks were recorded prior to update.")
            if any(st["found_inf"] for st in self._per_opt.values()):
                self._scale = _f32(self._scale * self._backoff_factor)
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    self._scale = _f32(self._scale * self._growth_factor)
                    self._growth_tracker = 0
        self._per_opt = {}

    def state_dict(self) -> Dict[str, Any]:
        """As GradScaler.state_dict."""
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """As GradScaler.load_state_dict."""
        if not state:
            raise RuntimeError("The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler.")
        self._scale = _f32(state["scale"])
        self._growth_factor = float(state["growth_factor"])
        self._backoff_factor = float(state["backoff_factor"])
        self._growth_interval = int(state["growth_interval"])
        self._growth_tracker = int(state["_growth_tracker"])
