"""Higher-order operators' per-tensor-subclass rules (what `hop.py_impl(subclass)` sets).

Checked against torch 2.11.x to 2.15.x (`CHECKED_WITH_TORCH`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from . import MISSING, ensure_supported_torch

CHECKED_WITH_TORCH = ">=2.11.0,<2.16"
_lock = threading.RLock()


def subclass_rules(hop: Any) -> dict[type, Any]:
    """The live table of `hop`'s subclass rules (read-only use)."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    return hop.python_key_table


def all_hops() -> list[Any]:
    """Every higher-order operator torch knows by name (for state snapshots)."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch._ops import _higher_order_ops

    return list(_higher_order_ops.values())


def swap_hop_rule(hop: Any, subclass: type | None, fn: Callable[..., object] | Any) -> Any:
    """Make `hop` call `fn` for `subclass` (None: DTensor), or with MISSING remove the rule.

    Returns what was registered before (MISSING if nothing), so the same call with that
    value undoes it. `hop.py_impl(subclass)` registers but refuses to replace and has no
    removal, hence the direct table access.
    """
    if subclass is None:
        from torch.distributed.tensor import DTensor

        subclass = DTensor
    with _lock:
        table = subclass_rules(hop)
        previous = table.get(subclass, MISSING)
        if fn is MISSING:
            table.pop(subclass, None)
        else:
            table[subclass] = fn
        hop._dispatch_cache.clear()
        return previous
