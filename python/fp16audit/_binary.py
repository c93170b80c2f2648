"""Finding the fp16audit binary and the ONNX Runtime library it loads.

The wheel carries the Go binary in its scripts folder, as ruff and uv do;
`python -m fp16audit`, the `fp16audit` console script and
`fp16audit.audit` all run that one binary. ONNX Runtime comes from the
`onnxruntime` package of the same environment (a dependency of the wheel):
its `capi/libonnxruntime.so.1.*` is handed to the binary with --ort-lib.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import sys
import sysconfig
from typing import List, Optional

# The environment variable that names a binary to use instead.
BINARY_ENV = "FP16AUDIT_BINARY"
NAME = "fp16audit.exe" if os.name == "nt" else "fp16audit"


class BinaryNotFound(RuntimeError):
    """The fp16audit binary is not where the package looks, or cannot run here."""


def _candidates() -> List[str]:
    out = []
    env = os.environ.get(BINARY_ENV)
    if env:
        return [env]
    for scheme in (None, f"{os.name}_user"):
        try:
            scripts = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        except KeyError:
            continue
        if scripts:
            out.append(os.path.join(scripts, NAME))
    here = os.path.dirname(os.path.abspath(__file__))
    # pip install --target DIR puts the scripts in DIR/bin beside the package
    out.append(os.path.join(os.path.dirname(here), "bin", NAME))
    # a source checkout: python/fp16audit -> bin/fp16audit of `make build`
    out.append(os.path.join(os.path.dirname(os.path.dirname(here)), "bin", NAME))
    which = shutil.which(NAME)
    if which:
        out.append(which)
    return out


def _is_binary(path: str) -> bool:
    """A file that is an executable program, not the console-script shim of
    an older version of this package (a Python script)."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return False
    with open(path, "rb") as f:
        return f.read(2) != b"#!"


def find_binary() -> str:
    """The path of the fp16audit binary; BinaryNotFound says where it looked."""
    tried = []
    for c in _candidates():
        if _is_binary(c):
            return c
        tried.append(c)
    raise BinaryNotFound(
        "fp16audit: the fp16audit binary is not installed where the Python package looks (%s). "
        "Install the platform wheel (pip install fp16audit-<version>-py3-none-manylinux_*_x86_64.whl, made by `make wheel`), "
        "build it from a checkout with `make build`, or set %s to its path." % (", ".join(tried) or "nowhere", BINARY_ENV))


def onnxruntime_library() -> Optional[str]:
    """The ONNX Runtime shared library of this environment's onnxruntime
    package (found without importing it), or None."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        libs = sorted(glob.glob(os.path.join(root, "capi", "libonnxruntime.so.1*")) +
                      glob.glob(os.path.join(root, "capi", "libonnxruntime.*.dylib")) +
                      glob.glob(os.path.join(root, "capi", "onnxruntime.dll")))
        if libs:
            return libs[-1]
    return None


def exec_binary(argv: List[str]) -> None:
    """Replace this process with the binary (python -m fp16audit)."""
    try:
        path = find_binary()
    except BinaryNotFound as e:
        sys.stderr.write(str(e) + "\n")
        raise SystemExit(2)
    args = list(argv)
    lib = onnxruntime_library()
    if lib and args and args[0] in ("run", "version") and not any(a.startswith("--ort-lib") for a in args):
        args[1:1] = ["--ort-lib", lib]
    os.execv(path, [path] + args)
