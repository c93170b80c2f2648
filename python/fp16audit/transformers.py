"""fp16audit for the Hugging Face Trainer (and TRL's SFTTrainer, built on it).

    from fp16audit.transformers import FP16AuditCallback

    args = TrainingArguments(output_dir="out", fp16=True)
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[FP16AuditCallback()])
    trainer.train()     # stops before the first step when fp16 will give NaN, with the verified fixes

At on_train_begin the callback audits two training batches (the training
dataset's first samples, through the Trainer's data collator; the run's
data order and random states are left as they were) under the policy the
TrainingArguments ask for: fp16=True is torch.autocast in fp16 with a
GradScaler, bf16=True autocast in bf16, neither what fp16=True would do (a
model whose weights are all float16 trains as model.half() does: the half
policy). When fp16 will give NaN it raises PreflightFailed before the first
step (warn=True only warns); the fixes are in the Trainer's words
(bf16=True, the model's _keep_in_fp32_modules, the collator). Every
optimizer step's raw loss goes to fp16audit's log (fp16audit scales reads
it), whatever logging_nan_inf_filter does to the Trainer's own logs.

`import fp16audit` does not import this module (nor transformers).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, Tuple

from transformers import TrainerCallback

from ._trainers import LossLog, PreflightFailed, decide, default_log, draw_batches, policy_for_weights, run_preflight
from .audit import Report

__all__ = ["FP16AuditCallback", "PreflightFailed", "trainer_policy"]

# On a machine without an accelerator the Trainer (through Accelerate)
# enables neither autocast nor a GradScaler for fp16=True: the run is fp32.
_CPU_FP16 = ("on this CPU the Trainer trains fp16=True in fp32 (Accelerate enables autocast and its GradScaler only on an "
             "accelerator): the audit says what fp16=True does on a GPU")


def trainer_policy(args: Any, model: Any) -> Tuple[str, str]:
    """The policy a Trainer trains model under, from its TrainingArguments: (policy, note)."""
    if getattr(args, "bf16", False):
        return "autocast-bf16", ""
    if getattr(args, "fp16", False):
        return "autocast-fp16", ""
    if policy_for_weights(model) == "half":
        return "half", ("the model's weights are float16 and TrainingArguments ask for neither fp16 nor bf16: it trains in half "
                        "precision throughout, audited as model.half()")
    return "autocast-fp16", "TrainingArguments ask for neither fp16 nor bf16: audited as fp16=True would train it"


class FP16AuditCallback(TrainerCallback):
    """The preflight and the raw-loss log for the Hugging Face Trainer.

    n_batches: training batches the preflight audits. warn: warn instead of
    stopping. preflight=False skips the audit (the log only). policy:
    audit under this policy instead of the TrainingArguments'. log: the
    log's path; None writes fp16audit-log.jsonl (never over an existing
    file) in args.output_dir; False writes none. Other keyword arguments
    go to fp16audit.audit (max_memory, exporter, progress, fixes, ...).
    After the preflight, `report` holds its Report and `log_path` the
    log's path.
    """

    def __init__(self, n_batches: int = 2, *, warn: bool = False, preflight: bool = True, policy: Optional[str] = None,
                 log: Any = None, **audit_kwargs: Any):
        self.n_batches, self.warn, self.preflight, self.policy = n_batches, warn, preflight, policy
        self.log, self.audit_kwargs = log, audit_kwargs
        self.report: Optional[Report] = None
        self.loss_log: Optional[LossLog] = None
        self.log_path: Optional[str] = None
        self._hook: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       train_dataloader: Any = None, **kwargs: Any) -> None:
        if self.preflight and self.report is None and state.global_step == 0:
            self._preflight(args, model, train_dataloader)
        if self.log is not False and self.loss_log is None:
            self._open_log(args, model, optimizer)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # After the optimizer step and the scaler's update: the step's raw
        # loss, the scale and whether the step was skipped are known here,
        # the place a capture of the failing step (issue 42) plugs in.
        if self.loss_log is None:
            return
        epoch = None if state.epoch is None else int(state.epoch)
        self.loss_log.step(epoch=epoch, iter=state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close()

    def _preflight(self, args: Any, model: Any, loader: Any) -> None:
        policy, note = trainer_policy(args, model)
        notes = [note]
        if self.policy:
            policy, notes = self.policy, ["audited under policy=%r as asked" % self.policy]
        if getattr(args, "fp16", False) and getattr(getattr(args, "device", None), "type", "cpu") == "cpu":
            notes.append(_CPU_FP16)
        # labels go to the model, which computes its own loss: the forward
        # is audited, and its overflow is what stops a run at the first step
        batches = draw_batches(loader, self.n_batches, getattr(args, "per_device_train_batch_size", None))
        device = getattr(getattr(args, "device", None), "type", "cuda")
        r = run_preflight(model, batches, trainer="transformers", policy=policy, notes=notes,
                          device_type=device if device not in ("cpu", None) else "cuda", audit_kwargs=self.audit_kwargs)
        self.report = r
        stop = decide(r, self.warn)
        if stop is not None:
            raise stop

    # -- the raw losses ------------------------------------------------------------

    def _open_log(self, args: Any, model: Any, optimizer: Any) -> None:
        path = self.log if isinstance(self.log, str) else default_log(getattr(args, "output_dir", None))
        if path is None:
            return
        # Accelerate's AcceleratedOptimizer holds the GradScaler (None in
        # bf16, fp32, and for fp16 on a CPU).
        scaler = getattr(optimizer, "scaler", None)
        try:
            self.loss_log = LossLog(path, scaler, "transformers", logging_nan_inf_filter=bool(getattr(args, "logging_nan_inf_filter", True)),
                                    gradient_accumulation_steps=int(getattr(args, "gradient_accumulation_steps", 1)))
        except OSError as e:
            warnings.warn("fp16audit: cannot write the loss log %s (%s): the run goes on without it" % (path, e), stacklevel=2)
            return
        self.log_path = self.loss_log.path
        self._hook = model.register_forward_hook(self._forward_hook, with_kwargs=True)

    def _forward_hook(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        # The loss of every training forward, as the model returns it
        # (labels in the batch); evaluation forwards are not training steps.
        # This is where the batch in hand is: a capture of the failing step
        # (issue 42) keeps a reference to kwargs here, without copying.
        if not module.training or self.loss_log is None:
            return
        loss = None
        if isinstance(output, dict) or hasattr(output, "keys"):
            loss = output.get("loss") if hasattr(output, "get") else None
        elif isinstance(output, (tuple, list)) and output and "labels" in kwargs:
            loss = output[0]
        self.loss_log.add(loss)

    def _close(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.loss_log is not None:
            self.loss_log.close()
