"""fp16audit's Python companion: record the training log `fp16audit scales` diagnoses.

- AmpRecorder: a plain PyTorch AMP loop (torch.cuda.amp.GradScaler).
- fastai_callback.Fp16AuditCallback: fastai's learn.to_fp16().
- GradTelemetry: per-module output-gradient telemetry from backward hooks.
- EmulatedGradScaler: GradScaler's rules on a CPU, for tests and dry runs.
- LogWriter / read_log: the JSON Lines log format (python/README.md).
"""

from .logfile import FORMAT_NAME, FORMAT_VERSION, FP16_MAX, FP16_MIN_NORMAL, FP16_MIN_SUBNORMAL, LogWriter, read_log
from .recorder import AmpRecorder, scaler_config
from .scaler import EmulatedGradScaler
from .telemetry import GradTelemetry, default_modules, grad_stats

__all__ = [
    "AmpRecorder", "EmulatedGradScaler", "GradTelemetry", "LogWriter", "read_log", "scaler_config",
    "default_modules", "grad_stats", "FORMAT_NAME", "FORMAT_VERSION", "FP16_MAX", "FP16_MIN_NORMAL",
    "FP16_MIN_SUBNORMAL",
]
