"""The capture of a failing training step and its replay, end to end.

The triggers are driven step by step through the trainer-neutral core;
the folders are written by the real writer and read back as the binary
reads them (no pickle, every file hashed, the arrays without pickle);
a disk that fills up leaves nothing behind; the recorder never changes
the run it records; and real CPU-fp16 runs (torch.autocast("cpu",
dtype=torch.float16) with torch.amp.GradScaler("cpu"), in a plain loop
and in a fastai learner) are captured and replayed by `fp16audit
replay`, continuations included. The real fp16 runs need torch 2.x: on
torch 1.13 they are skipped, and in the torch 2.x leg of CI
(FP16AUDIT_TEST_LEG=torch2) a skip fails.
"""

import copy
import errno
import glob
import hashlib
import json
import math
import os
import random
import shutil
import subprocess
import tempfile
import unittest
import warnings

import support
import numpy as np
import torch
from torch import nn

import fp16audit
from fp16audit import _binary, _safetensors
from fp16audit.capture import Capture, CaptureCore, CaptureStop
from fp16audit.scaler import EmulatedGradScaler


def cpu_fp16():
    """Skip without CPU fp16 autocast and torch.amp.GradScaler("cpu") (torch 1.13), but fail in the torch 2.x leg."""
    ok = int(torch.__version__.split(".")[0]) >= 2 and hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler")
    if ok:
        return
    msg = "torch %s has no CPU fp16 autocast with torch.amp.GradScaler('cpu')" % torch.__version__
    if os.environ.get("FP16AUDIT_TEST_LEG") == "torch2":
        raise AssertionError("the torch 2.x leg must run this test: " + msg)
    raise unittest.SkipTest(msg)


