"""Build the platform wheel: the Python package with the fp16audit binary in its scripts.

    python3 python/build_wheel.py --binary bin/fp16audit --out dist

(`make wheel` runs it after building the binary.) The wheel is written by
hand — a wheel is a zip file with a .dist-info folder (PEP 427) — because
setuptools has no place for a prebuilt executable among a wheel's scripts.
Name, version, description, extras and the console script come from
python/pyproject.toml; the wheel adds what the binary needs: ONNX Runtime
from the `onnxruntime` package (a dependency), and a platform tag. The tag
is manylinux_2_X_<arch>, with X the newest glibc symbol version the binary
links against (read from its dynamic symbol table with `objdump -T`), so
pip installs it only where it runs.
"""

import argparse
import base64
import hashlib
import os
import platform
import re
import stat
import subprocess
import sys
import zipfile

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

HERE = os.path.dirname(os.path.abspath(__file__))
# The ONNX Runtime the binary's C API bindings need (ORT_API_VERSION 24).
ONNXRUNTIME = "onnxruntime>=1.24"
# A fixed timestamp: two builds of the same files give the same wheel.
EPOCH = (1980, 1, 1, 0, 0, 0)


def project():
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        if tomllib is None:
            sys.exit("build_wheel.py needs Python 3.11 (tomllib)")
        return tomllib.load(f)["project"]


def glibc_tag(binary):
    """manylinux_2_X_<arch> for the newest GLIBC_2.X symbol the binary needs."""
    out = subprocess.run(["objdump", "-T", binary], capture_output=True, text=True, check=True).stdout
    versions = [tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_(\d+\.\d+(?:\.\d+)?)", out)]
    if not versions:
        sys.exit("%s links against no glibc symbol versions: is it a Linux ELF binary?" % binary)
    newest = max(versions)
    arch = {"x86_64": "x86_64", "aarch64": "aarch64"}.get(platform.machine(), platform.machine())
    return "manylinux_%d_%d_%s" % (newest[0], newest[1], arch)


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def metadata(p):
    lines = ["Metadata-Version: 2.1", "Name: %s" % p["name"], "Version: %s" % p["version"],
             "Summary: %s" % p["description"], "Requires-Python: %s" % p.get("requires-python", ">=3.8")]
    for c in p.get("classifiers", []):
        lines.append("Classifier: %s" % c)
    for d in list(p.get("dependencies", [])) + [ONNXRUNTIME]:
        lines.append("Requires-Dist: %s" % d)
    for extra, deps in sorted(p.get("optional-dependencies", {}).items()):
        lines.append("Provides-Extra: %s" % extra)
        for d in deps:
            lines.append('Requires-Dist: %s ; extra == "%s"' % (d, extra))
    lines.append("Description-Content-Type: text/markdown")
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        return "\n".join(lines) + "\n\n" + f.read()


def build(binary, out):
    p = project()
    name, version = p["name"], p["version"]
    tag = "py3-none-" + glibc_tag(binary)
    dist_info = "%s-%s.dist-info" % (name, version)
    files = []
    pkg = os.path.join(HERE, name)
    for fn in sorted(os.listdir(pkg)):
        if fn.endswith(".py") or fn == "py.typed":
            with open(os.path.join(pkg, fn), "rb") as f:
                files.append(("%s/%s" % (name, fn), f.read(), 0o644))
    with open(binary, "rb") as f:
        files.append(("%s-%s.data/scripts/fp16audit" % (name, version), f.read(), 0o755))
    files.append((dist_info + "/METADATA", metadata(p).encode(), 0o644))
    files.append((dist_info + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: fp16audit build_wheel.py\nRoot-Is-Purelib: true\nTag: %s\n" % tag).encode(), 0o644))
    scripts = p.get("scripts", {})
    if scripts:
        ep = "[console_scripts]\n" + "".join("%s = %s\n" % kv for kv in sorted(scripts.items()))
        files.append((dist_info + "/entry_points.txt", ep.encode(), 0o644))
    record = [record_line(n, d) for n, d, _ in files] + [dist_info + "/RECORD,,"]
    files.append((dist_info + "/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "%s-%s-%s.whl" % (name, version, tag))
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d, mode in files:
            zi = zipfile.ZipInfo(n, date_time=EPOCH)
            zi.external_attr = (stat.S_IFREG | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, d)
    os.replace(tmp, path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", required=True, help="the fp16audit binary (make build)")
    ap.add_argument("--out", default="dist", help="folder for the wheel")
    a = ap.parse_args()
    print(build(a.binary, a.out))


if __name__ == "__main__":
    main()
