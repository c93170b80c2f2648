"""The companion installs offline into a virtualenv, and reads and converts logs without torch.

The install is the one python/README.md gives: a virtualenv made with
--system-site-packages (so that the system's setuptools, wheel and torch
serve; in the torch 2.x leg the leg's, through a .pth: support.fresh_venv) and `pip install --no-build-isolation`, with the package index
switched off and a proxy that refuses every connection, so that anything
fetched from the network fails the test. It installs a copy of python/,
so the build leaves nothing in the tree.

Without torch: a directory whose `torch` package raises ImportError is put
first on PYTHONPATH, which is what a machine without torch looks like to
the package.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

import support

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)

with open(os.path.join(SOURCE, "pyproject.toml"), "rb") as _f:
    import tomllib

    VERSION = tomllib.load(_f)["project"]["version"]

# What a machine without torch answers to `import torch`.
NO_TORCH = 'raise ImportError("No module named \'torch\' (fp16audit test: torch is blocked)")\n'


def _venv_available():
    return importlib.util.find_spec("venv") is not None and importlib.util.find_spec("ensurepip") is not None


class OfflineInstallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not _venv_available():
            if os.environ.get("CI"):
                raise AssertionError(f"{sys.executable} has no venv/ensurepip, and CI must test the install (apt-get install python3-venv)")
            raise unittest.SkipTest(f"{sys.executable} has no venv/ensurepip (apt-get install python3-venv)")
        cls._tmp = tempfile.TemporaryDirectory()
        cls.tmp = cls._tmp.name
        src = os.path.join(cls.tmp, "src")
        os.mkdir(src)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(os.path.join(SOURCE, name), src)
        shutil.copytree(os.path.join(SOURCE, "fp16audit"), os.path.join(src, "fp16audit"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        blocker = os.path.join(cls.tmp, "no_torch", "torch")
        os.makedirs(blocker)
        with open(os.path.join(blocker, "__init__.py"), "w", encoding="utf-8") as f:
            f.write(NO_TORCH)
        cls.no_torch = os.path.dirname(blocker)

        venv = os.path.join(cls.tmp, "venv")
        cls.python = os.path.join(venv, "bin", "python")
        cls.bin = os.path.join(venv, "bin")
        cls.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")}
        cls.env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1", PIP_NO_INPUT="1",
                       http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9",
                       HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9")
        support.fresh_venv(venv)
        cls.install = cls.run_ok([cls.python, "-m", "pip", "install", "--no-build-isolation", src])

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    @classmethod
    def run_ok(cls, args, env=None, **kw):
        r = subprocess.run(args, cwd=cls.tmp, env=env or cls.env, capture_output=True, text=True, timeout=600, **kw)
        if r.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        return r

    def without_torch(self):
        return dict(self.env, PYTHONPATH=self.no_torch)

    def test_install_built_and_installed_the_package(self):
        self.assertIn("Successfully installed fp16audit-%s" % VERSION, self.install.stdout)
        r = self.run_ok([self.python, "-c", "import fp16audit, importlib.resources as r; print(fp16audit.__file__); "
                         "print(fp16audit.__version__); print(r.files('fp16audit').joinpath('py.typed').is_file())"])
        path, version, typed = r.stdout.split()
        self.assertTrue(path.startswith(os.path.join(self.tmp, "venv")), path)
        self.assertEqual((version, typed), (VERSION, "True"))

    def test_logfile_does_not_import_torch(self):
        # torch is there (the system's, through --system-site-packages):
        # importing the log reader still must not load it.
        r = self.run_ok([self.python, "-c", "import sys, fp16audit.logfile, fp16audit.convert; "
                         "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"])
        self.assertEqual(r.stdout.strip(), "[]")

    def test_reads_and_converts_logs_without_torch(self):
        log = os.path.join(self.tmp, "run.jsonl")
        script = textwrap.dedent(f"""
            import sys
            from fp16audit import LogWriter, read_log
            w = LogWriter({log!r})
            w.header(source="torch", grad_scaler={{"enabled": True, "class": "GradScaler", "init_scale": 65536.0,
                     "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}})
            w.step(step=0, loss=float("nan"), scale=32768.0, scale_used=65536.0, skipped=True)
            w.step(step=1, loss=2.5, scale=32768.0, scale_used=32768.0, skipped=False)
            w.end(steps=2, skipped=1, telemetry_lines=0)
            w.close()
            log = read_log({log!r})
            print(log.losses()[1], log.scales())
            assert "torch" not in sys.modules
        """)
        r = self.run_ok([self.python, "-c", script], env=self.without_torch())
        self.assertEqual(r.stdout.strip(), "2.5 [32768.0, 32768.0]")
        out = os.path.join(self.tmp, "run.csv")
        r = self.run_ok([os.path.join(self.bin, "fp16audit-convert"), log, out], env=self.without_torch())
        self.assertIn("2 steps", r.stdout)
        with open(out, encoding="utf-8") as f:
            self.assertEqual(f.read().split(), ["step,loss,scale", "0,nan,32768.0", "1,2.5,32768.0"])
        out = os.path.join(self.tmp, "run.json")
        self.run_ok([self.python, "-m", "fp16audit.convert", log, out], env=self.without_torch())
        with open(out, encoding="utf-8") as f:
            self.assertEqual(json.loads(f.read().replace("NaN", "null"))["scales"], [32768.0, 32768.0])
        # Recording is what needs torch, and says so.
        r = subprocess.run([self.python, "-c", "from fp16audit import AmpRecorder"], cwd=self.tmp, env=self.without_torch(),
                           capture_output=True, text=True, timeout=300)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("No module named 'torch'", r.stderr)

    def test_records_with_the_system_torch(self):
        log = os.path.join(self.tmp, "rec.jsonl")
        script = textwrap.dedent(f"""
            import torch
            from fp16audit import AmpRecorder, EmulatedGradScaler, read_log
            torch.manual_seed(0)
            model = torch.nn.Linear(3, 1)
            scaler = EmulatedGradScaler(init_scale=1024.0)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            with AmpRecorder({log!r}, scaler, model, every=1) as rec:
                loss = model(torch.randn(2, 3)).sum()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                rec.step(loss)
            t = read_log({log!r}).telemetry[0]["modules"][0]["params"]
            print(t["numel"], t["lost_mass"] is not None)
        """)
        r = self.run_ok([self.python, "-c", script])
        self.assertEqual(r.stdout.strip(), "4 True")


if __name__ == "__main__":
    unittest.main()
