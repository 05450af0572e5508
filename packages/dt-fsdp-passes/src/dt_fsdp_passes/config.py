"""Settings of the bucketing / overlap passes, on dt-core's settings convention.

`settings` is a `dt_core.kit.SettingsStore("fsdp-passes", FsdpPassSettings)`: values come
from `settings.scoped(...)`, `configure(...)`, the environment (`DT_FSDP_PASSES_<FIELD>`;
the older `DT_FSDP_<FIELD>` names are still read, the new ones win), then the defaults.
`dt-plugins list --settings` lists them. The passes read `current_settings()` at compile
time, and the plugin's GraphPass reports the same dict as its settings, so changing a
setting changes the pass's cache uuid and Inductor recompiles instead of serving a graph
bucketed under the old settings. Light at import (plugin.py loads it).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Literal

from dt_core.kit import SettingsStore

Mode = Literal["size", "module", "off"]
MODES: tuple[str, ...] = ("size", "module", "off")

# Chosen from the benchmark (benchmarks/run.py, bucket-cap sweep on gloo/CPU): step time
# flattens out once buckets reach a few MB; larger caps only delay the first compute.
DEFAULT_BUCKET_CAP_MB = 4.0

# Variable names from before the move onto dt-core's convention, still accepted.
LEGACY_ENV = {
    "mode": "DT_FSDP_MODE",
    "bucket_cap_mb": "DT_FSDP_BUCKET_CAP_MB",
    "overlap": "DT_FSDP_OVERLAP",
    "overlap_max_extra_mb": "DT_FSDP_OVERLAP_MAX_EXTRA_MB",
}


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

    def __post_init__(self) -> None:
        # configure() accepts any value: check every field, whatever mypy knows of it.
        if self.mode not in MODES:
            raise ValueError(f"dt_fsdp_passes: mode must be one of {MODES}, got {self.mode!r}")
        cap: object = self.bucket_cap_mb
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
            raise ValueError(
                f"dt_fsdp_passes: bucket_cap_mb must be a positive number, got {cap!r}"
            )
        object.__setattr__(self, "bucket_cap_mb", float(cap))
        overlap: object = self.overlap
        if not isinstance(overlap, bool):
            raise ValueError(f"dt_fsdp_passes: overlap must be a bool, got {overlap!r}")
        extra: object = self.overlap_max_extra_mb
        if extra is not None and (
            isinstance(extra, bool) or not isinstance(extra, (int, float)) or not extra >= 0
        ):
            raise ValueError(
                f"dt_fsdp_passes: overlap_max_extra_mb must be None or >= 0, got {extra!r}"
            )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _parse_legacy(field: str, name: str, text: str) -> object:
    """A `DT_FSDP_<FIELD>` value, parsed as before (mode case-insensitive)."""
    if field == "mode":
        return text.strip().lower()
    if field == "overlap":
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name}={text!r}: expected 1/0, true/false, yes/no or on/off")
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected a number") from None


class _FsdpSettingsStore(SettingsStore[FsdpPassSettings]):
    """dt-core's store, plus the legacy variable names and an explicit None in configure().

    Overrides two store internals; dt-core has no alias / explicit-None option yet.
    """

    def _from_environment(self) -> dict[str, object]:
        values: dict[str, object] = {}
        used: list[str] = []
        for field, name in LEGACY_ENV.items():
            text = os.environ.get(name)
            if text is not None:
                values[field] = _parse_legacy(field, name, text)
                used.append(f"{name}={text!r}")
        for field in self.fields():
            if self.env_var(field) in os.environ:
                used.append(f"{self.env_var(field)}={os.environ[self.env_var(field)]!r}")
        values.update(super()._from_environment())
        if used:  # a bad value should name the variable it came from
            try:
                self.schema(**values)  # type: ignore[arg-type]  # the fields are checked there
            except ValueError as error:
                raise ValueError(f"{error} (from the environment: {', '.join(used)})") from None
        return values

    def configure(self, **changes: object) -> FsdpPassSettings:
        """Like the store's, but None is a value (overlap_max_extra_mb=None), not "keep"."""
        merged = {**self._configured, **changes}
        new = self._build({**self._from_environment(), **merged})
        self._configured = merged
        return new


settings = _FsdpSettingsStore("fsdp-passes", FsdpPassSettings)


def current_settings() -> FsdpPassSettings:
    """The settings the next compile uses."""
    return settings.current()


def configure(**changes: Any) -> FsdpPassSettings:
    """Change settings for later compiles: mode, bucket_cap_mb, overlap, overlap_max_extra_mb.

    `configure(reset=True)` goes back to the environment's values (then applies any other
    changes given). Returns the new settings; a failed call changes nothing.
    """
    reset = bool(changes.pop("reset", False))
    if reset:
        saved = settings._configured
        settings.reset()
        try:
            return settings.configure(**changes)
        except Exception:
            settings._configured = saved
            raise
    return settings.configure(**changes)
