"""Audit a PyTorch model from Python: export, run the fp16audit binary, read its report.

    import fp16audit
    r = fp16audit.audit(model, batch)      # a tensor, a tuple, a dict, or a DataLoader
    r                                      # in Jupyter: the HTML report
    print(r)                               # the text report
    r.raise_for_failure()                  # in a script or CI

The model is exported to ONNX in fp32 and eval mode (the dynamo exporter
where torch has it, TorchScript where that fails or is asked for), the
batches are written as .npz into a private temporary folder, and the
binary audits them (`fp16audit run … --format json`); the folder is
removed afterwards, whatever happens. The Python side never decides a
verdict: everything in the Report comes from the binary's JSON. The
user's model is left as it was (mode, parameters and buffers).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import _axes, _binary
from ._document import Document
from . import _export as _exp
from ._axes import BatchAxes

__all__ = ["audit", "Report", "AuditError", "AuditFailure", "ExportError", "BatchError", "ModelError", "LOSSES", "POLICIES"]

# What the binary's --policy and --loss accept.
POLICIES = ("autocast-fp16", "autocast-bf16", "half", "fp32")
LOSSES = ("cross-entropy", "bce", "mse", "l1", "output")

# torch.nn losses by class name, as fp16audit's --loss names them.
_NN_LOSSES = {
    "CrossEntropyLoss": "cross-entropy", "NLLLoss": None, "BCEWithLogitsLoss": "bce",
    "MSELoss": "mse", "L1Loss": "l1",
}


class AuditError(RuntimeError):
    """The audit could not run: the binary refused the model or its batches, or failed."""


class ExportError(AuditError):
    """No exporter could write the model as ONNX."""


class BatchError(AuditError, TypeError):
    """A batch is of a type or shape the audit cannot use."""


class ModelError(AuditError, ValueError):
    """The model cannot be audited as it stands (its weights are on the meta device)."""


class AuditFailure(AssertionError):
    """Report.raise_for_failure(): the audit found an error-level problem."""

    def __init__(self, report: "Report"):
        super().__init__("fp16audit: %s — %s" % (report.verdict, report.verdict_text))
        self.report = report


# -- the report ---------------------------------------------------------------

class Report(Document):
    """What the binary found, from its JSON document (`Report.json`).

    `verdict` and `verdict_text` say what will happen under the policy;
    `origins` where NaN/Inf start (ONNX node and PyTorch module path),
    `fixes` the fixes verified by a rerun, `findings` every check's
    finding, `output_agreement` each output against fp32, `training` the
    backward audit when a loss was given. `ok` is False when some finding
    reached the failing level (the binary's exit status 1). `exporter`
    says which exporter wrote the model and `exporter_note` how (why not
    the other, the batch axes where they are not every input's axis 0,
    an export reused); `batch_axes` each input's and output's batch axis
    as the export has it (None: none).
    """

    render_error = AuditError

    def __init__(self, document: Dict[str, Any], exit_code: int, exporter: str, exporter_note: str = "",
                 notes: Sequence[str] = (), batch_axes: Optional[Mapping[str, Optional[int]]] = None):
        super().__init__(document, exit_code, notes)
        self.exporter = exporter
        self.exporter_note = exporter_note
        self.batch_axes: Dict[str, Optional[int]] = dict(batch_axes or {})

    verdict = property(lambda self: self.json.get("verdict"))
    verdict_text = property(lambda self: self.json.get("verdict_text"))
    origins = property(lambda self: self.json.get("origins") or [])
    fixes = property(lambda self: self.json.get("fixes") or [])
    findings = property(lambda self: self.json.get("findings") or [])
    output_agreement = property(lambda self: self.json.get("output_agreement") or [])
    training = property(lambda self: self.json.get("training"))
    policy = property(lambda self: self.json.get("policy"))

    @property
    def ok(self) -> bool:
        """No finding at the failing level (--fail-on, error by default)."""
        return self.exit_code == 0

    @property
    def modules(self) -> List[str]:
        """The PyTorch module paths of the origins, in order (getattr-able on the model)."""
        return [o.get("module") for o in self.origins if o.get("module")]

    @property
    def working_fixes(self) -> List[Dict[str, Any]]:
        return [f for f in self.fixes if f.get("works")]

    def raise_for_failure(self) -> "Report":
        """Raise AuditFailure when the audit failed; return self otherwise."""
        if not self.ok:
            raise AuditFailure(self)
        return self

    def __repr__(self) -> str:
        return "<fp16audit.Report %s (%s, %s%s)>" % (self.verdict, self.policy, "ok" if self.ok else "fails",
                                                     ", " + ", ".join(self.modules[:3]) if self.modules else "")


# -- batches ------------------------------------------------------------------

def _torch():
    import torch

    return torch


def _plain(x):
    """A plain CPU tensor of x (fastai's TensorBase subclasses, a device
    tensor, a numpy array)."""
    torch = _torch()
    if isinstance(x, torch.Tensor):
        if type(x) is not torch.Tensor:
            x = x.as_subclass(torch.Tensor)
        return x.detach()
    try:
        import numpy as np

        if isinstance(x, np.ndarray):
            return torch.from_numpy(x)
    except ImportError:  # pragma: no cover - numpy comes with torch
        pass
    raise BatchError("fp16audit.audit: a batch element is a %s; want a torch.Tensor (or a tuple, list or dict of them)" % type(x).__name__)


def _split(item, n_inp: Optional[int]) -> Tuple[List[Any], Optional[Any], Optional[List[str]]]:
    """Inputs, target and input names of one batch: a tensor is the only
    input; a dict maps input names to tensors; a tuple or list holds the
    inputs, then (when n_inp says so, or a DataLoader yields (x, y) pairs)
    the target."""
    torch = _torch()
    if isinstance(item, Mapping):
        return [_plain(v) for v in item.values()], None, [str(k) for k in item.keys()]
    if isinstance(item, torch.Tensor):
        return [_plain(item)], None, None
    if isinstance(item, (tuple, list)):
        items = list(item)
        if n_inp is None:
            n_inp = len(items)
        if not 0 < n_inp <= len(items):
            raise BatchError("fp16audit.audit: n_inp=%d, but a batch holds %d elements" % (n_inp, len(items)))
        target = items[n_inp] if len(items) > n_inp else None
        return [_plain(x) for x in items[:n_inp]], (_plain(target) if target is not None else None), None
    return [_plain(item)], None, None


def _draw(batch, n_batches: int, n_inp: Optional[int]):
    """The batches to audit: one batch, or up to n_batches drawn from an
    iterable (a DataLoader). A DataLoader of (x, y) pairs counts its last
    element as the target unless n_inp says otherwise."""
    torch = _torch()
    if isinstance(batch, (torch.Tensor, Mapping, tuple, list)):
        return [_split(batch, n_inp)]
    if isinstance(batch, Iterable):
        out = []
        for item in batch:
            k = n_inp
            if k is None and isinstance(item, (tuple, list)) and len(item) == 2:
                k = 1
            out.append(_split(item, k))
            if len(out) >= n_batches:
                break
        if not out:
            raise BatchError("fp16audit.audit: the DataLoader yielded no batch")
        return out
    raise BatchError("fp16audit.audit: batch is a %s; want a tensor, a tuple or dict of tensors, or a DataLoader" % type(batch).__name__)


def _input_names(model, n: int, given: Optional[List[str]]) -> List[str]:
    if given:
        return given
    names = _forward_params(model)[:n]
    if len(names) < n or len(set(names)) < n:
        names = ["input_%d" % i for i in range(n)] if n > 1 else ["input"]
    return names


# Keys of a dict batch that hold the target, not an input: a Hugging Face
# batch's labels go to the loss, not to forward (which would compute its
# own loss in the export).
_TARGET_KEYS = ("labels", "label", "target", "targets", "y")


def _forward_params(model) -> List[str]:
    """forward's positional parameters (without self); [] when its
    signature cannot be read."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _arrange_dict(model, xs: List[Any], keys: List[str], index: int) -> Tuple[List[Any], Optional[Any], List[str]]:
    """A dict batch as forward takes it: the keys that name forward's
    parameters are the inputs, in forward's order (passed positionally, so
    they must be its leading parameters); a target key (labels, ...) is the
    target. Anything else is refused with what to do."""
    params = _forward_params(model)
    items = dict(zip(keys, xs))
    target_key = next((k for k in keys if k in _TARGET_KEYS), None)
    target = items.pop(target_key) if target_key is not None else None
    sig = "%s.forward(%s)" % (type(model).__name__, ", ".join(params))
    unknown = [k for k in items if k not in params]
    if unknown and params:
        one = len(unknown) == 1
        raise BatchError("fp16audit.audit: batch %d is a dict whose key%s %s %s not a parameter of %s; the audit passes a "
                         "dict's tensors to forward by name: drop %s from the batch, or rename %s after forward's parameters" % (
                             index, "" if one else "s", ", ".join(repr(k) for k in unknown), "is" if one else "are", sig,
                             "it" if one else "them", "it" if one else "them"))
    if not items:
        raise BatchError("fp16audit.audit: batch %d is a dict that holds only the target (%s): add the model's inputs" % (index, target_key))
    if not params:
        return list(items.values()), target, list(items)
    order = sorted(items, key=params.index)
    missing = [p for p in params[:params.index(order[-1])] if p not in items]
    if missing:
        raise BatchError("fp16audit.audit: batch %d is a dict with %s but without %s, which %s takes before %r: the audit "
                         "passes a dict's tensors as forward's leading arguments; add %s to the batch or leave out the keys after it" % (
                             index, ", ".join(repr(k) for k in order), ", ".join(repr(k) for k in missing), sig, order[-1], missing[0]))
    return [items[k] for k in order], target, order


def _check_batches(names: List[str], drawn) -> None:
    """Refuse batches whose inputs differ in rank or dtype from batch 0's."""
    first = drawn[0][0]
    for b, (xs, _, _) in enumerate(drawn[1:], 1):
        for n, x0, x in zip(names, first, xs):
            if x.dim() != x0.dim() or x.dtype != x0.dtype:
                raise BatchError("fp16audit.audit: batch %d's input %r is %s %s, batch 0's is %s %s: every batch must give each input "
                                 "the same rank and dtype (draw the batches from one DataLoader, or audit them one at a time)" % (
                                     b, n, tuple(x.shape), str(x.dtype).replace("torch.", ""), tuple(x0.shape), str(x0.dtype).replace("torch.", "")))


def _write_npz(path: str, names: List[str], tensors: List[Any]) -> None:
    import numpy as np

    arrays = {}
    for name, t in zip(names, tensors):
        a = t.cpu()
        if a.dtype == _torch().bfloat16:
            a = a.float()
        arrays[name] = a.numpy()
    np.savez(path, **arrays)


# -- export -------------------------------------------------------------------

@contextlib.contextmanager
def _left_as_it_was(model):
    """Restore the model's mode and buffers after the export: a training-mode
    export runs the model once, and BatchNorm updates its running statistics
    then. A Hugging Face model's key-value cache is off meanwhile
    (_cache_off)."""
    training = model.training
    buffers = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()
               if not isinstance(v, _torch().nn.Parameter)}
    try:
        with _cache_off(model):
            yield
    finally:
        with _torch().no_grad():
            state = model.state_dict(keep_vars=True)
            for k, v in buffers.items():
                state[k].copy_(v)
        model.train(training)


