"""Replay a captured training step from Python: the binary's replay, and the continuations that verify fixes over steps.

    import fp16audit
    r = fp16audit.replay("captures/step-000412-scale-collapse")            # one step, no torch needed
    r = fp16audit.replay(capture, model=model, loader=train_dl, loss_func=loss_func)   # + continuations
    r = fp16audit.replay(capture, learn=learn)                              # fastai: the learner's model, data, loss
    r                                         # in Jupyter: the HTML report
    print(r)                                  # the text report

The one-step replay is `fp16audit replay CAPTURE --format json`: the
verdict, the culprit and the fixes one step verifies all come from the
binary. With the model (its code, for the continuations: the capture
holds its weights) and a data loader, each fix that only shows over
steps is tried from the captured state for `steps` steps, in this
process and on the model's device (real fp16 kernels: CUDA, or the CPU
with torch.autocast("cpu", dtype=torch.float16) and
torch.amp.GradScaler("cpu")), against the fp32 continuation: the run as
it was, fp32, bf16, gradient clipping at the norm the replay proposes,
a tenth of the learning rate. Every continuation starts from its own
copy of the captured model, optimizer and scaler state
(Optimizer.load_state_dict does not copy the tensors it is given), with
the captured RNG state; the user's model, optimizer, data loader and
random generators are left as they were. The losses go back to the
binary (`--continuations`), which judges them: the Python side never
decides a verdict.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import shutil
import tempfile
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import _binary
from ._document import Document

__all__ = ["replay", "ReplayReport", "ReplayError", "continue_from", "CONTINUATION_FIXES"]

#: The fixes a continuation can try (besides the run as it was).
CONTINUATION_FIXES = ("fp32", "bf16", "clip", "lower-lr")


class ReplayError(RuntimeError):
    """The replay could not run: the binary refused the capture, or a continuation could not be set up."""


class ReplayReport(Document):
    """What `fp16audit replay` found, from its JSON document (`ReplayReport.json`).

    `verdict` and `verdict_text` say what happened at the captured step;
    `culprit` where (module, node, op; a weight or an activation; how it
    grew); `fixes` each fix with whether it held and how that was
    verified (one step, a continuation, the log), in fastai's and
    PyTorch's words; `continuations` the runs from the captured state.
    """

    render_error = ReplayError

    verdict = property(lambda self: self.json.get("verdict"))
    verdict_text = property(lambda self: self.json.get("verdict_text"))
    culprit = property(lambda self: self.json.get("culprit"))
    fixes = property(lambda self: self.json.get("fixes") or [])
    continuations = property(lambda self: self.json.get("continuations"))
    capture = property(lambda self: self.json.get("capture") or {})

    @property
    def reproduced(self) -> bool:
        """Whether the replay found the failure again (any verdict but not-reproduced)."""
        return self.verdict != "not-reproduced"

    @property
    def working_fixes(self) -> List[Dict[str, Any]]:
        """The fixes verified to hold."""
        return [f for f in self.fixes if f.get("works")]

    def __repr__(self) -> str:
        c = self.capture
        return "<fp16audit.ReplayReport %s at step %s (%s)>" % (self.verdict, c.get("step"), c.get("trigger"))


def _run(args: List[str], progress: bool) -> Tuple[int, str]:
    from .audit import _run_binary

    return _run_binary(args, progress)


def _replay_binary(capture: str, tmp: str, progress: bool, extra: Sequence[str] = ()) -> Tuple[Dict[str, Any], int]:
    out = os.path.join(tmp, "replay-%d.json" % len(os.listdir(tmp)))
    cmd = ["replay", capture, "--format", "json", "-o", out, "--progress", "json"]
    lib = _binary.onnxruntime_library()
    if lib:
        cmd += ["--ort-lib", lib]
    code, stderr = _run(cmd + list(extra), progress)
    if code not in (0, 1) or not os.path.exists(out):
        raise ReplayError("fp16audit replay %s failed (exit %d): %s" % (capture, code, stderr.strip() or "no message"))
    with open(out, encoding="utf-8") as f:
        return json.load(f), code


def replay(capture: "os.PathLike[str] | str", *, model: Any = None, loader: Any = None, loss_func: Any = None,
           learn: Any = None, optimizer_factory: Optional[Callable[..., Any]] = None, steps: int = 50,
           fixes: Sequence[str] = CONTINUATION_FIXES, n_inp: int = 1, progress: bool = True) -> ReplayReport:
    """Replay the captured step at `capture` (a folder the recorder wrote); see the module docstring.

    model and loader (or learn, a fastai Learner: its model, training
    data, loss and optimizer function) turn on the continuations: `steps`
    steps from the captured state for each of `fixes` (fp32, bf16, clip,
    lower-lr) and the run as it was. loss_func is the loss (default: the
    capture's loss by name); optimizer_factory(param_groups, lr) builds
    the optimizer over the copy's parameter groups (default: the captured
    torch.optim class with its hyperparameters; fastai's opt_func with
    learn); the captured per-parameter state is loaded into it. n_inp: how many
    leading elements of a batch from the loader are inputs.
    """
    capture = os.fspath(capture)
    if learn is not None:
        model = model if model is not None else learn.model
        loader = loader if loader is not None else learn.dls.train
        loss_func = loss_func if loss_func is not None else learn.loss_func
        if optimizer_factory is None:
            opt_func = learn.opt_func

            def optimizer_factory(groups, lr):  # noqa: E306 - fastai's optimizer, as the learner makes it
                return opt_func([g["params"] for g in groups] if len(groups) > 1 else groups[0]["params"], lr=lr)
    if (model is None) != (loader is None):
        raise ValueError("fp16audit.replay: the continuations need both the model and a data loader (or learn=)")
    unknown = [f for f in fixes if f not in CONTINUATION_FIXES]
    if unknown:
        raise ValueError("fp16audit.replay: fixes %s; want some of %s" % (unknown, ", ".join(CONTINUATION_FIXES)))
    tmp = tempfile.mkdtemp(prefix="fp16audit-replay-")
    try:
        doc, code = _replay_binary(capture, tmp, progress)
        notes: List[str] = []
        if model is None:
            return ReplayReport(doc, code, notes)
        conts, notes = continue_from(capture, model, loader, loss_func=loss_func, steps=steps, fixes=fixes,
                                     clip_norm=doc.get("clip_norm"), optimizer_factory=optimizer_factory, n_inp=n_inp,
                                     progress=progress)
        first = os.path.join(tmp, "one-step.json")
        with open(first, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        cpath = os.path.join(tmp, "continuations.json")
        with open(cpath, "w", encoding="utf-8") as f:
            json.dump(conts, f, allow_nan=False)
        doc, code = _replay_binary(capture, tmp, False, ["--from", first, "--continuations", cpath])
        return ReplayReport(doc, code, notes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- the continuations ----------------------------------------------------------

def _torch():
    import torch

    return torch


def _enc(x: float) -> Any:
    from .logfile import encode_float

    return encode_float(x)


def _manifest(capture: str) -> Dict[str, Any]:
    path = os.path.join(capture, "manifest.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ReplayError("fp16audit.replay: %s: %s (pass the folder the recorder wrote)" % (path, e)) from None


def _sha256(path: str) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _verified(capture: str, manifest: Dict[str, Any], rel: Optional[str]) -> Optional[str]:
    """The path of a state file the continuations read, after its size and sha256 are checked against the manifest
    (the binary checks only the sizes and headers of the files it does not read)."""
    import hashlib

    path = _inside(capture, rel)
    if path is None:
        return None
    want = (manifest.get("files") or {}).get(rel)
    if want is None:
        raise ReplayError("fp16audit.replay: %s is not listed in the capture's manifest: refused" % rel)
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
            n += len(block)
    if n != want.get("bytes") or h.hexdigest() != want.get("sha256"):
        raise ReplayError("fp16audit.replay: %s differs from the capture's manifest (size or sha256): the file changed after "
                          "the capture was written; capture the step again" % rel)
    return path


def _inside(capture: str, rel: Optional[str]) -> Optional[str]:
    """The path of a manifest entry, refused unless it stays inside the folder (the binary checked the whole
    capture before this runs; this is the Python side's own guard)."""
    if rel is None:
        return None
    if os.path.isabs(rel) or ".." in rel.split("/") or "\\" in rel:
        raise ReplayError("fp16audit.replay: the capture names %r, outside its folder: refused" % rel)
    path = os.path.join(capture, *rel.split("/"))
    if os.path.islink(path):
        raise ReplayError("fp16audit.replay: %r in the capture is a symlink: refused" % rel)
    return path


def _loss_by_name(entry: Dict[str, Any]) -> Callable[..., Any]:
    import torch.nn.functional as F

    name = entry.get("name")
    if name == "cross-entropy":
        ii = entry.get("ignore_index")
        ii = -100 if ii is None else int(ii)
        if entry.get("class_axis") == "last":
            return lambda out, y: F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), ignore_index=ii)
        return lambda out, y: F.cross_entropy(out, y, ignore_index=ii)
    funcs = {"bce": F.binary_cross_entropy_with_logits, "mse": F.mse_loss, "l1": F.l1_loss}
    if name in funcs:
        return funcs[name]
    raise ReplayError("fp16audit.replay: the capture's loss (%s) has no fp16audit counterpart: pass loss_func=" % entry.get("function"))


