"""fp16audit for fastai: `learn.fp16audit()` and the FP16Preflight callback.

    from fp16audit.fastai import FP16Preflight   # adds Learner.fp16audit too

    learn = vision_learner(dls, resnet34).to_fp16()
    learn.fp16audit()                            # audits a few training batches, as the learner trains
    learn.fit_one_cycle(5, 1e-3, cbs=FP16Preflight())   # stops the fit before it starts when fp16 will give NaN

The learner's own things decide the audit: batches from learn.dls.train
(fastai's tensor subclasses as plain tensors), its loss function mapped to
fp16audit's --loss, and the policy from its callbacks: to_fp16() is
autocast-fp16 with the GradScaler's init_scale, to_bf16() autocast-bf16,
no MixedPrecision what to_fp16() would do. The verdict and the fixes are
the binary's (fastai's own words for the fixes: Normalize.from_stats in
batch_tfms, procs=[Normalize]).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, Tuple

from fastai.callback.core import Callback, CancelFitException
from fastai.learner import Learner
from fastcore.basics import patch

from .audit import LOSSES, Report, audit

__all__ = ["FP16Preflight", "learner_policy", "learner_loss"]

# fastai's and torch.nn's losses, by the class of the function they apply.
_LOSSES = {
    "CrossEntropyLoss": "cross-entropy", "BCEWithLogitsLoss": "bce", "MSELoss": "mse", "L1Loss": "l1",
    "LabelSmoothingCrossEntropy": "cross-entropy",
}


def learner_policy(learn: Learner) -> Tuple[str, Optional[float], str]:
    """The policy a learner trains under: (policy, init_scale, note)."""
    from fastai.callback.fp16 import AMPMode, MixedPrecision, NonNativeMixedPrecision

    for cb in learn.cbs:
        if isinstance(cb, MixedPrecision):
            if cb.amp_mode == AMPMode.BF16:
                return "autocast-bf16", None, ""
            return "autocast-fp16", cb.kwargs.get("init_scale"), ""
        if isinstance(cb, NonNativeMixedPrecision):
            return "half", None, "the learner uses NonNativeMixedPrecision (model.half() with fp32 master weights): audited as half"
    return "autocast-fp16", None, "the learner has no MixedPrecision callback: audited as learn.to_fp16() would train it"


def learner_loss(learn: Learner) -> Tuple[Optional[str], Optional[str], str]:
    """The learner's loss as fp16audit's --loss: (name, class axis, note);
    name None when it cannot be mapped (the note names it)."""
    lf = learn.loss_func
    func = getattr(lf, "func", lf)  # fastai's *Flat losses wrap a torch.nn loss
    cls = type(func).__name__
    name = _LOSSES.get(cls)
    if name is None:
        return None, None, ("the loss %s has no fp16audit counterpart (%s): the forward pass is audited, the backward is not"
                            % (type(lf).__name__, ", ".join(LOSSES)))
    axis = getattr(lf, "axis", None)
    class_axis = None
    if name == "cross-entropy" and axis is not None:
        class_axis = "1" if axis == 1 else "last"
    note = ""
    if cls == "LabelSmoothingCrossEntropy":
        note = "LabelSmoothingCrossEntropyFlat is audited as cross-entropy: its smoothing term (eps=%g) is left out of the backward" % getattr(func, "eps", 0.1)
    return name, class_axis, note


@patch
def fp16audit(self: Learner, n_batches: int = 2, loss: bool = True, policy: Optional[str] = None, **kwargs: Any) -> Report:
    """Audit the learner's model for fp16 failures on n_batches of its training batches.

    loss=True also audits the backward with the learner's loss (when
    fp16audit has it); policy overrides the one the learner's callbacks
    give. Other keyword arguments go to fp16audit.audit (max_memory,
    exporter, progress, fixes, device_type: "cuda" by default, where
    fastai's MixedPrecision autocasts).
    """
    pol, init_scale, note = learner_policy(self)
    notes = [note] if note else []
    loss_name, class_axis = None, None
    if loss:
        loss_name, class_axis, lnote = learner_loss(self)
        if lnote:
            notes.append(lnote)
    n_inp = getattr(self.dls, "n_inp", 1)
    batches = []
    for b in self.dls.train:
        batches.append(tuple(b))
        if len(batches) >= n_batches:
            break
    if not batches:
        raise ValueError("learn.fp16audit: learn.dls.train yielded no batch")
    kwargs.setdefault("init_scale", init_scale)
    # fastai's MixedPrecision autocasts on CUDA whatever the learner's
    # device: the fixes name that autocast
    kwargs.setdefault("device_type", "cuda")
    return audit(self.model, _Batches(batches), n_batches=n_batches, n_inp=n_inp, policy=policy or pol,
                 loss=loss_name, class_axis=class_axis, _notes=notes, **kwargs)


class _Batches:
    """Batches already drawn, which audit() iterates as it would a DataLoader."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


class FP16Preflight(Callback):
    """Audit once, before the first batch of the first fit, and stop the fit
    (CancelFitException) with the verdict when fp16 will produce NaN or
    wrong outputs; warn=True warns instead. The report is kept as
    `self.report` and `learn.fp16audit_report`."""

    # Before MixedPrecision (10): its settings are its constructor's
    # arguments, and a fit the preflight cancels never sets up autocast
    # and the GradScaler, which on a machine without CUDA warn that they
    # disable themselves (nothing trains, so that is not the user's
    # business then).
    order = 9

    def __init__(self, n_batches: int = 2, loss: bool = True, warn: bool = False, **kwargs: Any):
        super().__init__()
        self.n_batches, self.with_loss, self.warn_only, self.audit_kwargs = n_batches, loss, warn, kwargs
        self.report: Optional[Report] = None

    def before_fit(self) -> None:
        if self.report is not None:
            return
        r = self.learn.fp16audit(n_batches=self.n_batches, loss=self.with_loss, **self.audit_kwargs)
        self.report = r
        self.learn.fp16audit_report = r
        if r.ok:
            return
        msg = "fp16audit: %s — %s" % (r.verdict, r.verdict_text)
        fixes = [f["summary"] for f in r.working_fixes]
        if fixes:
            msg += "\n  verified fix: " + "\n  verified fix: ".join(fixes)
        if self.warn_only:
            warnings.warn(msg, stacklevel=2)
            return
        print(msg)
        raise CancelFitException()
