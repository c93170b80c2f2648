"""fp16audit beside the tools a user would pick instead (issue 35): the
same models and batches through each, whole process against whole
process, graded against PyTorch's truth; writes docs/peers.md.

    make bench-peers          # the virtualenv (bench/peers/requirements.txt), then this script
    python bench/peers/run.py --work DIR --out docs/peers.md [--runs 3] [--only a,b]

The peers, each run as a user runs it (the commands are in docs/peers.md):

- fp16audit: `fp16audit run model.onnx -i batches/ --format json`.
- Polygraphy: an fp32 reference run with every tensor marked as an output,
  then the model converted to fp16 (`--fp-to-fp16`) run with every tensor
  marked, NaN/Inf validation and a comparison against the reference.
- onnxconverter-common: `auto_convert_mixed_precision` with a validation
  of finite outputs within 5 % of fp32 (onnxcc_amp.py).
- ModelOpt AutoCast: `python -m modelopt.onnx.autocast` on the batches.
- PyTorch: forward hooks on every module under torch.autocast("cpu",
  dtype=torch.float16) and after model.half(), on real fp16 CPU kernels
  (torch_hooks.py); also the second truth of the emulation.

Truth is PyTorch's (the fixtures' truth.json, from fixtures/torch/oracle.py;
ResNet-18's is made here with the same machinery), under autocast-fp16,
the policy of fastai's to_fp16(). Nothing here is run by CI.
"""

import argparse
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TORCH_FIXTURES = os.path.join(ROOT, "fixtures", "torch")
sys.path.insert(0, TORCH_FIXTURES)

POLICY = "autocast-fp16"
TOL = 0.05  # relative L2 error of an output against fp32 that still agrees (fp16audit's default)

# One model per verdict class in the TorchScript (torch 1.13) and dynamo
# (torch 2.9) families, the three named models, and the Llama and BERT
# healthy twins.
CLASSES = [
    ("poisoned_batch", "poisoned-input"),
    ("fp32_broken_log", "fp32-broken"),
    ("explicit_cast_mul", "explicit-half-cast"),
    ("resnet_raw_pixels", "unnormalized-input"),
    ("regression_head_unscaled", "oversized-logits"),
    ("token_transformer_overflow", "overflowing-op"),
    ("mobilenet_v3_untrained", "forward-underflow"),
    ("resnet_normalized", "healthy"),
]
NAMED = ["resnet18_raw_pixels", "hf_bert", "hf_llama_massive_activation"]


def models():
    out = []
    for fam, label in (("cases", "TorchScript"), ("cases_dynamo", "dynamo")):
        for case, cls in CLASSES:
            out.append({"id": "%s/%s" % (fam, case), "case": case, "family": fam, "exporter": label, "class": cls,
                        "dir": os.path.join(TORCH_FIXTURES, fam, case)})
    out.append({"id": "resnet18_raw_pixels", "case": "resnet18_raw_pixels", "family": "bench", "exporter": "dynamo",
                "class": "healthy", "dir": None, "named": True})
    for case in ("hf_bert", "hf_llama", "hf_llama_massive_activation"):
        out.append({"id": "cases_hf/" + case, "case": case, "family": "cases_hf", "exporter": "dynamo", "class": None,
                    "dir": os.path.join(TORCH_FIXTURES, "cases_hf", case), "named": case in NAMED})
    return out


# -- preparing a model's inputs for every peer ---------------------------------

def case_builders():
    """realcases' case builders, the Hugging Face ones and ResNet-18's."""
    import realcases as rc
    import cases_hf

    rc.quiet()
    builders = dict(rc.CASES)
    builders.update(cases_hf.cases(rc))
    builders["resnet18_raw_pixels"] = lambda: resnet18_case(rc)
    return rc, builders


def resnet18_case(rc):
    """torchvision's ResNet-18 at 64x64, its BatchNorms calibrated on
    ImageNet-normalized images, fed raw 0-255 pixels: the forgotten
    Normalize on a real architecture. PyTorch says it is healthy (its
    largest value, ~4.6e3, fits fp16), and so must a tool."""
    from torchvision.models import resnet18

    rng = rc.seeded(70)
    m = resnet18(weights=None, num_classes=10).eval()
    raw = rc.images_raw(rng, 8, size=64)
    rc.calibrate_bn(m, [rc.normalize_images(raw)])
    return rc.Case(
        "resnet18_raw_pixels", "torchvision ResNet-18 (BatchNorm calibrated on normalized images) fed raw 0-255 pixels",
        m, [rc.Input("pixels", "image")], ["logits"], [rc.Batch("raw_pixels", [raw], "[8,3,64,64] raw pixels 0..255")],
        {p: rc.Expect("healthy") for p in rc.AUDITED},
        final_module="fc")