def _load_into(dup, state):
    torch = _torch()
    with torch.no_grad():
        params = dict(dup.named_parameters())
        buffers = dict(dup.named_buffers())
        for k, v in state.items():
            if k in params:
                params[k].data = v.clone()
            elif k in buffers:
                buffers[k].data = v.clone()


def _copy_model(model, state, device):
    """The user's module, deep-copied once per continuation with the captured state on device and no hooks, with the
    forward its class defines: Accelerate's prepare() wraps a model's forward in autocast (kept as _original_forward),
    which would run every continuation, fp32 and bf16 included, in the run's fp16."""
    torch = _torch()
    memo = {}
    for p in model.parameters():
        memo.setdefault(id(p), torch.nn.Parameter(torch.zeros(0), requires_grad=p.requires_grad))
    for b in model.buffers():
        memo.setdefault(id(b), torch.zeros(0))
    for m in model.modules():
        # the hooks are not copied at all: an observer's may hold what cannot be (a trainer callback's open log)
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                     "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called"):
            d = getattr(m, attr, None)
            if isinstance(d, dict):
                memo[id(d)] = type(d)()
    dup = copy.deepcopy(model, memo)
    for m in dup.modules():
        d = m.__dict__
        if "_original_forward" in d and "forward" in d:
            d["forward"] = d.pop("_original_forward")
    names = {k for k, _ in dup.named_parameters()} | {k for k, _ in dup.named_buffers()}
    missing = sorted(names - set(state))
    if missing:
        raise ReplayError("fp16audit.replay: the capture's state has no %s for this model (is it the captured model, %s?)" % (
            ", ".join(missing[:4]), type(model).__name__))
    _load_into(dup, state)
    dup.to(device)
    dup.train()
    return dup


