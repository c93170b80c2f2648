"""The notebook's rough edges (issue 34), on real torch, fastai and ONNX Runtime.

- `import fp16audit` alone adds learn.fp16audit(), whichever is imported
  first, and imports neither torch nor fastai itself;
- a machine without CUDA is told once that fp16 was emulated, a fit the
  preflight stops hears nothing of CUDA, and the fixes name the
  device_type the model runs on;
- fastai learners export with the TorchScript exporter (training mode:
  BatchNorm with the batch's statistics), the dynamo exporter on request
  with the reason it may be wrong said;
- a projection cast to fp16 by the model itself and overflowing in the
  op right after the cast is explicit-half-cast;
- bad input from a notebook: a model that branches on a tensor's value, a
  batch of the wrong shape, batches whose sequence length differs, a
  model on the meta device, a batch that requires grad, a DataLoader of
  dicts. Each either works or raises an error that says what to do, and
  the model is left as it was.

Some behaviours exist only on torch 2.x (the dynamo exporter, CPU fp16
matmuls): on torch 1.13 those tests are skipped, and in the torch 2.x
leg of CI (FP16AUDIT_TEST_LEG=torch2, `make test-torch2`) a skip fails.
"""

import os
import subprocess
import sys
import textwrap
import unittest
import warnings

import support
import torch
from torch import nn
from torch.nn import functional as F

import fp16audit

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_DYNAMO = "dynamo" in __import__("inspect").signature(torch.onnx.export).parameters


def torch2_only(why):
    """Skip on torch 1.x, but fail in the torch 2.x leg."""
    if int(torch.__version__.split(".")[0]) >= 2 and HAS_DYNAMO:
        return
    msg = "torch %s: %s" % (torch.__version__, why)
    if os.environ.get("FP16AUDIT_TEST_LEG") == "torch2":
        raise AssertionError("the torch 2.x leg must run this test: " + msg)
    raise unittest.SkipTest(msg)


def python(code, env=None):
    """Run code in a fresh interpreter (this one's), with the package
    from the checkout; returns (stdout, stderr)."""
    e = dict(os.environ, PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.update(env or {})
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e, timeout=600)
    if p.returncode != 0:
        raise AssertionError("exit %d:\n%s\n%s" % (p.returncode, p.stdout, p.stderr))
    return p.stdout, p.stderr


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_unchanged(test, model, before, training):
    test.assertEqual(model.training, training)
    after = model.state_dict()
    test.assertEqual(set(after), set(before))
    for k, v in before.items():
        test.assertTrue(torch.equal(after[k], v), k)


