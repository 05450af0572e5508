"""Settings of the bucketing / overlap passes: defaults, environment variables, configure().

The passes read `current_settings()` at compile time, and the plugin's GraphPass reports
the same dict as its settings, so changing a setting changes the pass's cache uuid and
Inductor recompiles instead of serving a graph bucketed under the old settings.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass
from typing import Any, Literal

Mode = Literal["size", "module", "off"]
MODES: tuple[str, ...] = ("size", "module", "off")

# Chosen from the benchmark (benchmarks/run.py, bucket-cap sweep on gloo/CPU): step time
# flattens out once buckets reach a few MB; larger caps only delay the first compute.
DEFAULT_BUCKET_CAP_MB = 4.0

ENV_MODE = "DT_FSDP_MODE"
ENV_BUCKET_CAP_MB = "DT_FSDP_BUCKET_CAP_MB"
ENV_OVERLAP = "DT_FSDP_OVERLAP"
ENV_MAX_EXTRA_MB = "DT_FSDP_OVERLAP_MAX_EXTRA_MB"


@dataclass(frozen=True)
class FsdpPassSettings:
    """What the passes do.

    mode: "size" buckets adjacent collectives up to `bucket_cap_mb` (gathered bytes);
      "module" makes one bucket per block (top-level child, or `name.<index>` entry of a
      ModuleList / Sequential); "off" leaves the graph alone.
    overlap: reorder so each bucket's all-gather is issued one bucket ahead and waits sit
      right before first use (reduce-scatters: waited as late as the bound allows).
    overlap_max_extra_mb: how much the estimated peak memory may grow through reordering;
      None allows the largest bucket (what prefetching one bucket ahead costs).
    """

    mode: Mode = "size"
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB
    overlap: bool = True
    overlap_max_extra_mb: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _parse_bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={text!r}: expected 1/0, true/false, yes/no or on/off")


def _parse_float(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected a number") from None


def _validated(settings: FsdpPassSettings) -> FsdpPassSettings:
    if settings.mode not in MODES:
        raise ValueError(f"dt_fsdp_passes: mode must be one of {MODES}, got {settings.mode!r}")
    cap: object = settings.bucket_cap_mb  # configure() takes any value: check it
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
        raise ValueError(f"dt_fsdp_passes: bucket_cap_mb must be a positive number, got {cap!r}")
    if not isinstance(settings.overlap, bool):
        raise ValueError(f"dt_fsdp_passes: overlap must be a bool, got {settings.overlap!r}")
    extra = settings.overlap_max_extra_mb
    if extra is not None and (isinstance(extra, bool) or not extra >= 0):
        raise ValueError(
            f"dt_fsdp_passes: overlap_max_extra_mb must be None or >= 0, got {extra!r}"
        )
    return dataclasses.replace(settings, bucket_cap_mb=float(cap))


def settings_from_env(environ: dict[str, str] | None = None) -> FsdpPassSettings:
    """Defaults overridden by DT_FSDP_MODE, DT_FSDP_BUCKET_CAP_MB, DT_FSDP_OVERLAP, ..."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    if ENV_MODE in env:
        values["mode"] = env[ENV_MODE].strip().lower()
    if ENV_BUCKET_CAP_MB in env:
        values["bucket_cap_mb"] = _parse_float(ENV_BUCKET_CAP_MB, env[ENV_BUCKET_CAP_MB])
    if ENV_OVERLAP in env:
        values["overlap"] = _parse_bool(ENV_OVERLAP, env[ENV_OVERLAP])
    if ENV_MAX_EXTRA_MB in env:
        values["overlap_max_extra_mb"] = _parse_float(ENV_MAX_EXTRA_MB, env[ENV_MAX_EXTRA_MB])
    try:
        return _validated(FsdpPassSettings(**values))
    except ValueError as error:
        used = [f"{k}={env[k]!r}" for k in (ENV_MODE, ENV_BUCKET_CAP_MB, ENV_OVERLAP) if k in env]
        raise ValueError(f"{error} (from the environment: {', '.join(used)})") from None


_lock = threading.Lock()
_current: FsdpPassSettings | None = None


def current_settings() -> FsdpPassSettings:
    """The settings the next compile uses (environment at first use, then configure())."""
    global _current
    with _lock:
        if _current is None:
            _current = settings_from_env()
        return _current


def configure(**changes: Any) -> FsdpPassSettings:
    """Change settings for later compiles: mode, bucket_cap_mb, overlap, overlap_max_extra_mb.

    `configure(reset=True)` goes back to the environment's values. Returns the new settings.
    """
    global _current
    reset = changes.pop("reset", False)
    known = {f.name for f in dataclasses.fields(FsdpPassSettings)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise TypeError(
            f"dt_fsdp_passes.configure: unknown settings {unknown}; known: {sorted(known)}"
        )
    base = settings_from_env() if reset else current_settings()
    new = _validated(dataclasses.replace(base, **changes))
    with _lock:
        _current = new
    return new