def _optimizer(manifest, capture, dup, factory, lr_mult):
    """A fresh optimizer over dup's parameters with the captured hyperparameters and its own copy of the captured
    state; lr_mult scales every group's learning rate."""
    torch = _torch()
    from . import _safetensors

    path = _verified(capture, manifest, (manifest.get("optimizer") or {}).get("state"))
    if path is None:
        raise ReplayError("fp16audit.replay: the capture holds no optimizer state (the recorder was given no optimizer): "
                          "pass optimizer_factory=")
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    tensors, _ = _safetensors.read(_verified(capture, manifest, doc["tensors"]))
    params = dict(dup.named_parameters())
    groups = []
    for g in doc["param_groups"]:
        hyper = dict(g["hyper"])
        ps = [params[n] for n in g["params"] if n in params]
        groups.append(dict(hyper, params=ps))
    lr = float(doc.get("lr") or groups[0].get("lr") or 1e-3) * lr_mult
    if factory is not None:
        opt = factory(groups, lr)
    elif doc.get("kind") == "torch":
        cls = getattr(torch.optim, doc["class"], None)
        if cls is None or not isinstance(cls, type) or not issubclass(cls, torch.optim.Optimizer):
            raise ReplayError("fp16audit.replay: the captured optimizer %s.%s is not one of torch.optim's: pass optimizer_factory=" % (
                doc.get("module"), doc["class"]))
        ok = {k for k in cls.__init__.__code__.co_varnames}
        opt = cls([{k: (tuple(v) if isinstance(v, list) else v) for k, v in g.items() if k in ok or k == "params"} for g in groups])
    else:
        raise ReplayError("fp16audit.replay: the capture's optimizer is fastai's %s: pass learn= (or optimizer_factory=)" % doc["class"])

    def value(entry):
        if isinstance(entry, dict) and "tensor" in entry:
            return tensors[entry["tensor"]].clone().to(next(iter(params.values())).device)
        if isinstance(entry, dict) and "scalar" in entry:
            return torch.tensor(entry["scalar"], dtype=getattr(torch, entry.get("dtype") or "float32"))
        return copy.deepcopy(entry)

    for name, st in doc["state"].items():
        p = params.get(name)
        if p is not None:
            opt.state[p] = {k: value(v) for k, v in st.items()}
    if doc.get("kind") == "torch":
        for g, saved in zip(opt.param_groups, doc["param_groups"]):
            for k, v in saved["hyper"].items():
                if k in g and isinstance(v, (int, float)) and not isinstance(v, bool):
                    g[k] = v
            if "lr" in g:
                g["lr"] = float(saved["hyper"].get("lr", g["lr"])) * lr_mult
    elif hasattr(opt, "set_hyper"):
        opt.set_hyper("lr", lr)
    return opt


