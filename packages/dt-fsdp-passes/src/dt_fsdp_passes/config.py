"""Settings of the bucketing / overlap passes, on dt-core's settings convention.

`settings` is a `dt_core.kit.SettingsStore("fsdp-passes", FsdpPassSettings)`: values come
from `settings.scoped(...)`, `configure(...)`, the environment (`DT_FSDP_PASSES_<FIELD>`;
the older `DT_FSDP_<FIELD>` names are the store's aliases, the new ones win), then the
defaults. None is a value (`configure(overlap_max_extra_mb=None)`, or the variable set to
`none`).
`dt-plugins list --settings` lists them. The passes read `current_settings()` at compile
time, and the plugin's GraphPass reports the same dict as its settings, so changing a
setting changes the pass's cache uuid and Inductor recompiles instead of serving a graph
bucketed under the old settings. Light at import (plugin.py loads it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from dt_core.kit import SettingsStore

Mode = Literal["auto", "size", "module", "off"]
MODES: tuple[str, ...] = ("auto", "size", "module", "off")

# For mode="size" (and "auto" on a graph without module structure). Chosen from the
# benchmark (benchmarks/run.py, bucket-cap sweep on gloo/CPU): step time flattens out once
# buckets reach a few MB; larger caps only delay the first compute.
DEFAULT_BUCKET_CAP_MB = 4.0

# Variable names from before the move onto dt-core's convention, still accepted.
LEGACY_ENV: dict[str, str] = {
    "mode": "DT_FSDP_MODE",
    "bucket_cap_mb": "DT_FSDP_BUCKET_CAP_MB",
    "overlap": "DT_FSDP_OVERLAP",
    "overlap_max_extra_mb": "DT_FSDP_OVERLAP_MAX_EXTRA_MB",
}


@dataclass(frozen=True)
class FsdpPassSettings:
    """What the passes do.

    mode: "auto" (default) makes one bucket per block and merges neighbouring blocks
      while a bucket stays within the largest block's gathered bytes: never more gathered
      at once than FSDP2 with one `fully_shard` per block, so peak memory stays at or
      below FSDP2's (falls back to "size" when the graph carries no module structure);
      "size" buckets adjacent collectives up to `bucket_cap_mb` (gathered bytes: faster
      for small models on slow links, at the price of gathering more at once);
      "module" makes exactly one bucket per block (a block: the path down to the first
      ModuleList / Sequential index, `layers.0`, else the top-level child);
      "off" leaves the graph alone.
    overlap: reorder so each bucket's all-gather is issued one bucket ahead and waits sit
      right before first use (reduce-scatters: waited as late as the bound allows).
    overlap_max_extra_mb: how much the estimated peak memory may grow through reordering;
      None allows the largest bucket (what prefetching one bucket ahead costs).
    """

    mode: Mode = "auto"
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


# None is a value here: configure(overlap_max_extra_mb=None) goes back to "largest bucket".
settings = SettingsStore("fsdp-passes", FsdpPassSettings, aliases=LEGACY_ENV, none_is_value=True)


def current_settings() -> FsdpPassSettings:
    """The settings the next compile uses."""
    return settings.current()


def configure(**changes: Any) -> FsdpPassSettings:
    """Change settings for later compiles: mode, bucket_cap_mb, overlap, overlap_max_extra_mb.

    `configure(reset=True)` goes back to the environment's values (then applies any other
    changes given). Returns the new settings; a failed call changes nothing.
    """
    if changes.pop("reset", False):
        return settings.reconfigure(**changes)
    return settings.configure(**changes)