def feeds(spec, names):
    """Every batch of the model as {input name: array}, in file order."""
    out = []
    for f in sorted(glob.glob(os.path.join(spec["dir"], "batches", "*"))):
        if f.endswith(".npy"):
            out.append({names[0]: np.load(f)})
        elif f.endswith(".npz"):
            with np.load(f) as z:
                out.append({n: z[n] for n in names})
    return out


def prepare(spec, work, builders, rc):
    """Copy the model and its batches into work (no peer writes beside the
    fixtures), and write each peer's form of the inputs and the nn.Module."""
    import onnx
    import torch

    d = os.path.join(work, spec["id"].replace("/", "__"))
    if os.path.exists(os.path.join(d, "ready")):
        spec["work"] = d
        return
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    case = builders[spec["case"]]()
    if spec["dir"] is None:
        # made here: export and truth by realcases, into the work folder
        rc.CASES_DIR, rc.EXPORTER = os.path.join(work, "_build"), "dynamo"
        rc.CASES[spec["case"]] = lambda: case
        _, problems = rc.build_case(spec["case"])
        if problems:
            sys.exit("%s: PyTorch disagrees with the intended verdicts: %s" % (spec["id"], "; ".join(problems)))
        src = os.path.join(rc.CASES_DIR, spec["case"])
        for f in os.listdir(src):
            shutil.move(os.path.join(src, f), d)
        shutil.rmtree(rc.CASES_DIR)
        case = builders[spec["case"]]()
    else:
        for f in os.listdir(spec["dir"]):
            if f.startswith("model.onnx") or f in ("truth.json", "batches"):
                s = os.path.join(spec["dir"], f)
                (shutil.copytree if os.path.isdir(s) else shutil.copy)(s, os.path.join(d, f))
    m = onnx.load(os.path.join(d, "model.onnx"), load_external_data=False)
    names = [i.name for i in m.graph.input if i.name not in {t.name for t in m.graph.initializer}]
    spec["work"] = d
    fs = feeds(spec | {"dir": d}, names)
    from polygraphy.json import save_json

    save_json(fs, os.path.join(d, "inputs.json"))
    os.makedirs(os.path.join(d, "calib"))
    for i, f in enumerate(fs):
        np.savez(os.path.join(d, "calib", "batch%d.npz" % i), **f)
    np.savez(os.path.join(d, "batch0.npz"), **fs[0])
    np.savez(os.path.join(d, "args.npz"), **{"arg%d" % i: fs[0][n] for i, n in enumerate(names)})
    torch.save(case.model, os.path.join(d, "model.pt"))
    with open(os.path.join(d, "ready"), "w") as f:
        f.write("ok\n")


# -- running a peer as a process -----------------------------------------------

