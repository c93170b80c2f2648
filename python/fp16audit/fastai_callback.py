"""A fastai callback that writes the fp16audit log of a `learn.to_fp16()` run.

    from fp16audit.fastai_callback import Fp16AuditCallback

    learn = vision_learner(dls, resnet34).to_fp16()
    learn.fit_one_cycle(5, 1e-3, cbs=Fp16AuditCallback("run.jsonl", every=100))

Written for fastai 2.x whose to_fp16() is native AMP: the MixedPrecision
callback of fastai.callback.fp16 holding a torch.cuda.amp.GradScaler (the
2.7 series and the earlier 2.x releases with the same callback). What it
relies on:

- MixedPrecision (order 10) creates the GradScaler in before_fit and stores
  it as learn.scaler (a disabled one under to_bf16()); this callback has
  order 11, so its before_fit finds it there and keeps its own reference
  (MixedPrecision sets learn.scaler to None in after_fit).
- MixedPrecision.before_step raises CancelStepException when the scaler
  found Inf/NaN; fastai then calls after_cancel_step and, for every step,
  after_step. MixedPrecision.after_step calls scaler.update() before this
  callback's after_step (order), so the scale read there is the updated one.
- learn.loss holds the unscaled loss (MixedPrecision scales loss_grad only).

Importing this module does not need fastai: without it the callback derives
from a small stand-in base class with fastai's dispatch rules, so the module
can be imported, tested and read anywhere.
"""

from __future__ import annotations

from typing import List, Optional, Union

from .capture import Capture, CaptureEvent, CaptureStop
from .recorder import AmpRecorder
from .telemetry import ModuleChoice

try:  # pragma: no cover - depends on the environment
    from fastai.callback.core import Callback as _CallbackBase
    from fastai.callback.core import CancelFitException as _CancelFit

    HAVE_FASTAI = True
except ImportError:
    HAVE_FASTAI = False

    # Events fastai runs only in the mode a callback's run_train/run_valid allow.
    _INNER_LOOP = frozenset({
        "before_batch", "after_pred", "after_loss", "before_backward", "after_cancel_backward", "after_backward",
        "before_step", "after_cancel_step", "after_step", "after_cancel_batch", "after_batch",
    })

    class _CallbackBase:
        """The part of fastai's Callback this module needs: ordering, dispatch and attribute delegation to learn."""

        order, learn, run, run_train, run_valid = 0, None, True, True, True

        def __call__(self, event_name):
            training = getattr(self.learn, "training", True)
            runs = (event_name not in _INNER_LOOP
                    or (self.run_train and training)
                    or (self.run_valid and not training))
            method = getattr(type(self), event_name, None)
            if self.run and runs and callable(method):
                return method(self)
            return None

        def __getattr__(self, name):
            # Only reached for names the callback lacks; fastai callbacks
            # read learner state (model, dls, epoch...) through this.
            if name.startswith("_") or self.learn is None:
                raise AttributeError(name)
            return getattr(self.learn, name)

    class _CancelFit(Exception):
        """fastai's CancelFitException, where fastai is not installed."""


__all__ = ["Fp16AuditCallback", "HAVE_FASTAI"]


