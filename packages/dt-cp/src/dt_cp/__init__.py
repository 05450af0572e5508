"""Context-parallel attention on sequence-sharded DTensors (dt-cp).

Installing the package is enough for `F.scaled_dot_product_attention` on DTensors sharded
along the sequence; `dt_cp.flex_attention` does the same for flex attention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import ALGORITHMS, LOAD_BALANCERS, Settings, configure, current, reset, settings

__version__ = "0.1.0"

_CONFIG_NAMES = ("ALGORITHMS", "LOAD_BALANCERS", "Settings", "configure", "current", "reset")


def __getattr__(name: str) -> object:
    # Everything loads on first use: `import torch` imports `dt_cp.plugin`, and so this
    # package; the settings load with it only when asked for (the plugin's DT_SETTINGS),
    # the heavy (torch.distributed.tensor) parts on the first attention call.
    if name in (*_CONFIG_NAMES, "settings"):
        from . import config

        return getattr(config, name)
    if name in ("shard_sequence", "unshard_sequence"):
        from . import sharding

        return getattr(sharding, name)
    if name in ("install_flex_rule", "remove_flex_rule"):
        from . import flex_hop

        return getattr(flex_hop, name)
    if name in ("flex_attention", "create_block_mask"):
        from . import flex

        return getattr(flex, name)
    raise AttributeError(name)


__all__ = [
    "ALGORITHMS",
    "LOAD_BALANCERS",
    "Settings",
    "configure",
    "create_block_mask",
    "flex_attention",
    "install_flex_rule",
    "remove_flex_rule",
    "shard_sequence",
    "unshard_sequence",
    "current",
    "reset",
    "settings",
]
