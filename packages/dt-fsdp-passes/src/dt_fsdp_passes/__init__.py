"""dt-fsdp-passes: SimpleFSDP sharding whose compiled collectives are bucketed and overlapped.

`simple_fsdp(module, mesh)` shards parameters as Shard(0) DTensors gathered on use;
installing the package (plugin `fsdp-passes`) adds Inductor post-grad passes that bucket
the resulting all-gathers / reduce-scatters and reorder them for overlap, on any backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dt_core.lazy import lazy_exports

if TYPE_CHECKING:
    from dt_fsdp_passes.config import FsdpPassSettings, configure, current_settings
    from dt_fsdp_passes.frontend import (
        MixedPrecision,
        gathered_state,
        is_simple_fsdp,
        simple_fsdp,
    )

__version__ = "0.1.0"

# The public names load on first use: `import torch` imports `dt_fsdp_passes.plugin`, and
# so this package, which must not pull in the front end (or the settings: the plugin
# names them as DT_SETTINGS) on every `import torch`.
_LAZY = {
    **dict.fromkeys(("FsdpPassSettings", "configure", "current_settings"), "config"),
    **dict.fromkeys(
        ("MixedPrecision", "gathered_state", "is_simple_fsdp", "simple_fsdp"), "frontend"
    ),
}


__getattr__ = lazy_exports(__name__, _LAZY)


def __dir__() -> list[str]:
    """The lazy names too, so `dir()`, completion and the API reference see them."""
    return sorted({*globals(), *_LAZY})


__all__ = [
    "FsdpPassSettings",
    "MixedPrecision",
    "configure",
    "current_settings",
    "gathered_state",
    "is_simple_fsdp",
    "simple_fsdp",
]
