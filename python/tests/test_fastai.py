"""Fp16AuditCallback in real fastai (2.7.18): its event order, the MixedPrecision
callback's learn.scaler, CancelStepException and its `scales`.

On a CPU torch's GradScaler disables itself (it needs CUDA), so the
learners here train under fastai's own MixedPrecision with one change: the
scaler it creates in before_fit is EmulatedGradScaler (GradScaler's rules on
a CPU). Everything else is fastai's: the fit loop, the callback dispatch,
MixedPrecision's before_backward/before_step/after_step.
"""

import unittest
import warnings

import support
from torch import nn



def setUpModule():
    support.require_fastai()


def _fastai():
    from fastai.callback.core import Callback, CancelStepException
    from fastai.callback.fp16 import MixedPrecision
    from fastai.data.core import DataLoaders
    from fastai.learner import Learner
    from fastai.optimizer import SGD

    return Callback, CancelStepException, MixedPrecision, DataLoaders, Learner, SGD


def learner(model, n_train=6, n_valid=2, cbs=(), growth_interval=10, lr=1e-6, loss=nn.functional.cross_entropy):
    """A real fastai Learner on support.batches, under MixedPrecision whose
    scaler is EmulatedGradScaler."""
    Callback, _, MixedPrecision, DataLoaders, Learner, SGD = _fastai()
    from fp16audit import EmulatedGradScaler
    from fastai.data.load import DataLoader

    class EmulatedMixedPrecision(MixedPrecision):
        def before_fit(self):
            super().before_fit()
            self.learn.scaler = EmulatedGradScaler(growth_interval=growth_interval)

    data = support.batches(n_train + n_valid)
    # one fastai DataLoader item per batch: bs=None keeps each as it is
    dls = DataLoaders(DataLoader(data[:n_train], bs=None), DataLoader(data[n_train:], bs=None))
    mp = EmulatedMixedPrecision()
    learn = Learner(dls, model, loss_func=loss, opt_func=SGD, lr=lr, cbs=[mp] + list(cbs))
    return learn, mp


def fit(path, n_epoch=2, **cb_kwargs):
    import fp16audit.fastai_callback as fcb

    cb = fcb.Fp16AuditCallback(path, **cb_kwargs)
    learn, mp = learner(support.planted_overflow_model(), cbs=[cb])
    scales = []

    class KeepScales(_fastai()[0]):
        order = 9  # its after_fit before MixedPrecision's (10), which drops them

        def after_fit(self):
            scales.extend(mp.scales)  # MixedPrecision.after_fit drops them

    learn.add_cb(KeepScales())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # autocast("cuda") on a CPU warns and disables itself
        with learn.no_bar(), learn.no_logging():
            learn.fit(n_epoch)
    from fp16audit import read_log

    return learn, scales, read_log(path)


