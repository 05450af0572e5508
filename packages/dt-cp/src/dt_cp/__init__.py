"""Context-parallel attention on sequence-sharded DTensors (dt-cp).

Installing the package is enough for `F.scaled_dot_product_attention` on DTensors sharded
along the sequence; `dt_cp.flex_attention` does the same for flex attention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dt_core.lazy import lazy_exports

if TYPE_CHECKING:
    from .config import ALGORITHMS, LOAD_BALANCERS, Settings, configure, current, reset, settings
    from .flex import create_block_mask, flex_attention
    from .flex_hop import install_flex_rule, remove_flex_rule
    from .records import LayoutMismatchError, forget_layouts
    from .sharding import shard_sequence, unshard_sequence

__version__ = "0.1.0"

# Everything loads on first use: `import torch` imports `dt_cp.plugin`, and so this
# package; the settings load only when asked for (the plugin's DT_SETTINGS), the heavy
# (torch.distributed.tensor) parts on the first attention call.
_LAZY = {
    **dict.fromkeys(
        ("ALGORITHMS", "LOAD_BALANCERS", "Settings", "configure", "current", "reset", "settings"),
        "config",
    ),
    **dict.fromkeys(("shard_sequence", "unshard_sequence"), "sharding"),
    **dict.fromkeys(("install_flex_rule", "remove_flex_rule"), "flex_hop"),
    **dict.fromkeys(("LayoutMismatchError", "forget_layouts"), "records"),
    **dict.fromkeys(("flex_attention", "create_block_mask"), "flex"),
}

__getattr__ = lazy_exports(__name__, _LAZY)


def __dir__() -> list[str]:
    """The lazy names too, so `dir()`, completion and the API reference see them."""
    return sorted({*globals(), *_LAZY})


__all__ = [
    "ALGORITHMS",
    "LOAD_BALANCERS",
    "LayoutMismatchError",
    "Settings",
    "configure",
    "create_block_mask",
    "flex_attention",
    "forget_layouts",
    "install_flex_rule",
    "remove_flex_rule",
    "shard_sequence",
    "unshard_sequence",
    "current",
    "reset",
    "settings",
]