@contextlib.contextmanager
def _cache_off(model):
    """A Hugging Face model's key-value cache (its config's use_cache) off,
    and back on afterwards: an export cannot return transformers'
    DynamicCache, and a training step does not use it."""
    config = getattr(model, "config", None)
    cache = getattr(config, "use_cache", None)
    if cache:
        config.use_cache = False
    try:
        yield
    finally:
        if cache:
            config.use_cache = cache


# The export's machinery lives in _export; these names are audit's own
# (the capture of issue 42 calls _export).
_has_dynamo = _exp.has_dynamo
_batchnorms = _exp.batchnorms
_quiet = _exp.quiet


def _export(model, args, names, out_names, path, exporter, train_mode, axes=None):
    """Export model to path (its external data, if any, beside it); returns
    (exporter used, a note saying why when it is not the first choice).
    axes are the inputs' dynamic axes (the batch axis of each by default)."""
    axes = dict(axes or {n: {0: "batch"} for n in names})
    folder = tempfile.mkdtemp(prefix="fp16audit-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        ex = _exp.export(model, args, names, out_names, folder, exporter, train_mode, axes, made_up=False, static_ok=False)
        for f in os.listdir(os.path.dirname(ex.path)):
            dst = os.path.join(os.path.dirname(os.path.abspath(path)), f if f != "model.onnx" else os.path.basename(path))
            shutil.move(os.path.join(os.path.dirname(ex.path), f), dst)
        return ex.exporter, ex.note
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _flatten(out, prefix: str = "output") -> List[Tuple[str, Any]]:
    """The tensors of a forward's result in the order the exporters write
    them as graph outputs, each with its name: "output" for a lone
    tensor, output_0, output_1, ... in a tuple (output_1_0 nested), a
    dict's keys (a Hugging Face ModelOutput's)."""
    torch = _torch()
    if isinstance(out, torch.Tensor):
        return [(prefix, out)]
    if isinstance(out, Mapping):
        flat = []
        for k, v in out.items():
            flat += _flatten(v, str(k))
        return flat
    if isinstance(out, (tuple, list)):
        flat = []
        for i, v in enumerate(out):
            flat += _flatten(v, "%s_%d" % (prefix, i))
        return flat
    return []


def _outputs(model, args) -> List[Tuple[str, Any]]:
    with _torch().no_grad():
        return _flatten(model(*args))


# -- running the binary --------------------------------------------------------

class _Progress:
    """Progress of the binary's passes, one bar per pass: fastprogress (a
    notebook's or a terminal's bar, as fastai's loops show) when it is
    there, tqdm otherwise, else nothing. A bar that fails is dropped: it
    never stops the audit."""

    def __init__(self, enabled: bool):
        self.kind, self.bar, self.pass_index = None, None, None
        if not enabled:
            return
        for kind, module in (("fastprogress", "fastprogress.fastprogress"), ("tqdm", "tqdm")):
            try:
                __import__(module)
                self.kind = kind
                break
            except ImportError:
                continue

    def update(self, p: Dict[str, Any]) -> None:
        if self.kind is None:
            return
        try:
            label = "fp16audit: pass %d (%s)" % (p["pass_index"], p["pass"])
            if p["pass_index"] != self.pass_index:
                self.close()
                self.pass_index = p["pass_index"]
                if self.kind == "tqdm":
                    import tqdm

                    self.bar = tqdm.tqdm(total=p["batches"], desc=label, leave=False, unit="batch")
                else:
                    from fastprogress.fastprogress import progress_bar

                    self.bar = progress_bar(range(p["batches"]), leave=False)
                    self.bar.comment = label
                    self.bar.on_iter_begin()
            if self.kind == "tqdm":
                self.bar.n = p["batch"]
                self.bar.refresh()
            else:
                self.bar.update(p["batch"])
        except Exception:  # a display problem must not stop the audit
            self.kind, self.bar = None, None

    def close(self) -> None:
        try:
            if self.bar is not None:
                if self.kind == "tqdm":
                    self.bar.close()
                else:
                    self.bar.on_iter_end()
        except Exception:
            self.kind = None
        self.bar = None


def _run_binary(args: List[str], progress: bool) -> Tuple[int, str]:
    """Run the binary; its JSON progress lines drive a progress bar, other
    stderr lines are kept (and echoed when no bar is shown). Ctrl-C stops
    the binary and is raised again."""
    cmd = [_binary.find_binary()] + args
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, bufsize=1)
    except OSError as e:
        raise _binary.BinaryNotFound("fp16audit: %s cannot run here (%s): it is built for another platform or is damaged; "
                                     "install the wheel for this platform or rebuild it with `make build`" % (cmd[0], e)) from e
    bar = _Progress(progress)
    kept = []
    try:
        for line in proc.stderr:
            if line.startswith('{"progress"'):
                try:
                    bar.update(json.loads(line)["progress"])
                    continue
                except (ValueError, KeyError):
                    pass
            kept.append(line)
        code = proc.wait()
    except KeyboardInterrupt:
        # the binary stops its session on SIGINT and exits; wait for it so
        # that nothing is left running, then give the interrupt back
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    finally:
        bar.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    return code, "".join(kept)