class Overflow(nn.Module):
    """fc2's output passes 65504 on standard inputs: an overflowing op,
    whose keep-fp32 fix names the autocast device."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.head = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)
        with torch.no_grad():
            self.fc2.weight.mul_(1e5)

    def forward(self, x):
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))) * 1e-4)


class ImportTest(unittest.TestCase):
    def setUp(self):
        support.require_fastai()

    def test_import_fp16audit_is_enough_in_either_order(self):
        for code in ("import fp16audit\nfrom fastai.learner import Learner",
                     "from fastai.learner import Learner\nimport fp16audit",
                     "import fp16audit\nfrom fastai.tabular.all import Learner"):
            out, _ = python(code + "\nprint(hasattr(Learner, 'fp16audit'), callable(getattr(Learner, 'fp16audit', None)))",
                            env={"PYTHONWARNINGS": "ignore"})
            self.assertEqual(out.split(), ["True", "True"], code)

    def test_import_alone_loads_neither_torch_nor_fastai(self):
        # nor any trainer whose adapter fp16audit has
        out, _ = python("import sys, fp16audit\n"
                        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'fastai', 'numpy', 'transformers', 'lightning', "
                        "'pytorch_lightning', 'accelerate', 'peft', 'trl'}))")
        self.assertEqual(out.strip(), "[]")


class CPUSessionTest(unittest.TestCase):
    def setUp(self):
        if torch.cuda.is_available():
            self.skipTest("this machine has CUDA: the CPU-only note is not given")

    def test_the_emulation_is_said_once_and_in_every_report(self):
        out, err = python("""
            import torch, fp16audit
            from torch import nn
            m = nn.Linear(8, 4)
            for _ in range(2):
                r = fp16audit.audit(m, torch.randn(4, 8), progress=False)
                print(any("no CUDA" in n for n in r.notes), "no CUDA" in str(r))
        """)
        self.assertEqual(out.split(), ["True", "True", "True", "True"])
        self.assertEqual(err.count("fp16audit: this machine has no CUDA: fp16 was emulated"), 1, err)
        self.assertIn("the verdict holds for the same model and batches on a GPU", err)

    def test_fixes_name_the_device_the_model_runs_on(self):
        m = Overflow().eval()
        x = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
        for kw, want in (({}, "cpu"), ({"device_type": "cuda"}, "cuda")):
            r = fp16audit.audit(m, x, progress=False, **kw)
            self.assertEqual(r.verdict, "overflowing-op", r.verdict_text)
            keep = [f for f in r.fixes if f["kind"] == "keep-fp32"][0]
            self.assertTrue(keep["works"], keep)
            self.assertIn('torch.autocast(device_type="%s", enabled=False)' % want, keep["summary"])


class FastaiTest(support.TempDirMixin, unittest.TestCase):
    def setUp(self):
        super().setUp()
        support.require_fastai()

    def learner(self, bn):
        from fastai.callback.fp16 import MixedPrecision  # noqa: F401  (adds Learner.to_fp16)
        from fastai.data.core import DataLoaders
        from fastai.learner import Learner
        from fastai.losses import CrossEntropyLossFlat

        g = torch.Generator().manual_seed(0)
        ds = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 4, (64,), generator=g))
        dls = DataLoaders.from_dsets(ds, ds, bs=16, num_workers=0)
        torch.manual_seed(0)
        layers = [nn.Linear(8, 16)] + ([nn.BatchNorm1d(16)] if bn else []) + [nn.ReLU(), nn.Linear(16, 4)]
        return Learner(dls, nn.Sequential(*layers), loss_func=CrossEntropyLossFlat()).to_fp16()

    def test_a_learner_exports_with_torchscript(self):
        learn = self.learner(bn=False)
        r = learn.fp16audit(progress=False)
        self.assertEqual(r.verdict, "healthy", r.verdict_text)
        self.assertEqual(r.training["mode"], "train")
        self.assertEqual(r.exporter, "torchscript", r.exporter_note)

    def test_a_learner_with_batchnorm_asked_for_dynamo_says_why_not(self):
        learn = self.learner(bn=True)
        before, training = state(learn.model), learn.model.training
        r = learn.fp16audit(progress=False)
        self.assertEqual(r.exporter, "torchscript")
        self.assertEqual(r.exporter_note, "")
        assert_unchanged(self, learn.model, before, training)
        torch2_only("no dynamo exporter")
        r = learn.fp16audit(progress=False, exporter="dynamo")
        self.assertEqual(r.exporter, "dynamo")
        self.assertIn("the model has BatchNorm layers (1)", r.exporter_note)  # by module path
        assert_unchanged(self, learn.model, before, training)

    def test_a_learners_fixes_name_cuda(self):
        learn = self.learner(bn=False)
        with torch.no_grad():
            learn.model[0].weight.mul_(1e5)
        r = learn.fp16audit(loss=False, progress=False)
        self.assertEqual(r.verdict, "overflowing-op", r.verdict_text)
        keep = [f for f in r.fixes if f["kind"] == "keep-fp32"]
        self.assertTrue(keep and 'torch.autocast(device_type="cuda", enabled=False)' in keep[0]["summary"], r.fixes)

    def test_a_cancelled_fit_says_nothing_of_cuda(self):
        # The preflight runs before MixedPrecision sets up autocast and the
        # GradScaler: a fit it stops never hears them say, on a machine
        # without CUDA, that they disable themselves.
        from fp16audit.fastai import FP16Preflight

        if torch.cuda.is_available():
            self.skipTest("this machine has CUDA")
        learn = self.learner(bn=False)
        with torch.no_grad():
            learn.model[0].weight.mul_(1e5)
        with learn.no_bar(), learn.no_logging(), warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            pre = FP16Preflight(n_batches=1, loss=False, progress=False)
            learn.fit(1, cbs=pre)
        self.assertEqual(pre.report.verdict, "overflowing-op")
        self.assertEqual([str(x.message) for x in w if "CUDA" in str(x.message)], [])
        # a fit the preflight lets through sets them up as usual
        learn = self.learner(bn=False)
        with learn.no_bar(), learn.no_logging(), warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            learn.fit(1, cbs=FP16Preflight(n_batches=1, loss=False, progress=False))
        self.assertTrue(any("CUDA" in str(x.message) for x in w), [str(x.message) for x in w])


class HalfProjection(nn.Module):
    """h = fc1(x).half(), then fc2 written in fp16 by the model itself:
    F.linear(h, fc2.weight.half(), fc2.bias.half()) passes 65504."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.head = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            f = 300.0 / float(self.fc1(x).abs().max())
            self.fc1.weight.mul_(f), self.fc1.bias.mul_(f)
            f = 1.2e5 / float(F.linear(self.fc1(x), self.fc2.weight, self.fc2.bias).abs().max())
            self.fc2.weight.mul_(f), self.fc2.bias.mul_(f)
        self.x = x

    def forward(self, features):
        h = self.fc1(features).half()
        y = F.linear(h, self.fc2.weight.half(), self.fc2.bias.half())
        return self.head(torch.layer_norm(y.to(self.head.weight.dtype), (32,)))