def timed(cmd, log, env=None, cwd=None):
    """Run cmd to completion with its output in log; returns (exit code,
    wall seconds, peak RSS in MB) of that process. GNU time measures it:
    a process forked from this one (torch loaded) would count this one's
    pages in its peak until it execs, so the command is forked from time."""
    fd, stats = tempfile.mkstemp(prefix="peer-time-")
    os.close(fd)
    try:
        with open(log, "ab") as out:
            p = subprocess.run([TIME, "-f", "%e %M", "-o", stats, "--"] + cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        with open(stats) as f:
            last = f.read().split("\n")
        wall, kb = [x for x in last if x.strip()][-1].split()
    finally:
        os.remove(stats)
    return p.returncode, float(wall), int(kb) / 1024.0


TIME = "/usr/bin/time"  # GNU time (Debian's package time)


def binary():
    return os.path.join(ROOT, "bin", "fp16audit")


def ort_env():
    env = dict(os.environ)
    env.setdefault("ONNXRUNTIME_LIB", os.path.join(ROOT, ".ort", "libonnxruntime.so.1"))
    # torch.load needs the classes the fixtures' models are made of, as a
    # user's script has its own model's classes
    env["PYTHONPATH"] = TORCH_FIXTURES + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


PY = sys.executable


def commands(peer, d, out):
    """The commands a user runs for peer on the model in d, writing into out."""
    model = os.path.join(d, "model.onnx")
    if peer == "fp16audit":
        return [[binary(), "run", model, "-i", os.path.join(d, "batches"), "--policy", POLICY, "--format", "json",
                 "-o", os.path.join(out, "report.json"), "--progress", "none"]]
    if peer == "polygraphy":
        poly = os.path.join(os.path.dirname(PY), "polygraphy")
        inputs = os.path.join(d, "inputs.json")
        ref = os.path.join(out, "fp32.json")
        return [[poly, "run", model, "--onnxrt", "--onnx-outputs", "mark", "all", "--load-inputs", inputs, "--save-outputs", ref],
                [poly, "run", model, "--onnxrt", "--fp-to-fp16", "--onnx-outputs", "mark", "all", "--load-inputs", inputs,
                 "--load-outputs", ref, "--validate", "--rtol", str(TOL), "--atol", "1e-3"]]
    if peer == "onnxcc":
        return [[PY, os.path.join(HERE, "onnxcc_amp.py"), model, os.path.join(d, "batch0.npz"),
                 os.path.join(out, "mixed.onnx"), os.path.join(out, "result.json")]]
    if peer == "modelopt":
        return [[PY, "-m", "modelopt.onnx.autocast", "--onnx_path", model, "--output_path", os.path.join(out, "autocast.onnx"),
                 "--calibration_data", os.path.join(d, "calib"), "--keep_io_types", "--providers", "cpu"]]
    if peer == "pytorch":
        return [[PY, os.path.join(HERE, "torch_hooks.py"), os.path.join(d, "model.pt"), os.path.join(d, "args.npz"),
                 os.path.join(out, "result.json")]]
    raise ValueError(peer)


PEERS = ["fp16audit", "polygraphy", "onnxcc", "modelopt", "pytorch"]


def run_peer(peer, spec, runs):
    """runs runs of peer on spec: every run's wall time and peak RSS, and
    the first run's outputs kept for grading."""
    d = spec["work"]
    keep = os.path.join(d, "out-" + peer)
    shutil.rmtree(keep, ignore_errors=True)
    walls, rss, codes = [], [], []
    for r in range(runs):
        out = keep if r == 0 else tempfile.mkdtemp(prefix="peer-")
        os.makedirs(out, exist_ok=True)
        log = os.path.join(out, "log.txt")
        wall, peak, code = 0.0, 0.0, 0
        for cmd in commands(peer, d, out):
            c, w, m = timed(cmd, log, env=ort_env(), cwd=out)
            wall, peak, code = wall + w, max(peak, m), c if code == 0 else code
        walls.append(wall)
        rss.append(peak)
        codes.append(code)
        if r:
            shutil.rmtree(out, ignore_errors=True)
    return {"walls": walls, "rss": rss, "code": codes[0], "out": keep}


# -- grading ---------------------------------------------------------------------

def node_module(model, node):
    """The PyTorch module path of an ONNX node, as the exporter wrote it:
    the dynamo exporter's name_scopes metadata, the TorchScript exporter's
    /scope/scope.sub/Op names."""
    for n in model.graph.node:
        if n.name != node:
            continue
        for p in n.metadata_props:
            if p.key == "pkg.torch.onnx.name_scopes":
                scopes = [s.strip(" '") for s in p.value.strip("[]").split(",")]
                return scopes[-2] if len(scopes) > 1 else ""
        parts = [s for s in node.split("/") if s][:-1]
        mod = ""
        for s in parts:
            mod = s if mod and s.startswith(mod + ".") else (mod + "." + s if mod else s)
        return mod
    return None


def producer(model, tensor):
    for n in model.graph.node:
        if tensor in n.output:
            return n.name
    return None


def module_matches(got, truth):
    if got is None or truth is None:
        return False
    return got == truth or got.startswith(truth + ".") or (truth != "" and truth.startswith(got + "."))


def ort_outputs_ok(path, d, ref_model):
    """Whether a converted model runs on every batch with finite outputs
    within TOL of the fp32 model's: does a peer's converted model hold?"""
    import onnxruntime as ort

    try:
        conv = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        ref = ort.InferenceSession(ref_model, providers=["CPUExecutionProvider"])
    except Exception as e:  # a peer's model that does not load
        return False, "does not load: %s" % str(e).splitlines()[0][:120]
    for f in sorted(glob.glob(os.path.join(d, "calib", "*.npz"))):
        with np.load(f) as z:
            feed = {k: z[k] for k in z.files}
        try:
            got, want = conv.run(None, feed), ref.run(None, feed)
        except Exception as e:
            return False, "does not run: %s" % str(e).splitlines()[0][:120]
        for g, w in zip(got, want):
            if not np.issubdtype(np.asarray(w).dtype, np.floating):
                continue
            g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
            if not np.isfinite(g).all():
                return False, "outputs hold NaN/Inf"
            if np.isfinite(w).all() and np.linalg.norm(g - w) > TOL * max(np.linalg.norm(w), 1e-30):
                return False, "outputs off fp32 by %.0f %%" % (100 * np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))
    return True, ""


