"""fp16audit.audit on real torch models through the real binary and ONNX Runtime.

The binary is the one `make build` writes (bin/fp16audit, found from the
source checkout) unless FP16AUDIT_BINARY names another; ONNX Runtime is the
onnxruntime package of the interpreter's environment (python/
requirements-test.txt), else the binary's own search (.ort/).
"""

import gc
import os
import signal
import stat
import tempfile
import time
import unittest

import support  # noqa: F401  (puts python/ on sys.path)
import torch
from torch import nn

import fp16audit
from fp16audit import _binary
import importlib

audit_mod = importlib.import_module("fp16audit.audit")


def stem_cnn(gain=400.0, seed=0):
    """A small CNN whose first conv responds strongly, as trained stem
    filters do: raw 0-255 pixels pass 65504 there, standardized ones do not."""
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    with torch.no_grad():
        m[0].weight.mul_(gain)
    return m


def raw_pixels(n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 16, 16), generator=g).float()


def standardized(x):
    return (x - x.mean((0, 2, 3), keepdim=True)) / x.std((0, 2, 3), keepdim=True)


class PrivateTemp:
    """A temporary folder of this test's own, as the one place where the
    audit and the binary it starts may write temporary files: Python's
    tempfile (tempfile.tempdir) and the child's TMPDIR point into it, so
    what is left there afterwards is this audit's, never another process's
    (colleagues' audits run in the shared /tmp at the same time).
    `entries()` lists what it holds."""

    def __enter__(self):
        self._dir = tempfile.TemporaryDirectory(prefix="fp16audit-test-private-")
        self.path = self._dir.name
        self._saved = tempfile.tempdir, os.environ.get("TMPDIR")
        tempfile.tempdir = self.path
        os.environ["TMPDIR"] = self.path
        return self

    def entries(self):
        out = []
        for root, dirs, files in os.walk(self.path):
            out += [os.path.relpath(os.path.join(root, n), self.path) for n in dirs + files]
        return sorted(out)

    def __exit__(self, *exc):
        tempfile.tempdir, tmpdir = self._saved
        if tmpdir is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = tmpdir
        self._dir.cleanup()
        return False


