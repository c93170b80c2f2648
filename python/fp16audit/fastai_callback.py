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

from typing import Optional

from .recorder import AmpRecorder
from .telemetry import ModuleChoice

try:  # pragma: no cover - depends on the environment
    from fastai.callback.core import Callback as _CallbackBase

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


__all__ = ["Fp16AuditCallback", "HAVE_FASTAI"]


class Fp16AuditCallback(_CallbackBase):
    """Write the fp16audit log (every step, telemetry every `every` steps and at skipped ones) to `fname`.

    `modules` selects the watched modules as for GradTelemetry; telemetry=False
    records loss and scale only (no hooks).
    """

    order = 11  # after MixedPrecision (10): its after_step has called scaler.update()
    run_valid = False  # training steps only

    def __init__(self, fname: str = "fp16audit.jsonl", every: int = 100, modules: ModuleChoice = None,
                 telemetry: bool = True) -> None:
        super().__init__()
        # Attribute names chosen not to shadow the learner's: fastai warns
        # when a callback sets a name the learner already has.
        self.fname, self.every, self.watch_modules, self.with_telemetry = fname, every, modules, telemetry
        self._rec: Optional[AmpRecorder] = None
        self._cancelled = False

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
        self._rec = AmpRecorder(
            self.fname,
            scaler=getattr(learn, "scaler", None),
            model=learn.model if self.with_telemetry else None,
            every=self.every,
            steps_per_epoch=steps_per_epoch,
            modules=self.watch_modules,
            source="fastai",
            fastai_version=fastai_version,
            n_epoch=getattr(learn, "n_epoch", None),
        )
        self._cancelled = False

    def after_cancel_step(self) -> None:
        self._cancelled = True

    def after_step(self) -> None:
        learn = self.learn
        self._rec.step(learn.loss, epoch=getattr(learn, "epoch", None), iter=getattr(learn, "iter", None),
                       skipped=self._cancelled)
        self._cancelled = False

    def after_fit(self) -> None:
        if self._rec is not None:
            self._rec.close()
            self._rec = None
