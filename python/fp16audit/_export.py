"""Exporting the user's model to ONNX for the audit: which exporter, how, and what to say when it fails.

audit() exports the model as autocast sees it: every BatchNorm kept as
its own node after its convolution. An eval-mode export folds BatchNorm
into the Conv before it (the TorchScript exporter's eval peephole pass,
the dynamo exporter's optimizer), so the raw convolution output, which
autocast holds in fp16, is never in the graph: with trained statistics a
conv output of 1e5 folds to ~1 and the audit would say healthy where
PyTorch's output is Inf. The TorchScript exporter keeps BatchNorm with
training=TrainingMode.PRESERVE on a model in eval() (its eval pass does
not run; constant folding still does), the dynamo exporter with
optimize=False (measured on torch 1.13 and 2.15: fixtures/torch/
cases_trained).

"auto" tries the TorchScript exporter first, then the dynamo exporter:
on torch 2.15 the TorchScript exporter takes 0.2-1 s for a torchvision
CNN where the dynamo exporter takes 2-9 s (torch.export's tracing and
decompositions; python/bench_audit.py), and both give the same verdicts
on every fixture family. The tracer keeps only the branch the batch
takes where the model branches on a tensor's value: there the dynamo
exporter decides (it refuses a branch on a value and exports one on a
shape). Each exporter's narration (Python's and C++'s stdout and stderr,
torch's loggers and warnings, the TorchScript exporter's dump of the
graph it was building) is kept away from the user, and a failure is said
by its cause, not by the exporter's first line.

An export is reused while the model is unchanged (ExportCache).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import inspect
import io
import itertools
import linecache
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import traceback
import warnings
import weakref
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple


def torch_module():
    import torch

    return torch


def has_dynamo(torch) -> bool:
    """Whether torch.onnx.export has the dynamo exporter (torch >= 2.5)."""
    try:
        return "dynamo" in inspect.signature(torch.onnx.export).parameters
    except (TypeError, ValueError):
        return False


def _accepts(torch, name: str) -> bool:
    try:
        return name in inspect.signature(torch.onnx.export).parameters
    except (TypeError, ValueError):
        return False


def batchnorms(model) -> List[str]:
    """The model's BatchNorm layers, by module path."""
    bn = torch_module().nn.modules.batchnorm._BatchNorm
    return [name for name, m in model.named_modules() if isinstance(m, bn)]


# -- keeping the exporters quiet ------------------------------------------------

class Captured:
    """What an exporter said while _quiet held it: its warnings, each with
    the Python stack where it was raised, and its output."""

    def __init__(self):
        self.warnings: List[Tuple[warnings.WarningMessage, List[traceback.FrameSummary]]] = []
        # the warnings (by index) raised by a condition that reads sizes only
        self.on_sizes: set = set()
        self.output = ""

    def show(self, message, category, filename, lineno, file=None, line=None):
        # warnings.showwarning runs inside warn(), on the stack that warned:
        # the frames above it say where in the user's code the tracer was
        stack = traceback.extract_stack()[:-1]
        if "Python boolean" in str(message):
            f = sys._getframe(1)
            while f is not None and os.path.realpath(f.f_code.co_filename) == _WARNINGS_FILE:
                f = f.f_back
            if f is not None and _reads_sizes_only(f):
                self.on_sizes.add(len(self.warnings))
        self.warnings.append((warnings.WarningMessage(message, category, filename, lineno, file, line), stack))


