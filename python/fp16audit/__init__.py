"""fp16audit from Python: audit a model from the notebook, and record the training log `fp16audit scales` diagnoses.

- audit(model, batch): export the model, run the fp16audit binary, return its Report.
- fastai: learn.fp16audit() and the FP16Preflight callback (fp16audit.fastai), added to
  fastai's Learner by `import fp16audit` alone, whether fastai is imported before or after.
- transformers.FP16AuditCallback, lightning.FP16Preflight, accelerate.preflight: the
  same preflight (and a raw-loss log) for the Hugging Face Trainer, Lightning and
  Accelerate, with the fixes in each trainer's words; imported only when used.
- AmpRecorder: a plain PyTorch AMP loop (torch.cuda.amp.GradScaler).
- Capture: the failing step kept as a folder (AmpRecorder(..., capture=...), Fp16AuditCallback(capture=...)).
- replay(capture): what happened at a captured step and which fix holds (fp16audit replay, plus continuations).
- fastai_callback.Fp16AuditCallback: fastai's learn.to_fp16().
- GradTelemetry: per-module gradient telemetry from backward hooks.
- EmulatedGradScaler: GradScaler's rules on a CPU, for tests and dry runs.
- LogWriter / read_log: the JSON Lines log format (docs/log-format.md).

Only recording needs torch: the names that do are imported on first use,
so reading and converting logs (fp16audit.logfile, fp16audit.convert)
works where torch is not installed. `import fp16audit` imports neither
torch nor fastai: where fastai is installed but not yet imported, a hook
adds Learner.fp16audit when fastai.learner is first imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import TYPE_CHECKING, Any, List

from .audit import AuditError, AuditFailure, BatchError, ExportError, ModelError, Report, audit
from .logfile import FORMAT_NAME, FORMAT_VERSION, FP16_MAX, FP16_MIN_NORMAL, FP16_MIN_SUBNORMAL, LogWriter, read_log

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from .capture import Capture, CaptureEvent, CaptureStop
    from .replaying import ReplayError, ReplayReport, replay
    from .recorder import AmpRecorder, scaler_config
    from .scaler import EmulatedGradScaler
    from .telemetry import GradTelemetry, default_modules, grad_stats

__version__ = "0.4.0"

# The names that need torch, and the module that holds each.
_LAZY = {
    "AmpRecorder": "recorder", "scaler_config": "recorder", "EmulatedGradScaler": "scaler",
    "GradTelemetry": "telemetry", "default_modules": "telemetry", "grad_stats": "telemetry",
    "Capture": "capture", "CaptureStop": "capture", "CaptureEvent": "capture",
    "replay": "replaying", "ReplayReport": "replaying", "ReplayError": "replaying",
}

__all__ = [
    "audit", "Report", "AuditError", "AuditFailure", "BatchError", "ExportError", "ModelError",
    "AmpRecorder", "EmulatedGradScaler", "GradTelemetry", "LogWriter", "read_log", "scaler_config",
    "default_modules", "grad_stats", "FORMAT_NAME", "FORMAT_VERSION", "FP16_MAX", "FP16_MIN_NORMAL",
    "FP16_MIN_SUBNORMAL", "Capture", "CaptureStop", "CaptureEvent", "replay", "ReplayReport", "ReplayError",
]


class _FastaiHook:
    """A meta path finder that adds Learner.fp16audit (fp16audit.fastai)
    once fastai.learner has been imported, so that `import fp16audit` is
    enough in a notebook that imports fastai afterwards; it finds nothing
    itself and never imports fastai. (A plain class: importlib.abc costs
    more to import than the rest of the package.)"""

    def find_spec(self, name, path=None, target=None):
        if name != "fastai.learner":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _ThenPatch(spec.loader)
                return spec
        return None


class _ThenPatch:
    """fastai.learner's own loader, then fp16audit.fastai."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _unhook()
        _patch_learner()


def _unhook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _FastaiHook)]


def _patch_learner() -> None:
    # A fastai this package cannot patch must not break the user's import
    # of fastai: say so and go on (fp16audit.audit still works).
    try:
        importlib.import_module(".fastai", __name__)
    except Exception as e:  # noqa: BLE001 - any failure of a third-party import
        import warnings

        warnings.warn("fp16audit: could not add Learner.fp16audit to this fastai (%s: %s); fp16audit.audit(learn.model, ...) "
                      "still works" % (type(e).__name__, e), stacklevel=2)


def _hook_fastai() -> None:
    if "fastai.learner" in sys.modules:
        _patch_learner()
    elif "fastai" in sys.modules or importlib.util.find_spec("fastai") is not None:
        _unhook()
        sys.meta_path.insert(0, _FastaiHook())


_hook_fastai()


def __getattr__(name: str) -> Any:
    # PEP 562: `from fp16audit import AmpRecorder` imports torch then, and
    # only then.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
