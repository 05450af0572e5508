"""dt-fsdp-passes: SimpleFSDP sharding whose compiled collectives are bucketed and overlapped.

`simple_fsdp(module, mesh)` shards parameters as Shard(0) DTensors gathered on use;
installing the package (plugin `fsdp-passes`) adds Inductor post-grad passes that bucket
the resulting all-gathers / reduce-scatters and reorder them for overlap, on any backend.
"""

from __future__ import annotations

from dt_fsdp_passes.config import FsdpPassSettings, configure, current_settings
from dt_fsdp_passes.frontend import MixedPrecision, gathered_state, is_simple_fsdp, simple_fsdp

__version__ = "0.1.0"

__all__ = [
    "FsdpPassSettings",
    "MixedPrecision",
    "configure",
    "current_settings",
    "gathered_state",
    "is_simple_fsdp",
    "simple_fsdp",
]