def _reads_sizes_only(frame) -> bool:
    """Whether the condition the frame is testing reads nothing but sizes:
    every name in it, and every attribute it reads off one, is a Python
    value, a module or a 0-dim integer tensor the tracer computed from
    sizes (torch 2.x's tracer holds a size as one: torchvision's Swin pads
    by `if window_size[0] >= pad_H`, pad_H from x.shape). A tensor of
    values, float or integer (ids.max()), makes it a branch on a value."""
    import ast

    torch = torch_module()
    text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    m = re.match(r"(?:el)?if (.*):\s*(#.*)?$|while (.*):\s*(#.*)?$", text)
    if not m:
        return False
    try:
        tree = ast.parse(m.group(1) or m.group(3), mode="eval")
    except SyntaxError:
        return False
    scope = dict(frame.f_globals, **frame.f_locals)

    def value(node):
        if isinstance(node, ast.Name):
            return scope.get(node.id, _MISSING)
        if isinstance(node, ast.Attribute):
            base = value(node.value)
            return _MISSING if base is _MISSING else getattr(base, node.attr, _MISSING)
        return _MISSING

    def sizes(v) -> bool:
        if isinstance(v, torch.Tensor):
            return v.dim() == 0 and not v.is_floating_point() and _traced_from_sizes(torch, v)
        if isinstance(v, (tuple, list)):
            return all(sizes(x) for x in v)
        return True

    for node in ast.walk(tree):
        if isinstance(node, (ast.Name, ast.Attribute)):
            v = value(node)
            if v is _MISSING or not sizes(v):
                return False
    return True


_MISSING = object()
_SIZE_OPS = frozenset(("aten::size", "aten::numel", "aten::dim", "aten::len", "prim::shape"))


def _traced_from_sizes(torch, t) -> bool:
    """Whether the tracer computed t from tensors' sizes alone: no path of
    the trace from t back to a graph input (prim::Param) avoids an
    aten::size. ids.max() is a value; x.shape[1] % 3 is a size."""
    try:
        stack = [torch._C._get_value_trace(t).node()]
    except (RuntimeError, AttributeError, TypeError):
        return False
    for _ in range(10000):
        if not stack:
            return True
        n = stack.pop()
        k = n.kind()
        if k in _SIZE_OPS:
            continue
        if k == "prim::Param":
            return False
        stack.extend(i.node() for i in n.inputs())
    return False


_fd_lock = threading.Lock()


def _flush_c_stdio() -> None:
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):
        pass


