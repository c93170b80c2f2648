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


def growth_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def prices():
    torch.manual_seed(1000)
    X = torch.randn(512, 16)
    w = torch.randn(16)
    return torch.utils.data.TensorDataset(X, (X @ w).unsqueeze(1) * 8000 + 60000)


class CaptureTest(support.TempDirMixin, unittest.TestCase):
    """The capture in a real Accelerate custom loop. Accelerate 1.16 trains
    mixed_precision="fp16" in fp32 on a CPU; this loop gives the
    Accelerator the GradScaler and autocast it holds on a GPU
    (support.accelerate_cpu_fp16), so prepare(), accelerator.backward()
    and the prepared optimizer run Accelerate's own fp16 path in real CPU
    fp16 kernels, and the run (fixtures/torch/runs.py's forward_growth:
    regression on unnormalized targets) fails by itself."""

    def test_a_mid_training_nan_stops_the_loop_at_its_capture(self):
        import os

        from fp16audit import Capture, CaptureStop
        from fp16audit.accelerate import recorder

        acc = accelerator("fp16")
        support.accelerate_cpu_fp16(acc)
        m = growth_net()
        model, opt, dl = acc.prepare(m, torch.optim.Adam(m.parameters(), lr=0.05), torch.utils.data.DataLoader(prices(), batch_size=32))
        loss_fn = nn.L1Loss()
        snaps, batches = [], []
        with self.assertRaises(CaptureStop) as ctx:
            with recorder(acc, self.path("run.jsonl"), model, capture=Capture(self.path("caps"), on_event="stop"), optimizer=opt,
                          loss_func=loss_fn, every=10) as rec:
                for epoch in range(4):
                    for x, y in dl:
                        snaps.append({k: v.detach().clone() for k, v in m.state_dict().items()})
                        batches.append((x.clone(), y.clone()))
                        with acc.autocast():
                            loss = loss_fn(model(x).float(), y)
                        acc.backward(loss)
                        rec.before_step(loss, batch=(x, y))
                        opt.step()
                        opt.zero_grad()
                        rec.step(loss, batch=(x, y))
        ev = ctx.exception.event
        step = ev.step
        self.assertEqual(ev.trigger, "nonfinite-loss")
        self.assertGreater(step, 20, "a mid-training failure, not one at the first steps")
        self.assertEqual(len(snaps), step + 1)
        for k, v in m.state_dict().items():
            self.assertTrue(torch.equal(v, snaps[step][k]), "the failing step's update was applied to %s" % k)
        with open(os.path.join(ev.path, "manifest.json"), encoding="utf-8") as f:
            man = json.load(f)
        self.assertEqual((man["trainer"], man["precision"]["policy"], man["precision"]["autocast_device"]), ("accelerate", "autocast-fp16", "cpu"))
        self.assertEqual((man["optimizer"]["class"], man["loss"]["name"], man["step_applied"]), ("Adam", "l1", False))
        x, y = batches[step]
        net = growth_net()
        net.load_state_dict(snaps[step])
        truth = support.pytorch_record().truth_of(net, x, y, batches[step - 1][0], loss_fn, step, man["grad_scaler"]["scale"])
        r = replay_json(ev.path)
        self.assertEqual(r["verdict"], truth["class"], r["verdict_text"])
        self.assertEqual(r["verdict"], "forward-overflow")
        self.assertEqual(r["culprit"]["module"], truth["fp16_forward"]["first_reaching_output"])
        self.assertEqual(r["capture"]["trainer_label"], "Accelerate")
        words = {f["kind"]: f["words"] for f in r["fixes"]}
        self.assertEqual(words.get("bf16"), 'Accelerator(mixed_precision="bf16")', r["fixes"])
        # the continuations from the prepared model: each copy runs the forward its class defines under its own
        # precision, not Accelerate's fp16 autocast wrapper (fp32 and bf16 would overflow as fp16 does)
        import fp16audit

        rr = fp16audit.replay(ev.path, model=model, loader=torch.utils.data.DataLoader(prices(), batch_size=32), loss_func=loss_fn,
                              steps=5, progress=False)
        runs = {x["fix"]: x for x in rr.continuations["runs"]}
        self.assertEqual((runs["fp32"]["outcome"], runs["bf16"]["outcome"]), ("finite", "finite"), runs)
        self.assertIn("_original_forward", m.__dict__, "the user's prepared model keeps its wrapper")

    def test_a_cpu_fp16_run_is_captured_as_the_fp32_it_trains_in(self):
        from fp16audit.accelerate import capture_policy, recorder

        acc = accelerator("fp16")  # on a CPU: no GradScaler, no autocast
        self.assertEqual(capture_policy(acc), "fp32")
        m = net(False)
        model, opt, dl = acc.prepare(m, torch.optim.SGD(m.parameters(), 0.1), loader())
        with recorder(acc, self.path("run.jsonl"), model, capture=self.path("caps"), optimizer=opt, loss_func=nn.CrossEntropyLoss()) as rec:
            rec.capture_now()
            for x, y in dl:
                with acc.autocast():
                    loss = nn.functional.cross_entropy(model(x), y)
                acc.backward(loss)
                rec.before_step(loss, batch=(x, y))
                opt.step()
                opt.zero_grad()
                rec.step(loss, batch=(x, y))
        path = rec.captures[0].path
        with open(path + "/manifest.json", encoding="utf-8") as f:
            man = json.load(f)
        self.assertEqual((man["precision"]["policy"], man["grad_scaler"]), ("fp32", None))
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