class ExplicitCastTest(unittest.TestCase):
    def test_the_op_right_after_the_models_cast(self):
        torch2_only("torch 1.13's CPU has no fp16 matmul, so the model does not run here")
        m = HalfProjection().eval()
        for policy in ("autocast-fp16", "half"):
            r = fp16audit.audit(m, m.x, policy=policy, progress=False)
            self.assertEqual(r.verdict, "explicit-half-cast", "%s: %s" % (policy, r.verdict_text))
            self.assertIn("explicit-cast", r.origins[0]["provenance"]["reasons"])
        r = fp16audit.audit(m, m.x, policy="autocast-bf16", progress=False)
        self.assertEqual(r.verdict, "healthy", r.verdict_text)


class Branchy(nn.Module):
    """forward branches on a value: if x.mean() > 0."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        if x.mean() > 0:
            return self.a(x)
        return self.b(x)


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head = nn.Embedding(64, 16), nn.Linear(16, 3)

    def forward(self, input_ids, attention_mask):
        h = self.emb(input_ids) * attention_mask[..., None].to(torch.float32)
        return self.head(h.sum(1) / attention_mask.sum(1, keepdim=True).clamp(min=1))


def token_batch(n, t, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 64, (n, t), generator=g)
    mask = torch.ones(n, t, dtype=torch.int64)
    mask[0, t // 2:] = 0
    return ids, mask, torch.randint(0, 3, (n,), generator=g)


class BadInputTest(unittest.TestCase):
    def test_a_branch_on_a_value(self):
        m = Branchy().eval()
        before = state(m)
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
        if HAS_DYNAMO:
            with self.assertRaises(fp16audit.ExportError) as cm:
                fp16audit.audit(m, x, progress=False)
            msg = str(cm.exception)
            self.assertIn("branches on a tensor's value", msg)
            self.assertIn("test_notebook.py", msg)
            self.assertIn("if x.mean() > 0", msg)
            self.assertIn("torch.where", msg)
            self.assertIn("exporter='torchscript'", msg)
            assert_unchanged(self, m, before, False)
            r = fp16audit.audit(m, x, exporter="torchscript", progress=False)
        else:
            r = fp16audit.audit(m, x, progress=False)
        self.assertEqual(r.exporter, "torchscript")
        self.assertIn("only the branch this batch takes", r.exporter_note)
        self.assertIn("if x.mean() > 0", r.exporter_note)
        assert_unchanged(self, m, before, False)

    def test_a_batch_of_the_wrong_shape(self):
        m = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
        before = state(m)
        with self.assertRaisesRegex(fp16audit.BatchError, r"does not run on the batch \(inputs input \(4, 8\) float32\)"):
            fp16audit.audit(m, torch.randn(4, 8), progress=False)
        loader = iter([torch.randn(4, 16), torch.randn(4, 16, 1)])  # a DataLoader whose batches change rank
        with self.assertRaisesRegex(fp16audit.BatchError, r"batch 1's input 'input' is \(4, 16, 1\) float32, batch 0's is \(4, 16\) float32"):
            fp16audit.audit(m, loader, progress=False)
        assert_unchanged(self, m, before, False)

    def test_batches_padded_to_their_own_length(self):
        m = Tokens().eval()
        b0, b1 = token_batch(4, 12, 0), token_batch(4, 16, 1)
        r = fp16audit.audit(m, iter([b0[:2], b1[:2]]), n_inp=2, progress=False)
        self.assertEqual(r.verdict, "healthy", r.verdict_text)
        self.assertEqual([b["shapes"] for b in r.json["batches"]], [["input_ids[4,12]", "attention_mask[4,12]"], ["input_ids[4,16]", "attention_mask[4,16]"]])

    def test_a_model_on_the_meta_device(self):
        m = nn.Sequential(nn.Linear(8, 4, device="meta"), nn.ReLU(), nn.Linear(4, 2, device="meta"))
        with self.assertRaises(fp16audit.ModelError) as cm:
            fp16audit.audit(m, torch.randn(2, 8), progress=False)
        msg = str(cm.exception)
        self.assertIn("meta device", msg)
        self.assertIn("0.weight", msg)
        self.assertIn("load_state_dict", msg)
        self.assertTrue(all(p.is_meta for p in m.parameters()))

    def test_a_batch_that_requires_grad(self):
        m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        before = state(m)
        x = torch.randn(4, 8, requires_grad=True)
        y = torch.randint(0, 2, (4,))
        r = fp16audit.audit(m, (x, y), n_inp=1, loss=nn.CrossEntropyLoss(), progress=False)
        self.assertEqual(r.verdict, "healthy", r.verdict_text)
        self.assertEqual(r.training["mode"], "train")
        self.assertTrue(x.requires_grad)
        self.assertIsNone(x.grad)
        self.assertTrue(all(p.grad is None for p in m.parameters()))
        assert_unchanged(self, m, before, True)

    def test_a_dataloader_of_dicts(self):
        m = Tokens().eval()
        before = state(m)
        # the keys in another order than forward's, and the labels beside
        # them, as a Hugging Face collator yields them
        ids, mask, y = token_batch(8, 12, 0)
        rows = [{"attention_mask": mask[i], "input_ids": ids[i], "labels": y[i]} for i in range(8)]
        loader = torch.utils.data.DataLoader(rows, batch_size=4)
        r = fp16audit.audit(m, loader, loss="cross-entropy", progress=False)
        self.assertEqual([i["name"] for i in r.json["inputs"]], ["input_ids", "attention_mask"])
        self.assertEqual(r.json["inputs"][0]["kind"], "tokens")
        self.assertEqual(r.training["mode"], "train")
        self.assertEqual(len(r.json["batches"]), 2)
        bad = {"input_ids": ids, "attention_mask": mask, "token_type_ids": ids * 0}
        with self.assertRaisesRegex(fp16audit.BatchError, r"'token_type_ids' is not a parameter of Tokens.forward\(input_ids, attention_mask\)"):
            fp16audit.audit(m, bad, progress=False)
        with self.assertRaisesRegex(fp16audit.BatchError, r"without 'input_ids'"):
            fp16audit.audit(m, {"attention_mask": mask}, progress=False)
        assert_unchanged(self, m, before, False)


if __name__ == "__main__":
    unittest.main()
