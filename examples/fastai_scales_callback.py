"""Record a fastai mixed-precision run for `fp16audit scales`.

RecordScales writes, after fit, the JSON log fp16audit reads: the loss of
every training step and the GradScaler loss scale after every step.

    from fastai.vision.all import *
    from fastai_scales_callback import RecordScales

    learn = vision_learner(dls, resnet34, metrics=accuracy).to_fp16()
    learn.fit_one_cycle(5, 1e-3, cbs=RecordScales("run.json"))

    # the fp32 baseline: the same training without to_fp16() (losses only)
    learn = vision_learner(dls, resnet34, metrics=accuracy)
    learn.fit_one_cycle(5, 1e-3, cbs=RecordScales("fp32.json"))

Then, in a shell:

    fp16audit scales run.json --baseline fp32.json

Why not `learn.mixed_precision.scales`? fastai's MixedPrecision appends to
that list in before_step only when the step was NOT skipped (it raises
CancelStepException first), reads the scale before scaler.update(), and
sets the list to None in its after_fit. Skipped steps, the very thing
fp16audit counts, never show in it. This callback has order 11, after
MixedPrecision's 10, so in after_step (which fastai calls even for a
cancelled step) the scaler has already updated: one entry per step, a
backoff shows as the scale halving. It keeps its own reference to the
scaler, so MixedPrecision tearing it down in after_fit does not matter.

Reading the loss and the scale costs one GPU synchronisation per step.
"""

import json
import math

from fastai.callback.core import Callback

__all__ = ["RecordScales"]


class RecordScales(Callback):
    "Write the loss and the loss scale of every training step to `fname` as JSON after fit."

    order = 11  # after MixedPrecision (order 10): its after_step calls scaler.update() first
    run_valid = False  # training steps only

    def __init__(self, fname="scales.json"):
        self.fname = fname

    def before_fit(self):
        self.losses, self.scales = [], []
        # MixedPrecision.before_fit (order 10) has created learn.scaler; it
        # is absent in fp32 and None or disabled under to_bf16().
        scaler = getattr(self.learn, "scaler", None)
        self.rec_scaler = scaler if scaler is not None and scaler.is_enabled() else None
        self.config = None
        if self.rec_scaler is not None:
            self.config = {
                "init_scale": self.rec_scaler.get_scale(),  # no step yet: the initial scale
                "growth_factor": self.rec_scaler.get_growth_factor(),
                "backoff_factor": self.rec_scaler.get_backoff_factor(),
                "growth_interval": self.rec_scaler.get_growth_interval(),
            }

    def after_step(self):
        loss = self.learn.loss
        self.losses.append(float(loss.detach().float().item()) if hasattr(loss, "item") else float(loss))
        if self.rec_scaler is not None:
            self.scales.append(float(self.rec_scaler.get_scale()))

    def after_fit(self):
        log = {"steps_per_epoch": len(self.learn.dls.train), "losses": self.losses}
        if self.rec_scaler is not None:
            log["grad_scaler"] = self.config
            log["scales"] = self.scales
        with open(self.fname, "w") as f:
            # allow_nan writes NaN and Infinity bare, as fp16audit expects.
            json.dump(log, f, allow_nan=True)
        nonfinite = sum(1 for x in self.losses if not math.isfinite(x))
        print(f"RecordScales: {len(self.losses)} steps ({nonfinite} non-finite losses) written to {self.fname}")
