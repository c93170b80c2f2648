"""fp16audit for Lightning: the FP16Preflight callback.

    from fp16audit.lightning import FP16Preflight

    trainer = L.Trainer(precision="16-mixed", callbacks=[FP16Preflight()])
    trainer.fit(model, train_dataloaders=loader)   # stops before the first step when fp16 will give NaN

At on_train_start the callback audits two training batches (the training
dataset's first samples through its DataLoader's collate_fn; the run's
data order and random states are left as they were) of the
LightningModule under the policy its precision plugin trains with:
"16-mixed" is torch.autocast in fp16 with the plugin's GradScaler,
"bf16-mixed" autocast in bf16, "16-true" model.half(), anything else what
"16-mixed" would do. When fp16 will give NaN it stops the fit before the
first step (trainer.should_stop, Lightning's own way to stop; warn=True
only warns) and prints the verdict with the fixes in Lightning's words
(precision="bf16-mixed", ...). Every optimizer step's raw loss goes to
fp16audit's log (fp16audit scales reads it).

With capture="captures/" (or a fp16audit.Capture) it also keeps the
failing step of a run that goes wrong later (docs/capture.md), for
`fp16audit replay`; loss_func= tells the replay the loss training_step
computes (its backward is replayed only then), n_inp how many leading
elements of a tuple batch are forward's inputs:

    FP16Preflight(capture=Capture("captures/", on_event="stop"), loss_func=nn.CrossEntropyLoss())

The loss triggers are checked in on_before_optimizer_step (after the
backward and the unscaling, before the optimizer), the loss-scale collapse
in on_train_batch_end; the loss is the one on_before_backward sees, the
batch on_train_batch_start's, the scaler the precision plugin's.

Lightning 2.6 turns Trainer(accelerator="cpu", precision="16-mixed") into
"bf16-mixed" (with a warning): on a CPU, real fp16 autocast needs the
plugin given explicitly, plugins=[MixedPrecision("16-mixed", "cpu")].

`import fp16audit` does not import this module (nor lightning).
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Tuple

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package
    import pytorch_lightning as pl  # type: ignore[no-redef]

from ._trainers import CaptureHandle, LossLog, PreflightFailed, decide, default_log, draw_batches, message, run_preflight, update_will_be_skipped
from .audit import Report
from .capture import Capture, CaptureEvent, CaptureStop

__all__ = ["FP16Preflight", "PreflightFailed", "trainer_policy", "capture_policy"]


def trainer_policy(trainer: Any) -> Tuple[str, Optional[float], str]:
    """The policy a Lightning Trainer trains under, from its precision plugin: (policy, init_scale, note)."""
    plugin = trainer.precision_plugin
    precision = str(getattr(plugin, "precision", trainer.precision))
    scaler = getattr(plugin, "scaler", None)
    if precision == "16-mixed":
        init = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else None
        return "autocast-fp16", init, ""
    if precision == "bf16-mixed":
        return "autocast-bf16", None, ""
    if precision == "16-true":
        return "half", None, 'precision="16-true" trains the model in float16 throughout: audited as model.half()'
    return "autocast-fp16", None, 'the Trainer\'s precision is %r: audited as precision="16-mixed" would train it' % precision


# What each precision plugin trains in, as fp16audit's --policy: what the
# replay of a capture emulates. "bf16-true" and "transformer-engine" have no
# policy: such a run is not captured.
_CAPTURE_POLICIES = {"16-mixed": "autocast-fp16", "bf16-mixed": "autocast-bf16", "16-true": "half", "32-true": "fp32",
                     "32": "fp32", "64-true": "fp32"}


def capture_policy(trainer: Any) -> Optional[str]:
    """The policy a Lightning run really trains under, for its capture; None where fp16audit has none."""
    return _CAPTURE_POLICIES.get(str(getattr(trainer.precision_plugin, "precision", trainer.precision)))


class FP16Preflight(CaptureHandle, pl.Callback):
    """The preflight, the raw-loss log and the capture of the failing step for Lightning.

    n_batches: training batches the preflight audits. warn: warn instead of
    stopping. preflight=False skips the audit (the log only). policy:
    audit under this policy instead of the precision plugin's. log: the
    log's path; None writes fp16audit-log.jsonl (never over an existing
    file) in trainer.log_dir (or default_root_dir); False writes none.
    capture: a folder or a fp16audit.Capture (docs/capture.md); it needs
    the log. loss_func: the loss training_step computes, for the replay's
    backward (a loss module, or a fp16audit.capture.LOSS_KEYS
    description). n_inp: how many leading elements of a tuple batch are
    forward's inputs (the next is the target; a dict batch's labels key is
    the target). telemetry=True adds the log's per-module gradient
    telemetry (as the Hugging Face callback's: the pinned-plateau trigger
    and the culprit's history need it; off unless asked for, for its cost
    at every step). Other keyword arguments go to fp16audit.audit
    (max_memory, exporter, progress, fixes, ...). After the preflight,
    `report` holds its Report and `log_path` the log's path; `captures`
    lists the captures of the run.

    on_event="stop" ends the fit at the captured step: Lightning's own way
    (trainer.should_stop) after the step when the capture came after the
    update or the GradScaler skips the step anyway; otherwise before the
    optimizer applies it, by raising fp16audit.CaptureStop from
    trainer.fit(), the one way to keep Lightning from an update.
    """

    def __init__(self, n_batches: int = 2, *, warn: bool = False, preflight: bool = True, policy: Optional[str] = None,
                 log: Any = None, capture: Any = None, loss_func: Any = None, n_inp: int = 1, telemetry: bool = False,
                 every: int = 100, **audit_kwargs: Any):
        super().__init__()
        self.n_batches, self.warn, self.preflight, self.policy = n_batches, warn, preflight, policy
        self.log, self.audit_kwargs = log, audit_kwargs
        self.capture = Capture.of(capture)
        if self.capture is not None and log is False:
            raise ValueError("FP16Preflight: capture needs the log (log=False): a capture holds the log so far, and the log names "
                             "the capture")
        self.loss_func, self.n_inp = loss_func, n_inp
        self.telemetry = bool(telemetry)
        self.every = every
        self.report: Optional[Report] = None
        self.loss_log: Optional[LossLog] = None
        self.log_path: Optional[str] = None
        self._last_step = 0
        self._batch: Any = None
        self._scaler: Any = None
        self._stopped = False
        self._captures: List[CaptureEvent] = []

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.preflight and self.report is None and trainer.global_step == 0:
            if not self._preflight(trainer, pl_module):
                return
        if self.log is not False and self.loss_log is None:
            self._open_log(trainer, pl_module)

    def _preflight(self, trainer: Any, pl_module: Any) -> bool:
        policy, init_scale, note = trainer_policy(trainer)
        notes = [note]
        if self.policy:
            policy, notes = self.policy, ["audited under policy=%r as asked" % self.policy]
        loader = trainer.train_dataloader
        if isinstance(loader, (list, tuple)):
            loader = loader[0]
        elif isinstance(loader, dict):
            loader = next(iter(loader.values()))
        batches = draw_batches(loader, self.n_batches)
        device = getattr(trainer.precision_plugin, "device", None) or "cuda"
        r = run_preflight(pl_module, batches, trainer="lightning", policy=policy, notes=notes, init_scale=init_scale,
                          device_type=device if device != "cpu" else "cuda", audit_kwargs=self.audit_kwargs)
        self.report = r
        stop = decide(r, self.warn)
        if stop is None:
            return True
        # Lightning's own way to end a fit (EarlyStopping's): the fit loop
        # checks should_stop before its first step.
        print(message(r))
        trainer.should_stop = True
        return False

    def _open_log(self, trainer: Any, pl_module: Any) -> None:
        folder = getattr(trainer, "log_dir", None) or trainer.default_root_dir
        path = self.log if isinstance(self.log, str) else default_log(folder)
        if path is None:
            return
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        cap: Dict[str, Any] = {}
        if self.capture is not None:
            policy = capture_policy(trainer)
            if policy is None:
                warnings.warn("fp16audit: precision=%r has no fp16audit policy to replay it under: the run is not captured" %
                              str(trainer.precision), stacklevel=2)
            else:
                # trainer.optimizers holds the torch optimizers themselves
                # (LightningOptimizer wraps them only in the hooks)
                opts = list(trainer.optimizers)
                cap = dict(capture=self.capture, optimizer=opts[0] if len(opts) == 1 else None, loss_func=self.loss_func,
                           policy=policy, autocast_device=getattr(trainer.precision_plugin, "device", None) or pl_module.device.type)
        try:
            self.loss_log = LossLog(path, scaler, "lightning", model=pl_module, telemetry=self.telemetry, every=self.every,
                                    n_inp=self.n_inp, precision=str(trainer.precision),
                                    accumulate_grad_batches=int(trainer.accumulate_grad_batches), **cap)
        except OSError as e:
            warnings.warn("fp16audit: cannot write the loss log %s (%s): the run goes on without it" % (path, e), stacklevel=2)
            return
        self.log_path = self.loss_log.path
        self._last_step = trainer.global_step
        self._scaler, self._stopped = scaler, False

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        # kept by reference, never copied, for a capture of this step
        self._batch = batch

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        # The loss as training_step returned it: the MixedPrecision plugin
        # has multiplied it by the scale (a power of two: dividing is
        # exact), and automatic optimization by 1/accumulate_grad_batches.
        if self.loss_log is None or loss is None:
            return
        raw = loss.detach().float()
        if self._scaler is not None and self._scaler.is_enabled():
            raw = raw / float(self._scaler.get_scale())
        if pl_module.automatic_optimization:
            raw = raw * int(trainer.accumulate_grad_batches)
        self.loss_log.add(raw)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        # After the backward and the plugin's unscale_, before the
        # optimizer: the capture's before_update, at the step's weights.
        if self.loss_log is None or not self.loss_log.capturing:
            return
        inputs, target = self.loss_log.recorder.split_batch(self._batch)
        try:
            self.loss_log.before_step(inputs, target, epoch=trainer.current_epoch, iter=trainer.global_step)
        except CaptureStop:
            self._stopped = True
            if update_will_be_skipped(self._scaler, pl_module):
                # the GradScaler leaves this update out: Lightning ends the step and stops in its own way
                trainer.should_stop = True
                return
            self._close(ended=False)
            raise

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        # After the optimizer step (when this batch ended one) and the
        # scaler's update: the step's raw loss, the scale and whether the
        # step was skipped; the capture's after_update (a loss-scale
        # collapse).
        if self.loss_log is None or trainer.global_step <= self._last_step:
            return
        self._last_step = trainer.global_step
        if self._stopped:  # a stop before the update wrote the step's lines
            return
        inputs, target = self.loss_log.recorder.split_batch(batch)
        try:
            self.loss_log.step(epoch=trainer.current_epoch, iter=batch_idx, inputs=inputs, target=target)
        except CaptureStop:
            self._stopped = True
            trainer.should_stop = True

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # a fit that failed: its log ends without its end line
        self._close(ended=False)

    def _close(self, ended: bool = True) -> None:
        if self.loss_log is not None:
            self._captures = self.loss_log.captures
            if ended:
                self.loss_log.close()
            else:
                self.loss_log.abort()
            # a later fit writes a log of its own
            self.loss_log = None
        self._batch = None
