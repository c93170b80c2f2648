"""How fp16audit.audit() exports (issue 41), on real torch models, the real binary and ONNX Runtime.

- Trained BatchNorm is not folded away: CNNs whose raw convolution output
  passes 65504 while their trained BatchNorm brings it back
  (fixtures/torch/cases_trained.py, rebuilt here) are overflowing-op at
  the convolution, as PyTorch's truth beside the fixtures says, with
  either exporter; an eval-mode export folds BatchNorm into the Conv and
  hides it (that fixture is the known failure).
- The batch axis is per input: a recurrent model called with its state,
  a sequence-first model (fixtures/torch/cases_stateful.py) audit as
  PyTorch runs them, with the batch axes the fixtures were exported with;
  the user can say them; a hint the front door made up never ends the
  audit.
- Errors keep their cause and give advice that can still work; the
  exporters' narration never reaches the notebook.
- An export is reused while the model is unchanged, and only then.

The truth of each fixture is PyTorch's (the oracle's CUDA autocast
emulation; on torch 2.x also its real CPU autocast fp16 run). On torch 1.13
the TorchScript family's truth applies, on torch 2.x the dynamo family's.
"""

import importlib
import json
import os
import sys
import unittest

import support  # noqa: F401  (puts python/ on sys.path)
import torch
from torch import nn

import fp16audit

audit_mod = importlib.import_module("fp16audit.audit")
exp_mod = importlib.import_module("fp16audit._export")
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(HERE)), "fixtures", "torch")
sys.path.insert(0, FIXTURES)
sys.dont_write_bytecode = True  # no __pycache__ beside the fixtures

import cases_stateful  # noqa: E402
import cases_trained  # noqa: E402

TORCH2 = exp_mod.has_dynamo(torch)


def truth(family, case):
    """PyTorch's truth for a fixture of this torch's family."""
    with open(os.path.join(FIXTURES, family + ("_dynamo" if TORCH2 else ""), case, "truth.json"), encoding="utf-8") as f:
        return json.load(f)


def tensors(arrays):
    return tuple(torch.from_numpy(a) for a in arrays)


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


class Exports:
    """Counts audit's exports (the real ones run)."""

    def __init__(self):
        self.n = 0
        self.real = exp_mod.export

    def __enter__(self):
        def counted(*a, **k):
            self.n += 1
            return self.real(*a, **k)
        exp_mod.export = counted
        return self

    def __exit__(self, *exc):
        exp_mod.export = self.real


class TrainedBatchNormTest(unittest.TestCase):
    def test_the_overflow_a_fold_would_hide_is_found_at_the_convolution(self):
        for name, (_, _, conv, _, _) in cases_trained.SPECS.items():
            with self.subTest(name):
                m, batch = cases_trained.model(name)
                want = truth("cases_trained", name)["policies"]["autocast-fp16"]
                self.assertEqual((want["verdict"], want["origin_module"]), ("overflowing-op", conv))
                before = state(m)
                r = fp16audit.audit(m, tensors(batch), progress=False)
                self.assertEqual(r.verdict, want["verdict"], r.verdict_text)
                self.assertEqual(r.modules[0], want["origin_module"])
                self.assertFalse(m.training)
                for k, v in m.state_dict().items():
                    self.assertTrue(torch.equal(v, before[k]), k)  # the trained statistics too
                if TORCH2:
                    # PyTorch's own CPU autocast, real fp16 kernels: Inf at that conv
                    cpu = truth("cases_trained", name)["extra"]["cpu_autocast_fp16"]
                    self.assertEqual((cpu["outputs_finite"], cpu["first_nonfinite_module"]), (False, conv))
                    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
                        self.assertFalse(bool(torch.isfinite(m(*tensors(batch))).all()))

    def test_the_dynamo_exporter_keeps_batchnorm_too(self):
        support.torch2_only(self, "no dynamo exporter")
        m, batch = cases_trained.model("trained_bn_resnet")
        r = fp16audit.audit(m, tensors(batch), exporter="dynamo", progress=False)
        self.assertEqual(r.exporter, "dynamo")
        self.assertEqual((r.verdict, r.modules[0]), ("overflowing-op", "conv1"), r.verdict_text)

    def test_half_and_bf16_as_pytorch_says(self):
        m, batch = cases_trained.model("trained_bn_cnn")
        t = truth("cases_trained", "trained_bn_cnn")["policies"]
        for policy in ("half", "autocast-bf16"):
            r = fp16audit.audit(m, tensors(batch), policy=policy, progress=False)
            self.assertEqual(r.verdict, t[policy]["verdict"], "%s: %s" % (policy, r.verdict_text))
            if t[policy]["origin_module"]:
                self.assertEqual(r.modules[0], t[policy]["origin_module"])


