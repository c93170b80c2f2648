"""Shared test helpers: the import path, planted models, batches, a temporary folder.

fastai is the real one (python/requirements-test.txt, fastai 2.7.18 on
Debian's torch 1.13); `require_fastai` fails a test run under CI that lacks
it rather than skipping it.
"""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch import nn  # noqa: E402


def require_fastai():
    """Skip without fastai, or fail under CI, which must run these tests."""
    import importlib.util
    import unittest

    if importlib.util.find_spec("fastai") is None:
        msg = "fastai is not installed for %s (make pyvenv installs python/requirements-test.txt into .venv-py)" % sys.executable
        if os.environ.get("CI"):
            raise AssertionError(msg)
        raise unittest.SkipTest(msg)


def require_trainers(*modules):
    """Skip on the torch 1.13 leg, which has no trainer packages; on the
    torch 2.x leg (FP16AUDIT_TEST_LEG=torch2: python/requirements-torch2.txt
    pins transformers, peft, lightning, accelerate and trl) a missing one
    fails the test."""
    import importlib.util
    import unittest

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    msg = "%s not installed for %s (make test-torch2 installs python/requirements-torch2.txt)" % (", ".join(missing), sys.executable)
    if os.environ.get("FP16AUDIT_TEST_LEG") == "torch2":
        raise AssertionError(msg)
    raise unittest.SkipTest(msg)


def leg_site_packages():
    """The site-packages of this interpreter's virtualenv when torch comes
    from there (the torch 2.x leg: a virtualenv of a Python without
    torch), else [] (the torch 1.13 leg: a virtualenv that sees Debian's
    torch through --system-site-packages)."""
    import site

    if sys.prefix == sys.base_prefix:
        return []
    here = [os.path.realpath(p) for p in site.getsitepackages() if os.path.realpath(p).startswith(os.path.realpath(sys.prefix))]
    torch_dir = os.path.realpath(os.path.dirname(os.path.dirname(torch.__file__)))
    return here if torch_dir in here else []


def fresh_venv(path, python=sys.executable):
    """Make a virtualenv at path that sees the torch this test runs on, as
    a user's environment with torch does: --system-site-packages, and
    where torch lives in this interpreter's own virtualenv, a .pth that
    adds that virtualenv's site-packages after the new one's, and no pip
    or setuptools of its own (the leg's serve: `python -m pip`). Returns
    the leg's site-packages ([] without the .pth)."""
    import subprocess

    leg = leg_site_packages()
    subprocess.run([python, "-m", "venv", "--system-site-packages"] + (["--without-pip"] if leg else []) + [path], check=True)
    if leg:
        out = subprocess.run([os.path.join(path, "bin", "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
        with open(os.path.join(out, "_fp16audit_test_leg.pth"), "w", encoding="utf-8") as f:
            f.write("\n".join(leg) + "\n")
    return leg


def planted_overflow_model(seed=0):
    """first -> ReLU -> planted -> ReLU -> head, where head's weights are 1000x too large.

    The loss gradient is ordinary, but head multiplies it by ~1000 on its
    way back, so the output gradient of `planted` (and, through it, of
    `first`) is out of fp16 range at scale 2^16 while head's own output
    gradient is not. `planted` is therefore the first module, in backward
    order, whose output gradient overflows.
    """
    torch.manual_seed(seed)
    model = nn.Sequential()
    model.add_module("first", nn.Linear(8, 16))
    model.add_module("act1", nn.ReLU())
    model.add_module("planted", nn.Linear(16, 16))
    model.add_module("act2", nn.ReLU())
    model.add_module("head", nn.Linear(16, 4))
    with torch.no_grad():
        model.head.weight.mul_(1e3)
    return model


def batches(n, bs=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(bs, 8, generator=g), torch.randint(0, 4, (bs,), generator=g)) for _ in range(n)]


class TempDirMixin:
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp, name)


def accelerate_cpu_fp16(accelerator):
    """Accelerate's fp16 mixed precision on the CPU, as it runs on a GPU.

    Accelerate 1.16 enables fp16's autocast and GradScaler only on an
    accelerator: Accelerator(mixed_precision="fp16") on a CPU trains in
    fp32, and so does the Hugging Face Trainer's fp16=True. This sets the
    two attributes its constructor sets on a GPU, before prepare(): with
    them, prepare() wraps the model's forward in torch.autocast("cpu",
    dtype=torch.float16) (real fp16 kernels), accelerator.backward()
    scales the loss, clip_grad_norm_() unscales the gradients and the
    prepared optimizer steps through GradScaler.step() and update(), all
    Accelerate's own code. Returns the scaler."""
    scaler = torch.amp.GradScaler("cpu")
    accelerator.native_amp = True
    accelerator.scaler = scaler
    return scaler


def pytorch_record():
    """fixtures/torch/runs.py, whose truth_of is PyTorch's record of a
    captured step (hooks: the first non-finite module, the gradients, the
    class by the fixtures' rule), made without fp16audit."""
    import importlib

    here = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "fixtures", "torch")
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module("runs")


def torch2_only(test, why):
    """Skip on torch 1.x (no dynamo exporter), but fail in the torch 2.x leg of CI."""
    from fp16audit import _export

    if _export.has_dynamo(torch):
        return
    if os.environ.get("FP16AUDIT_TEST_LEG") == "torch2":
        raise AssertionError("the torch 2.x leg must run this test: torch %s: %s" % (torch.__version__, why))
    test.skipTest("torch %s: %s" % (torch.__version__, why))
