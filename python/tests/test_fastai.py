import importlib
import importlib.util
import os
import subprocess
import sys
import types
import unittest

import support
import torch
from torch import nn

import fp16audit.fastai_callback as fcb
from fp16audit import read_log

# The tests pass with and without fastai; the ones that depend on it
# branch on whether it is there.
FASTAI_INSTALLED = importlib.util.find_spec("fastai") is not None


def fit(path, n_epoch=2, n_train=6, n_valid=2, **cb_kwargs):
    model = support.planted_overflow_model()
    data = support.batches(n_train + n_valid)
    dls = support.DataLoaders(data[:n_train], data[n_train:])
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    mp = support.StandInMixedPrecision(growth_interval=10)
    cb = fcb.Fp16AuditCallback(path, **cb_kwargs)
    learn = support.StandInLearner(dls, model, nn.functional.cross_entropy, opt, cbs=[cb, mp])
    learn.fit(n_epoch)
    return learn, mp, read_log(path)


class StandInLearnerTest(unittest.TestCase):
    def test_event_order_of_one_training_batch(self):
        # The stand-in itself must follow fastai's order, or the callback
        # tests prove nothing.
        learn = support.StandInLearner(support.DataLoaders(support.batches(1), []), nn.Linear(8, 4),
                                       nn.functional.cross_entropy, torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0))
        learn.fit(1)
        self.assertEqual(learn.events, [
            "before_fit", "before_epoch", "before_train",
            "before_batch", "after_pred", "after_loss", "before_backward", "after_backward",
            "before_step", "after_step", "after_batch",
            "after_train", "before_validate", "after_validate", "after_epoch", "after_fit",
        ])