class BatchAxesTest(unittest.TestCase):
    def test_stateful_and_sequence_first_models_audit_as_pytorch_runs_them(self):
        for name in cases_stateful.SPECS:
            with self.subTest(name):
                m, arrays = cases_stateful.model(name)
                want = truth("cases_stateful", name)["policies"]["autocast-fp16"]
                r = fp16audit.audit(m, tensors(arrays), progress=False)
                self.assertEqual(r.verdict, want["verdict"], r.verdict_text)
                if want["origin_module"]:
                    self.assertEqual(r.modules[0], want["origin_module"])
                # the axes the fixture was exported with are the ones inferred
                axes = {n: next(iter(d)) for n, d in cases_stateful.axes(name).items()}
                self.assertEqual(r.batch_axes, axes, r.exporter_note)

    def test_images_into_a_sequence_first_layer_keep_their_batch_first(self):
        class ConvAttention(nn.Module):
            # DETR's way: conv features as a (HW, B, C) sequence
            def __init__(self):
                super().__init__()
                torch.manual_seed(0)
                self.conv, self.attn, self.head = nn.Conv2d(3, 16, 3, padding=1), nn.MultiheadAttention(16, 2), nn.Linear(16, 4)

            def forward(self, x):
                f = self.conv(x).flatten(2).permute(2, 0, 1)
                return self.head(self.attn(f, f, f)[0].mean(0))

        r = fp16audit.audit(ConvAttention().eval(), torch.randn(2, 3, 8, 8), progress=False)
        self.assertEqual(r.verdict, "healthy", r.verdict_text)
        self.assertEqual(r.batch_axes, {"x": 0, "output": 0}, r.exporter_note)

    def test_the_user_says_the_batch_axes(self):
        m, arrays = cases_stateful.model("lstm_state_overflow")
        r = fp16audit.audit(m, tensors(arrays), batch_axes={"h0": 1, "c0": 1}, progress=False)
        self.assertEqual(r.verdict, "overflowing-op", r.verdict_text)
        self.assertEqual(r.batch_axes["h0"], 1)
        r = fp16audit.audit(m, tensors(arrays), dynamic_axes={"x": {0: "batch"}, "h0": {1: "batch"}, "c0": {1: "batch"}},
                            progress=False)
        self.assertEqual(r.modules[0], "proj", r.verdict_text)
        with self.assertRaisesRegex(fp16audit.BatchError, r"axes of different sizes \(x axis 0: 4, h0 axis 0: 2, c0 axis 0: 2\)"):
            fp16audit.audit(m, tensors(arrays), batch_axes=0, progress=False)
        with self.assertRaisesRegex(ValueError, r"batch_axes names 'hx', which is not among the inputs \(x, h0, c0\)"):
            fp16audit.audit(m, tensors(arrays), batch_axes={"hx": 1}, progress=False)

    def test_an_inferred_hint_that_is_refused_does_not_end_the_audit(self):
        support.torch2_only(self, "no dynamo exporter")

        class FixedBatch(nn.Module):
            # the batch size written into the model: torch.export refuses a
            # dynamic batch axis
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def forward(self, x):
                return self.fc(x).reshape(4, 2, 4).sum(1)

        r = fp16audit.audit(FixedBatch().eval(), torch.randn(4, 8), exporter="dynamo", progress=False)
        self.assertEqual(r.verdict, "healthy", r.verdict_text)
        self.assertIn("the dynamic axes the audit inferred were refused", r.exporter_note)
        self.assertIn("exported with static shapes", r.exporter_note)
        self.assertIn("static shape of 4", r.exporter_note)  # torch's own reason

    def test_a_failure_in_the_binary_says_what_the_front_door_assumed(self):
        m, arrays = cases_stateful.model("gru_state_seqfirst")
        with self.assertRaises(fp16audit.AuditError) as cm:
            fp16audit.audit(m, tensors(arrays), extra_args=["--max-memory", "1K"], progress=False)
        msg = str(cm.exception)
        self.assertIn("--max-memory", msg)
        self.assertIn("batch axes x 1, h0 1, output 0", msg)
        self.assertIn("dynamic axes: x 1=batch; h0 1=batch; output 0=batch", msg)
        self.assertIn("batch_axes=", msg)