class AuditTest(unittest.TestCase):
    def test_raw_pixels_are_unnormalized_input_and_standardized_ones_healthy(self):
        m = stem_cnn()
        private = PrivateTemp().__enter__()
        self.addCleanup(private.__exit__)
        r = fp16audit.audit(m, raw_pixels(), progress=False)
        self.assertEqual(r.verdict, "unnormalized-input", r.verdict_text)
        self.assertFalse(r.ok)
        self.assertEqual(r.modules[0], "0")  # m[0], as getattr(m, "0")
        std = [f for f in r.fixes if f["kind"] == "standardize-inputs"]
        self.assertTrue(std and std[0]["works"], r.fixes)
        with self.assertRaises(fp16audit.AuditFailure):
            r.raise_for_failure()
        self.assertIn("unnormalized-input", str(r))
        self.assertIn("<html", r._repr_html_().lower())
        self.assertIn("unnormalized-input", repr(r))
        self.assertEqual(r.json["policy"], "autocast-fp16")
        ok = fp16audit.audit(m, standardized(raw_pixels()), progress=False)
        self.assertEqual(ok.verdict, "healthy", ok.verdict_text)
        self.assertIs(ok.raise_for_failure(), ok)
        # what stays is the export, kept for the next audit of m while m
        # lives (one: the second audit reused it), and it goes with m
        left = os.listdir(private.path)
        self.assertEqual(len(left), 1, left)
        self.assertTrue(all(e.startswith("fp16audit-export-") for e in left), left)
        self.assertIn("reused", ok.exporter_note)
        del m
        gc.collect()
        self.assertEqual(private.entries(), [], "audit left files in the temporary folder")

    def test_the_exporter_used_is_said(self):
        m, x = stem_cnn(gain=1.0), standardized(raw_pixels())
        r = fp16audit.audit(m, x, progress=False)
        self.assertEqual(r.exporter, "torchscript")  # the first choice: nothing to say
        self.assertEqual(r.exporter_note, "")
        if audit_mod._has_dynamo(torch):
            r = fp16audit.audit(m, x, exporter="dynamo", progress=False)
            self.assertEqual(r.exporter, "dynamo")
        else:
            with self.assertRaises(fp16audit.ExportError) as cm:
                fp16audit.audit(m, x, exporter="dynamo", progress=False)
            self.assertIn("no dynamo exporter", str(cm.exception))
            self.assertIn("torch >= 2.5", str(cm.exception))

    def test_batches_as_dict_tuple_and_dataloader(self):
        class TwoInputs(nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = nn.Linear(4, 3), nn.Linear(2, 3)

            def forward(self, features, meta):
                return self.a(features) + self.b(meta)

        torch.manual_seed(0)
        m = TwoInputs()
        f, meta = torch.randn(8, 4), torch.randn(8, 2)
        r = fp16audit.audit(m, {"features": f, "meta": meta}, progress=False)
        self.assertEqual([i["name"] for i in r.json["inputs"]], ["features", "meta"])
        r = fp16audit.audit(m, (f, meta), progress=False)
        self.assertEqual([i["name"] for i in r.json["inputs"]], ["features", "meta"])  # from forward's signature
        ds = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,)))
        loader = torch.utils.data.DataLoader(ds, batch_size=8)
        r = fp16audit.audit(nn.Linear(4, 3), loader, n_batches=3, progress=False)
        self.assertEqual(len(r.json["batches"]), 3)
        self.assertEqual(r.verdict, "healthy")

    def test_the_loss_audits_the_backward_and_the_model_is_left_as_it_was(self):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
        m.train()
        state = {k: v.clone() for k, v in m.state_dict().items()}
        x, y = torch.randn(8, 8), torch.randint(0, 3, (8,))
        r = fp16audit.audit(m, (x, y), n_inp=1, loss=nn.CrossEntropyLoss(), progress=False)
        self.assertEqual(r.training["mode"], "train")
        self.assertIsNotNone(r.training.get("backward"))
        self.assertTrue(m.training)
        for k, v in m.state_dict().items():
            self.assertTrue(torch.equal(v, state[k]), k)  # BatchNorm's running statistics too
        m.eval()
        fp16audit.audit(m, x, progress=False)
        self.assertFalse(m.training)

    def test_the_loss_applies_to_the_first_of_the_outputs_training_adds(self):
        # GoogLeNet and Inception return their auxiliary logits after the
        # logits in train mode only: the loss applies to the first output,
        # as the training loop's does, and the audit is not refused for
        # want of --loss-output
        class AuxHead(nn.Module):
            def __init__(self):
                super().__init__()
                self.body, self.head, self.aux = nn.Linear(8, 16), nn.Linear(16, 3), nn.Linear(16, 3)

            def forward(self, x):
                h = torch.relu(self.body(x))
                return (self.head(h), self.aux(h)) if self.training else self.head(h)

        torch.manual_seed(0)
        m = AuxHead()
        x, y = torch.randn(8, 8), torch.randint(0, 3, (8,))
        r = fp16audit.audit(m, (x, y), n_inp=1, loss="cross-entropy", progress=False)
        backward = r.training["backward"]
        self.assertEqual(backward["output"], "output")
        names = {p["name"] for p in backward["parameters"]}
        self.assertIn("head.weight", names)
        self.assertNotIn("aux.weight", names)  # no gradient reaches the auxiliary head

    def test_a_stochastic_depth_draws_the_same_in_every_backward_run(self):
        # torchvision's StochasticDepth (EfficientNet's, ConvNeXt's; timm's
        # DropPath alike) draws its row mask with torch's RNG, which the
        # exporters write as a random op: the backward's runs compared
        # different masks and called a healthy model backward-underflow.
        # With the draws fixed it audits as with the stochastic depth off.
        support.torch2_only(self, "its TorchScript exporter cannot write bernoulli_, which StochasticDepth calls")
        from torchvision.ops import StochasticDepth

        class Block(nn.Module):
            def __init__(self, p):
                super().__init__()
                self.conv, self.bn, self.depth = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), StochasticDepth(p, "row")

            def forward(self, x):
                return x + self.depth(torch.relu(self.bn(self.conv(x))))

        def model(p):
            torch.manual_seed(0)
            return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), Block(p), Block(p), Block(p), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                 nn.Linear(8, 4))

        x, y = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(1)), torch.arange(8) % 4
        verdicts = {}
        for p in (0.0, 0.5):
            r = fp16audit.audit(model(p), (x, y), n_inp=1, loss="cross-entropy", progress=False)
            verdicts[p] = r.training["backward"]["verdict"]
        self.assertEqual(verdicts[0.0], "healthy")
        self.assertEqual(verdicts[0.5], verdicts[0.0])

    def test_bad_batches_are_refused_with_what_was_found(self):
        m = stem_cnn()
        with self.assertRaisesRegex(fp16audit.BatchError, r"does not run on the batch .*input \(4, 16, 16\)"):
            fp16audit.audit(m, raw_pixels()[:, 0], progress=False)
        with self.assertRaisesRegex(fp16audit.BatchError, "str"):
            fp16audit.audit(m, ["pixels"], progress=False)
        with self.assertRaisesRegex(fp16audit.BatchError, "empty"):
            fp16audit.audit(m, raw_pixels()[:0], progress=False)
        with self.assertRaisesRegex(fp16audit.BatchError, "needs a target"):
            fp16audit.audit(m, raw_pixels(), loss="cross-entropy", progress=False)
        with self.assertRaisesRegex(ValueError, "policy"):
            fp16audit.audit(m, raw_pixels(), policy="fp8")

    def test_a_model_no_exporter_can_write_says_which_and_what_to_try(self):
        class Eigen(nn.Module):
            # runs in PyTorch; no exporter has linalg_eigh
            def forward(self, x):
                return torch.linalg.eigh(x @ x.transpose(-1, -2))[0]

        with self.assertRaises(fp16audit.ExportError) as cm:
            fp16audit.audit(Eigen(), torch.randn(4, 4, 4), progress=False)
        msg = str(cm.exception)
        self.assertIn("torchscript: UnsupportedOperatorError: Exporting the operator 'aten::linalg_eigh'", msg)
        self.assertIn("the model uses torch's linalg_eigh, which", msg)
        if audit_mod._has_dynamo(torch):
            self.assertIn("dynamo: DispatchError: No ONNX function found for <OpOverload(op='aten._linalg_eigh'", msg)
        # nothing that has just failed, nor a smaller batch: size is not the problem
        self.assertNotIn("exporter='torchscript'", msg)
        self.assertNotIn("exporter='dynamo'", msg)
        self.assertNotIn("smaller", msg)
        self.assertNotIn("Next steps", msg)

    def test_a_model_that_returns_no_tensor(self):
        class ReturnsAString(nn.Module):
            def forward(self, x):
                return "%.3f" % float(x.sum())

        with self.assertRaisesRegex(fp16audit.ExportError, r"ReturnsAString.forward returns a str, which holds no tensor"):
            fp16audit.audit(ReturnsAString(), torch.randn(2, 16), progress=False)

    def test_missing_and_foreign_binaries(self):
        saved = os.environ.get(_binary.BINARY_ENV)
        try:
            os.environ[_binary.BINARY_ENV] = "/nonexistent/fp16audit"
            with self.assertRaisesRegex(_binary.BinaryNotFound, "make wheel"):
                fp16audit.audit(stem_cnn(), raw_pixels(), progress=False)
            with tempfile.TemporaryDirectory() as tmp:
                foreign = os.path.join(tmp, "fp16audit")
                with open(foreign, "wb") as f:
                    f.write(b"\xcf\xfa\xed\xfe" + os.urandom(64))  # a Mach-O header: another platform's binary
                os.chmod(foreign, os.stat(foreign).st_mode | stat.S_IXUSR)
                os.environ[_binary.BINARY_ENV] = foreign
                with self.assertRaisesRegex(_binary.BinaryNotFound, "another platform"):
                    fp16audit.audit(stem_cnn(), raw_pixels(), progress=False)
        finally:
            if saved is None:
                os.environ.pop(_binary.BINARY_ENV, None)
            else:
                os.environ[_binary.BINARY_ENV] = saved

    def test_no_onnx_runtime_says_how_to_install_it(self):
        # the binary alone, in a folder with no .ort/ above it, in an
        # environment without onnxruntime
        with tempfile.TemporaryDirectory() as tmp:
            lone = os.path.join(tmp, "fp16audit")
            with open(_binary.find_binary(), "rb") as src, open(lone, "wb") as dst:
                dst.write(src.read())
            os.chmod(lone, 0o755)
            saved = {k: os.environ.get(k) for k in (_binary.BINARY_ENV, "ONNXRUNTIME_LIB", "VIRTUAL_ENV", "CONDA_PREFIX")}
            saved_lib, saved_cwd = _binary.onnxruntime_library, os.getcwd()
            try:
                for k in saved:
                    os.environ.pop(k, None)
                os.environ[_binary.BINARY_ENV] = lone
                _binary.onnxruntime_library = lambda: None
                os.chdir(tmp)
                with self.assertRaisesRegex(fp16audit.AuditError, "pip install onnxruntime"):
                    fp16audit.audit(stem_cnn(), raw_pixels(), progress=False)
            finally:
                os.chdir(saved_cwd)
                _binary.onnxruntime_library = saved_lib
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v

    def test_an_interrupted_audit_stops_the_binary_and_leaves_nothing(self):
        # Ctrl-C arrives while the binary runs: as the first progress line
        # is read, this process is sent SIGINT, as a terminal or Jupyter's
        # interrupt does.
        private = PrivateTemp().__enter__()
        self.addCleanup(private.__exit__)
        children = []
        real_popen = audit_mod.subprocess.Popen

        def popen(*a, **k):
            p = real_popen(*a, **k)
            children.append(p)
            return p

        def interrupt(self, p):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the KeyboardInterrupt arrives here

        # Python turns SIGINT into KeyboardInterrupt only where it started
        # with SIGINT handled: a test run started in the background of a
        # non-interactive shell inherits it ignored (POSIX), a terminal's
        # or Jupyter's process does not.
        self.addCleanup(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, signal.default_int_handler))
        saved = audit_mod._Progress.update
        audit_mod.subprocess.Popen, audit_mod._Progress.update = popen, interrupt
        try:
            with self.assertRaises(KeyboardInterrupt):
                fp16audit.audit(stem_cnn(), raw_pixels(), progress=True)
        finally:
            audit_mod.subprocess.Popen, audit_mod._Progress.update = real_popen, saved
        self.assertEqual(len(children), 1)
        self.assertIsNotNone(children[0].poll(), "the binary is still running")
        self.assertEqual(private.entries(), [], "an interrupted audit left files behind")


if __name__ == "__main__":
    unittest.main()