class Fp16AuditCallback(_CallbackBase):
    """Write the fp16audit log (every step, telemetry every `every` steps and at skipped ones) to `fname`.

    `modules` selects the watched modules as for GradTelemetry; telemetry=False
    records loss and scale only (no hooks). capture (a folder or a
    fp16audit.Capture) keeps the failing step (docs/capture.md): the
    triggers the loss decides capture in before_step, before the optimizer
    applies the step, the scale collapse in after_step; with
    on_event="stop" the fit ends there (CancelFitException). The policy is
    read from the learner's MixedPrecision callback (to_fp16, to_bf16,
    none: fp32); pass policy= to say it otherwise.
    """

    order = 11  # after MixedPrecision (10): its after_step has called scaler.update()
    run_valid = False  # training steps only

    def __init__(self, fname: str = "fp16audit.jsonl", every: int = 100, modules: ModuleChoice = None,
                 telemetry: bool = True, capture: Union[Capture, str, None] = None, policy: Optional[str] = None) -> None:
        super().__init__()
        # Attribute names chosen not to shadow the learner's: fastai warns
        # when a callback sets a name the learner already has.
        self.fname, self.every, self.watch_modules, self.with_telemetry = fname, every, modules, telemetry
        self.capture_to, self.capture_policy = Capture.of(capture), policy
        self._rec: Optional[AmpRecorder] = None
        self._cancelled = False
        #: the captures of the last fit (fp16audit.capture.CaptureEvent), in order
        self.captures: List[CaptureEvent] = []

    def before_fit(self) -> None:
        if self._rec is not None:
            # A previous fit died before after_fit: its hooks must not pile
            # up, and its log stays without an end line.
            self._rec.abort()
        learn = self.learn
        try:
            steps_per_epoch = len(learn.dls.train)
        except (AttributeError, TypeError):
            steps_per_epoch = None
        fastai_version = None
        if HAVE_FASTAI:  # pragma: no cover - depends on the environment
            import fastai

            fastai_version = fastai.__version__
        scaler = getattr(learn, "scaler", None)
        extra = {}
        if self.capture_to is not None:
            policy, device = self.capture_policy, None
            if policy is None:
                policy, device = _fastai_policy(learn, scaler)
            extra = dict(capture=self.capture_to, optimizer=getattr(learn, "opt", None), loss_func=getattr(learn, "loss_func", None),
                         policy=policy, autocast_device=device)
        self._rec = AmpRecorder(
            self.fname,
            scaler=scaler,
            model=learn.model if (self.with_telemetry or self.capture_to is not None) else None,
            every=self.every,
            steps_per_epoch=steps_per_epoch,
            modules=self.watch_modules,
            source="fastai",
            telemetry=self.with_telemetry,
            fastai_version=fastai_version,
            n_epoch=getattr(learn, "n_epoch", None),
            **extra,
        )
        self.captures = []
        self._cancelled = False

    def before_step(self) -> None:
        # Reached only when MixedPrecision did not cancel the step: the
        # gradients are unscaled and finite (or there is no scaler), and
        # the optimizer has not run yet.
        if self._rec is None or self._rec.capture is None:
            return
        learn = self.learn
        try:
            self._rec.before_step(learn.loss, inputs=tuple(learn.xb), target=_first(learn.yb),
                                  epoch=getattr(learn, "epoch", None), iter=getattr(learn, "iter", None))
        except CaptureStop as e:
            self.captures = self._rec.captures
            raise _CancelFit() from e

    def after_cancel_step(self) -> None:
        self._cancelled = True

    def after_step(self) -> None:
        learn = self.learn
        kw = {}
        if self._rec.capture is not None:
            kw = dict(inputs=tuple(learn.xb), target=_first(learn.yb))
        try:
            self._rec.step(learn.loss, epoch=getattr(learn, "epoch", None), iter=getattr(learn, "iter", None),
                           skipped=self._cancelled, **kw)
        except CaptureStop as e:
            self.captures = self._rec.captures
            raise _CancelFit() from e
        finally:
            self._cancelled = False
        if self._rec.capture is not None:
            self.captures = self._rec.captures

    def capture_now(self) -> None:
        """Capture the next training step (trigger "request")."""
        if self._rec is None or self._rec.capture is None:
            raise RuntimeError("Fp16AuditCallback: no capture is armed (pass capture='captures/' and call this during fit)")
        self._rec.capture_now()

    def after_fit(self) -> None:
        if self._rec is not None:
            self._rec.close()
            self._rec = None


def _first(yb):
    """fastai's yb is a tuple of targets; the capture keeps one."""
    if isinstance(yb, (tuple, list)):
        return yb[0] if len(yb) == 1 else None
    return yb


def _fastai_policy(learn, scaler):
    """(fp16audit --policy, autocast device_type) of a learner, from its MixedPrecision callback."""
    for cb in getattr(learn, "cbs", []):
        if type(cb).__name__ == "MixedPrecision" or any(c.__name__ == "MixedPrecision" for c in type(cb).__mro__):
            ac = getattr(cb, "autocast", None)
            device = getattr(ac, "device", None) or getattr(ac, "device_type", None)
            mode = str(getattr(cb, "amp_mode", "fp16")).lower()
            return ("autocast-bf16" if "bf16" in mode else "autocast-fp16"), device
        if type(cb).__name__ == "NonNativeMixedPrecision":
            return "half", None
    if scaler is not None and scaler.is_enabled():
        return "autocast-fp16", None
    return "fp32", None
