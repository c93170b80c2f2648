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

With capture="captures/" (or a fp16audit.Capture) the callback also keeps
the failing step of a run that goes wrong later (docs/capture.md), for
`fp16audit replay`:

    cb = FP16AuditCallback(capture=Capture("captures/", on_event="stop"))

The loss triggers are checked in on_pre_optimizer_step (after the backward
and the clipping, before the optimizer), the loss-scale collapse in
on_step_end; the batch is the one the model's forward was given, the
scaler Accelerate's (optimizer.scaler). A Hugging Face model's own loss
(a causal or masked LM, token or sequence classification) is recognised
for the replay's backward; give loss_func= for another model's.

`import fp16audit` does not import this module (nor transformers).
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Tuple

from transformers import TrainerCallback

from ._trainers import (CaptureHandle, LossLog, PreflightFailed, base_model, decide, default_log, draw_batches, policy_for_weights, run_preflight,
                        update_will_be_skipped)
from .audit import Report
from .capture import Capture, CaptureEvent, CaptureStop, observer

__all__ = ["FP16AuditCallback", "PreflightFailed", "trainer_policy", "capture_policy", "model_loss"]

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


def capture_policy(args: Any, model: Any, scaler: Any) -> str:
    """The policy a Trainer's run really trains under, for its capture (what
    the replay emulates): fp16=True is autocast-fp16 where Accelerate holds
    a GradScaler, and fp32 where it holds none (a CPU: no autocast either)."""
    if getattr(args, "bf16", False):
        return "autocast-bf16"
    if getattr(args, "fp16", False):
        return "autocast-fp16" if scaler is not None and bool(scaler.is_enabled()) else "fp32"
    return policy_for_weights(model) or "fp32"


def model_loss(model: Any) -> Optional[Dict[str, Any]]:
    """The loss a Hugging Face model computes from its labels, as a capture
    describes it to the replay (fp16audit.capture.LOSS_KEYS), or None for a
    model whose loss fp16audit does not know. A causal LM scores the logits
    at each position against the next label (lm_shift); a masked LM and a
    token classifier score every position; a sequence classifier follows
    its config's problem_type."""
    m = base_model(model)
    kind = getattr(m, "loss_type", None)
    cfg = getattr(m, "config", None)
    ce = {"function": "%sLoss" % kind, "name": "cross-entropy", "class_axis": "last", "ignore_index": -100, "lm_shift": False,
          "output": "logits"}
    if kind == "ForCausalLM":
        return dict(ce, lm_shift=True)
    if kind in ("ForMaskedLM", "ForTokenClassification"):
        return ce
    if kind in ("ForSequenceClassification", "ForImageClassification", "ForAudioClassification", "ForVideoClassification"):
        problem = getattr(cfg, "problem_type", None)
        if problem is None and getattr(cfg, "num_labels", None) == 1:
            problem = "regression"
        if problem == "regression":
            return {"function": "MSELoss", "name": "mse", "output": "logits"}
        if problem == "single_label_classification":
            return dict(ce, function="CrossEntropyLoss", class_axis="1")
        if problem == "multi_label_classification":
            return {"function": "BCEWithLogitsLoss", "name": "bce", "output": "logits"}
    return None


# Keyword arguments the Trainer gives a model's forward that are not its
# inputs: the count of a step's target tokens, for the loss's mean.
_NOT_INPUTS = ("num_items_in_batch",)