def grade(peer, spec, res, truth):
    """What the peer said, against PyTorch's truth."""
    import onnx

    d = spec["work"]
    model = onnx.load(os.path.join(d, "model.onnx"), load_external_data=False)
    out = res["out"]
    with open(os.path.join(out, "log.txt"), errors="replace") as f:
        log = f.read()
    g = {"ran": True, "flagged": None, "named": None, "named_module": None, "why": "", "fix": "", "fix_holds": None, "note": ""}
    if peer == "fp16audit":
        try:
            r = json.load(open(os.path.join(out, "report.json")))
        except (OSError, ValueError):
            return dict(g, ran=False, note=log.strip().splitlines()[-1][:200] if log.strip() else "no report")
        g["flagged"] = r["verdict"] != "healthy" or res["code"] == 1
        o = (r.get("origins") or [{}])[0]
        g["named"] = o.get("node") or o.get("input")
        g["named_module"] = o.get("module")
        g["why"] = r["verdict"]
        fixes = [f for f in r.get("fixes") or [] if f.get("works")]
        if fixes:
            g["fix"], g["fix_holds"] = fixes[0]["kind"], True
        elif g["flagged"]:
            g["fix_holds"] = False
    elif peer == "polygraphy":
        if "Inference Session" in log and "Fail" in log and "Errors detected" not in log and "Accuracy Summary" not in log:
            line = next((x for x in log.splitlines() if "Fail" in x and "ONNXRuntimeError" in x), "")
            return dict(g, ran=False, note="the fp16 model does not load in ONNX Runtime: " + line.split("FAIL :")[-1].strip()[:160])
        bad = [x.split("Errors detected in output:")[-1].strip() for x in log.splitlines() if "Errors detected in output:" in x]
        outs = [o.name for o in model.graph.output]
        failed = [o for o in outs if "FAILED | Output: '%s'" % o in log]
        if bad:
            g["flagged"], g["named"] = True, producer(model, bad[0]) or bad[0]
            g["why"] = "NaN/Inf first in tensor %s" % bad[0]
        elif failed:
            g["flagged"], g["why"] = True, "graph output off fp32 beyond rtol %g" % TOL
        elif "Accuracy Summary" in log or "PASSED | Output" in log:
            g["flagged"] = False
        else:
            return dict(g, ran=False, note=(log.strip().splitlines() or ["no output"])[-1][:200])
        if g["named"]:
            g["named_module"] = node_module(model, g["named"])
    elif peer == "onnxcc":
        try:
            r = json.load(open(os.path.join(out, "result.json")))
        except (OSError, ValueError):
            return dict(g, ran=False, note=(log.strip().splitlines() or ["no result"])[-1][:200])
        if r["error"]:
            return dict(g, ran=False, note=r["error"][:200])
        kept = r["kept_fp32"] or []
        g["flagged"] = bool(kept)
        g["kept"] = kept
        if kept:
            # the first node it keeps, in its own order: what it names is
            # not chosen with PyTorch's answer in hand
            g["named"] = kept[0]
            g["named_module"] = node_module(model, g["named"])
            g["why"] = "%d node(s) kept in fp32" % len(kept)
            g["fix"] = "ONNX graph, %d node(s) fp32" % len(kept)
            g["fix_holds"], g["note"] = ort_outputs_ok(os.path.join(out, "mixed.onnx"), d, os.path.join(d, "model.onnx"))
    elif peer == "modelopt":
        skipped = []
        for x in log.splitlines():
            if "Skipping node " in x and "out of range" in x:
                skipped.append(x.split("Skipping node ")[1].split(":")[0])
        if not os.path.exists(os.path.join(out, "autocast.onnx")):
            return dict(g, ran=False, note=(log.strip().splitlines() or ["no output"])[-1][:200])
        g["flagged"] = bool(skipped)
        g["kept"] = skipped
        if skipped:
            g["named"] = skipped[0]
            g["named_module"] = node_module(model, skipped[0])
            g["why"] = "|x| > 512 at %d node(s)" % len(skipped)
            g["fix"] = "ONNX graph, %d node(s) fp32" % len(skipped)
            g["fix_holds"], g["note"] = ort_outputs_ok(os.path.join(out, "autocast.onnx"), d, os.path.join(d, "model.onnx"))
    elif peer == "pytorch":
        try:
            r = json.load(open(os.path.join(out, "result.json")))
        except (OSError, ValueError):
            return dict(g, ran=False, note=(log.strip().splitlines() or ["no result"])[-1][:200])
        a = r["autocast"]
        g["real"] = r
        if a["raised"]:
            return dict(g, ran=False, note="raised: " + a["raised"][:160])
        g["flagged"] = a["outputs_nonfinite"] or (a["worst_rel_err"] or 0) > TOL
        g["named_module"] = a["first_nonfinite_module"]
        if r["fp32"]["outputs_nonfinite"]:
            g["why"] = "NaN/Inf in fp32 too"
            g["named_module"] = g["named_module"] or r["fp32"]["first_nonfinite_module"]
        elif a["outputs_nonfinite"]:
            g["why"] = ("NaN/Inf first in module %s" % a["first_nonfinite_module"] if a["first_nonfinite_module"]
                        else "NaN/Inf in the outputs, no module's output first")
        elif g["flagged"]:
            g["why"] = "outputs off fp32 by %.0f %%" % (100 * a["worst_rel_err"])
    return g