@contextlib.contextmanager
def quiet():
    """Keep an exporter's narration away from the user: stdout and stderr at
    the file-descriptor level (C++ writes there directly: the TorchScript
    exporter's ~200-line "ONNX graph being constructed during exception",
    which a notebook shows as its kernel reads those descriptors), Python's
    sys.stdout and sys.stderr, torch's loggers and every warning. Yields a
    Captured."""
    names = {n for n in logging.root.manager.loggerDict if n.startswith(("torch.", "onnxscript"))} | {"torch", "onnxscript"}
    loggers = [logging.getLogger(n) for n in sorted(names)]
    levels = [(lg, lg.level) for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    cap = Captured()
    out, err = io.StringIO(), io.StringIO()
    with _fd_lock, tempfile.TemporaryFile() as sink:
        saved = []
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        _flush_c_stdio()
        for fd in (1, 2):
            try:
                saved.append((fd, os.dup(fd)))
                os.dup2(sink.fileno(), fd)
            except OSError:
                continue
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                warnings.simplefilter("always")
                warnings.showwarning = cap.show
                yield cap
        finally:
            _flush_c_stdio()
            for fd, dup in saved:
                os.dup2(dup, fd)
                os.close(dup)
            for lg, level in levels:
                lg.setLevel(level)
            try:
                sink.seek(0)
                cap.output = sink.read().decode("utf-8", "replace") + out.getvalue() + err.getvalue()
            except (OSError, ValueError):
                pass


# -- where the tracer branched ---------------------------------------------------

_TORCH_DIR = None
_WARNINGS_FILE = os.path.realpath(warnings.__file__)


def _inside(path: str, roots: Sequence[str]) -> bool:
    p = os.path.realpath(path)
    for r in roots:
        if p == r or p.startswith(r + os.sep):
            # a conda environment's site-packages sits inside Python's own
            # library: the models installed there are the user's
            return r != roots[-1] or not any(d in p[len(r):].split(os.sep) for d in ("site-packages", "dist-packages"))
    return False


def _library_roots() -> List[str]:
    """Folders whose frames are not the user's: torch's, this package's,
    Python's own library (last)."""
    global _TORCH_DIR
    if _TORCH_DIR is None:
        import torch

        _TORCH_DIR = os.path.realpath(os.path.dirname(torch.__file__))
    return [_TORCH_DIR, os.path.realpath(os.path.dirname(os.path.abspath(__file__))),
            os.path.realpath(os.path.dirname(contextlib.__file__))]


def _is_assert(frame: traceback.FrameSummary) -> bool:
    return bool(re.match(r"(assert\b|(torch\.)?_assert\()", (frame.line or "").strip()))


def _guards(frame: traceback.FrameSummary) -> bool:
    """An `if` whose body raises (a check, like an assert: the trace keeps
    the path that goes on)."""
    if not (frame.line or "").strip().startswith("if "):
        return False
    for k in range(1, 4):
        nxt = linecache.getline(frame.filename, (frame.lineno or 0) + k).strip()
        if nxt:
            return nxt.startswith("raise ")
    return False


def _on_a_shape(frame: traceback.FrameSummary) -> bool:
    """A condition on sizes (torch 2.x's tracer holds them as tensors:
    nn.LSTM's `if self.input_size != input.size(-1)`): the batches the
    audit runs have the shapes traced, so the branch taken is theirs."""
    return bool(re.search(r"\.size\(|\.shape\b|\.dim\(\)|\.numel\(\)|\blen\(", frame.line or ""))


def branch_sites(cap: Captured) -> List[str]:
    """Where the TorchScript tracer turned a tensor into a Python bool (an
    `if` on a tensor): the user's file:line and the line itself, with the
    torch function it went through when the conversion happened inside
    torch. An assert is not a branch (the trace keeps the path that goes
    on, right for every batch that passes it), nor is an `if` that raises,
    nor a condition on sizes:
    torch._assert's own body, nn.MultiheadAttention's and nn.LSTM's shape
    checks, the user's asserts are left out."""
    roots = _library_roots()
    out = []
    for i, (w, stack) in enumerate(cap.warnings):
        if "Python boolean" not in str(w.message) or w.category.__name__ != "TracerWarning":
            continue
        frames = [f for f in stack if not f.filename.startswith("<") and os.path.realpath(f.filename) != _WARNINGS_FILE]
        # the innermost frame that is not the warnings machinery: where the
        # tensor became a bool
        site = frames[-1] if frames else None
        if site is None:
            continue
        if _is_assert(site) or _guards(site) or _on_a_shape(site) or i in cap.on_sizes:
            continue
        user = next((f for f in reversed(frames) if not _inside(f.filename, roots)), None)
        if user is None:
            continue
        if _is_assert(user):
            continue
        text = "%s:%s" % (user.filename, user.lineno)
        if user.line:
            text += " (%s)" % user.line.strip()
        if site is not user:
            text += ", inside %s" % site.name
        if text not in out:
            out.append(text)
    return out


# -- what failed, and why --------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# torch's lines that say nothing of the cause: what step failed, what to do
# in general, where to report it
_NOISE = re.compile(r"^(Failed to (export|decompose|convert|serialize)|Next steps|- |\(Refer to|For (more|extended|C\+\+)|If you (suspect|would)|"
                    r"consider using|Caused by:|The error above|## |⬆️|ONNX graph being constructed|Torch IR graph|graph\(|\s+%|\s+return)")
_SUMMARY = re.compile(r"<class '([\w.]+)'>: (.*)")


def _lines(text: str) -> List[str]:
    return [ln.rstrip() for ln in _ANSI.sub("", text).splitlines()]


def cause(e: BaseException) -> str:
    """The line of an exporter's error that names its cause, with where in
    the user's code it happened when torch says so. torch.onnx's own
    errors open with the step that failed ("Failed to export the model
    with torch.export. This is step 1/3 ... Next steps:") and hold the
    cause in an "Exception summary" and in __cause__; the TorchScript
    exporter's say it on their first line."""
    chain, seen = [], set()
    x: Optional[BaseException] = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        chain.append(x)
        x = x.__cause__ or (x.__context__ if not x.__suppress_context__ else None)
    reason = ""
    where = ""
    for x in chain:
        lines = _lines(str(x))
        for i, ln in enumerate(lines):
            if ln.strip().startswith("The following call raised this error:") and not where:
                rest = [s.strip() for s in lines[i + 1:i + 3] if s.strip()]
                if rest:
                    where = " ".join(rest)
        at = next((i for i, ln in enumerate(lines) if _SUMMARY.match(ln.strip())), None)
        if at is not None and not reason:
            # the first entry of torch.onnx's "Exception summary" is the
            # innermost error; a message that ends with ":" goes on in the
            # lines below it ("- Received user-specified dim hint ...")
            m = _SUMMARY.match(lines[at].strip())
            assert m is not None
            msg = m.group(2).strip()
            if msg.endswith(":"):
                more = list(itertools.takewhile(lambda s: s.strip(), lines[at + 1:at + 4]))
                msg = " ".join([msg] + [s.strip() for s in more])
            reason = "%s: %s" % (m.group(1).rsplit(".", 1)[-1], msg)
    if not reason:
        # the innermost error whose message says something
        for x in reversed(chain):
            useful = [ln.strip() for ln in _lines(str(x)) if ln.strip() and not _NOISE.match(ln)]
            if useful:
                reason = "%s: %s" % (type(x).__name__, useful[0])
                break
    if not reason:
        reason = type(e).__name__
    if where and where not in reason:
        reason += " (at %s)" % where
    return reason[:600]


def data_dependent(e: BaseException) -> bool:
    """Whether an exporter's error is the model branching on a tensor's
    value (torch.export's GuardOnDataDependentSymNode and its kin)."""
    seen = set()
    x: Optional[BaseException] = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        text = type(x).__name__ + " " + str(x)[:4000]
        if "DataDependent" in type(x).__name__ or "data-dependent" in text or "Dynamic control flow" in text:
            return True
        x = x.__cause__ or x.__context__
    return False


def _unsupported_op(reason: str) -> Optional[str]:
    m = re.search(r"operator '([\w:.]+)'", reason) or re.search(r"No ONNX function found for <OpOverload\(op='([\w.]+)'", reason) \
        or re.search(r"Unsupported: .*?(aten[\w.:]+)", reason)
    # aten::linalg_eigh (TorchScript) and aten._linalg_eigh (dynamo) are one op
    return re.sub(r"^aten(::|\.)_?", "", m.group(1)).replace(".default", "") if m else None


def _out_of_memory(reason: str) -> bool:
    return bool(re.search(r"out of memory|can't allocate memory|bad_alloc|MemoryError|CUDA error: out of memory", reason, re.I))


def advice(tried: Sequence[str], reasons: Dict[str, str], torch) -> str:
    """What to try after every exporter failed: only what can still work.
    An exporter that just failed is not offered again, a smaller batch
    only where memory ran out, the dynamo exporter only where this torch
    has none."""
    out = []
    ops = sorted({op for r in reasons.values() for op in [_unsupported_op(r)] if op})
    if ops:
        out.append("the model uses torch's %s, which %s cannot write as ONNX: audit the part of the model before it, or write it "
                   "with ops ONNX has" % (", ".join(ops), "the exporters" if len(tried) > 1 else "the %s exporter" % tried[0]))
    if any(_out_of_memory(r) for r in reasons.values()):
        out.append("the export ran out of memory: audit a smaller batch (fewer samples)")
    if "dynamo" not in tried and not has_dynamo(torch):
        out.append("torch >= 2.5 has the dynamo exporter (torch.onnx.export(..., dynamo=True)), which writes models the "
                   "TorchScript tracer cannot")
    elif "dynamo" not in tried:
        out.append("exporter='dynamo' tries the dynamo exporter")
    if "torchscript" not in tried:
        out.append("exporter='torchscript' tries the TorchScript exporter")
    out.append("%sexport the model by hand (docs/how-to/export.md: exporting a model) and run `fp16audit run model.onnx -i batch.npz` "
               "on it" % ("or " if out else ""))
    return "; ".join(out)


# -- the exports -------------------------------------------------------------------

class Exported:
    """One export that worked: the exporter, the file, the dynamic axes it
    has, and what the note of the audit says about how it was made."""

    def __init__(self, exporter: str, path: str, axes: Optional[Dict[str, Dict[int, str]]], notes: List[str], static_fallback: bool,
                 branches: Sequence[str] = (), out_names: Optional[Sequence[str]] = None):
        self.exporter = exporter
        self.path = path
        self.axes = axes
        self.notes = notes
        self.static_fallback = static_fallback
        # where the tracer kept one branch of an `if` on a tensor: such an
        # export holds this batch's branch and is not reused for another
        self.branches = list(branches)
        # the graph's inputs (None: not read): the TorchScript exporter
        # leaves out those the trace does not read
        self.inputs: Optional[List[str]] = None
        # what the audit that made it decided, for one that reuses it: the
        # batch axes (audit's _axes.Axes) and the outputs' names
        self.plan: Any = None
        self.out_names: List[str] = list(out_names) if out_names is not None else []

    @property
    def note(self) -> str:
        return "; ".join(self.notes)


def _f_optional(torch) -> bool:
    try:
        return inspect.signature(torch.onnx.export).parameters["f"].default is None
    except (TypeError, ValueError, KeyError):
        return False


def _fold(program) -> None:
    """Fold the constants of a dynamo export made with optimize=False, and
    nothing else. Unfolded, every chunk and split is a SplitToSequence
    read by SequenceAt (values of sequence type, which the binary audits
    too: fixtures/torch/cases_seq_dynamo) and every shape a chain of
    Shape, Gather and Concat; folded, they are Split and constants, as the
    optimizer writes them: a smaller graph.
    The optimizer's rewrite rules are left out: they fold BatchNorm into
    the Conv before it (and a tiny epsilon out of a root)."""
    try:
        from onnxscript import optimizer
    except ImportError:
        return
    try:
        optimizer.fold_constants(program.model)
        optimizer.remove_unused_nodes(program.model)
    except Exception:  # an onnxscript without them, or one they fail in: the export unfolded
        return


def _kwargs(torch, which: str, names, out_names, axes, train_mode: bool) -> Dict[str, Any]:
    kwargs: Dict[str, Any] = dict(input_names=list(names), output_names=list(out_names))
    if axes:
        kwargs["dynamic_axes"] = axes
    if which == "dynamo":
        kwargs["dynamo"] = True
        if _accepts(torch, "optimize"):
            # the optimizer folds BatchNorm into the layer before it (and an
            # epsilon below 1e-8 out of a root): the graph autocast does not
            # compute
            kwargs["optimize"] = False
        return kwargs
    kwargs["opset_version"] = 17
    if has_dynamo(torch):
        kwargs["dynamo"] = False
    if train_mode:
        kwargs["training"] = torch.onnx.TrainingMode.TRAINING
        kwargs["do_constant_folding"] = False
    else:
        # with the model in eval(), PRESERVE exports the eval forward
        # without the eval peephole pass that folds BatchNorm into the Conv
        kwargs["training"] = torch.onnx.TrainingMode.PRESERVE
    return kwargs


# An exporter's failure that may come from the dynamic axes it was given
_AXES_TROUBLE = re.compile(r"dim|shape|constraint|speciali|symbol|guard|range", re.I)


def export(model, args, names: Sequence[str], out_names: Sequence[str], folder: str, exporter: str, train_mode: bool,
           axes: Optional[Dict[str, Dict[int, str]]], made_up: bool, static_ok: bool) -> Exported:
    """Export model into folder/<exporter>/model.onnx and return what
    worked. axes are the dynamic axes of inputs and outputs; made_up says
    that the front door inferred them (the user did not give them): an
    exporter that refuses them is asked again without them when static_ok
    (the caller can audit the batches a static export takes), and the
    note says so. ExportError when no exporter could write the model."""
    from .audit import ExportError

    torch = torch_module()
    order = {"auto": ["torchscript", "dynamo"], "dynamo": ["dynamo"], "torchscript": ["torchscript"]}.get(exporter)
    if order is None:
        raise ValueError("fp16audit.audit: exporter=%r; want 'auto', 'dynamo' or 'torchscript'" % exporter)
    notes: List[str] = []
    reasons: Dict[str, str] = {}
    tried: List[str] = []
    data_dep: Optional[str] = None
    traced: Optional[Exported] = None
    for which in order:
        if which == "dynamo" and not has_dynamo(torch):
            reasons[which] = "torch %s has no dynamo exporter (torch.onnx.export(..., dynamo=True) needs torch >= 2.5)" % torch.__version__
            notes.append("dynamo: " + reasons[which])
            continue
        if which == "dynamo" and train_mode and batchnorms(model):
            # torch's dynamo exporter (2.9 to 2.15 at least) writes
            # BatchNorm in eval form even from model.train()
            # (fixtures/torch/dynamo_train)
            bns = batchnorms(model)
            notes.append("dynamo: the model has BatchNorm layers (%s%s), which torch %s's dynamo exporter writes in eval form "
                         "(running statistics, not the batch's) even from model.train()" % (
                             ", ".join(bns[:2]), ", ..." if len(bns) > 2 else "", torch.__version__))
        tried.append(which)
        sub = os.path.join(folder, which)
        done, r, dd = _try(torch, which, model, args, names, out_names, sub, train_mode, axes)
        if done is None and made_up and axes and static_ok and not dd and _AXES_TROUBLE.search(r):
            notes.append("%s: the dynamic axes the audit inferred were refused (%s): exported with static shapes" % (which, r))
            done, r, dd = _try(torch, which, model, args, names, out_names, sub, train_mode, None)
            if done is not None:
                done.static_fallback = True
        if done is None:
            reasons[which] = r
            notes.append("%s: %s" % (which, r))
            if dd:
                data_dep = r
            continue
        done.notes = notes + done.notes
        if which == "torchscript" and done.branches and "dynamo" in order[order.index(which) + 1:] and has_dynamo(torch):
            # the tracer kept one branch: the dynamo exporter exports a
            # branch on a shape and refuses one on a value
            traced = done
            notes.append("torchscript: the tracer turned a tensor into a Python bool at %s, where the export holds only the "
                         "branch this batch takes: exported with the dynamo exporter instead" % "; ".join(done.branches))
            continue
        return done
    if traced is not None:
        sites = "; ".join(traced.branches)
        if data_dep is not None:
            raise ExportError(
                "fp16audit.audit: the model branches on a tensor's value at %s: the dynamo exporter cannot export that (%s), and "
                "the TorchScript tracer keeps only the branch this batch takes, so its export would say nothing of the other. Write "
                "the branch with torch.where (both sides computed) or torch.cond, or pass exporter='torchscript' to audit the branch "
                "this batch takes." % (sites, data_dep))
        traced.notes = [n for n in notes if not n.startswith(("torchscript: the tracer", "dynamo: "))] + [
            "dynamo: %s" % reasons.get("dynamo", "?"),
            "torchscript: the tracer turned a tensor into a Python bool at %s: where the model branches on a value there, the "
            "export holds only the branch this batch takes" % sites]
        return traced
    said = " | ".join("%s: %s" % (k, v) for k, v in reasons.items())
    raise ExportError("fp16audit.audit: the model could not be exported to ONNX. %s. What can still work: %s." % (
        said, advice(tried, {k: v for k, v in reasons.items() if k in tried}, torch)))


def _try(torch, which, model, args, names, out_names, sub, train_mode, axes) -> Tuple[Optional[Exported], str, bool]:
    """One export: (what worked, or None with the cause and whether the
    model branches on a value)."""
    shutil.rmtree(sub, ignore_errors=True)
    os.makedirs(sub)
    path = os.path.join(sub, "model.onnx")
    try:
        with quiet() as cap:
            kwargs = _kwargs(torch, which, names, out_names, axes, train_mode)
            if which == "dynamo" and kwargs.get("optimize") is False and _f_optional(torch):
                program = torch.onnx.export(model, tuple(args), None, **kwargs)
                _fold(program)
                program.save(path)
            else:
                torch.onnx.export(model, tuple(args), path, **kwargs)
    except Exception as e:  # the exporters raise many kinds
        shutil.rmtree(sub, ignore_errors=True)
        return None, cause(e), data_dependent(e)
    done = Exported(which, path, axes, [], False)
    done.inputs = graph_inputs(path)
    gone = [n for n in names if done.inputs is not None and n not in done.inputs]
    if gone:
        done.notes.append("%s: input%s %s %s not in the export: the traced graph does not read %s" % (
            which, "s" if len(gone) > 1 else "", ", ".join(repr(n) for n in gone), "are" if len(gone) > 1 else "is",
            "them" if len(gone) > 1 else "it"))
    if which == "torchscript":
        done.branches = branch_sites(cap)
        if done.branches:
            done.notes.append("torchscript: the tracer turned a tensor into a Python bool at %s: where the model branches on a "
                              "value there, the export holds only the branch this batch takes" % "; ".join(done.branches))
    return done, "", False


# -- what an export holds ------------------------------------------------------------

def _varint(buf: bytes, i: int) -> Tuple[int, int]:
    out = shift = 0
    while True:
        c = buf[i]
        i += 1
        out |= (c & 0x7F) << shift
        if c < 0x80:
            return out, i
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of a protobuf message: value is the
    bytes of a length-delimited field, else its number."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
            yield num, wt, v
        elif wt == 2:
            n, i = _varint(buf, i)
            yield num, wt, buf[i:i + n]
            i += n
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        else:
            raise ValueError("protobuf wire type %d" % wt)


def graph_inputs(path: str) -> Optional[List[str]]:
    """The names of an ONNX file's graph inputs that are not initializers,
    read off the protobuf (ModelProto.graph = 7, GraphProto.input = 11,
    .initializer = 5, ValueInfoProto/TensorProto name = 1 and 8) without the
    onnx package; None when it cannot be read. The TorchScript exporter
    leaves out an input the trace does not read."""
    try:
        with open(path, "rb") as f:
            model = f.read()
        graph = next(v for n, wt, v in _fields(model) if n == 7 and wt == 2)
        names, inits = [], set()
        for n, wt, v in _fields(graph):
            if n == 11 and wt == 2:
                names += [x.decode() for k, t, x in _fields(v) if k == 1 and t == 2]
            elif n == 5 and wt == 2:
                inits.update(x.decode() for k, t, x in _fields(v) if k == 8 and t == 2)
        return [x for x in names if x not in inits]
    except (OSError, StopIteration, ValueError, IndexError, UnicodeDecodeError):
        return None


# -- reusing an export -------------------------------------------------------------

def _simple(v: Any, depth: int = 0) -> Any:
    """v as a comparable value when it is made of Python scalars, else a
    marker of its type and identity (one level into plain objects such
    as a Hugging Face config)."""
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return v
    if isinstance(v, (tuple, list)) and len(v) <= 64:
        return tuple(_simple(x, depth + 1) for x in v)
    if isinstance(v, dict) and len(v) <= 64 and depth < 2:
        return tuple(sorted((str(k), _simple(x, depth + 1)) for k, x in v.items()))
    torch = torch_module()
    if isinstance(v, (torch.Tensor, torch.nn.Module)):
        return ("obj", type(v).__qualname__, id(v))
    if depth == 0 and hasattr(v, "__dict__") and not callable(v):
        return (type(v).__qualname__, id(v), tuple(sorted((k, _simple(x, 1)) for k, x in vars(v).items() if not k.startswith("__"))))
    return ("obj", type(v).__qualname__, id(v))


_MODULE_SKIP = {"_parameters", "_buffers", "_modules", "training", "_non_persistent_buffers_set"}


def _digest(update, t) -> None:
    """Feed a tensor's values to the hash (a copy to the CPU where it lives elsewhere)."""
    torch = torch_module()
    a = t.detach()
    if a.device.type != "cpu":
        a = a.cpu()
    a = a.contiguous()
    if a.dtype == torch.bfloat16:
        a = a.view(torch.int16)
    update(memoryview(a.numpy()).cast("B"))


def _sha1():
    try:
        return hashlib.sha1(usedforsecurity=False)  # type: ignore[call-arg]
    except TypeError:  # Python 3.8
        return hashlib.sha1()


def fingerprint(model) -> Optional[str]:
    """What an export of model depends on, as a hash: every parameter's and
    buffer's name, shape, dtype, device, storage and values (values, not
    only their _version: fastai's optimizer writes through p.data, which
    leaves p._version as it was), every module's class, plain attributes
    and hooks, torch's global module hooks. None when a tensor cannot be
    read (it is not cached then)."""
    torch = torch_module()
    h = _sha1()
    up = h.update
    try:
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            up(repr((name, tuple(t.shape), str(t.dtype), str(t.device), t.data_ptr(), t.requires_grad)).encode())
            _digest(up, t)
        for name, m in model.named_modules():
            attrs = tuple(sorted((k, _simple(v)) for k, v in vars(m).items()
                                 if k not in _MODULE_SKIP and not k.endswith("_hooks") and not k.endswith("_hooks_with_kwargs")))
            hooks = tuple((k, tuple((hid, id(fn)) for hid, fn in getattr(m, k).items()))
                          for k in sorted(vars(m)) if k.endswith("hooks") and isinstance(getattr(m, k), dict))
            up(repr((name, type(m).__module__, type(m).__qualname__, attrs, hooks)).encode())
        mod = torch.nn.modules.module
        up(repr([(k, tuple(getattr(mod, k).keys())) for k in sorted(vars(mod)) if k.startswith("_global_") and isinstance(getattr(mod, k), dict)]).encode())
    except (RuntimeError, TypeError, ValueError, AttributeError):
        return None
    return h.hexdigest()


class ExportCache:
    """The exports of this process's audits, reused while a model is unchanged.

    An entry is keyed by the model object (a weak reference: it goes when
    the model does), the fingerprint of its weights, modules and hooks, and
    everything the export was asked for (exporter, mode, input names,
    every batch's dtypes and shapes, the batch axes the user gave). An
    audit that finds one runs neither the model nor the exporter. Its
    files live in a
    private temporary folder, removed when the model is collected, when
    the entry is pushed out (the last `size` exports are kept) and at
    exit."""

    def __init__(self, size: int = 4):
        self.size = size
        self.entries: "OrderedDict[Tuple, Tuple[weakref.ref, str, Exported]]" = OrderedDict()
        # reentrant: a model collected while the lock is held calls forget
        self.lock = threading.RLock()

    def get(self, model, key: Tuple) -> Optional[Exported]:
        with self.lock:
            e = self.entries.get(key)
            if e is None:
                return None
            ref, folder, ex = e
            if ref() is not model or not os.path.exists(ex.path):
                self._drop(key)
                return None
            self.entries.move_to_end(key)
            return ex

    def put(self, model, key: Tuple, folder: str, ex: Exported) -> None:
        with self.lock:
            if key in self.entries:
                self._drop(key)
            try:
                ref = weakref.ref(model, self._forgetter(key))
            except TypeError:
                shutil.rmtree(folder, ignore_errors=True)
                return
            self.entries[key] = (ref, folder, ex)
            while len(self.entries) > self.size:
                self._drop(next(iter(self.entries)))

    def _forgetter(self, key: Tuple):
        return lambda _ref: self.forget(key)

    def forget(self, key: Tuple) -> None:
        with self.lock:
            self._drop(key)

    def _drop(self, key: Tuple) -> None:
        e = self.entries.pop(key, None)
        if e is not None:
            shutil.rmtree(e[1], ignore_errors=True)

    def clear(self) -> None:
        """Remove every cached export and its files."""
        with self.lock:
            for k in list(self.entries):
                self._drop(k)


CACHE = ExportCache()
atexit.register(CACHE.clear)