class FastaiCallbackTest(support.TempDirMixin, unittest.TestCase):
    def test_is_a_fastai_callback_after_mixed_precision(self):
        import fp16audit.fastai_callback as fcb
        from fastai.callback.core import Callback
        from fastai.callback.fp16 import MixedPrecision

        self.assertTrue(fcb.HAVE_FASTAI)
        self.assertTrue(issubclass(fcb.Fp16AuditCallback, Callback))
        self.assertGreater(fcb.Fp16AuditCallback.order, MixedPrecision.order)
        self.assertFalse(fcb.Fp16AuditCallback.run_valid)

    def test_fit_records_every_training_step_and_names_the_planted_module(self):
        learn, scales, log = fit(self.path("run.jsonl"), every=4)
        self.assertEqual(log.header["source"], "fastai")
        self.assertEqual(log.header["steps_per_epoch"], 6)
        self.assertEqual(log.header["n_epoch"], 2)
        self.assertEqual(log.header["grad_scaler"]["class"], "EmulatedGradScaler")
        import fastai

        self.assertEqual(log.header.get("fastai_version"), fastai.__version__)
        # Training batches only: 2 epochs x 6, validation batches absent.
        self.assertEqual([(s["step"], s["epoch"], s["iter"]) for s in log.steps],
                         [(e * 6 + i, e, i) for e in range(2) for i in range(6)])
        # The callback's skipped flags agree with what MixedPrecision saw:
        # fastai appends a scale to its `scales` only for steps it did not
        # cancel with CancelStepException.
        kept = [s for s in log.steps if not s["skipped"]]
        self.assertEqual(len(kept), len(scales))
        self.assertEqual([s["scale_used"] for s in kept], list(scales))
        self.assertTrue(log.steps[0]["skipped"])
        first = log.telemetry[0]
        self.assertEqual((first["step"], first["first_nonfinite_output"]), (0, "planted"))
        self.assertEqual(log.end["steps"], 12)
        # The loss is the unscaled one (learn.loss), not loss_grad.
        xb, yb = support.batches(8)[0]
        want = nn.functional.cross_entropy(support.planted_overflow_model()(xb), yb).item()
        self.assertAlmostEqual(log.steps[0]["loss"], want, places=4)

    def test_after_fit_leaves_nothing_attached(self):
        learn, _, _ = fit(self.path("run.jsonl"))
        self.assertIsNone(learn.scaler)  # MixedPrecision.after_fit
        for m in learn.model.modules():
            self.assertEqual(len(m._forward_hooks), 0)
        for p in learn.model.parameters():
            self.assertFalse(p._backward_hooks)

    def test_a_fit_that_raises_does_not_leave_hooks_for_the_next(self):
        import fp16audit.fastai_callback as fcb
        from fp16audit import read_log

        Callback = _fastai()[0]

        class Boom(Callback):
            order = 12

            def after_step(self):
                if self.learn.iter == 2:
                    raise RuntimeError("boom")

        model = support.planted_overflow_model()
        cb = fcb.Fp16AuditCallback(self.path("a.jsonl"), every=1)
        learn, _ = learner(model, n_train=4, n_valid=1, cbs=[cb])
        boom = Boom()
        learn.add_cb(boom)
        with warnings.catch_warnings(), learn.no_bar(), learn.no_logging():
            warnings.simplefilter("ignore")
            with self.assertRaisesRegex(RuntimeError, "boom"):
                learn.fit(1)
            first = read_log(self.path("a.jsonl"))
            self.assertIsNone(first.end)
            self.assertEqual(len(first.steps), 3)
            learn.remove_cb(boom)
            cb.fname = self.path("b.jsonl")
            learn.fit(1)
        self.assertEqual(len(model.planted._forward_hooks), 0)
        second = read_log(self.path("b.jsonl"))
        self.assertEqual(second.end["steps"], 4)
        # One hook per module: each telemetry line saw each output once.
        self.assertTrue(all(m["output"]["tensors"] == 1 for t in second.telemetry for m in t["modules"]))

    def test_cancel_step_counts_as_skipped(self):
        # A step cancelled after the scaler found nothing: only fastai's
        # after_cancel_step says it did not happen.
        import fp16audit.fastai_callback as fcb
        from fp16audit import read_log

        Callback, CancelStepException = _fastai()[:2]

        class CancelEveryOther(Callback):
            order = 10.5

            def before_step(self):
                if self.learn.iter % 2 == 1:
                    raise CancelStepException()

        learn, _ = learner(nn.Sequential(nn.Linear(8, 4)), n_train=4, n_valid=1, lr=0.01,
                           cbs=[CancelEveryOther(), fcb.Fp16AuditCallback(self.path("c.jsonl"), telemetry=False)])
        with warnings.catch_warnings(), learn.no_bar(), learn.no_logging():
            warnings.simplefilter("ignore")
            learn.fit(1)
        log = read_log(self.path("c.jsonl"))
        self.assertEqual([s["skipped"] for s in log.steps], [False, True, False, True])
        self.assertEqual([s["scale"] for s in log.steps], [65536.0] * 4)
        self.assertIsNone(log.header["telemetry"])
        self.assertEqual(log.telemetry, [])


if __name__ == "__main__":
    unittest.main()