# -- the entry point ------------------------------------------------------------

def _loss_name(loss) -> Tuple[Optional[str], Optional[str], str]:
    """fp16audit's --loss for a name or a loss module: (name, class axis,
    note); name None when the loss cannot be mapped (the note says so)."""
    if loss is None or loss is False:
        return None, None, ""
    if isinstance(loss, str):
        if loss not in LOSSES:
            raise ValueError("fp16audit.audit: loss=%r; want one of %s, or a torch.nn loss module" % (loss, ", ".join(LOSSES)))
        return loss, None, ""
    name = type(loss).__name__
    if name in _NN_LOSSES and _NN_LOSSES[name]:
        return _NN_LOSSES[name], None, ""
    return None, None, "the loss %s has no fp16audit counterpart (%s): the forward pass is audited, the backward is not" % (name, ", ".join(LOSSES))


# Said once per process: a machine without CUDA emulates fp16, and the
# verdict holds for the GPU the model trains on.
_CPU_NOTE = ("this machine has no CUDA: fp16 was emulated on the CPU (ONNX Runtime, with fp16's range and rounding wherever "
             "the policy holds a value in fp16), and the verdict holds for the same model and batches on a GPU")
_cpu_note_said = False


def _device_type(model) -> str:
    """The device type the model's parameters are on (cpu without any)."""
    return next((t.device.type for t in list(model.parameters()) + list(model.buffers())), "cpu")