class ErrorsTest(unittest.TestCase):
    def test_an_assert_is_not_a_branch_and_no_site_points_into_torch(self):
        class Checked(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 4)

            def forward(self, x):
                torch._assert((x.abs() < 1e6).all(), "inputs out of range")
                return self.fc(x)

        r = fp16audit.audit(Checked().eval(), torch.randn(4, 8), progress=False)
        self.assertEqual(r.exporter, "torchscript")
        self.assertNotIn("torch/__init__.py", r.exporter_note)
        self.assertNotIn("Python bool", r.exporter_note)

    def test_a_branch_inside_a_helper_is_named_at_the_users_line(self):
        def helper(x):
            if x.mean() > 0:
                return x
            return -x

        class Branchy(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 4)

            def forward(self, x):
                return self.fc(helper(x))

        r = fp16audit.audit(Branchy().eval(), torch.randn(4, 8), exporter="torchscript", progress=False)
        self.assertIn("test_export.py", r.exporter_note)
        self.assertIn("if x.mean() > 0", r.exporter_note)

    def test_a_condition_on_sizes_is_not_a_branch_on_a_value(self):
        class Padded(nn.Module):
            # pads by its input's size, as torchvision's Swin does, and
            # branches on a value of its integer input
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(6, 4)

            def forward(self, x, ids):
                pad = x.shape[1] % 3
                if pad > 0:
                    x = torch.nn.functional.pad(x, (0, 3 - pad))
                n = ids.max()
                if n > 5:
                    x = x * 2
                return self.fc(x)

        r = fp16audit.audit(Padded().eval(), (torch.randn(4, 4), torch.randint(0, 9, (4, 3))), exporter="torchscript",
                            progress=False)
        self.assertIn("if n > 5", r.exporter_note)
        self.assertNotIn("if pad > 0", r.exporter_note)
        # the trace reads ids only in that branch: the export has no such input
        self.assertIn("input 'ids' is not in the export", r.exporter_note)

    def test_an_input_the_model_does_not_read(self):
        class Unread(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 4)

            def forward(self, x, mask):
                return self.fc(x)

        r = fp16audit.audit(Unread().eval(), (torch.randn(4, 8), torch.ones(4, 8)), progress=False)
        self.assertEqual(r.verdict, "healthy", r.verdict_text)
        self.assertEqual([i["name"] for i in r.json["inputs"]], ["x"])

    def test_the_exporters_narration_never_reaches_the_notebook(self):
        # a notebook shows what is written to the process's stdout and
        # stderr descriptors, C++'s included: torch 2.x's TorchScript
        # exporter dumps the graph it was building there when it fails
        out, err = support_python("""
            import torch, fp16audit
            from torch import nn
            class Eigen(nn.Module):
                def forward(self, x):
                    return torch.linalg.eigh(x @ x.transpose(-1, -2))[0]
            try:
                fp16audit.audit(Eigen(), torch.randn(4, 4, 4), progress=False)
            except fp16audit.ExportError as e:
                print("ExportError")
        """)
        self.assertEqual(out.strip(), "ExportError")
        for text in ("ONNX graph being constructed", "Torch IR graph", "Traceback", "torch.onnx", "Warning"):
            self.assertNotIn(text, out + err)


def support_python(code):
    """Run code in a fresh interpreter; (stdout, stderr)."""
    import subprocess
    import textwrap

    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        raise AssertionError("exit %d:\n%s\n%s" % (p.returncode, p.stdout, p.stderr))
    # the one line a session without CUDA is told, by design
    err = "\n".join(ln for ln in p.stderr.splitlines() if not ln.startswith("fp16audit: this machine has no CUDA"))
    return p.stdout, err


class ReuseTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
        self.x = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))

    def test_a_second_policy_reuses_the_export(self):
        calls = []
        self.m.register_forward_pre_hook(lambda mod, inp: calls.append(1))
        with Exports() as e:
            r1 = fp16audit.audit(self.m, self.x, progress=False)
            first = len(calls)
            r2 = fp16audit.audit(self.m, self.x, policy="autocast-bf16", progress=False)
            r3 = fp16audit.audit(self.m, self.x, policy="half", progress=False)
        self.assertEqual(e.n, 1)
        self.assertGreater(first, 0)
        self.assertEqual(len(calls), first)  # a reused export runs the model no more
        self.assertNotIn("reused", r1.exporter_note)
        self.assertIn("reused", r2.exporter_note)
        self.assertEqual([r.verdict for r in (r1, r2, r3)], ["healthy"] * 3)

    def test_any_change_to_the_model_exports_again(self):
        m, x = self.m, self.x
        fp16audit.audit(m, x, progress=False)
        changes = [
            ("a weight changed in place", lambda: m[2].weight.mul_(1e5)),
            ("a weight changed through .data (its _version stays)", lambda: m[0].weight.data.mul_(2)),
            ("a forward hook", lambda: m[0].register_forward_hook(lambda mod, i, o: o * 2)),
            ("an attribute forward may read", lambda: setattr(m[1], "inplace", True)),
            ("a module replaced", lambda: m.__setitem__(1, nn.GELU())),
        ]
        for what, change in changes:
            with self.subTest(what):
                with torch.no_grad():
                    change()
                with Exports() as e:
                    r = fp16audit.audit(m, x, progress=False)
                self.assertEqual(e.n, 1, what)
                self.assertNotIn("reused", r.exporter_note)
        # the audit sees the model as it is now: head's weights are 1e5x
        self.assertEqual(r.verdict, "oversized-logits", r.verdict_text)
        with Exports() as e:
            fp16audit.audit(m, x, progress=False)
            fp16audit.audit(m, x, cache=False, progress=False)
        self.assertEqual(e.n, 1)

    def test_another_batch_shape_exports_again(self):
        with Exports() as e:
            fp16audit.audit(self.m, self.x, progress=False)
            fp16audit.audit(self.m, self.x[:4], progress=False)
        self.assertEqual(e.n, 2)


if __name__ == "__main__":
    unittest.main()
