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


def tanh_mlp():
    torch.manual_seed(0)
    layers = []
    for a, b in ((16, 64), (64, 64), (64, 64)):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(64, 4))


def collapse_module():
    """fixtures/torch/runs.py's collapse run as a LightningModule: a tanh
    MLP trained with SGD at a learning rate just too high, whose loss
    spikes, whose GradScaler then backs off step after step, and whose
    loss goes NaN some steps later."""
    import lightning as L

    class Collapse(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = tanh_mlp()

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self(x).float(), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.8, momentum=0.9)

    return Collapse()


def tanh_loader():
    torch.manual_seed(1000)
    X = torch.randn(1024, 16)
    W = torch.randn(16, 4)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, torch.tanh(X @ W)), batch_size=64, shuffle=False)


class CaptureTest(support.TempDirMixin, unittest.TestCase):
    """The capture in the real Lightning Trainer, with real fp16 on the CPU
    (the MixedPrecision("16-mixed", "cpu") plugin: torch.autocast("cpu",
    float16) and torch.amp.GradScaler("cpu")): a run that fails by itself,
    each of its captures replayed and held to PyTorch's record."""

    def test_a_collapsing_run_is_captured_at_its_onset_and_at_its_nan(self):
        import lightning as L

        from fp16audit import Capture
        from fp16audit.lightning import FP16Preflight

        snaps, batches, scales = {}, {}, {}

        class Record(L.Callback):
            """PyTorch's side, made without fp16audit: the weights and the batch before each step's forward."""

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                step = trainer.global_step
                snaps[step] = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
                batches[step] = (batch[0].clone(), batch[1].clone())
                scales[step] = trainer.precision_plugin.scaler.get_scale()

        cb = FP16Preflight(preflight=False, capture=Capture(self.path("caps")), loss_func=nn.MSELoss(), telemetry=True, every=5)
        m = collapse_module()
        tr = trainer(self.tmp, [Record(), cb], max_steps=42)
        tr.fit(m, train_dataloaders=tanh_loader())
        got = [(e.trigger, e.step) for e in cb.captures if e.path]
        self.assertEqual([k for k, _ in got], ["loss-spike", "scale-collapse", "nonfinite-loss"], cb.captures)
        self.assertGreater(got[-1][1], 20, "the NaN comes mid-training")
        runs = support.pytorch_record()
        for e in cb.captures:
            with self.subTest(trigger=e.trigger, step=e.step):
                with open(os.path.join(e.path, "manifest.json"), encoding="utf-8") as f:
                    man = json.load(f)
                self.assertEqual((man["trainer"], man["precision"]["policy"], man["precision"]["autocast_device"]),
                                 ("lightning", "autocast-fp16", "cpu"))
                self.assertEqual((man["optimizer"]["class"], man["loss"]["name"]), ("SGD", "mse"))
                self.assertEqual(man["grad_scaler"]["scale"], scales[e.step])
                self.assertFalse(man["step_applied"], "captured at the weights the step saw")
                from fp16audit import _safetensors

                state, _ = _safetensors.read(os.path.join(e.path, "state", "model.safetensors"))
                for k, v in snaps[e.step].items():
                    self.assertTrue(torch.equal(state[k], v), k)
                net = tanh_mlp()
                net.load_state_dict({k[len("net."):]: v for k, v in snaps[e.step].items()})
                x, y = batches[e.step]
                truth = runs.truth_of(net, x, y, batches[e.step - 1][0], nn.MSELoss(), e.step, scales[e.step])
                r = replay_json(e.path)
                self.assertEqual(r["verdict"], truth["class"], r["verdict_text"])
                if truth["class"] == "forward-overflow":
                    self.assertEqual(r["culprit"]["module"], "net." + truth["fp16_forward"]["first_reaching_output"])
                elif truth["class"] == "gradient-overflow":
                    self.assertEqual(r["gradient"]["module"], "net." + truth["fp16_backward"]["first_nonfinite"])
                    self.assertEqual(r["gradient"]["max_clean_exp"], truth["largest_finite_exp"])
                self.assertEqual(r["capture"]["trainer_label"], "Lightning")
                words = {f["kind"]: f["words"] for f in r["fixes"]}
                if "bf16" in words:
                    self.assertEqual(words["bf16"], 'Trainer(precision="bf16-mixed")')
                if "clip" in words:
                    self.assertIn("Trainer(gradient_clip_val=", words["clip"])
        # the log: every step's raw loss, the captures' lines, its end (on_event="continue": the fit went on)
        lines = [json.loads(x) for x in open(cb.log_path, encoding="utf-8")]
        self.assertEqual([x["path"] for x in lines if x["kind"] == "capture"], [e.path for e in cb.captures])
        self.assertEqual(lines[-1]["kind"], "end")
        self.assertEqual(tr.global_step, 42)

    def test_a_stop_where_the_scaler_skips_the_step_ends_the_fit_in_lightnings_way(self):
        import lightning as L

        from fp16audit import Capture
        from fp16audit.lightning import FP16Preflight

        snaps = {}

        class Record(L.Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                snaps[trainer.global_step] = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

        cb = FP16Preflight(preflight=False, capture=Capture(self.path("caps"), on_event="stop"), loss_func=nn.MSELoss())
        m = collapse_module()
        tr = trainer(self.tmp, [Record(), cb], max_steps=42)
        tr.fit(m, train_dataloaders=tanh_loader())  # no exception: trainer.should_stop
        self.assertEqual([(e.trigger, e.step) for e in cb.captures], [("loss-spike", 21)])
        # the spike's gradients overflow: the GradScaler skipped step 21, and the fit ended after it
        self.assertEqual(tr.global_step, 22)
        for k, v in m.state_dict().items():
            self.assertTrue(torch.equal(v, snaps[21][k]), k)
        lines = [json.loads(x) for x in open(cb.log_path, encoding="utf-8")]
        self.assertEqual([x["kind"] for x in lines][-3:], ["step", "capture", "end"])
        self.assertEqual((lines[-3]["step"], lines[-3]["skipped"]), (21, True))

    def test_a_requested_capture_comes_before_the_update_and_a_stop_keeps_the_update_out(self):
        import lightning as L

        from fp16audit import Capture, CaptureStop
        from fp16audit.lightning import FP16Preflight

        snaps = {}

        class Record(L.Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                snaps[trainer.global_step] = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

        class Request(FP16Preflight):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
                if trainer.global_step == 2:
                    self.capture_now()

        # bf16-mixed on the CPU: real bf16 autocast, no GradScaler, so
        # nothing but the stop keeps the step's update out
        cb = Request(preflight=False, capture=Capture(self.path("caps"), on_event="stop"), loss_func=nn.CrossEntropyLoss())
        m = module(False)
        tr = trainer(self.tmp, [Record(), cb], fp16=False, precision="bf16-mixed", max_steps=6)
        with self.assertRaises(CaptureStop):
            tr.fit(m, train_dataloaders=loader())
        self.assertEqual([(e.trigger, e.step) for e in cb.captures], [("request", 2)])
        self.assertEqual(tr.global_step, 2)
        for k, v in m.state_dict().items():
            self.assertTrue(torch.equal(v, snaps[2][k]), "the captured step's update was applied to %s" % k)
        path = cb.captures[0].path
        with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
            man = json.load(f)
        self.assertEqual((man["precision"]["policy"], man["step_applied"], man["grad_scaler"]), ("autocast-bf16", False, None))
        from fp16audit import _safetensors

        state, _ = _safetensors.read(os.path.join(path, "state", "model.safetensors"))
        for k, v in snaps[2].items():
            self.assertTrue(torch.equal(state[k], v), k)
        self.assertEqual(replay_json(path)["verdict"], "not-reproduced")


def replay_json(folder):
    import subprocess

    from fp16audit import _binary

    p = subprocess.run([_binary.find_binary(), "replay", folder, "--format", "json"], capture_output=True, text=True)
    if p.returncode not in (0, 1):
        raise AssertionError("fp16audit replay %s: exit %d: %s" % (folder, p.returncode, p.stderr))
    return json.loads(p.stdout)


if __name__ == "__main__":
    unittest.main()