def _meta_check(model) -> None:
    """Refuse a model whose weights are on the meta device: shapes with no
    values (a model built under torch.device("meta") or loaded with
    device_map="meta"/low_cpu_mem_usage, not yet filled in)."""
    meta = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if meta:
        raise ModelError("fp16audit.audit: the model's weights are on the meta device (%s%s): they have shapes but no values, so "
                         "nothing can be run or exported. Load the weights first: model.to_empty(device='cpu') then "
                         "model.load_state_dict(...), or from_pretrained(...) without device_map='meta'" % (
                             ", ".join(meta[:3]), ", ... (%d in all)" % len(meta) if len(meta) > 3 else ""))


def audit(model, batch, *, n_batches: int = 2, n_inp: Optional[int] = None, policy: str = "autocast-fp16",
          loss: Any = None, target: Any = None, class_axis: Optional[str] = None, init_scale: Optional[float] = None,
          max_memory: Optional[str] = None, exporter: str = "auto", progress: bool = True, fixes: bool = True,
          device_type: Optional[str] = None, batch_axes: BatchAxes = None, dynamic_axes: Optional[Mapping[str, Any]] = None,
          cache: bool = True, extra_args: Sequence[str] = (), _notes: Sequence[str] = ()) -> Report:
    """Audit `model` on `batch` for fp16 mixed-precision failures.

    batch: a tensor (the only input), a tuple or list of tensors (the
    inputs; with n_inp, the element after them is the target), a dict of
    input name to tensor (forward's parameters by name; a labels, label,
    target, targets or y key is the target), or a DataLoader, from which
    up to n_batches are drawn (a DataLoader of (x, y) pairs: x is the
    input, y the target). policy: autocast-fp16 (learn.to_fp16(),
    torch.autocast), autocast-bf16, half (model.half()) or fp32. loss:
    None (forward only), one of LOSSES, or a torch.nn loss module; with a
    loss the model is exported in training mode and the backward is
    audited against the target (the first batch's, or `target`).
    init_scale: the GradScaler's initial scale. max_memory: the binary's
    --max-memory ("4G"). exporter: 'auto' (the TorchScript exporter,
    the dynamo exporter where that fails or where the tracer meets a
    branch on a tensor), 'dynamo' or 'torchscript'; either keeps every
    BatchNorm as its own node. device_type: the torch.autocast
    device_type the fixes name (default: the device the model's
    parameters are on). batch_axes: each input's batch axis (an int for
    every input, a dict by input name or a list; None in it: no batch
    axis), inferred when not given; dynamic_axes: torch.onnx.export's
    dynamic_axes, taken as given. cache: reuse the export of an earlier
    audit of this model object while its weights, buffers, modules and
    hooks are unchanged.
    """
    torch = _torch()
    if not isinstance(model, torch.nn.Module):
        raise TypeError("fp16audit.audit: model is a %s; want a torch.nn.Module" % type(model).__name__)
    if policy not in POLICIES:
        raise ValueError("fp16audit.audit: policy=%r; want one of %s" % (policy, ", ".join(POLICIES)))
    if exporter not in ("auto", "dynamo", "torchscript"):
        raise ValueError("fp16audit.audit: exporter=%r; want 'auto', 'dynamo' or 'torchscript'" % exporter)
    if batch_axes is not None and dynamic_axes is not None:
        raise ValueError("fp16audit.audit: pass batch_axes or dynamic_axes, not both (dynamic_axes is taken as given)")
    _meta_check(model)
    return _audit(torch, model, batch, n_batches, n_inp, policy, loss, target, class_axis, init_scale, max_memory,
                  exporter, progress, fixes, device_type or _device_type(model), batch_axes, dynamic_axes, cache, extra_args, _notes)


