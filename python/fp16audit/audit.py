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
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import _binary

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

class Report:
    """What the binary found, from its JSON document (`Report.json`).

    `verdict` and `verdict_text` say what will happen under the policy;
    `origins` where NaN/Inf start (ONNX node and PyTorch module path),
    `fixes` the fixes verified by a rerun, `findings` every check's
    finding, `output_agreement` each output against fp32, `training` the
    backward audit when a loss was given. `ok` is False when some finding
    reached the failing level (the binary's exit status 1).
    """

    def __init__(self, document: Dict[str, Any], exit_code: int, exporter: str, exporter_note: str = "",
                 notes: Sequence[str] = ()):
        self.json = document
        self.exit_code = exit_code
        self.exporter = exporter
        self.exporter_note = exporter_note
        self.notes = list(notes)
        self._text: Optional[str] = None
        self._html: Optional[str] = None

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

    def render(self, fmt: str = "text") -> str:
        """The report as the binary renders it: text, markdown, html or json."""
        if fmt == "json":
            return json.dumps(self.json, indent=1)
        # the notes of the Python side (how the model was exported, that
        # fp16 was emulated on a CPU) are shown with the binary's own
        doc = dict(self.json, notes=list(self.json.get("notes") or []) + self.notes)
        with tempfile.TemporaryDirectory(prefix="fp16audit-") as tmp:
            path = os.path.join(tmp, "report.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(doc, f)
            p = subprocess.run([_binary.find_binary(), "render", path, "--format", fmt, "--no-color"],
                               capture_output=True, text=True)
        if p.returncode != 0:
            raise AuditError("fp16audit render --format %s: %s" % (fmt, p.stderr.strip()))
        return p.stdout

    def __str__(self) -> str:
        if self._text is None:
            self._text = self.render("text")
        return self._text

    def _repr_html_(self) -> str:
        if self._html is None:
            self._html = self.render("html")
        return self._html

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


def _dynamic_axes(names: List[str], drawn) -> Dict[str, Dict[int, str]]:
    """The export's dynamic axes: the batch axis of every input, and every
    other axis whose size differs between the batches drawn (a DataLoader
    that pads each batch to its longest sequence). Batches whose inputs
    differ in rank or dtype are refused."""
    first = drawn[0][0]
    axes = {n: {0: "batch"} for n in names}
    for b, (xs, _, _) in enumerate(drawn[1:], 1):
        for n, x0, x in zip(names, first, xs):
            if x.dim() != x0.dim() or x.dtype != x0.dtype:
                raise BatchError("fp16audit.audit: batch %d's input %r is %s %s, batch 0's is %s %s: every batch must give each input "
                                 "the same rank and dtype (draw the batches from one DataLoader, or audit them one at a time)" % (
                                     b, n, tuple(x.shape), str(x.dtype).replace("torch.", ""), tuple(x0.shape), str(x0.dtype).replace("torch.", "")))
            for k in range(1, x.dim()):
                if x.shape[k] != x0.shape[k]:
                    axes[n][k] = "%s_dim%d" % (n, k)
    return axes


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
    then."""
    training = model.training
    buffers = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()
               if not isinstance(v, _torch().nn.Parameter)}
    try:
        yield
    finally:
        with _torch().no_grad():
            state = model.state_dict(keep_vars=True)
            for k, v in buffers.items():
                state[k].copy_(v)
        model.train(training)


def _has_dynamo(torch) -> bool:
    try:
        return "dynamo" in inspect.signature(torch.onnx.export).parameters
    except (TypeError, ValueError):
        return False


def _batchnorms(model) -> List[str]:
    """The model's BatchNorm layers, by module path."""
    bn = _torch().nn.modules.batchnorm._BatchNorm
    return [name for name, m in model.named_modules() if isinstance(m, bn)]


@contextlib.contextmanager
def _quiet():
    """Keep an exporter's narration away from the user: its stdout and
    stderr (the dynamo exporter prints its steps and, when it fails, the
    graph it traced), torch's loggers and its warnings. Yields the list of
    warnings it caught: a TracerWarning says where the tracer turned a
    tensor into a Python value."""
    names = {n for n in logging.root.manager.loggerDict if n.startswith("torch.")} | {"torch"}
    loggers = [logging.getLogger(n) for n in sorted(names)]
    levels = [(lg, lg.level) for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(record=True) as caught, \
                contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("always")
            yield caught
    finally:
        for lg, level in levels:
            lg.setLevel(level)


def _data_dependent(e: BaseException) -> bool:
    """Whether an exporter's error is the model branching on a tensor's
    value (torch.export's GuardOnDataDependentSymNode and its kin)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = type(e).__name__ + " " + str(e)[:2000]
        if "DataDependent" in type(e).__name__ or "data-dependent" in text or "Dynamic control flow" in text:
            return True
        e = e.__cause__ or e.__context__
    return False


def _branch_sites(caught) -> List[str]:
    """Where the TorchScript tracer turned a tensor into a Python bool (an
    `if` on a tensor): file:line and the line itself."""
    import linecache

    out = []
    for w in caught:
        if "Python boolean" in str(w.message) and w.category.__name__ == "TracerWarning":
            site = "%s:%d" % (w.filename, w.lineno)
            code = linecache.getline(w.filename, w.lineno).strip()
            site += " (%s)" % code if code else ""
            if site not in out:
                out.append(site)
    return out


def _first_line(e: BaseException) -> str:
    msg = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()
    return msg[0] if msg else ""


def _export(model, args, names, out_names, path, exporter, train_mode, axes=None):
    """Export model to path; returns (exporter used, a note saying why when
    it is not the first choice). axes are the inputs' dynamic axes (the
    batch axis of each by default)."""
    torch = _torch()
    axes = dict(axes or {n: {0: "batch"} for n in names})
    axes.update({n: {0: "batch"} for n in out_names})
    errors = []
    order = {"auto": ["dynamo", "torchscript"], "dynamo": ["dynamo"], "torchscript": ["torchscript"]}.get(exporter)
    if order is None:
        raise ValueError("fp16audit.audit: exporter=%r; want 'auto', 'dynamo' or 'torchscript'" % exporter)
    bns = _batchnorms(model) if train_mode else []
    if bns and exporter == "auto" and _has_dynamo(torch):
        # torch's dynamo exporter (2.9 to 2.15 at least) writes BatchNorm in
        # eval form, with its running statistics, even for a model in
        # train() mode (fixtures/torch/dynamo_train): a train-mode audit of
        # a model with BatchNorm wants the TorchScript exporter
        order = ["torchscript", "dynamo"]
        errors.append("dynamo: not tried first: the model has BatchNorm layers (%s%s), which torch %s's dynamo exporter writes "
                      "in eval form (running statistics, not the batch's) even from model.train()" % (
                          ", ".join(bns[:2]), ", ..." if len(bns) > 2 else "", torch.__version__))
    dynamo_data_dependent = None
    for which in order:
        if which == "dynamo" and not _has_dynamo(torch):
            errors.append("dynamo: torch %s has no dynamo exporter (torch.onnx.export(..., dynamo=True) needs torch >= 2.5)" % torch.__version__)
            continue
        kwargs = dict(input_names=list(names), output_names=list(out_names), dynamic_axes=axes)
        if which == "dynamo":
            kwargs["dynamo"] = True
        else:
            kwargs["opset_version"] = 17
            if _has_dynamo(torch):
                kwargs["dynamo"] = False
            if train_mode:
                kwargs["training"] = torch.onnx.TrainingMode.TRAINING
                kwargs["do_constant_folding"] = False
        try:
            with _quiet() as caught:
                torch.onnx.export(model, tuple(args), path, **kwargs)
        except Exception as e:  # the exporters raise many kinds
            if which == "dynamo" and _data_dependent(e):
                dynamo_data_dependent = _first_line(e)
            errors.append("%s: %s: %s" % (which, type(e).__name__, _first_line(e)))
            continue
        sites = _branch_sites(caught) if which == "torchscript" else []
        if sites and dynamo_data_dependent is not None and exporter == "auto":
            raise ExportError(
                "fp16audit.audit: the model branches on a tensor's value at %s: the dynamo exporter cannot export that "
                "(%s), and the TorchScript tracer keeps only the branch this batch takes, so its export would say nothing of the "
                "other. Write the branch with torch.where (both sides computed) or torch.cond, or pass exporter='torchscript' "
                "to audit the branch this batch takes." % ("; ".join(sites), dynamo_data_dependent))
        if sites:
            errors.append("torchscript: the tracer turned a tensor into a Python bool at %s: where the model branches on a "
                          "value there, the export holds only the branch this batch takes" % "; ".join(sites))
        return which, "; ".join(errors)
    raise ExportError("fp16audit.audit: the model could not be exported to ONNX. " + " | ".join(errors) +
                      ". Try exporter='torchscript' (dynamo=False), a smaller example batch, or, for the dynamo exporter, "
                      "torch.export's non-strict mode; export by hand and run `fp16audit run model.onnx` on it.")


def _output_names(model, args) -> List[str]:
    torch = _torch()
    with torch.no_grad():
        out = model(*args)
    if isinstance(out, torch.Tensor):
        return ["output"]
    if isinstance(out, (tuple, list)):
        return ["output_%d" % i for i in range(len(out))]
    if isinstance(out, Mapping):
        return [str(k) for k in out.keys()]
    return ["output"]


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
          device_type: Optional[str] = None, extra_args: Sequence[str] = (), _notes: Sequence[str] = ()) -> Report:
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
    --max-memory ("4G"). exporter: 'auto' (dynamo where torch has it,
    TorchScript where that fails), 'dynamo' or 'torchscript'.
    device_type: the torch.autocast device_type the fixes name (default:
    the device the model's parameters are on).
    """
    torch = _torch()
    if not isinstance(model, torch.nn.Module):
        raise TypeError("fp16audit.audit: model is a %s; want a torch.nn.Module" % type(model).__name__)
    if policy not in POLICIES:
        raise ValueError("fp16audit.audit: policy=%r; want one of %s" % (policy, ", ".join(POLICIES)))
    _meta_check(model)
    return _audit(torch, model, batch, n_batches, n_inp, policy, loss, target, class_axis, init_scale, max_memory,
                  exporter, progress, fixes, device_type or _device_type(model), extra_args, _notes)


def _audit(torch, model, batch, n_batches, n_inp, policy, loss, target, class_axis, init_scale, max_memory, exporter,
           progress, fixes, device_type, extra_args, _notes) -> Report:
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
    axes = _dynamic_axes(names, drawn)
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
        path = os.path.join(tmp, "model.onnx")
        with _left_as_it_was(model):
            model.eval()
            try:
                out_names = _output_names(model, args)
            except Exception as e:
                raise BatchError("fp16audit.audit: the model does not run on the batch (inputs %s): %s: %s" % (
                    ", ".join("%s %s %s" % (n, tuple(x.shape), str(x.dtype).replace("torch.", "")) for n, x in zip(names, inputs0)),
                    type(e).__name__, e)) from e
            if train_mode:
                model.train()
            used, why = _export(model, args, names, out_names, path, exporter, train_mode, axes)
        bdir = os.path.join(tmp, "batches")
        os.mkdir(bdir)
        for i, (xs, _, _) in enumerate(drawn):
            _write_npz(os.path.join(bdir, "batch%d.npz" % i), names, xs)
        report_path = os.path.join(tmp, "report.json")
        cmd = ["run", path, "-i", bdir, "--policy", policy, "--format", "json", "-o", report_path, "--progress", "json",
               "--autocast-device", device_type]
        lib = _binary.onnxruntime_library()
        if lib:
            cmd += ["--ort-lib", lib]
        if train_mode:
            cmd += ["--mode", "train", "--loss", loss_name]
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
        if code not in (0, 1) or not os.path.exists(report_path):
            raise AuditError("fp16audit run failed (exit %d): %s" % (code, stderr.strip() or "no message"))
        with open(report_path, encoding="utf-8") as f:
            doc = json.load(f)
        if stderr.strip():
            notes.append(stderr.strip())
        if not torch.cuda.is_available():
            notes.append(_CPU_NOTE)
            if not _cpu_note_said:
                _cpu_note_said = True
                print("fp16audit: " + _CPU_NOTE, file=sys.stderr)
        return Report(doc, code, used, why, notes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