class Recorded(CaptureCore):
    """The core with its folder writer replaced by a list: the trigger tests look at when, not at what is written."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.written = []

    def write(self, trigger, step, detail, loss, scale, epoch=None, iter=None, step_applied=False):
        self.written.append((trigger, step, step_applied))
        return "folder-%d" % step


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def regression(n=512):
    torch.manual_seed(1000)
    X = torch.randn(n, 16)
    w = torch.randn(16)
    return X, (X @ w).unsqueeze(1) * 8000 + 60000


def growth_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


class TestTriggers(unittest.TestCase):
    def core(self, **kw):
        scaler = EmulatedGradScaler(growth_interval=1000)
        return Recorded(Capture("unused", **kw), model=tiny(), scaler=scaler, policy="autocast-fp16"), scaler

    def drive(self, core, rows):
        """rows: (loss, scale_used, scale_after, skipped) per step."""
        x = torch.zeros(2, 4)
        for step, (loss, used, after, skipped) in enumerate(rows):
            core.after_update(step, loss, x, None, skipped=skipped, scale_used=used, scale_after=after)

    def test_warmup_backoffs_are_no_collapse(self):
        core, _ = self.core()
        # the scaler halves six times from 2^16 before its first applied step: its warm-up
        rows = [(1.0, 2.0 ** (16 - i), 2.0 ** (15 - i), True) for i in range(6)] + [(1.0, 2.0 ** 10, 2.0 ** 10, False)] * 20
        self.drive(core, rows)
        self.assertEqual(core.written, [])

    def test_collapse_at_its_onset(self):
        core, _ = self.core()
        rows = [(1.0, 1024.0, 1024.0, False)] * 10
        s = 1024.0
        for _ in range(5):
            rows.append((1.0, s, s / 2, True))
            s /= 2
        self.drive(core, rows)
        # the third backoff in a row, not the fifth: the weights are still those before the collapse
        self.assertEqual(core.written, [("scale-collapse", 12, False)])

    def test_scale_floor(self):
        core, _ = self.core(backoffs_in_a_row=None, scale_floor=1.0)
        rows = [(1.0, 4.0, 4.0, False)] * 3 + [(1.0, 4.0, 2.0, True), (1.0, 2.0, 2.0, False), (1.0, 2.0, 1.0, True),
                                               (1.0, 1.0, 1.0, False), (1.0, 1.0, 0.5, True)]
        self.drive(core, rows)
        self.assertEqual(core.written, [("scale-collapse", 7, False)])

    def test_low_init_scale_is_no_collapse(self):
        core, _ = self.core()
        self.drive(core, [(1.0, 2.0 ** -20, 2.0 ** -20, False)] * 30)
        self.assertEqual(core.written, [])

    def test_nonfinite_loss_once_before_the_update(self):
        core, _ = self.core()
        x = torch.zeros(2, 4)
        for step, loss in enumerate([1.0, 0.9, float("nan"), float("inf"), 0.8]):
            core.before_update(step, torch.tensor(loss), x, scale=1024.0)
            core.after_update(step, loss, x, skipped=not math.isfinite(loss), scale_used=1024.0, scale_after=1024.0)
        self.assertEqual(core.written, [("nonfinite-loss", 2, False)])

    def test_spike(self):
        core, _ = self.core()
        losses = [2.0 - 0.05 * i for i in range(15)] + [25.0, 1.0]
        self.drive(core, [(v, 8.0, 8.0, False) for v in losses])
        # after the update: the step was applied, as the manifest will say
        self.assertEqual(core.written, [("loss-spike", 15, True)])

    def test_request(self):
        core, _ = self.core()
        self.drive(core, [(1.0, 8.0, 8.0, False)] * 3)
        core.request()
        self.drive(core, [(1.0, 8.0, 8.0, False)])
        self.assertEqual([w[0] for w in core.written], ["request"])

    def test_plateau_needs_the_telemetry_evidence(self):
        for evidence, want in ((None, []), (("0", "is 97% zeros"), ["pinned-plateau"])):
            core, _ = self.core(plateau_steps=40)
            core.telemetry(evidence)
            self.drive(core, [(1.3862, 2.0 ** -20, 2.0 ** -20, False)] * 60)
            self.assertEqual([w[0] for w in core.written], want)
            if want:
                # steps 1 to 40 at the same scale (step 0 ended the warm-up), then the check at step 41
                self.assertEqual(core.written[0][1], 41)

    def test_converging_is_no_plateau(self):
        core, _ = self.core(plateau_steps=40)
        core.telemetry(("0", "loses 3% of its norm to fp16"))
        self.drive(core, [(2.0 * 0.97 ** i, 1024.0, 1024.0, False) for i in range(80)])
        self.assertEqual(core.written, [])

    def test_each_kind_once_and_at_most_max_captures(self):
        core, _ = self.core(max_captures=2)
        x = torch.zeros(2, 4)
        for step in range(6):
            core.request()
            core.after_update(step, float("nan"), x, skipped=True, scale_used=1.0, scale_after=0.5)
        self.assertEqual(len(core.written), 2)

    def test_bad_configuration(self):
        for kw in ({"on_event": "halt"}, {"backoffs_in_a_row": 0}, {"scale_floor": 0}, {"flat": 1.5}, {"spike_factor": 1},
                   {"plateau_steps": 2}, {"exporter": "onnx"}):
            with self.assertRaises(ValueError, msg=str(kw)):
                Capture("c", **kw)


def train_growth(rec_kw, steps=60, scaler=None, before=True, stop_after_nan=2):
    """The forward-growth run (fixtures/torch/runs.py): Adam on unnormalized regression targets under CPU autocast
    fp16 with GradScaler("cpu"); returns (model, optimizer, recorder)."""
    X, y = regression()
    model = growth_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    scaler = scaler or torch.amp.GradScaler("cpu")
    loss_fn = nn.L1Loss()
    rec = fp16audit.AmpRecorder(rec_kw.pop("log"), scaler, model, optimizer=opt, loss_func=loss_fn, **rec_kw)
    nan_at = None
    with rec:
        for step in range(steps):
            i = (step * 32) % 512
            xb, yb = X[i:i + 32], y[i:i + 32]
            with torch.autocast("cpu", dtype=torch.float16):
                loss = loss_fn(model(xb).float(), yb)
            scaler.scale(loss).backward()
            if before:
                rec.before_step(loss, batch=(xb, yb))
            scaler.step(opt)
            scaler.update()
            rec.step(loss, batch=(xb, yb))
            opt.zero_grad(set_to_none=True)
            if not math.isfinite(loss.item()) and nan_at is None:
                nan_at = step
            if nan_at is not None and step >= nan_at + stop_after_nan:
                break
    return model, opt, rec


def no_pickle(folder):
    """Every file of a capture: (relative path, first bytes); the test asserts none is a pickle."""
    out = []
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out.append((os.path.relpath(p, folder), fh.read(4)))
    return out


class TestCaptureFolder(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="fp16audit-test-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def nan_run(self, capture, scaler=None, inject_at=12, steps=20, policy=None, on_grads=False):
        """A tiny classifier fed one NaN sample at inject_at: (model, optimizer, recorder, snapshots before each step)."""
        torch.manual_seed(1)
        X = torch.randn(320, 4)
        y = (X[:, 0] > 0).long()
        model = tiny()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        scaler = scaler if scaler is not None else EmulatedGradScaler()
        kw = dict(optimizer=opt, loss_func=nn.CrossEntropyLoss(), capture=capture, every=5)
        if policy:
            kw["policy"] = policy
        rec = fp16audit.AmpRecorder(os.path.join(self.tmp, "run.jsonl"), scaler if scaler is not False else None, model, **kw)
        snaps = []
        with rec:
            for step in range(steps):
                xb, yb = X[step * 16:(step + 1) * 16].clone(), y[step * 16:(step + 1) * 16]
                if step == inject_at:
                    xb[3, 2] = float("nan")
                snaps.append(copy.deepcopy(model.state_dict()))
                loss = nn.functional.cross_entropy(model(xb), yb)
                if scaler is not False:
                    scaler.scale(loss).backward()
                    rec.before_step(loss, batch=(xb, yb))
                    scaler.step(opt)
                    scaler.update()
                else:
                    loss.backward()
                    rec.before_step(loss, batch=(xb, yb))
                    opt.step()
                rec.step(loss, batch=(xb, yb))
                opt.zero_grad()
        return model, opt, rec, snaps

    def test_folder(self):
        cap = os.path.join(self.tmp, "caps")
        model, opt, rec, snaps = self.nan_run(cap)
        self.assertEqual([(e.trigger, e.step) for e in rec.captures], [("nonfinite-loss", 12)])
        folder = rec.captures[0].path
        self.assertEqual(os.path.basename(folder), "step-000012-nonfinite-loss")
        self.assertEqual(sorted(os.listdir(cap)), ["step-000012-nonfinite-loss"])  # no temporary folder left
        with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as f:
            m = json.load(f)
        self.assertEqual((m["format"], m["version"]), ("fp16audit.capture", "1.1"))
        self.assertEqual(m["trigger"]["kind"], "nonfinite-loss")
        self.assertEqual(m["loss"]["name"], "cross-entropy")
        self.assertFalse(m["step_applied"])
        self.assertEqual(m["optimizer"]["class"], "SGD")
        self.assertEqual(m["batches"]["previous"]["step"], 11)
        # every other file is listed with its size and sha256
        listed = set(m["files"])
        for rel, _ in no_pickle(folder):
            if rel == "manifest.json":
                continue
            self.assertIn(rel, listed)
            with open(os.path.join(folder, rel), "rb") as f:
                data = f.read()
            self.assertEqual(m["files"][rel], {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        for rel, head in no_pickle(folder):
            self.assertFalse(head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"), rel)
            self.assertFalse(rel.endswith((".pkl", ".pt", ".pth")), rel)
        # the arrays need no pickle; the batch holds the NaN sample
        with np.load(os.path.join(folder, "batch.npz"), allow_pickle=False) as z:
            xb = z[m["model"]["inputs"][0]]
        self.assertTrue(np.isnan(xb[3, 2]))
        np.load(os.path.join(folder, "target.npy"), allow_pickle=False)
        # the state is the model's before the step (the scaler skipped it), read back from safetensors
        state, _ = _safetensors.read(os.path.join(folder, "state", "model.safetensors"))
        for k, v in snaps[12].items():
            self.assertTrue(torch.equal(state[k], v), k)
        with open(os.path.join(folder, "state", "optimizer.json"), encoding="utf-8") as f:
            od = json.load(f)
        tensors, _ = _safetensors.read(os.path.join(folder, od["tensors"]))
        self.assertEqual(set(od["state"]), {n for n, _ in model.named_parameters()})
        self.assertTrue(any(k.endswith("momentum_buffer") for k in tensors))
        # the run's log points to the capture, after the step's line
        with open(os.path.join(self.tmp, "run.jsonl"), encoding="utf-8") as f:
            lines = [json.loads(x) for x in f]
        i = next(i for i, x in enumerate(lines) if x["kind"] == "capture")
        self.assertEqual(lines[i], {"kind": "capture", "step": 12, "trigger": "nonfinite-loss", "path": folder})
        self.assertEqual([x["step"] for x in lines[:i] if x["kind"] == "step"][-1], 12)
        # the binary replays it: the data, sample 3
        out = subprocess.run([_binary.find_binary(), "replay", folder, "--format", "json"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 1, out.stderr)
        r = json.loads(out.stdout)
        self.assertEqual(r["verdict"], "data-nonfinite", r["verdict_text"])
        self.assertEqual(r["data"]["samples"], [3])

    def test_recording_does_not_change_the_run(self):
        runs = []
        for cap in (None, os.path.join(self.tmp, "caps")):
            model, opt, rec, _ = self.nan_run(cap)
            runs.append(model.state_dict())
        for k in runs[0]:
            self.assertTrue(torch.equal(runs[0][k], runs[1][k]), k)

    def test_full_disk_leaves_nothing(self):
        cap = os.path.join(self.tmp, "caps")
        real = os.fsync
        calls = []

        def fsync(fd):
            calls.append(fd)
            if len(calls) == 4:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd)

        os.fsync = fsync
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model, _, rec, _ = self.nan_run(cap)
        finally:
            os.fsync = real
        self.assertTrue(any("No space left" in str(w.message) for w in caught), [str(w.message) for w in caught])
        self.assertEqual(os.listdir(cap), [])  # neither the folder nor its temporary one
        ev = rec.captures[0]
        self.assertIsNone(ev.path)
        with open(os.path.join(self.tmp, "run.jsonl"), encoding="utf-8") as f:
            lines = [json.loads(x) for x in f]
        self.assertIn("No space left", next(x for x in lines if x["kind"] == "capture")["error"])
        self.assertEqual(lines[-1]["kind"], "end")  # training went on to its end

    @unittest.skipUnless(hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("mount"), "mounting a tmpfs needs root")
    def test_full_tmpfs_leaves_nothing(self):
        mnt = os.path.join(self.tmp, "small")
        os.mkdir(mnt)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", mnt], capture_output=True).returncode != 0:
            self.skipTest("this machine does not let root mount a tmpfs")
        try:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 2))  # 130 KB of weights: more than the disk
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            core = CaptureCore(Capture(os.path.join(mnt, "caps")), model=model, optimizer=opt, scaler=EmulatedGradScaler(),
                               loss_func=nn.CrossEntropyLoss(), policy="autocast-fp16")
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                ev = core.before_update(0, torch.tensor(float("nan")), torch.randn(4, 64), torch.zeros(4, dtype=torch.long), scale=1.0)
            self.assertIsNone(ev.path)
            self.assertIn("No space left", ev.error)
            self.assertEqual(os.listdir(os.path.join(mnt, "caps")), [])
        finally:
            subprocess.run(["umount", mnt], check=False)

    def test_stop_before_a_nonfinite_update_without_a_scaler(self):
        cap = Capture(os.path.join(self.tmp, "caps"), on_event="stop")
        with self.assertRaises(CaptureStop) as ctx:
            self.nan_run(cap, scaler=False, policy="fp32")
        ev = ctx.exception.event
        self.assertEqual((ev.trigger, ev.step), ("nonfinite-loss", 12))
        with open(os.path.join(ev.path, "manifest.json"), encoding="utf-8") as f:
            m = json.load(f)
        self.assertFalse(m["step_applied"])
        self.assertIsNone(m["grad_scaler"])
        self.assertEqual(m["precision"]["policy"], "fp32")

    def test_capture_needs_what_it_says(self):
        with self.assertRaisesRegex(ValueError, "policy="):
            fp16audit.AmpRecorder(os.path.join(self.tmp, "r.jsonl"), None, tiny(), capture=os.path.join(self.tmp, "c"))
        with self.assertRaisesRegex(ValueError, "needs the model"):
            fp16audit.AmpRecorder(os.path.join(self.tmp, "r.jsonl"), EmulatedGradScaler(), capture=os.path.join(self.tmp, "c"))

    def test_the_copy_leaves_out_fp16audits_observers_and_the_run_its_random_state(self):
        from fp16audit.capture import _cpu_copy, observer

        class Log:
            """An observer holding what cannot be copied, as a trainer adapter's loss hook holds its open log."""

            def __init__(self, path):
                self.f = open(path, "w", encoding="utf-8")
                self.calls = 0

            @observer
            def hook(self, module, args, output):
                self.calls += 1

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2))
        own = []
        model[2].register_forward_hook(lambda m, a, o: own.append(1))  # the model's own hook stays
        log = Log(os.path.join(self.tmp, "log.txt"))
        self.addCleanup(log.f.close)
        model.register_forward_hook(log.hook)
        dup = _cpu_copy(model)
        dup(torch.zeros(1, 4))
        self.assertEqual((log.calls, len(own)), (0, 1))
        # a capture of a train-mode step with dropout: its export draws masks, and the run's generators are put back
        core = CaptureCore(Capture(os.path.join(self.tmp, "caps")), model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                           scaler=EmulatedGradScaler(), loss_func=nn.CrossEntropyLoss(), policy="autocast-fp16")
        core.request()
        rng = torch.get_rng_state()
        ev = core.before_update(0, torch.tensor(0.7), torch.randn(4, 4, generator=torch.Generator().manual_seed(1)),
                                torch.zeros(4, dtype=torch.long), scale=1.0)
        self.assertIsNotNone(ev.path, ev.error)
        self.assertTrue(torch.equal(rng, torch.get_rng_state()))
        self.assertEqual(log.calls, 0, "the export ran the observer")

    def test_a_loss_described_rather_than_given(self):
        from fp16audit.capture import loss_entry

        e = loss_entry({"function": "ForCausalLMLoss", "name": "cross-entropy", "class_axis": "last", "ignore_index": -100,
                        "lm_shift": True, "output": "logits"}, 2.5)
        self.assertEqual((e["value"], e["name"], e["lm_shift"], e["output"]), (2.5, "cross-entropy", True, "logits"))
        for bad in ({"name": "hinge"}, {"name": "mse", "reduction": "sum"}):
            with self.assertRaises(ValueError):
                loss_entry(bad, 1.0)

    def test_replay_refuses_what_is_not_a_capture(self):
        with self.assertRaisesRegex(fp16audit.ReplayError, "manifest.json"):
            fp16audit.replay(self.tmp, progress=False)


