"""fp16audit from Python: audit a model from the notebook, and record the training log `fp16audit scales` diagnoses.

- audit(model, batch): export the model, run the fp16audit binary, return its Report.
- fastai: `import fp16audit.fastai` adds learn.fp16audit() and the FP16Preflight callback.
- AmpRecorder: a plain PyTorch AMP loop (torch.cuda.amp.GradScaler).
- fastai_callback.Fp16AuditCallback: fastai's learn.to_fp16().
- GradTelemetry: per-module gradient telemetry from backward hooks.
- EmulatedGradScaler: GradScaler's rules on a CPU, for tests and dry runs.
- LogWriter / read_log: the JSON Lines log format (python/README.md).

Only recording needs torch: the names that do are imported on first use,
so reading and converting logs (fp16audit.logfile, fp16audit.convert)
works where torch is not installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, List

from .audit import AuditError, AuditFailure, BatchError, ExportError, Report, audit
from .logfile import FORMAT_NAME, FORMAT_VERSION, FP16_MAX, FP16_MIN_NORMAL, FP16_MIN_SUBNORMAL, LogWriter, read_log

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from .recorder import AmpRecorder, scaler_config
    from .scaler import EmulatedGradScaler
    from .telemetry import GradTelemetry, default_modules, grad_stats

__version__ = "0.4.0"

# The names that need torch, and the module that holds each.
_LAZY = {
    "AmpRecorder": "recorder", "scaler_config": "recorder", "EmulatedGradScaler": "scaler",
    "GradTelemetry": "telemetry", "default_modules": "telemetry", "grad_stats": "telemetry",
}

__all__ = [
    "audit", "Report", "AuditError", "AuditFailure", "BatchError", "ExportError",
    "AmpRecorder", "EmulatedGradScaler", "GradTelemetry", "LogWriter", "read_log", "scaler_config",
    "default_modules", "grad_stats", "FORMAT_NAME", "FORMAT_VERSION", "FP16_MAX", "FP16_MIN_NORMAL",
    "FP16_MIN_SUBNORMAL",
]


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