def _shapes(names: Sequence[str], xs) -> str:
    return ", ".join("%s %s %s" % (n, tuple(x.shape), str(x.dtype).replace("torch.", "")) for n, x in zip(names, xs))


def _cache_key(torch, model, names, drawn, target0, exporter, train_mode, batch_axes, dynamic_axes, device) -> Optional[Tuple]:
    """What an export, its outputs' names and its axes depend on: the model
    (fingerprint), how it is exported, and the inputs' dtypes and shapes in
    every batch drawn; None when the model's tensors cannot be read."""
    fp = _exp.fingerprint(model)
    if fp is None:
        return None
    sig = tuple(tuple((str(x.dtype), tuple(x.shape)) for x in xs) for xs, _, _ in drawn)
    tshape = tuple(target0.shape) if target0 is not None and hasattr(target0, "shape") else None
    return (id(model), fp, exporter, train_mode, tuple(names), sig, tshape, repr(batch_axes), repr(dynamic_axes), str(device),
            torch.__version__)


# An ONNX Runtime failure of the binary that the shapes the export was
# given can cause (a trace that fixed a size the dynamic axes free)
_SHAPE_TROUBLE = re.compile(r"status code|running \w+ node|out of (data )?bounds|cannot be reshaped|must agree|[Ii]nvalid rank|dimension", re.I)


