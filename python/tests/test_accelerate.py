"""fp16audit.accelerate.preflight and recorder with a real Accelerate (1.16) custom loop.

Accelerate 1.16 enables fp16's autocast and GradScaler only on an
accelerator: Accelerator(mixed_precision="fp16") on a CPU trains in fp32,
and the preflight audits what fp16 does on a GPU (emulated, said in the
report's notes). mixed_precision="bf16" runs real CPU bf16 autocast. The
failing model is test_lightning's planted net (its fp16 Inf under CPU
autocast is checked there).
"""

import json
import unittest
import warnings

import support
import torch
from torch import nn


def setUpModule():
    support.require_trainers("accelerate")
    warnings.filterwarnings("ignore")


def net(planted):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    if planted:
        with torch.no_grad():
            m[0].weight.mul_(100.0)
            m[2].weight.abs_().mul_(3e3)
    return m


def loader():
    g = torch.Generator().manual_seed(1)
    ds = torch.utils.data.TensorDataset(torch.randn(32, 8, generator=g), torch.randint(0, 2, (32,), generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True)


def accelerator(mp):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    # the state is a process-wide singleton: each test asks for its own
    AcceleratorState._reset_state(reset_partial_state=True)
    return Accelerator(mixed_precision=mp, cpu=True)


def train(acc, model, opt, dl, rec=None):
    for x, y in dl:
        with acc.autocast():
            loss = nn.functional.cross_entropy(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        if rec is not None:
            rec.step(loss)


class AccelerateTest(support.TempDirMixin, unittest.TestCase):
    def test_fp16_nan_is_refused_with_accelerates_words(self):
        from fp16audit.accelerate import PreflightFailed, preflight

        acc = accelerator("fp16")
        model, opt, dl = acc.prepare(net(True), torch.optim.SGD(net(True).parameters(), 0.1), loader())
        with self.assertRaises(PreflightFailed) as ctx:
            preflight(acc, model, dl, progress=False)
        r = ctx.exception.report
        self.assertEqual(r.policy, "autocast-fp16")
        self.assertEqual(r.verdict, "overflowing-op")
        self.assertIn("2", r.modules)
        summaries = " | ".join(f["summary"] for f in r.working_fixes)
        self.assertIn('Accelerator(mixed_precision="bf16") removes every overflow', summaries)
        self.assertNotIn("learn.", summaries)
        self.assertTrue(any('trains mixed_precision="fp16" in fp32' in n for n in r.notes), r.notes)
        # warn=True hands the report back
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertFalse(preflight(acc, model, dl, warn=True, progress=False).ok)
        self.assertTrue(any("overflowing-op" in str(w.message) for w in caught))

    def test_healthy_loop_is_untouched_and_recorded(self):
        from fp16audit.accelerate import preflight, recorder

        def run(check, path=None):
            acc = accelerator("bf16")
            m = net(False)
            model, opt, dl = acc.prepare(m, torch.optim.SGD(m.parameters(), 0.1), loader())
            torch.manual_seed(7)
            if check:
                r = preflight(acc, model, dl, progress=False)
                self.assertEqual(r.policy, "autocast-bf16")
                self.assertTrue(r.ok)
            with recorder(acc, path or self.path("x.jsonl")) as rec:
                train(acc, model, opt, dl, rec)
            return m

        a = run(True, self.path("log.jsonl"))
        b = run(False)
        for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
            self.assertTrue(torch.equal(x, y), k)
        lines = [json.loads(x) for x in open(self.path("log.jsonl"), encoding="utf-8")]
        self.assertEqual(lines[0]["source"], "accelerate")
        self.assertEqual(lines[0]["mixed_precision"], "bf16")
        self.assertIsNone(lines[0]["grad_scaler"])
        self.assertEqual(len([x for x in lines if x["kind"] == "step"]), 4)


if __name__ == "__main__":
    unittest.main()
