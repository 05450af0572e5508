"""Context-parallel attention on sequence-sharded DTensors (dt-cp).

Installing the package is enough for `F.scaled_dot_product_attention` on DTensors sharded
along the sequence; `dt_cp.flex_attention` does the same for flex attention.
"""

from __future__ import annotations

from .config import ALGORITHMS, LOAD_BALANCERS, Settings, configure, current, reset, settings

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # Heavy (torch.distributed.tensor) parts load on first use, keeping `import dt_cp` light.
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