class TestRealRuns(unittest.TestCase):
    """Real CPU-fp16 runs, captured and replayed, continuations included."""

    def setUp(self):
        cpu_fp16()
        self.tmp = tempfile.mkdtemp(prefix="fp16audit-test-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_plain_loop_forward_growth(self):
        cap = os.path.join(self.tmp, "caps")
        model, opt, rec = train_growth({"log": os.path.join(self.tmp, "run.jsonl"), "every": 10,
                                        "capture": Capture(cap, backoffs_in_a_row=None, scale_floor=None)})
        ev = [e for e in rec.captures if e.trigger == "nonfinite-loss"]
        self.assertEqual(len(ev), 1, rec.captures)
        self.assertGreater(ev[0].step, 20)
        X, y = regression()
        dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=32)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        opt_before = copy.deepcopy(opt.state_dict())
        rng = torch.get_rng_state()
        py = random.getstate()
        r = fp16audit.replay(ev[0].path, model=model, loader=dl, loss_func=nn.L1Loss(), steps=20, progress=False)
        self.assertEqual(r.verdict, "forward-overflow", r.verdict_text)
        self.assertEqual(r.culprit["module"], "4")
        self.assertGreater(r.culprit["fp32_max_abs"], 65504)
        self.assertTrue(r.culprit["earlier"], "the log's telemetry saw the activation grow")
        runs = {x["fix"]: x for x in r.continuations["runs"]}
        self.assertEqual(set(runs), {"as-run", "fp32", "bf16", "clip", "lower-lr"})
        self.assertTrue(r.continuations["reproduced"])
        self.assertEqual(runs["fp32"]["outcome"], "finite")
        self.assertEqual(runs["bf16"]["outcome"], "finite")
        fixes = {(f["kind"], f["verified"]): f for f in r.fixes}
        self.assertTrue(fixes[("bf16", "continuation")]["works"])
        self.assertIn("learn.to_bf16()", fixes[("bf16", "continuation")]["fastai"])
        # the user's model, optimizer and random generators are as they were
        for k, v in model.state_dict().items():
            self.assertTrue(torch.equal(before[k], v), k)
        self.assertEqual(str(opt.state_dict()), str(opt_before))
        self.assertTrue(torch.equal(rng, torch.get_rng_state()))
        self.assertEqual(py, random.getstate())
        self.assertIn("forward-overflow", str(r))
        self.assertIn("<html", r._repr_html_())

    def test_scales_names_the_capture_and_the_replay_agrees(self):
        """Record, capture, `fp16audit scales` on the log, `fp16audit replay` on the capture it names: one story."""
        cwd = os.getcwd()
        os.chdir(self.tmp)  # as a user's run: the capture line names the folder relative to the working directory
        try:
            train_growth({"log": "run.jsonl", "every": 10, "capture": Capture("caps", backoffs_in_a_row=None, scale_floor=None)})
            exe = _binary.find_binary()
            out = subprocess.run([exe, "scales", "run.jsonl", "--format", "json"], capture_output=True, text=True)
            self.assertIn(out.returncode, (0, 1), out.stderr)
            s = json.loads(out.stdout)
            caps = s["captures"]
            self.assertEqual([c["trigger"] for c in caps], ["nonfinite-loss"], caps)
            c = caps[0]
            self.assertTrue(c["decides"], s["verdict_text"])
            self.assertTrue(c["path"].startswith("caps" + os.sep + "step-"), c)
            self.assertIn(c["replay"], s["verdict_text"])
            out = subprocess.run([exe, "replay", c["path"], "--format", "json"], capture_output=True, text=True)
            self.assertEqual(out.returncode, 1, out.stderr)  # a failure reproduced
            r = json.loads(out.stdout)
            self.assertEqual((r["verdict"], r["capture"]["step"]), ("forward-overflow", c["step"]), r["verdict_text"])
            self.assertEqual(r["culprit"]["module"], "4")
            self.assertEqual(fp16audit.replay(c["path"], progress=False).verdict, "forward-overflow")
        finally:
            os.chdir(cwd)

    def test_keep_fp32_verified(self):
        """A gradient failure's modules kept in fp32, verified by the replay's rerun, and by PyTorch with autocast off
        around them: 12 Linear+Sigmoid layers whose first layers' gradients vanish below fp16 at 2^16, which bf16's 8
        bits do not keep either."""

        class DeepMLP(nn.Module):
            def __init__(self, width=32, depth=12):
                super().__init__()
                self.layers = nn.Sequential()
                for i in range(depth):
                    self.layers.add_module("fc%d" % i, nn.Linear(width, width))
                    self.layers.add_module("act%d" % i, nn.Sigmoid())
                self.head = nn.Linear(width, 4)

            def forward(self, x):
                return self.head(self.layers(x))

        torch.manual_seed(5)
        model = DeepMLP()
        g = torch.Generator().manual_seed(6)
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)
        rec = fp16audit.AmpRecorder(os.path.join(self.tmp, "run.jsonl"), torch.amp.GradScaler("cpu"), model,
                                    optimizer=torch.optim.SGD(model.parameters(), lr=0.01), loss_func=nn.CrossEntropyLoss(),
                                    capture=os.path.join(self.tmp, "caps"))
        with rec:
            rec.capture_now()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(x).float(), y)
            rec.before_step(loss, batch=(x, y))
        r = fp16audit.replay(rec.captures[0].path, progress=False)
        self.assertEqual(r.verdict, "underflow", r.verdict_text)
        fixes = {(f["kind"], f["verified"]): f for f in r.fixes}
        keep = fixes[("keep-fp32", "one-step")]
        self.assertTrue(keep["works"], keep["summary"])
        self.assertIn("layers.fc0", keep["modules"])
        self.assertFalse(fixes[("bf16", "one-step")]["works"])

        # PyTorch's truth: the same step at 2^16, autocast off around the kept modules
        def lost(kept):
            mods = dict(model.named_modules())
            hooks = []
            for name in kept:
                def pre(mod, inp):
                    mod._fp32 = torch.autocast("cpu", enabled=False)
                    mod._fp32.__enter__()
                    return tuple(i.float() for i in inp)

                def post(mod, inp, out):
                    mod._fp32.__exit__(None, None, None)
                hooks += [mods[name].register_forward_pre_hook(pre), mods[name].register_forward_hook(post)]
            grads = {}
            for scale, amp in ((1.0, False), (2.0 ** 16, True)):
                model.zero_grad()
                with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
                    out = nn.functional.cross_entropy(model(x).float(), y)
                (out * scale).backward()
                grads[amp] = {n: p.grad.detach().float() / scale for n, p in model.named_parameters()}
            for h in hooks:
                h.remove()
            return max(float((grads[True][n] - g32).norm() / g32.norm()) for n, g32 in grads[False].items() if g32.norm() > 0)

        self.assertGreater(lost(()), 0.01)
        self.assertLess(lost(keep["modules"]), 0.01)

    def test_weight_past_fp16_is_the_culprit(self):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        with torch.no_grad():
            model[2].weight[1, 3] = 70000.0  # a weight that outgrew fp16
        x = torch.rand(8, 8) * 1e-3
        y = torch.randint(0, 4, (8,))
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        self.assertFalse(bool(torch.isfinite(out).all()), "PyTorch's CPU autocast casts the weight to fp16: Inf")
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        rec = fp16audit.AmpRecorder(os.path.join(self.tmp, "run.jsonl"), torch.amp.GradScaler("cpu"), model, optimizer=opt,
                                    loss_func=nn.CrossEntropyLoss(), capture=os.path.join(self.tmp, "caps"))
        with rec:
            rec.capture_now()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(x).float(), y)
            rec.before_step(loss, batch=(x, y))
        path = rec.captures[0].path
        r = fp16audit.replay(path, progress=False)
        self.assertEqual(r.verdict, "forward-overflow", r.verdict_text)
        self.assertEqual((r.culprit["kind"], r.culprit["weight"]), ("weight", "2.weight"))
        self.assertIn("master weight", r.verdict_text)

    def test_fastai_stops_at_the_capture(self):
        support.require_fastai()
        from fastai.callback.fp16 import MixedPrecision
        from fastai.data.core import DataLoaders
        from fastai.data.load import DataLoader
        from fastai.learner import Learner
        from fastai.optimizer import Adam

        from fp16audit.fastai_callback import Fp16AuditCallback

        class CPUMixedPrecision(MixedPrecision):
            def before_fit(self):
                super().before_fit()
                self.autocast = torch.autocast("cpu", dtype=torch.float16)
                self.learn.scaler = torch.amp.GradScaler("cpu", **self.kwargs)

        X, y = regression()
        ds = list(zip(X, y))
        dls = DataLoaders(DataLoader(ds, bs=32), DataLoader(ds[:64], bs=32), device="cpu")
        cb = Fp16AuditCallback(os.path.join(self.tmp, "run.jsonl"), every=10,
                               capture=Capture(os.path.join(self.tmp, "caps"), on_event="stop", backoffs_in_a_row=None, scale_floor=None))
        learn = Learner(dls, growth_model(), loss_func=nn.L1Loss(), opt_func=Adam, cbs=[CPUMixedPrecision(), cb])
        with warnings.catch_warnings(), learn.no_bar(), learn.no_logging():
            warnings.simplefilter("ignore")
            learn.fit(6, lr=0.05)
        self.assertEqual([e.trigger for e in cb.captures], ["nonfinite-loss"])
        path = cb.captures[0].path
        with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
            m = json.load(f)
        self.assertEqual((m["trainer"], m["precision"]["autocast_device"]), ("fastai", "cpu"))
        with open(os.path.join(path, "state", "optimizer.json"), encoding="utf-8") as f:
            self.assertEqual(json.load(f)["kind"], "fastai")
        with open(os.path.join(self.tmp, "run.jsonl"), encoding="utf-8") as f:
            kinds = [json.loads(x)["kind"] for x in f]
        # the fit stopped at the capture: no step after it, then after_fit's end line
        self.assertEqual(kinds[-2:], ["capture", "end"])
        r = fp16audit.replay(path, learn=learn, steps=10, progress=False)
        self.assertEqual(r.verdict, "forward-overflow", r.verdict_text)
        runs = {x["fix"]: x for x in r.continuations["runs"]}
        self.assertEqual(runs["fp32"]["outcome"], "finite", runs["fp32"])
