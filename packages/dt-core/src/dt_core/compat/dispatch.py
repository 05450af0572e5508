"""DTensor's op dispatch: the table of ops whose whole dispatch a handler owns, and the
sharding-decision caches that must be forgotten when handlers or strategies change.

Checked against torch 2.13.x and 2.14.x (`CHECKED_WITH_TORCH`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from . import MISSING, ensure_supported_torch

CHECKED_WITH_TORCH = ">=2.13.0,<2.15"
_lock = threading.RLock()


def op_dispatcher() -> Any:
    """DTensor's op dispatcher (holds the handler table and the sharding propagator)."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher


def op_handler_table() -> dict[Any, Callable[..., object]]:
    """DTensor's live table of ops whose whole dispatch a handler owns (read-only use)."""
    return op_dispatcher()._custom_op_handlers


def swap_op_handler(op: Any, handler: Callable[..., object] | Any) -> Any:
    """Put `handler` (or MISSING: remove) in DTensor's handler table; return what was there."""
    with _lock:
        table = op_handler_table()
        previous = table.get(op, MISSING)
        if handler is MISSING:
            table.pop(op, None)
        else:
            table[op] = handler
        return previous


def clear_sharding_caches() -> None:
    """Forget cached sharding decisions (Python LRU and the C++ fast path)."""
    import torch

    op_dispatcher().sharding_propagator.propagate_op_sharding.cache_clear()
    torch._C._clear_DTensor_sharding_propagator_cache()