class FP16AuditCallback(CaptureHandle, TrainerCallback):
    """The preflight, the raw-loss log and the capture of the failing step for the Hugging Face Trainer.

    n_batches: training batches the preflight audits. warn: warn instead of
    stopping. preflight=False skips the audit (the log only). policy:
    audit under this policy instead of the TrainingArguments'. log: the
    log's path; None writes fp16audit-log.jsonl (never over an existing
    file) in args.output_dir; False writes none. capture: a folder or a
    fp16audit.Capture (docs/capture.md); it needs the log. loss_func: the
    loss the model computes, for the replay's backward (a loss module such
    as nn.L1Loss(), or a fp16audit.capture.LOSS_KEYS description); a
    Hugging Face model's own loss is recognised (model_loss).
    telemetry=True adds the log's per-module gradient telemetry (in full
    every `every` steps, its overflow part at every other step): the
    capture's pinned-plateau trigger and the replay's history of the
    culprit need it, and it costs time at every step, so it is off unless
    asked for. Other keyword arguments go to fp16audit.audit (max_memory,
    exporter, progress, fixes, ...). After the preflight, `report` holds
    its Report and `log_path` the log's path; `captures` lists the
    captures of the run.

    on_event="stop" ends the run at the captured step: after the step
    (control.should_training_stop) when the capture came after the update,
    or when the GradScaler skips the step anyway; otherwise before the
    optimizer applies it, by raising fp16audit.CaptureStop from
    trainer.train(), the one way to keep the Trainer from an update.
    """

    def __init__(self, n_batches: int = 2, *, warn: bool = False, preflight: bool = True, policy: Optional[str] = None,
                 log: Any = None, capture: Any = None, loss_func: Any = None, telemetry: bool = False, every: int = 100,
                 **audit_kwargs: Any):
        self.n_batches, self.warn, self.preflight, self.policy = n_batches, warn, preflight, policy
        self.log, self.audit_kwargs = log, audit_kwargs
        self.capture = Capture.of(capture)
        if self.capture is not None and log is False:
            raise ValueError("FP16AuditCallback: capture needs the log (log=False): a capture holds the log so far, and the log "
                             "names the capture")
        self.loss_func = loss_func
        self.telemetry = bool(telemetry)
        self.every = every
        self.report: Optional[Report] = None
        self.loss_log: Optional[LossLog] = None
        self.log_path: Optional[str] = None
        self._hook: Any = None
        self._model: Any = None
        self._scaler: Any = None
        self._batch: Any = None
        self._stopped = False
        self._captures: List[CaptureEvent] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       train_dataloader: Any = None, **kwargs: Any) -> None:
        if self.preflight and self.report is None and state.global_step == 0:
            self._preflight(args, model, train_dataloader)
        if self.log is not False and self.loss_log is None:
            self._open_log(args, model, optimizer)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # After the backward (and the clipping), before the optimizer: the
        # capture's before_update, at the weights the step's forward saw.
        if self.loss_log is None or not self.loss_log.capturing:
            return
        try:
            self.loss_log.before_step(self._inputs(), epoch=_epoch(state), iter=state.global_step + 1)
        except CaptureStop:
            self._stopped = True
            if update_will_be_skipped(self._scaler, self._model):
                # the GradScaler leaves this update out: the Trainer ends the step in its own way
                control.should_training_stop = True
                return
            self._close(ended=False)
            raise

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # After the optimizer step and the scaler's update: the step's raw
        # loss, the scale and whether the step was skipped; the capture's
        # after_update (a loss-scale collapse).
        if self.loss_log is None or self._stopped:  # a stop before the update wrote the step's lines
            return
        try:
            self.loss_log.step(epoch=_epoch(state), iter=state.global_step, inputs=self._inputs())
        except CaptureStop:
            self._stopped = True
            control.should_training_stop = True

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

    # -- the raw losses and the capture --------------------------------------------

    def _open_log(self, args: Any, model: Any, optimizer: Any) -> None:
        path = self.log if isinstance(self.log, str) else default_log(getattr(args, "output_dir", None))
        if path is None:
            return
        # Accelerate's AcceleratedOptimizer holds the GradScaler (None in
        # bf16, fp32, and for fp16 on a CPU) and, as .optimizer, the torch
        # optimizer whose class and state a capture keeps.
        scaler = getattr(optimizer, "scaler", None)
        cap: Dict[str, Any] = {}
        if self.capture is not None:
            loss = self.loss_func if self.loss_func is not None else model_loss(model)
            cap = dict(capture=self.capture, optimizer=getattr(optimizer, "optimizer", optimizer), loss_func=loss,
                       policy=capture_policy(args, model, scaler), autocast_device=getattr(getattr(args, "device", None), "type", None))
        try:
            self.loss_log = LossLog(path, scaler, "transformers", model=model, telemetry=self.telemetry, every=self.every, **cap,
                                    logging_nan_inf_filter=bool(getattr(args, "logging_nan_inf_filter", True)),
                                    gradient_accumulation_steps=int(getattr(args, "gradient_accumulation_steps", 1)))
        except OSError as e:
            warnings.warn("fp16audit: cannot write the loss log %s (%s): the run goes on without it" % (path, e), stacklevel=2)
            return
        self.log_path = self.loss_log.path
        self._model, self._scaler, self._stopped = model, scaler, False
        self._hook = model.register_forward_hook(self._forward_hook, with_kwargs=True)

    @observer  # no part of the model: a capture's copy of the model leaves it out
    def _forward_hook(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        # The loss of every training forward, as the model returns it
        # (labels in the batch); evaluation forwards are not training steps.
        # The batch is kept by reference, never copied, for a capture of
        # this step.
        if not module.training or self.loss_log is None:
            return
        self._batch = kwargs if kwargs else args
        loss = None
        if isinstance(output, dict) or hasattr(output, "keys"):
            loss = output.get("loss") if hasattr(output, "get") else None
        elif isinstance(output, (tuple, list)) and output and "labels" in kwargs:
            loss = output[0]
        self.loss_log.add(loss)

    def _inputs(self) -> Any:
        """The step's batch as the model was given it: its tensors by name (labels the target), or its positional ones."""
        import torch

        b = self._batch
        if isinstance(b, dict):
            return {k: v for k, v in b.items() if isinstance(v, torch.Tensor) and k not in _NOT_INPUTS}
        return b

    def _close(self, ended: bool = True) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.loss_log is not None:
            self._captures = self.loss_log.captures
            if ended:
                self.loss_log.close()
            else:
                self.loss_log.abort()
            # a later trainer.train() writes a log of its own
            self.loss_log = None
        self._batch = None


def _epoch(state: Any) -> Optional[int]:
    return None if state.epoch is None else int(state.epoch)
