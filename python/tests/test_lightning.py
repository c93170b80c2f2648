"""fp16audit.lightning.FP16Preflight with the real Lightning Trainer (2.6).

On a CPU Lightning turns Trainer(precision="16-mixed") into "bf16-mixed";
these runs use real fp16 autocast on the CPU instead, with the precision
plugin given explicitly (plugins=[MixedPrecision("16-mixed", "cpu")]:
torch.autocast("cpu", float16) and torch.amp.GradScaler("cpu")), and one
test checks what the plain flag becomes. The failing model's hidden layer
is scaled so that its output passes 65504, and PyTorch's own CPU fp16
autocast makes its logits Inf (the first test: the truth beside the rest).
"""

import json
import os
import unittest
import warnings

import support
import torch
from torch import nn


def setUpModule():
    support.require_trainers("lightning")
    warnings.filterwarnings("ignore")


def net(planted):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    if planted:
        with torch.no_grad():
            # every weight stays far within fp16's range; the hidden
            # layer's output reaches ~1e5
            m[0].weight.mul_(100.0)
            m[2].weight.abs_().mul_(3e3)
    return m


def module(planted):
    import lightning as L

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net(planted)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Classifier()


def loader():
    g = torch.Generator().manual_seed(1)
    ds = torch.utils.data.TensorDataset(torch.randn(32, 8, generator=g), torch.randint(0, 2, (32,), generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True)


def trainer(tmp, callbacks, fp16=True, **kw):
    import lightning as L
    from lightning.pytorch.plugins import MixedPrecision

    base = dict(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, default_root_dir=tmp, callbacks=callbacks)
    if fp16:
        base["plugins"] = [MixedPrecision("16-mixed", "cpu")]
    base.update(kw)
    return L.Trainer(**base)


class LightningTest(support.TempDirMixin, unittest.TestCase):
    def test_the_planted_net_gives_inf_under_cpu_fp16_autocast(self):
        x = next(iter(loader()))[0]
        with torch.autocast("cpu", dtype=torch.float16):
            self.assertFalse(torch.isfinite(net(True)(x)).all())
            self.assertTrue(torch.isfinite(net(False)(x)).all())

    def test_fp16_nan_stops_the_fit_before_its_first_step(self):
        from fp16audit.lightning import FP16Preflight

        m = module(True)
        before = {k: v.clone() for k, v in m.state_dict().items()}
        cb = FP16Preflight(progress=False)
        tr = trainer(self.tmp, [cb])
        tr.fit(m, train_dataloaders=loader())
        self.assertEqual(tr.global_step, 0)
        for k, v in m.state_dict().items():
            self.assertTrue(torch.equal(v, before[k]), k)
        r = cb.report
        self.assertEqual(r.policy, "autocast-fp16")
        self.assertEqual(r.verdict, "overflowing-op")
        self.assertIn("net.2", r.modules)
        summaries = " | ".join(f["summary"] for f in r.working_fixes)
        self.assertIn('Trainer(precision="bf16-mixed") removes every overflow', summaries)
        self.assertIn("in the LightningModule", summaries)
        self.assertNotIn("learn.", summaries)

    def test_healthy_module_trains_untouched_and_its_losses_are_logged(self):
        from fp16audit.lightning import FP16Preflight

        def fit(callbacks, tmp):
            m = module(False)
            torch.manual_seed(5)
            tr = trainer(tmp, callbacks)
            tr.fit(m, train_dataloaders=loader())
            return m, tr

        cb = FP16Preflight(progress=False)
        a, tr = fit([cb], self.path("a"))
        b, _ = fit([], self.path("b"))
        self.assertEqual(cb.report.verdict, "healthy")
        self.assertEqual(tr.global_step, 3)
        for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
            self.assertTrue(torch.equal(x, y), k)
        lines = [json.loads(x) for x in open(cb.log_path, encoding="utf-8")]
        self.assertEqual(lines[0]["source"], "lightning")
        self.assertTrue(lines[0]["grad_scaler"]["enabled"])  # the plugin's real GradScaler("cpu")
        steps = [x for x in lines if x["kind"] == "step"]
        self.assertEqual(len(steps), 3)
        self.assertTrue(all(isinstance(s["loss"], float) for s in steps))
        self.assertEqual(steps[0]["scale_used"], 65536.0)

    def test_warn_only_warns(self):
        from fp16audit.lightning import FP16Preflight

        cb = FP16Preflight(warn=True, progress=False)
        tr = trainer(self.tmp, [cb], max_steps=1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tr.fit(module(True), train_dataloaders=loader())
        self.assertEqual(tr.global_step, 1)
        self.assertTrue(any("overflowing-op" in str(w.message) for w in caught))

    def test_16_mixed_on_a_cpu_becomes_bf16_and_is_audited_so(self):
        from fp16audit.lightning import FP16Preflight

        cb = FP16Preflight(progress=False, log=False)
        tr = trainer(self.tmp, [cb], fp16=False, precision="16-mixed", max_steps=1)
        tr.fit(module(True), train_dataloaders=loader())
        self.assertEqual(str(tr.precision), "bf16-mixed")
        self.assertEqual(cb.report.policy, "autocast-bf16")
        self.assertTrue(cb.report.ok)
        self.assertEqual(tr.global_step, 1)


if __name__ == "__main__":
    unittest.main()