def right(g, truth):
    """Right: flagged as PyTorch fails, and for a failure the origin named
    (node, module, or the input at fault)."""
    if not g["ran"] or g["flagged"] is None:
        return False
    if g["flagged"] != truth["fails"]:
        return False
    if not truth["fails"]:
        return True
    return origin_right(g, truth)


def origin_right(g, truth):
    if truth.get("input_at_fault") and truth["verdict"] in ("poisoned-input",):
        return g.get("named") in truth["input_at_fault"]
    if truth["verdict"] == "forward-underflow":
        return any(module_matches(g.get("named_module"), m) for m in truth.get("decayed_modules") or [])
    if truth.get("origin_node") and g.get("named") == truth["origin_node"]:
        return True
    if truth.get("origin_module"):
        return module_matches(g.get("named_module"), truth["origin_module"])
    return False


# -- the page --------------------------------------------------------------------

def rng(xs, fmt):
    return (fmt % min(xs)) if fmt % min(xs) == fmt % max(xs) else "%s–%s" % (fmt % min(xs), fmt % max(xs))


def cell(g, truth):
    if not g["ran"]:
        return "✗ did not run"
    if g["flagged"] is None:
        return "?"
    parts = []
    ok = g["flagged"] == truth["fails"]
    parts.append(("flagged" if g["flagged"] else "clean") + ("" if ok else " ✗"))
    if truth["fails"] and g["flagged"]:
        parts.append("origin ✓" if origin_right(g, truth) else ("origin ✗" if (g.get("named") or g.get("named_module")) else "no origin"))
    if g.get("why") and g["flagged"]:
        parts.append(g["why"].replace("|", "\\|"))
    if g.get("fix"):
        parts.append("fix %s%s" % (g["fix"], " holds" if g["fix_holds"] else " ✗ (%s)" % g["note"] if g["note"] else " ✗"))
    return " · ".join(parts)


def versions():
    import importlib.metadata as md

    out = {}
    for p in ("torch", "onnx", "onnxruntime-gpu", "polygraphy", "onnxconverter-common", "nvidia-modelopt", "transformers"):
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            pass
    v = subprocess.run([binary(), "version"], capture_output=True, text=True, env=ort_env()).stdout.split("\n")
    out["fp16audit"] = v[0].split()[-1] if v and v[0] else "?"
    return out