def _audit(torch, model, batch, n_batches, n_inp, policy, loss, target, class_axis, init_scale, max_memory, exporter,
           progress, fixes, device_type, batch_axes, dynamic_axes, cache, extra_args, _notes) -> Report:
    global _cpu_note_said
    drawn = _draw(batch, n_batches, n_inp)
    for i, (xs, t, keys) in enumerate(drawn):
        if keys is not None:
            xs, t, keys = _arrange_dict(model, xs, keys, i)
            drawn[i] = (xs, t, keys)
    inputs0, target0, names0 = drawn[0]
    for i, (xs, _, keys) in enumerate(drawn):
        if len(xs) != len(inputs0) or keys != names0:
            raise BatchError("fp16audit.audit: batch %d has %d inputs%s, batch 0 has %d%s" % (
                i, len(xs), " (%s)" % ", ".join(keys) if keys else "", len(inputs0), " (%s)" % ", ".join(names0) if names0 else ""))
        for x in xs:
            if x.dim() > 0 and x.shape[0] == 0:
                raise BatchError("fp16audit.audit: batch %d is empty (its first dimension is 0): it would pass any check" % i)
    names = _input_names(model, len(inputs0), names0)
    _check_batches(names, drawn)
    loss_name, axis, loss_note = _loss_name(loss)
    notes = list(_notes)
    if loss_note:
        notes.append(loss_note)
    if target is not None:
        target0 = _plain(target)
    if loss_name and loss_name != "output" and target0 is None:
        raise BatchError("fp16audit.audit: loss=%r needs a target: pass target=..., or batches that hold one (n_inp)" % loss_name)
    train_mode = loss_name is not None
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    args = [x.to(device) for x in inputs0]

    tmp = tempfile.mkdtemp(prefix="fp16audit-")
    try:
        key = _cache_key(torch, model, names, drawn, target0, exporter, train_mode, batch_axes, dynamic_axes, device) if cache else None
        ex = _exp.CACHE.get(model, key) if key is not None else None
        reused = ex is not None
        if ex is not None:
            # the same model, weights and shapes: it ran, and was exported
            axes, out_names = ex.plan, ex.out_names
        else:
            with _left_as_it_was(model):
                model.eval()
                try:
                    with torch.no_grad():
                        out = model(*args)
                except Exception as e:
                    raise BatchError("fp16audit.audit: the model does not run on the batch (inputs %s): %s: %s" % (
                        _shapes(names, inputs0), type(e).__name__, e)) from e
                outputs = _flatten(out)
                if not outputs:
                    raise ExportError("fp16audit.audit: %s.forward returns a %s, which holds no tensor: there is nothing to audit; "
                                      "audit a module that returns the model's outputs as tensors" % (type(model).__name__, type(out).__name__))
                out_names = [n for n, _ in outputs]
                axes = _axes.plan(model, names, drawn, outputs, target0, batch_axes, dynamic_axes,
                                  run=lambda xs: [t for _, t in _outputs(model, [x.to(device) for x in xs])])
                del out, outputs
                if train_mode:
                    model.train()
                ex = _export_into(model, args, names, out_names, exporter, train_mode, axes, axes.made_up, tmp, key)
                ex.plan, ex.out_names = axes, out_names
        used = drawn
        if ex.static_fallback and axes.varying:
            used = [d for d in drawn if all(tuple(x.shape) == tuple(x0.shape) for x, x0 in zip(d[0], inputs0))]
            left = [str(i) for i, d in enumerate(drawn) if d not in used]
            notes.append("batch%s %s left out: the model exports only with static shapes, and %s of batch 0's" % (
                "es" if len(left) > 1 else "", ", ".join(left), "their shapes are not" if len(left) > 1 else "its shapes are not"))
        code, stderr, report_path = _run(tmp, ex, names, used, policy, device_type, train_mode, loss_name, target0, axis,
                                         class_axis, init_scale, max_memory, fixes, extra_args, progress)
        retried = ""
        if code not in (0, 1) and axes.made_up and ex.axes and not axes.varying and _SHAPE_TROUBLE.search(stderr):
            # the dynamic axes the audit inferred may be what ONNX Runtime
            # failed on (a trace that fixed a size they free): once more
            # with static shapes before saying anything
            with _left_as_it_was(model):
                model.train(train_mode)
                ex2 = _export_into(model, args, names, out_names, exporter, train_mode, None, False, tmp, key, sub="static")
                ex2.plan, ex2.out_names = axes, out_names
            code2, stderr2, report_path2 = _run(tmp, ex2, names, used, policy, device_type, train_mode, loss_name, target0, axis,
                                                class_axis, init_scale, max_memory, fixes, extra_args, progress)
            if code2 in (0, 1):
                retried = ("the audit with the inferred dynamic axes failed in ONNX Runtime (%s): exported again with static "
                           "shapes" % stderr.strip().splitlines()[-1][:300])
                ex, code, stderr, report_path = ex2, code2, stderr2, report_path2
        if code not in (0, 1) or not os.path.exists(report_path):
            msg = "fp16audit run failed (exit %d): %s" % (code, stderr.strip() or "no message")
            if not re.search(r"library not found|pip install onnxruntime", stderr):
                msg += (". The audit exported the model with the %s exporter, %s; if an axis is not the batch's, pass "
                        "batch_axes= (an axis per input) or dynamic_axes=" % (ex.exporter, axes.describe()))
            raise AuditError(msg)
        with open(report_path, encoding="utf-8") as f:
            doc = json.load(f)
        if stderr.strip():
            notes.append(stderr.strip())
        if not torch.cuda.is_available():
            notes.append(_CPU_NOTE)
            if not _cpu_note_said:
                _cpu_note_said = True
                print("fp16audit: " + _CPU_NOTE, file=sys.stderr)
        note = [ex.note] if ex.note else []
        if (axes.made_up and any(a not in (0, None) for a in axes.batch.values())) or axes.how.startswith("no axis"):
            note.append(axes.describe())
        if retried:
            note.append(retried)
        if reused:
            note.append("the export of an earlier audit of this model was reused (its weights, buffers, modules and hooks are "
                        "unchanged; cache=False exports again)")
        return Report(doc, code, ex.exporter, "; ".join(note), notes, batch_axes=axes.batch)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _export_into(model, args, names, out_names, exporter, train_mode, axes: Optional[_axes.Axes], made_up, tmp, key, sub="export"):
    """Export into a folder of its own (kept by the cache when key says it
    may be: no branch kept by the tracer) or into tmp."""
    folder = tempfile.mkdtemp(prefix="fp16audit-export-") if key is not None else os.path.join(tmp, sub)
    os.makedirs(folder, exist_ok=True)
    try:
        # static_ok: a static export serves the batches of batch 0's
        # shapes, and the audit leaves the others out (and says so)
        ex = _exp.export(model, args, names, out_names, folder, exporter, train_mode, axes.dynamic if axes is not None else None,
                         made_up, static_ok=True)
    except BaseException:
        if key is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    if key is not None:
        if ex.branches:
            # this batch's branch: not for another audit; moved under tmp
            # to go with it
            dst = os.path.join(tmp, sub)
            shutil.move(folder, dst)
            ex.path = os.path.join(dst, os.path.relpath(ex.path, folder))
        else:
            _exp.CACHE.put(model, key, folder, ex)
    return ex