def _scaler(manifest, device_type):
    torch = _torch()
    gs = manifest.get("grad_scaler") or {}
    if not gs.get("enabled"):
        return None
    amp = getattr(torch, "amp", None)
    cls = getattr(amp, "GradScaler", None) if amp is not None else None
    if cls is None:
        raise ReplayError("this torch (%s) has no torch.amp.GradScaler for %s" % (torch.__version__, device_type))
    from .logfile import decode_float

    s = cls(device_type, init_scale=decode_float(gs["scale"]), growth_factor=gs.get("growth_factor") or 2.0,
            backoff_factor=gs.get("backoff_factor") or 0.5, growth_interval=gs.get("growth_interval") or 2000)
    if not s.is_enabled():
        raise ReplayError("torch.amp.GradScaler(%r) is disabled on this machine (torch %s)" % (device_type, torch.__version__))
    s.load_state_dict({"scale": decode_float(gs["scale"]), "growth_factor": gs.get("growth_factor") or 2.0,
                       "backoff_factor": gs.get("backoff_factor") or 0.5, "growth_interval": gs.get("growth_interval") or 2000,
                       "_growth_tracker": int(gs.get("growth_tracker") or 0)})
    return s


def _captured_batch(capture, manifest, device):
    import numpy as np

    torch = _torch()
    inputs = manifest["model"]["inputs"]
    with np.load(_inside(capture, manifest["batches"]["failing"]["inputs"]), allow_pickle=False) as z:
        xs = [torch.from_numpy(np.array(z[n])).to(device) for n in inputs]
    t = manifest["batches"]["failing"].get("target")
    y = None
    if t is not None:
        y = torch.from_numpy(np.load(_inside(capture, t), allow_pickle=False)).to(device)
    return xs, y


@contextlib.contextmanager
def _rng_kept():
    """Every generator the continuations touch is put back afterwards: torch's (CPU and CUDA), Python's, NumPy's."""
    torch = _torch()
    py = random.getstate()
    np_state = None
    try:
        import numpy as np

        np_state = np.random.get_state()
    except ImportError:  # pragma: no cover
        np = None
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py)
            if np_state is not None:
                np.random.set_state(np_state)


def _split_item(item, n_inp):
    torch = _torch()
    from .audit import _plain

    if isinstance(item, dict):
        raise ReplayError("fp16audit.replay: the loader yields dicts; the continuations take (inputs..., target) tuples")
    if isinstance(item, torch.Tensor):
        return [_plain(item)], None
    items = list(item)
    xs = [_plain(x) for x in items[:n_inp]]
    y = _plain(items[n_inp]) if len(items) > n_inp else None
    return xs, y


