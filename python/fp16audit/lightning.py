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

Lightning 2.6 turns Trainer(accelerator="cpu", precision="16-mixed") into
"bf16-mixed" (with a warning): on a CPU, real fp16 autocast needs the
plugin given explicitly, plugins=[MixedPrecision("16-mixed", "cpu")].

`import fp16audit` does not import this module (nor lightning).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, Tuple

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package
    import pytorch_lightning as pl  # type: ignore[no-redef]

from ._trainers import LossLog, PreflightFailed, decide, default_log, draw_batches, message, run_preflight
from .audit import Report

__all__ = ["FP16Preflight", "PreflightFailed", "trainer_policy"]


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


class FP16Preflight(pl.Callback):
    """The preflight and the raw-loss log for Lightning.

    n_batches: training batches the preflight audits. warn: warn instead of
    stopping. preflight=False skips the audit (the log only). policy:
    audit under this policy instead of the precision plugin's. log: the
    log's path; None writes fp16audit-log.jsonl (never over an existing
    file) in trainer.log_dir (or default_root_dir); False writes none.
    Other keyword arguments go to fp16audit.audit (max_memory, exporter,
    progress, fixes, ...). After the preflight, `report` holds its Report
    and `log_path` the log's path.
    """

    def __init__(self, n_batches: int = 2, *, warn: bool = False, preflight: bool = True, policy: Optional[str] = None,
                 log: Any = None, **audit_kwargs: Any):
        super().__init__()
        self.n_batches, self.warn, self.preflight, self.policy = n_batches, warn, preflight, policy
        self.log, self.audit_kwargs = log, audit_kwargs
        self.report: Optional[Report] = None
        self.loss_log: Optional[LossLog] = None
        self.log_path: Optional[str] = None
        self._last_step = 0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.preflight and self.report is None and trainer.global_step == 0:
            if not self._preflight(trainer, pl_module):
                return
        if self.log is not False and self.loss_log is None:
            self._open_log(trainer)

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

    def _open_log(self, trainer: Any) -> None:
        folder = getattr(trainer, "log_dir", None) or trainer.default_root_dir
        path = self.log if isinstance(self.log, str) else default_log(folder)
        if path is None:
            return
        try:
            self.loss_log = LossLog(path, getattr(trainer.precision_plugin, "scaler", None), "lightning",
                                    precision=str(trainer.precision), accumulate_grad_batches=int(trainer.accumulate_grad_batches))
        except OSError as e:
            warnings.warn("fp16audit: cannot write the loss log %s (%s): the run goes on without it" % (path, e), stacklevel=2)
            return
        self.log_path = self.loss_log.path
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        # After the optimizer step (when this batch ended one) and the
        # scaler's update: the raw loss, the scaler and the batch are in
        # hand here, the place a capture of the failing step (issue 42)
        # plugs in.
        if self.loss_log is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.loss_log.add(loss)
        if trainer.global_step > self._last_step:
            self._last_step = trainer.global_step
            self.loss_log.step(epoch=trainer.current_epoch, iter=batch_idx)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.loss_log is not None:
            self.loss_log.close()
