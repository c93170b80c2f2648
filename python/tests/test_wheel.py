"""The platform wheel installs as a user installs it, and everything runs from it.

A fresh virtualenv (--system-site-packages, for Debian's torch), then
`pip install fp16audit-….whl onnxruntime==1.30.0` from the package index
(in the torch 2.x leg the virtualenv sees the leg's torch and fastai 2.8
through a .pth, support.fresh_venv, and gets the wheel and onnxruntime
itself);
outside the source tree, with no ONNXRUNTIME_LIB and no activated
environment: `fp16audit version` names the virtualenv's ONNX Runtime,
`fp16audit run` audits the demo model, `python -m fp16audit` is the same
binary, `import fp16audit; fp16audit.audit(...)` audits a torch model and
`learn.fp16audit()` a real fastai learner (the pinned fastai of
requirements-test.txt installed beside).
The wheel is built from the binary `make build` wrote (bin/fp16audit).
"""

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
import zipfile

import support

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
ROOT = os.path.dirname(PYTHON_DIR)
BINARY = os.path.join(ROOT, "bin", "fp16audit")
ORT_PIN = "onnxruntime==1.30.0"


class WheelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(BINARY):
            raise AssertionError("%s is missing: run `make build` (make test does) before the wheel test" % BINARY)
        sys.path.insert(0, PYTHON_DIR)
        import build_wheel

        cls._tmp = tempfile.TemporaryDirectory()
        cls.tmp = cls._tmp.name
        cls.wheel = build_wheel.build(BINARY, os.path.join(cls.tmp, "dist"))
        venv = os.path.join(cls.tmp, "venv")
        leg = support.fresh_venv(venv)
        cls.bin = os.path.join(venv, "bin")
        cls.env = {k: v for k, v in os.environ.items()
                   if k not in ("ONNXRUNTIME_LIB", "VIRTUAL_ENV", "PYTHONPATH", "FP16AUDIT_BINARY")}
        if not leg:
            # the wheel with its dependencies from the index (onnxruntime),
            # then the pinned fastai set for the learner test
            p = subprocess.run([os.path.join(cls.bin, "python"), "-m", "pip", "install", "-q", cls.wheel, ORT_PIN],
                               capture_output=True, text=True, env=cls.env, timeout=900)
            if p.returncode == 0:
                p = subprocess.run([os.path.join(cls.bin, "python"), "-m", "pip", "install", "-q", "--no-deps", "-r",
                                    os.path.join(PYTHON_DIR, "requirements-test.txt")],
                                   capture_output=True, text=True, env=cls.env, timeout=900)
        else:
            # the torch 2.x leg: torch, fastai 2.8 and onnxruntime's own
            # dependencies come from the leg's virtualenv (the .pth), the
            # wheel and onnxruntime go into this one, so that the binary
            # finds this environment's onnxruntime
            p = subprocess.run([os.path.join(cls.bin, "python"), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", cls.wheel, ORT_PIN],
                               capture_output=True, text=True, env=cls.env, timeout=900)
        if p.returncode != 0:
            msg = "pip install of the wheel and %s failed: %s" % (ORT_PIN, p.stderr[-2000:])
            if os.environ.get("CI") or "No matching distribution" not in p.stderr and "Could not" not in p.stderr:
                raise AssertionError(msg)
            raise unittest.SkipTest(msg + " (no package index?)")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def run_in_venv(self, *args, check_code=None):
        p = subprocess.run(list(args), capture_output=True, text=True, env=self.env, cwd=self.tmp, timeout=600)
        if check_code is not None:
            self.assertEqual(p.returncode, check_code, p.stdout + p.stderr)
        return p

    def test_wheel_carries_the_binary_and_a_platform_tag(self):
        name = os.path.basename(self.wheel)
        self.assertRegex(name, r"^fp16audit-[0-9.]+-py3-none-manylinux_2_[0-9]+_x86_64\.whl$")
        with zipfile.ZipFile(self.wheel) as z:
            names = z.namelist()
            meta = z.read([n for n in names if n.endswith(".dist-info/METADATA")][0]).decode()
            script = [n for n in names if n.endswith(".data/scripts/fp16audit")]
            self.assertEqual(len(script), 1)
            self.assertEqual((z.getinfo(script[0]).external_attr >> 16) & 0o111, 0o111)
        self.assertIn("Requires-Dist: onnxruntime>=1.24", meta)
        self.assertIn("Provides-Extra: fastai", meta)

    def test_the_command_finds_the_virtualenvs_onnxruntime(self):
        p = self.run_in_venv(os.path.join(self.bin, "fp16audit"), "version", check_code=0)
        self.assertIn(os.path.join(self.tmp, "venv"), p.stdout)
        self.assertIn("onnxruntime/capi/libonnxruntime.so", p.stdout)
        p = self.run_in_venv(os.path.join(self.bin, "python"), "-m", "fp16audit", "version", check_code=0)
        self.assertIn("onnxruntime/capi/libonnxruntime.so", p.stdout)

    def test_the_command_audits_the_demo_model(self):
        p = self.run_in_venv(os.path.join(self.bin, "fp16audit"), "run", os.path.join(ROOT, "fixtures", "models", "demo_cnn.onnx"),
                             "-i", os.path.join(ROOT, "fixtures", "batches", "demo_cnn_raw.npy"), "--no-color", check_code=1)
        self.assertIn("verdict: unnormalized-input", p.stdout)

    def test_the_python_api_audits_a_torch_model(self):
        code = textwrap.dedent("""
            import torch, fp16audit
            from torch import nn
            torch.manual_seed(0)
            m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
            with torch.no_grad():
                m[0].weight.mul_(400)
            x = torch.randint(0, 256, (4, 3, 16, 16), generator=torch.Generator().manual_seed(1)).float()
            r = fp16audit.audit(m, x, progress=False)
            print(r.verdict, r.ok, fp16audit.__file__)
        """)
        p = self.run_in_venv(os.path.join(self.bin, "python"), "-c", code, check_code=0)
        verdict, ok, where = p.stdout.split()
        self.assertEqual((verdict, ok), ("unnormalized-input", "False"))
        self.assertTrue(where.startswith(os.path.join(self.tmp, "venv")), where)

    def test_a_fastai_learner_audits_itself(self):
        code = textwrap.dedent("""
            import os, sys, tempfile, warnings
            warnings.filterwarnings("ignore")
            import numpy as np, torch
            from torch import nn
            from PIL import Image
            from fastai.vision.all import (CategoryBlock, CrossEntropyLossFlat, DataBlock, ImageBlock, IntToFloatTensor,
                                           Learner, RandomSplitter, Resize, get_image_files, parent_label)
            from fp16audit.fastai import FP16Preflight
            tmp = tempfile.mkdtemp()
            rng = np.random.default_rng(0)
            for c in ("a", "b"):
                os.makedirs(os.path.join(tmp, c))
                for i in range(8):
                    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(os.path.join(tmp, c, "%d.png" % i))
            block = DataBlock(blocks=(ImageBlock, CategoryBlock), get_items=get_image_files, get_y=parent_label,
                              splitter=RandomSplitter(0.25, seed=0), item_tfms=Resize(32), batch_tfms=[IntToFloatTensor(div=1)])
            torch.manual_seed(0)
            m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
            with torch.no_grad():
                m[0].weight.mul_(1000)
            learn = Learner(block.dataloaders(tmp, bs=4, num_workers=0), m, loss_func=CrossEntropyLossFlat()).to_fp16()
            r = learn.fp16audit(progress=False)
            print(r.verdict, r.ok)
        """)
        p = self.run_in_venv(os.path.join(self.bin, "python"), "-c", code, check_code=0)
        self.assertEqual(p.stdout.split()[-2:], ["unnormalized-input", "False"])


if __name__ == "__main__":
    unittest.main()