def write_page(path, results, specs, runs, train):
    vs = versions()
    L = []
    w = L.append
    w("# fp16audit beside the tools users pick instead")
    w("")
    w("Generated by `make bench-peers` (`bench/peers/run.py`) on %s: %s, %d cores, Python %s; %d runs of every peer on every model."
      % (time.strftime("%Y-%m-%d"), platform.processor() or platform.machine(), os.cpu_count(), platform.python_version(), runs))
    w("Versions: " + ", ".join("%s %s" % kv for kv in sorted(vs.items())) + ". Nothing on this page is hand-edited; rerun the target to refresh it.")
    w("")
    w("The question every tool is asked: *will this model give NaN, or wrong outputs, under fp16 mixed precision (fastai's"
      " `to_fp16()`, `torch.autocast`), where does it start, why, and what fixes it?* The truth is PyTorch's under"
      " autocast-fp16 (each fixture's `truth.json`, from `fixtures/torch/oracle.py`), not any tool's. A peer is **right**"
      " on a model when it flags a problem exactly where PyTorch fails and, for a failure, names where it starts: the"
      " ONNX node PyTorch's first non-finite op was exported as, a node or module of the same PyTorch module, the input"
      " at fault for poisoned data, or a module fp16 loses to underflow.")
    w("")
    w("## The commands")
    w("")
    w("Each model folder holds `model.onnx`, `batches/` (fp16audit's input), `inputs.json` (Polygraphy's), `calib/`"
      " (ModelOpt's, one `.npz` per batch), `batch0.npz` (onnxconverter-common's: its API takes one feed) and"
      " `model.pt` with `args.npz` (the nn.Module and its first batch, for the PyTorch script).")
    w("")
    w("| peer | what was run |")
    w("|---|---|")
    ex = specs[0]["work"]
    for p in PEERS:
        cmds = [" ".join(os.path.relpath(c, ex) if os.path.isabs(c) and c.startswith(ex) else
                         ("…/" + os.path.basename(c) if os.path.isabs(c) else c) for c in cmd) for cmd in commands(p, ex, ".")]
        w("| %s | %s |" % (p, "<br>".join("`%s`" % c for c in cmds)))
    w("")
    w("`onnxcc_amp.py` calls `auto_convert_mixed_precision(model, feed, validate_fn, keep_io_types=True)`, the validation"
      " being finite outputs within 5 % of fp32; `torch_hooks.py` records, with forward hooks, the first module whose"
      " output holds NaN/Inf while its inputs are finite, under `torch.autocast(\"cpu\", dtype=torch.float16)` and after"
      " a plain `model.half()` (BatchNorm in fp16 too, where fastai and the oracle's `half` keep it in fp32), and compares"
      " the outputs with fp32's.")
    w("")
    w("## Did it find the problem, where, why, and a fix that holds")
    w("")
    w("A cell says: flagged or clean (✗ where PyTorch disagrees); for a failure whether the origin it names is"
      " PyTorch's; its reason in its own words; its fix, and whether that fix holds (fp16audit: verified by its own"
      " rerun; onnxconverter-common and ModelOpt: their converted model run here on every batch, finite and within"
      " 5 % of fp32). A converted ONNX graph is a fix for inference in ONNX Runtime, not for training in PyTorch.")
    w("")
    w("| model | PyTorch (autocast-fp16) | " + " | ".join(PEERS) + " |")
    w("|---|---|" + "---|" * len(PEERS))
    score = {p: 0 for p in PEERS}
    any_right, ours_right = 0, 0
    missed = []
    for s in specs:
        t = results[s["id"]]["truth"]
        row = ["`%s`" % s["id"], "%s%s" % (t["verdict"], " at `%s`" % (t.get("origin_module") or t.get("origin_node") or "")
                                           if t["fails"] and (t.get("origin_module") or t.get("origin_node")) else "")]
        rights = {}
        for p in PEERS:
            g = results[s["id"]]["peers"][p]["grade"]
            rights[p] = right(g, t)
            score[p] += rights[p]
            row.append(cell(g, t) + (" **right**" if rights[p] else ""))
        if any(rights[p] for p in PEERS if p != "fp16audit"):
            any_right += 1
            if rights["fp16audit"]:
                ours_right += 1
            else:
                missed.append(s["id"])
        w("| " + " | ".join(row) + " |")
    w("| **right** | | " + " | ".join("**%d of %d**" % (score[p], len(specs)) for p in PEERS) + " |")
    w("")
    w("## Time and memory, whole process against whole process")
    w("")
    w("Wall time and peak resident memory of each peer's processes as a user runs them (Polygraphy: its two `run`s"
      " together, the larger peak), min–max of %d runs; the peer's own start-up (imports) included." % runs)
    w("")
    w("| model | " + " | ".join(PEERS) + " |")
    w("|---|" + "---|" * len(PEERS))
    for s in specs:
        row = ["`%s`%s" % (s["id"], " (named)" if s.get("named") else "")]
        for p in PEERS:
            r = results[s["id"]]["peers"][p]
            row.append("%s s · %s MB" % (rng(r["walls"], "%.2f"), rng(r["rss"], "%.0f")))
        w("| " + " | ".join(row) + " |")
    w("")
    w("## The targets")
    w("")
    w("- **Right wherever any peer is right**: some peer is right on %d model(s); fp16audit on %d of them%s." % (
        any_right, ours_right, "" if not missed else " (missed: %s)" % ", ".join("`%s`" % m for m in missed)))
    for s in specs:
        if not s.get("named"):
            continue
        r = results[s["id"]]["peers"]
        ours = max(r["fp16audit"]["walls"])
        others = {p: min(r[p]["walls"]) for p in PEERS if p != "fp16audit" and results[s["id"]]["peers"][p]["grade"]["ran"]}
        fastest = min(others, key=others.get) if others else None
        lean = {p: min(r[p]["rss"]) for p in PEERS if p != "fp16audit" and results[s["id"]]["peers"][p]["grade"]["ran"]}
        leanest = min(lean, key=lean.get) if lean else None
        w("- **`%s`**: fp16audit's slowest run %.2f s against the fastest run of the fastest peer that ran (%s, %.2f s): %s;"
          " fp16audit's largest peak %.0f MB against the leanest peer's smallest (%s, %.0f MB) × 1.25 = %.0f MB: %s." % (
              s["id"], ours, fastest, others.get(fastest, float("nan")),
              "met (%.1f× faster)" % (others[fastest] / ours) if fastest and ours < others[fastest] else "NOT met",
              max(r["fp16audit"]["rss"]), leanest, lean.get(leanest, float("nan")), 1.25 * lean.get(leanest, float("nan")),
              "met" if leanest and max(r["fp16audit"]["rss"]) <= 1.25 * lean[leanest] else "NOT met (by %.0f MB)" % (
                  max(r["fp16audit"]["rss"]) - 1.25 * lean.get(leanest, 0))))
    w("")
    w("## Real fp16 kernels against the emulation")
    w("")
    w("The PyTorch script runs the models on this CPU's real fp16 kernels, under `torch.autocast(\"cpu\")` (CPU autocast,"
      " whose op lists are not CUDA's) and after `model.half()`. Where its outcome (outputs non-finite or beyond 5 % of"
      " fp32) differs from the truth of the emulated CUDA policy (fixtures/torch/oracle.py; fp16audit agrees with it on"
      " every fixture), the case is listed:")
    w("")
    dis = []
    for s in specs:
        g = results[s["id"]]["peers"]["pytorch"]["grade"]
        t = results[s["id"]]["truth_all"]
        if not g.get("real"):
            continue
        for mode, pol in (("autocast", "autocast-fp16"), ("half", "half")):
            rr = g["real"][mode]
            if pol not in t:
                continue
            real_fails = bool(rr["outputs_nonfinite"] or rr["raised"] or (rr["worst_rel_err"] or 0) > TOL)
            if real_fails != t[pol]["fails"]:
                dis.append("- `%s` under %s: real CPU fp16 %s (%s), the emulated CUDA policy %s (%s)." % (
                    s["id"], pol, "fails" if real_fails else "is clean",
                    rr["raised"] or ("NaN/Inf from `%s`" % rr["first_nonfinite_module"] if rr["outputs_nonfinite"] else
                                     "outputs within %.2g %% of fp32" % (100 * (rr["worst_rel_err"] or 0)) if not real_fails else
                                     "outputs off fp32 by %.0f %%" % (100 * rr["worst_rel_err"])),
                    "fails" if t[pol]["fails"] else "is clean", t[pol]["verdict"]))
    L.extend(dis or ["None: on every model the real CPU fp16 run and the emulated policy agree."])
    w("")
    if train:
        w("## The training step")
        w("")
        w("fp16audit's training audit (`--mode train --loss …`: the train-mode forward, the scaled loss gradient and every"
          " fp16 gradient, GradScaler's settled scale) against the PyTorch alternative, one training step under"
          " `torch.autocast(\"cpu\", dtype=torch.float16)` with a GradScaler-scaled backward and a tensor hook on every"
          " module's output gradient (`torch_train.py`), whole process, %d runs:" % runs)
        w("")
        w("| model | fp16audit forward audit | fp16audit training audit | ratio | PyTorch training step with hooks |")
        w("|---|---|---|---|---|")
        for row in train:
            w("| `%s` | %s s | %s s | %s× | %s s |" % (row["id"], rng(row["forward"], "%.2f"), rng(row["train"], "%.2f"),
                                                    rng([a / b for a, b in zip(row["train"], row["forward"])], "%.1f"),
                                                    rng(row["torch"], "%.2f")))
        w("")
    w("## What each peer cannot do")
    w("")
    w("Read off the table above (counts of %d models):" % len(specs))
    w("")
    for p in PEERS[1:]:
        gs = [results[s["id"]]["peers"][p]["grade"] for s in specs]
        ts = [results[s["id"]]["truth"] for s in specs]
        w("- **%s**: did not run on %d; false alarms on %d healthy; missed %d failures; named the origin of %d of the %d"
          " failures it flagged; gave a cause class on none; a fix that holds on %d failures." % (
              p, sum(not g["ran"] for g in gs),
              sum(1 for g, t in zip(gs, ts) if g["ran"] and not t["fails"] and g["flagged"]),
              sum(1 for g, t in zip(gs, ts) if g["ran"] and t["fails"] and g["flagged"] is False),
              sum(1 for g, t in zip(gs, ts) if g["ran"] and t["fails"] and g["flagged"] and origin_right(g, t)),
              sum(1 for g, t in zip(gs, ts) if g["ran"] and t["fails"] and g["flagged"]),
              sum(1 for g, t in zip(gs, ts) if t["fails"] and g.get("fix_holds"))))
        reasons = {}
        for g in gs:
            if not g["ran"]:
                key = g["note"].split(" in node")[0].split(" of node")[0][:110]
                reasons[key] = reasons.get(key, 0) + 1
        for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
            w("  - did not run on %d: %s" % (n, why.replace("|", "\\|")))
    w("")
    w("Why the ONNX peers miss what they miss, as far as the table shows it: Polygraphy's `--fp-to-fp16` and"
      " onnxconverter-common share one converter, whose fp16 models of the dynamo exports and of models that cast to"
      " half themselves do not load (the reasons above); and on ONNX Runtime's CPU provider an fp16 model's ops mostly"
      " compute in fp32 between the casts it inserts, so only the values a tool fetches are rounded: onnxconverter-common,"
      " which fetches the outputs alone, finds `resnet_raw_pixels` clean, while Polygraphy, which marks every tensor,"
      " sees its conv1 overflow. ModelOpt AutoCast keeps in fp32 every node whose fp32 values pass 512 (`--data_max`), a"
      " magnitude rule: it keeps the overflowing node, and as many that are only large.")
    w("")
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def train_rows(specs, runs):
    """fp16audit's forward and training audits and the PyTorch training
    step on the named models that have a loss here."""
    rows = []
    for s in specs:
        if s["case"] not in ("resnet18_raw_pixels", "hf_llama_massive_activation"):
            continue
        d = s["work"]
        tgt = os.path.join(d, "target.npy")
        x = np.load(os.path.join(d, "args.npz"))["arg0"]
        lm = s["case"].startswith("hf_llama")
        np.save(tgt, x if lm else np.arange(x.shape[0]) % 10)
        audit = [binary(), "run", os.path.join(d, "model.onnx"), "-i", os.path.join(d, "batches"), "--format", "json",
                 "--progress", "none", "--no-fixes", "-o"]
        fwd = audit + [os.path.join(d, "fwd.json")]
        tr = audit + [os.path.join(d, "train.json"), "--mode", "train", "--loss", "cross-entropy", "--target", tgt] + (["--lm-shift"] if lm else [])
        th = [PY, os.path.join(HERE, "torch_train.py"), os.path.join(d, "model.pt"), os.path.join(d, "args.npz"), tgt,
              "lm" if lm else "classes", os.path.join(d, "torch_train.json")]
        row = {"id": s["id"], "forward": [], "train": [], "torch": []}
        for _ in range(runs):
            for key, cmd in (("forward", fwd), ("train", tr), ("torch", th)):
                code, wall, _ = timed(cmd, os.path.join(d, "train-log.txt"), env=ort_env())
                row[key].append(wall)
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "peers.md"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--page-only", action="store_true", help="rewrite the page from the work folder's results.json")
    a = ap.parse_args()
    a.work = os.path.abspath(a.work)  # the peers run in folders of their own
    os.makedirs(a.work, exist_ok=True)
    specs = [s for s in models() if not a.only or s["id"] in a.only.split(",")]
    if a.page_only:
        saved = json.load(open(os.path.join(a.work, "results.json")))
        for s in specs:
            s["work"] = os.path.join(a.work, s["id"].replace("/", "__"))
        write_page(a.out, saved["results"], specs, a.runs, saved["train"])
        print("wrote", a.out)
        return
    rc, builders = case_builders()
    results = {}
    for s in specs:
        print("prepare", s["id"], flush=True)
        prepare(s, a.work, builders, rc)
        truth = json.load(open(os.path.join(s["work"], "truth.json")))["policies"]
        results[s["id"]] = {"truth": truth[POLICY], "truth_all": truth, "peers": {}}
    for s in specs:
        for p in PEERS:
            t0 = time.time()
            res = run_peer(p, s, a.runs)
            res["grade"] = grade(p, s, res, results[s["id"]]["truth"])
            results[s["id"]]["peers"][p] = res
            print("%-40s %-11s %5.1f s  %s %s" % (s["id"], p, time.time() - t0, cell(res["grade"], results[s["id"]]["truth"]),
                                                 res["grade"]["note"]), flush=True)
    train = train_rows(specs, a.runs)
    with open(os.path.join(a.work, "results.json"), "w") as f:
        json.dump({"results": results, "train": train}, f, indent=1, default=str)
    write_page(a.out, results, specs, a.runs, train)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
