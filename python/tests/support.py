"""Shared test helpers: the import path, planted models and a stand-in fastai Learner.

The stand-in Learner follows fastai 2.x's documented training loop (the
events of fastai.learner.Learner and the Callback docs): callbacks sorted by
`order`; each phase run as before_X, the work, after_cancel_X when the
phase's Cancel exception is raised, after_X; per batch: before_batch, the
forward, after_pred, the loss, after_loss, then for training batches only
before_backward, backward, after_backward, before_step, the optimizer step,
after_step, zero_grad; after_batch. Validation batches run under no_grad
with training=False. The stand-in MixedPrecision mirrors how fastai's
MixedPrecision uses its GradScaler: created in before_fit as learn.scaler,
loss_grad scaled in before_backward, scaler.step(self) in before_step with
the callback posing as the optimizer and CancelStepException when the
scaler skipped, scaler.update() in after_step, learn.scaler = None in
after_fit. It is written from that description, not from fastai's code.
"""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from fp16audit import EmulatedGradScaler  # noqa: E402


class CancelFitException(Exception):
    pass


class CancelEpochException(Exception):
    pass


class CancelTrainException(Exception):
    pass


class CancelValidException(Exception):
    pass


class CancelBatchException(Exception):
    pass


class CancelBackwardException(Exception):
    pass


class CancelStepException(Exception):
    pass


class DataLoaders:
    def __init__(self, train, valid):
        self.train, self.valid = train, valid


class StandInLearner:
    def __init__(self, dls, model, loss_func, opt, cbs=()):
        self.dls, self.model, self.loss_func, self.opt = dls, model, loss_func, opt
        self.cbs = []
        self.training = False
        self.events = []  # every event dispatched, for the order test
        for cb in cbs:
            self.add_cb(cb)

    def add_cb(self, cb):
        cb.learn = self
        self.cbs.append(cb)

    def __call__(self, event):
        self.events.append(event)
        for cb in sorted(self.cbs, key=lambda c: c.order):
            cb(event)

    def _with_events(self, f, name, ex):
        try:
            self(f"before_{name}")
            f()
        except ex:
            self(f"after_cancel_{name}")
        self(f"after_{name}")

    def fit(self, n_epoch):
        self.n_epoch = n_epoch
        self._with_events(self._do_fit, "fit", CancelFitException)

    def _do_fit(self):
        for epoch in range(self.n_epoch):
            self.epoch = epoch
            self._with_events(self._do_epoch, "epoch", CancelEpochException)

    def _do_epoch(self):
        self.training = True
        self.model.train()
        self.dl = self.dls.train
        self._with_events(self._all_batches, "train", CancelTrainException)
        self.training = False
        self.model.eval()
        self.dl = self.dls.valid
        with torch.no_grad():
            self._with_events(self._all_batches, "validate", CancelValidException)

    def _all_batches(self):
        self.n_iter = len(self.dl)
        for i, (xb, yb) in enumerate(self.dl):
            self.iter, self.xb, self.yb = i, (xb,), (yb,)
            self._with_events(self._do_one_batch, "batch", CancelBatchException)

    def _do_one_batch(self):
        self.pred = self.model(*self.xb)
        self("after_pred")
        self.loss_grad = self.loss_func(self.pred, *self.yb)
        self.loss = self.loss_grad.clone()
        self("after_loss")
        if not self.training:
            return
        self._with_events(lambda: self.loss_grad.backward(), "backward", CancelBackwardException)
        self._with_events(lambda: self.opt.step(), "step", CancelStepException)
        self.opt.zero_grad()


class StandInMixedPrecision:
    """fastai's MixedPrecision as described in the module docstring, on EmulatedGradScaler."""

    order = 10
    learn = None

    def __init__(self, **scaler_kwargs):
        self.scaler_kwargs = scaler_kwargs
        self.step_scales = []  # like fastai's `scales`: appended only for steps that were not skipped

    def __call__(self, event):
        method = getattr(self, event, None)
        inner = event not in ("before_fit", "after_fit", "before_epoch", "after_epoch", "before_train",
                              "after_train", "before_validate", "after_validate")
        if callable(method) and (not inner or self.learn.training):
            method()

    def before_fit(self):
        self.learn.scaler = EmulatedGradScaler(**self.scaler_kwargs)

    def before_backward(self):
        self.learn.loss_grad = self.learn.scaler.scale(self.learn.loss_grad)

    def before_step(self):
        self.skipped = True
        self.learn.scaler.step(self)  # calls self.step() only when nothing overflowed
        if self.skipped:
            raise CancelStepException()
        self.step_scales.append(self.learn.scaler.get_scale())

    @property
    def param_groups(self):
        return self.learn.opt.param_groups

    def step(self, *args, **kwargs):
        self.skipped = False

    def after_step(self):
        self.learn.scaler.update()

    def after_fit(self):
        self.learn.scaler = None


def planted_overflow_model(seed=0):
    """first -> ReLU -> planted -> ReLU -> head, where head's weights are 1000x too large.

    The loss gradient is ordinary, but head multiplies it by ~1000 on its
    way back, so the output gradient of `planted` (and, through it, of
    `first`) is out of fp16 range at scale 2^16 while head's own output
    gradient is not. `planted` is therefore the first module, in backward
    order, whose output gradient overflows.
    """
    torch.manual_seed(seed)
    model = nn.Sequential()
    model.add_module("first", nn.Linear(8, 16))
    model.add_module("act1", nn.ReLU())
    model.add_module("planted", nn.Linear(16, 16))
    model.add_module("act2", nn.ReLU())
    model.add_module("head", nn.Linear(16, 4))
    with torch.no_grad():
        model.head.weight.mul_(1e3)
    return model


def batches(n, bs=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(bs, 8, generator=g), torch.randint(0, 4, (bs,), generator=g)) for _ in range(n)]


class TempDirMixin:
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp, name)
