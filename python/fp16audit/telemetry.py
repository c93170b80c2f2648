"""Per-module gradient telemetry from backward hooks.

For every watched module two gradients of the (scaled) loss are measured as
they pass through the backward pass:

- the output gradient: with respect to the module's output tensor(s), the
  activation gradient that the module's backward consumes;
- the parameter gradient: with respect to the module's own parameters
  (not its children's).

Each is measured as fp16 would hold it. A gradient that arrives in float16
(under autocast on a GPU, the output gradient of a Linear or Conv) is taken
as it is; any other floating gradient (fp32 on a CPU; fp32 parameters and
fp32-output ops under autocast) is cast to float16 first and the counts
describe that copy. On a CPU this is what makes the telemetry real fp16
telemetry: the backward pass runs in fp32 there, and the cast shows which
values fp16 could not hold. The gradients themselves are never changed.

Output gradients are caught with tensor hooks that a forward hook attaches
to each output, not with register_full_backward_hook: that wraps the
outputs in a view which a following in-place op (ReLU(inplace=True), common
in CNNs) refuses to modify. Parameter gradients use tensor hooks on the
parameters.

The mass a gradient loses to fp16 is lost(S) = ‖fp16(g·S)/S − g‖ / ‖g‖ at
the scale S the step used (flushing to zero and the rounding of fp16's
subnormals together), the same measure, under the same name lost_mass, as
`fp16audit run --loss`'s backward audit and `fp16audit scales`. The hooks
see the scaled gradient x = g·S, so it is ‖fp16(x) − x‖ / ‖x‖, over the
elements fp16 holds finite (what overflows is counted by nonfinite).

Measurements are reductions left on the gradient's device; nothing is
copied to the host until collect() or overflowed() is called, so a step
whose telemetry is not written costs a few reductions per module and no
synchronisation.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Dict, List, Sequence, Tuple, Union

import torch
from torch import nn

from .capture import observer
from .logfile import FP16_MIN_NORMAL

# Index of each count in a counts tensor (see grad_stats).
_NONFINITE, _NONFINITE_SRC, _NONZERO, _UNDERFLOW, _SUBNORMAL, _INEXACT = range(6)
_NCOUNTS = 6
_INF = float("inf")
_FP16_OVERFLOW = 65520.0

# Index of each sum in a sums tensor (see grad_stats).
_SUMSQ, _LOST_SUMSQ = range(2)
# The smallest divisor of the prescaled sums per dtype: 1/tiny stays finite
# and the squares of the prescaled elements do not underflow.
_TINY = {torch.float32: 2.0**-100, torch.float64: 2.0**-900}

OUTPUT, PARAMS = "output", "params"
FULL, OVERFLOW, OFF = "full", "overflow", "off"

#: What GradTelemetry's `modules` accepts: None (every module owning
#: parameters), names from named_modules() or (name, module) pairs, or a
#: predicate f(name, module).
ModuleChoice = Union[None, Sequence[Union[str, Tuple[str, nn.Module]]], Callable[[str, nn.Module], bool]]


def grad_stats(grad: torch.Tensor, full: bool = True) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Measure one gradient tensor; returns (counts int64[6], max_abs float32 0-d, sums float64[2]), on its device.

    counts, in order: elements Inf/NaN in the fp16 view; elements Inf/NaN
    as delivered; finite nonzero elements as delivered; of those, elements
    the fp16 view flushes to zero (|x| <= 2^-25); nonzero elements of the
    fp16 view below the smallest normal (2^-14); finite elements whose
    fp16 view differs from them (0 means the gradient was fp16 already, so
    whatever underflowed is already zero and cannot be counted). max_abs:
    the largest |x| over the elements finite as delivered (0 when none).
    sums, over the elements finite in the fp16 view: Σ x² and Σ (fp16(x) −
    x)², so that lost_mass is √(sums[1] / sums[0]). With full=False only
    the first two counts and max_abs are measured (what overflow needs, at
    about a third of the cost); the rest are 0.
    """
    g = grad.detach()
    if g.dtype not in (torch.float32, torch.float64):
        g = g.float()  # float16 and bfloat16 values are exact in fp32
    n = g.numel()
    sums = torch.zeros(2, dtype=torch.float64, device=g.device)
    if n == 0:
        return (torch.zeros(_NCOUNTS, dtype=torch.int64, device=g.device),
                torch.zeros((), dtype=torch.float32, device=g.device), sums)
    a = g.abs()
    finite = a < _INF  # NaN compares false
    zero = torch.zeros((), dtype=a.dtype, device=a.device)

    def count(mask):
        # An int32 sum: a bool sum widens to int64 element by element
        # first, several times slower on CPU.
        return torch.sum(mask, dtype=torch.int32)

    if not full:
        # Without the cast: rounding to nearest even sends exactly the
        # magnitudes >= 65520 (halfway between 65504 and 2^16) to Inf.
        parts = [n - count(a < _FP16_OVERFLOW), n - count(finite)]
        parts += [torch.zeros((), dtype=torch.int32, device=g.device)] * 4
    else:
        # The magnitude of the fp16 view (rounding is symmetric, so casting
        # |x| equals |cast(x)|), compared in g's dtype: older torch CPU
        # builds lack some half kernels.
        ha = a.to(torch.float16).to(a.dtype)
        nonzero = (a > 0) & finite
        kept = ha < _INF
        parts = [
            n - count(kept),
            n - count(finite),
            count(nonzero),
            count(nonzero & (ha == 0)),
            count((ha > 0) & (ha < FP16_MIN_NORMAL)),
            count(finite & (ha != a)),
        ]
        # The sums of squares in g's dtype, of the elements divided by the
        # largest kept one: the squares of a tiny gradient would underflow
        # (a float64 copy would double the memory), and every prescaled
        # square is at most 1. The divisor's square is taken out again in
        # float64.
        ak = torch.where(kept, a, zero)
        c = 1 / torch.clamp(ak.amax(), min=_TINY[a.dtype])
        lost = torch.where(kept, ha, zero).sub_(ak).mul_(c)
        ak.mul_(c)
        sums = torch.stack([torch.sum(ak * ak), torch.sum(lost * lost)]).double() / c.double() ** 2
    counts = torch.stack(parts).to(torch.int64)
    max_abs = torch.where(finite, a, zero).amax().float()
    return counts, max_abs, sums