def continue_from(capture: "os.PathLike[str] | str", model: Any, loader: Any, *, loss_func: Any = None, steps: int = 50,
                  fixes: Sequence[str] = CONTINUATION_FIXES, clip_norm: Optional[float] = None,
                  optimizer_factory: Optional[Callable[..., Any]] = None, n_inp: int = 1,
                  progress: bool = True) -> Tuple[Dict[str, Any], List[str]]:
    """The continuations from the captured state (the document `fp16audit replay --continuations` reads) and notes.

    The first step replays the captured failing batch; the others take
    the first steps - 1 batches of fresh passes over `loader` (the same
    batches, kept on the CPU, for every continuation).
    """
    torch = _torch()
    from . import _safetensors
    from .audit import _Progress

    capture = os.fspath(capture)
    manifest = _manifest(capture)
    if int(steps) < 1:
        raise ValueError("fp16audit.replay: steps=%r; want at least 1" % (steps,))
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    dtype_name = manifest.get("precision", {}).get("dtype")
    policy = manifest.get("precision", {}).get("policy")
    state, _ = _safetensors.read(_verified(capture, manifest, manifest["model"]["state"]))
    loss = loss_func if loss_func is not None else _loss_by_name(manifest.get("loss") or {})
    rng = None
    rng_path = _verified(capture, manifest, manifest.get("rng"))
    if rng_path is not None:
        with open(rng_path, encoding="utf-8") as f:
            rng = json.load(f).get("torch")
    notes: List[str] = []
    with _rng_kept():
        x0, y0 = _captured_batch(capture, manifest, "cpu")
        batches = [(x0, y0)]
        # fresh passes over the loader until there are enough batches (a
        # short loader is gone through again, as the next epoch would)
        while len(batches) < steps:
            before = len(batches)
            for item in loader:
                if len(batches) >= steps:
                    break
                xs, y = _split_item(item, n_inp)
                batches.append(([x.detach().to("cpu", copy=True) for x in xs], None if y is None else y.detach().to("cpu", copy=True)))
            if len(batches) == before:
                break
    if len(batches) < steps:
        notes.append("the loader gave %d batch(es): the continuations ran %d steps, not %d" % (len(batches) - 1, len(batches), steps))
    half = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(dtype_name)
    variants = [("as-run", dtype_name if half is not None else "float32", half, policy == "autocast-fp16", None, 1.0)]
    for f in fixes:
        if f == "fp32":
            variants.append(("fp32", "float32", None, False, None, 1.0))
        elif f == "bf16" and policy != "autocast-bf16":
            variants.append(("bf16", "bfloat16", torch.bfloat16, False, None, 1.0))
        elif f == "clip" and clip_norm:
            variants.append(("clip", dtype_name or "float32", half, policy == "autocast-fp16", float(clip_norm), 1.0))
        elif f == "lower-lr":
            variants.append(("lower-lr", dtype_name or "float32", half, policy == "autocast-fp16", None, 0.1))
    runs = []
    bar = _Progress(progress)
    try:
        for vi, (name, prec, dtype, use_scaler, clip, lr_mult) in enumerate(variants):
            run: Dict[str, Any] = {"fix": name, "precision": prec, "scaler": use_scaler, "clip_norm": clip, "lr": None,
                                   "losses": [], "skipped": [], "error": ""}
            try:
                with _rng_kept():
                    if rng is not None:
                        torch.set_rng_state(torch.tensor(rng, dtype=torch.uint8))
                    _continue(run, manifest, capture, model, state, device, dtype, use_scaler, clip, lr_mult, loss, batches,
                              optimizer_factory, lambda k: bar.update({"pass_index": vi, "pass": "continuation " + name,
                                                                        "batches": len(batches), "batch": k + 1}))
            except ReplayError as e:
                run["error"] = str(e)
            except Exception as e:  # noqa: BLE001 - a fix that cannot run is reported, not raised
                run["error"] = "%s: %s" % (type(e).__name__, e)
            runs.append(run)
    finally:
        bar.close()
    doc = {
        "format": "fp16audit.continuations", "version": 1,
        "manifest_sha256": _sha256(os.path.join(capture, "manifest.json")),
        "steps": len(batches), "device": str(device),
        "batches": "the captured failing batch, then %d from fresh passes over the loader" % (len(batches) - 1),
        "runs": runs,
    }
    return doc, notes


def _continue(run, manifest, capture, model, state, device, dtype, use_scaler, clip, lr_mult, loss, batches, factory, tick):
    torch = _torch()
    dup = _copy_model(model, state, device)
    opt = _optimizer(manifest, capture, dup, factory, lr_mult)
    lr = None
    if hasattr(opt, "param_groups") and opt.param_groups and "lr" in opt.param_groups[0]:
        lr = float(opt.param_groups[0]["lr"])
    run["lr"] = lr
    scaler = _scaler(manifest, device.type) if use_scaler else None
    for k, (xs, y) in enumerate(batches):
        xs = [x.to(device) for x in xs]
        yd = None if y is None else y.to(device)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            out = dup(*xs)
            value = loss(out.float() if out.is_floating_point() else out, yd) if yd is not None else loss(out)
        before = scaler.get_scale() if scaler is not None else None
        if scaler is not None:
            scaler.scale(value).backward()
            if clip:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(dup.parameters(), clip)
            scaler.step(opt)
            scaler.update()
            run["skipped"].append(bool(scaler.get_scale() < before))
        else:
            value.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(dup.parameters(), clip)
            opt.step()
            run["skipped"].append(False)
        opt.zero_grad()
        run["losses"].append(_enc(float(value.detach().float().item())))
        tick(k)
    del dup, opt