def _run(tmp, ex, names, drawn, policy, device_type, train_mode, loss_name, target0, axis, class_axis, init_scale, max_memory,
         fixes, extra_args, progress) -> Tuple[int, str, str]:
    """Write the batches and run the binary on ex's model: (exit code,
    its stderr, the report's path)."""
    bdir = os.path.join(tmp, "batches")
    shutil.rmtree(bdir, ignore_errors=True)
    os.mkdir(bdir)
    # the inputs the export has (an input the trace never read is not one)
    keep = [i for i, n in enumerate(names) if ex.inputs is None or n in ex.inputs]
    for i, (xs, _, _) in enumerate(drawn):
        _write_npz(os.path.join(bdir, "batch%d.npz" % i), [names[k] for k in keep], [xs[k] for k in keep])
    report_path = os.path.join(tmp, "report.json")
    if os.path.exists(report_path):
        os.remove(report_path)
    cmd = ["run", ex.path, "-i", bdir, "--policy", policy, "--format", "json", "-o", report_path, "--progress", "json",
           "--autocast-device", device_type]
    lib = _binary.onnxruntime_library()
    if lib:
        cmd += ["--ort-lib", lib]
    if train_mode:
        cmd += ["--mode", "train", "--loss", loss_name]
        if "--loss-output" not in extra_args and getattr(ex, "out_names", None):
            # the loss applies to forward's first output, as a training
            # loop's does: a model that returns more in train mode
            # (GoogLeNet's and Inception's auxiliary logits) exports them
            # after it
            cmd += ["--loss-output", ex.out_names[0]]
        if loss_name != "output":
            import numpy as np

            tpath = os.path.join(tmp, "target.npy")
            np.save(tpath, target0.cpu().numpy())
            cmd += ["--target", tpath]
        if axis or class_axis:
            cmd += ["--class-axis", class_axis or axis]
    if init_scale is not None:
        cmd += ["--init-scale", "%d" % init_scale]
    if max_memory:
        cmd += ["--max-memory", str(max_memory)]
    if not fixes:
        cmd.append("--no-fixes")
    cmd += list(extra_args)
    code, stderr = _run_binary(cmd, progress)
    return code, stderr, report_path