class _Acc:
    __slots__ = ("dtypes", "counts", "max_abs", "sums", "tensors", "numel", "full")

    def __init__(self, dtype, counts, max_abs, sums, numel, full):
        self.dtypes, self.counts, self.max_abs, self.sums = [dtype], counts, max_abs, sums
        self.tensors, self.numel, self.full = 1, numel, full

    def add(self, dtype, counts, max_abs, sums, numel, full):
        self.full = self.full and full
        if dtype not in self.dtypes:
            self.dtypes.append(dtype)
        self.counts = self.counts + counts
        self.max_abs = torch.maximum(self.max_abs, max_abs)
        self.sums = self.sums + sums
        self.tensors += 1
        self.numel += numel


def default_modules(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """The modules that own parameters directly (Linear, Conv, norms, embeddings...), as (name, module) pairs."""
    return [(name or "(model)", m) for name, m in model.named_modules()
            if next(m.parameters(recurse=False), None) is not None]


def _resolve(model, modules):
    if modules is None:
        return default_modules(model)
    if callable(modules):
        return [(name or "(model)", m) for name, m in model.named_modules() if modules(name, m)]
    named = dict(model.named_modules())
    out = []
    for item in modules:
        if isinstance(item, tuple):
            out.append(item)
            continue
        if item not in named:
            raise ValueError(f"no module named {item!r} in the model (names come from model.named_modules(), "
                             f"e.g. {[n for n in named if n][:4]})")
        out.append((item or "(model)", named[item]))
    return out


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _summary(acc, counts, max_abs, sums):
    out = {
        "dtype": "+".join(acc.dtypes),
        "tensors": acc.tensors,
        "numel": acc.numel,
        "nonfinite": counts[_NONFINITE],
        "nonfinite_src": counts[_NONFINITE_SRC],
        "max_abs": max_abs,
        "nonzero": None,
        "underflow": None,
        "underflow_fraction": None,
        "subnormal": None,
        "sumsq": None,
        "lost_sumsq": None,
        "lost_mass": None,
    }
    if acc.full:
        nonzero = counts[_NONZERO]
        # All finite values already fp16 values: the gradient was computed
        # in fp16 (delivered as float16, or an fp16 GEMM result cast up),
        # and what underflowed there is indistinguishable from a true zero.
        exact = counts[_INEXACT] == 0
        underflow = None if exact else counts[_UNDERFLOW]
        sumsq = sums[_SUMSQ]
        lost_sumsq = None if exact else sums[_LOST_SUMSQ]
        out.update(nonzero=nonzero, underflow=underflow, subnormal=counts[_SUBNORMAL],
                   underflow_fraction=(underflow / nonzero) if (underflow is not None and nonzero) else None,
                   sumsq=sumsq, lost_sumsq=lost_sumsq,
                   lost_mass=math.sqrt(lost_sumsq / sumsq) if (lost_sumsq is not None and sumsq > 0) else None)
    return out


class GradTelemetry:
    """Watches the output and parameter gradients of a model's modules.

    `modules` chooses them: None for every module that owns parameters, a
    list of names from model.named_modules() (or (name, module) pairs), or
    a predicate f(name, module). `params=False` leaves parameter gradients
    alone. Measurements accumulate over every backward pass (gradient
    accumulation, a module called twice) until reset().

    `level` sets what the hooks measure from now on: FULL (everything),
    OVERFLOW (Inf/NaN counts and max_abs only: about a third of the cost) or
    OFF (nothing; the hooks return at once).
    """

    def __init__(self, model: nn.Module, modules: ModuleChoice = None, params: bool = True, level: str = FULL) -> None:
        self.watched = _resolve(model, modules)
        self.level = level
        self._types = {name: type(m).__name__ for name, m in self.watched}
        self._stats = {}  # (name, OUTPUT|PARAMS) -> _Acc
        self._order = []  # module names in order of their first gradient
        self._forward = {}  # name -> (max |x| of its forward outputs, non-finite count), FULL steps only
        self._modules = dict(self.watched)
        self._handles = []
        for name, m in self.watched:
            # an observer: a capture's copy of the model leaves it out
            self._handles.append(m.register_forward_hook(observer(functools.partial(self._forward_hook, name))))
            if params:
                for p in m.parameters(recurse=False):
                    if p.requires_grad:
                        self._handles.append(p.register_hook(functools.partial(self._on_grad, name, PARAMS)))

    def _forward_hook(self, name, module, inputs, output):
        if self.level == OFF or not torch.is_grad_enabled():
            return
        for t in _tensors(output):
            if t.requires_grad and t.is_floating_point():
                t.register_hook(functools.partial(self._on_grad, name, OUTPUT))
            if self.level == FULL and t.is_floating_point():
                # The forward output's magnitude, on the interval steps
                # only: how an activation grows towards fp16's 65504
                # before it overflows (the replay's "how it grew").
                with torch.no_grad():
                    a = t.detach().abs()
                    fin = a < _INF
                    m = torch.where(fin, a, torch.zeros((), dtype=a.dtype, device=a.device)).amax().float()
                    nf = a.numel() - torch.sum(fin, dtype=torch.int32)
                prev = self._forward.get(name)
                self._forward[name] = (m, nf) if prev is None else (torch.maximum(prev[0], m), prev[1] + nf)

    def _on_grad(self, name, which, grad):
        if self.level == OFF or not grad.is_floating_point():
            return None
        full = self.level == FULL
        with torch.no_grad():
            counts, max_abs, sums = grad_stats(grad, full)
        dtype = str(grad.dtype).replace("torch.", "")
        key = (name, which)
        acc = self._stats.get(key)
        if acc is None:
            self._stats[key] = _Acc(dtype, counts, max_abs, sums, grad.numel(), full)
            if (name, OUTPUT if which == PARAMS else PARAMS) not in self._stats:
                self._order.append(name)
        else:
            acc.add(dtype, counts, max_abs, sums, grad.numel(), full)
        # None: the hook observes, the gradient flows on unchanged.
        return None

    def _to_host(self):
        # One copy per device rather than one per tensor: on a GPU each
        # copy is a synchronisation.
        by_device = {}
        for key, acc in self._stats.items():
            by_device.setdefault(acc.counts.device, []).append(key)
        host = {}
        for keys in by_device.values():
            counts = torch.stack([self._stats[k].counts for k in keys]).tolist()
            maxes = torch.stack([self._stats[k].max_abs for k in keys]).tolist()
            sums = torch.stack([self._stats[k].sums for k in keys]).tolist()
            host.update(zip(keys, zip(counts, maxes, sums)))
        return host

    def overflowed(self) -> bool:
        """True when any watched gradient since reset() held Inf/NaN in fp16."""
        return any(c[_NONFINITE] > 0 for c, _, _ in self._to_host().values())

    def collect(self) -> List[Dict[str, Any]]:
        """The measurements since reset(): one dict per module, in the order their first gradient arrived.

        Each has name, type, and "output" and "params" summaries (None when
        that gradient did not arrive); see docs/log-format.md ("telemetry") for the fields.
        """
        host = self._to_host()
        forward = self._forward_to_host()
        rows = []
        for name in self._order:
            row = {"name": name, "type": self._types.get(name, "")}
            for which in (OUTPUT, PARAMS):
                acc = self._stats.get((name, which))
                row[which] = None if acc is None else _summary(acc, *host[(name, which)])
            if name in forward:
                row["forward"], row["weight_max_abs"] = forward[name]
            rows.append(row)
        return rows

    def _forward_to_host(self):
        """name -> ({"max_abs", "nonfinite"} of its forward outputs, the largest |w| of its own parameters), for the
        modules whose forward was measured (FULL steps)."""
        if not self._forward:
            return {}
        names = list(self._forward)
        with torch.no_grad():
            wmax = []
            for n in names:
                ps = [p.detach() for p in self._modules[n].parameters(recurse=False)] if n in self._modules else []
                w = [p.abs().amax().float().to(self._forward[n][0].device) for p in ps if p.numel() and p.is_floating_point()]
                wmax.append(torch.stack(w).amax() if w else torch.zeros((), device=self._forward[n][0].device))
            maxes = torch.stack([self._forward[n][0] for n in names]).tolist()
            counts = torch.stack([self._forward[n][1].to(torch.int64) for n in names]).tolist()
            weights = torch.stack(wmax).tolist()
        return {n: ({"max_abs": m, "nonfinite": int(c)}, w) for n, m, c, w in zip(names, maxes, counts, weights)}

    def reset(self) -> None:
        """Forget the measurements so far (the recorder calls it after every step)."""
        self._stats = {}
        self._order = []
        self._forward = {}

    def remove(self) -> None:
        """Detach every hook from the model."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self.reset()