class FastaiCallbackTest(support.TempDirMixin, unittest.TestCase):
    def test_base_class_follows_what_is_installed(self):
        # With fastai the callback is one of fastai's; without it the
        # module imports all the same, on its stand-in base.
        self.assertEqual(fcb.HAVE_FASTAI, FASTAI_INSTALLED)
        if FASTAI_INSTALLED:
            from fastai.callback.core import Callback

            self.assertTrue(issubclass(fcb.Fp16AuditCallback, Callback))
        else:
            self.assertNotIn("fastai", sys.modules)
        self.assertEqual(fcb.Fp16AuditCallback.order, 11)
        self.assertFalse(fcb.Fp16AuditCallback.run_valid)

    def test_uses_fastais_callback_class_when_fastai_is_there(self):
        fake_core = types.ModuleType("fastai.callback.core")

        class Callback:
            order = 0

        fake_core.Callback = Callback
        fake = {"fastai": types.ModuleType("fastai"), "fastai.callback": types.ModuleType("fastai.callback"),
                "fastai.callback.core": fake_core}
        fake["fastai"].__version__ = "2.7.99"
        saved = {k: sys.modules.get(k) for k in fake}
        sys.modules.update(fake)
        try:
            mod = importlib.reload(fcb)
            self.assertTrue(mod.HAVE_FASTAI)
            self.assertTrue(issubclass(mod.Fp16AuditCallback, Callback))
        finally:
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v
            importlib.reload(fcb)
        self.assertEqual(fcb.HAVE_FASTAI, FASTAI_INSTALLED)

    def test_fit_records_every_training_step_and_names_the_planted_module(self):
        learn, mp, log = fit(self.path("run.jsonl"), every=4)
        self.assertEqual(log.header["source"], "fastai")
        self.assertEqual(log.header["steps_per_epoch"], 6)
        self.assertEqual(log.header["n_epoch"], 2)
        self.assertEqual(log.header["grad_scaler"]["class"], "EmulatedGradScaler")
        # Training batches only: 2 epochs x 6, validation batches absent.
        self.assertEqual([(s["step"], s["epoch"], s["iter"]) for s in log.steps],
                         [(e * 6 + i, e, i) for e in range(2) for i in range(6)])
        # The callback's skipped flags agree with what MixedPrecision saw:
        # it appends a scale only for steps it did not cancel.
        kept = [s for s in log.steps if not s["skipped"]]
        self.assertEqual(len(kept), len(mp.step_scales))
        self.assertEqual([s["scale_used"] for s in kept], mp.step_scales)
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
        self.assertIsNone(learn.scaler)
        for m in learn.model.modules():
            self.assertEqual(len(m._forward_hooks), 0)
        for p in learn.model.parameters():
            self.assertFalse(p._backward_hooks)

    def test_a_fit_that_raises_does_not_leave_hooks_for_the_next(self):
        class Boom:
            order = 12
            learn = None

            def __call__(self, event):
                if event == "after_step" and self.learn.iter == 2:
                    raise RuntimeError("boom")

        model = support.planted_overflow_model()
        data = support.batches(4)
        cb = fcb.Fp16AuditCallback(self.path("a.jsonl"), every=1)
        boom = Boom()
        learn = support.StandInLearner(support.DataLoaders(data, []), model, nn.functional.cross_entropy,
                                       torch.optim.SGD(model.parameters(), lr=1e-6),
                                       cbs=[support.StandInMixedPrecision(), cb, boom])
        with self.assertRaisesRegex(RuntimeError, "boom"):
            learn.fit(1)
        first = read_log(self.path("a.jsonl"))
        self.assertIsNone(first.end)
        self.assertEqual(len(first.steps), 3)
        learn.cbs.remove(boom)
        cb.fname = self.path("b.jsonl")
        learn.fit(1)
        self.assertEqual(len(model.planted._forward_hooks), 0)
        second = read_log(self.path("b.jsonl"))
        self.assertEqual(second.end["steps"], 4)
        # One hook per module: each telemetry line saw each output once.
        self.assertTrue(all(m["output"]["tensors"] == 1 for t in second.telemetry for m in t["modules"]))

    def test_cancel_step_counts_as_skipped(self):
        # A step cancelled after the scaler found nothing: only
        # after_cancel_step says it did not happen.
        class CancelEveryOther:
            order = 10.5
            learn = None

            def __call__(self, event):
                if event == "before_step" and self.learn.training and self.learn.iter % 2 == 1:
                    raise support.CancelStepException()

        model = nn.Sequential(nn.Linear(8, 4))
        data = support.batches(4)
        learn = support.StandInLearner(support.DataLoaders(data, []), model, nn.functional.cross_entropy,
                                       torch.optim.SGD(model.parameters(), lr=0.01),
                                       cbs=[support.StandInMixedPrecision(), CancelEveryOther(),
                                            fcb.Fp16AuditCallback(self.path("c.jsonl"), telemetry=False)])
        learn.fit(1)
        log = read_log(self.path("c.jsonl"))
        self.assertEqual([s["skipped"] for s in log.steps], [False, True, False, True])
        self.assertEqual([s["scale"] for s in log.steps], [65536.0] * 4)
        self.assertIsNone(log.header["telemetry"])
        self.assertEqual(log.telemetry, [])


class WhereFastaiIsInstalledTest(unittest.TestCase):
    @unittest.skipIf(FASTAI_INSTALLED, "fastai is installed: the tests above ran with it")
    def test_the_callback_tests_pass_with_fastai(self):
        # The same tests in a process where `import fastai` finds a
        # stand-in package (stub_fastai/) with fastai's Callback rules: the
        # callback then derives from fastai's class, as it does for users.
        here = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.path.join(here, "stub_fastai"), os.environ.get("PYTHONPATH")) if p))
        r = subprocess.run([sys.executable, "-m", "unittest", "test_fastai.StandInLearnerTest", "test_fastai.FastaiCallbackTest"],
                           cwd=here, env=env, capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stderr, r"Ran [1-9][0-9]* tests")
        self.assertNotIn("skipped", r.stderr)


if __name__ == "__main__":
    unittest.main()
