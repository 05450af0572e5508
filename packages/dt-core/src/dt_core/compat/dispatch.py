"""DTensor's op dispatch: the table of ops whose whole dispatch a handler owns, and the
sharding-decision caches that must be forgotten when handlers or strategies change.

Checked against torch 2.11.x to 2.15.x (`CHECKED_WITH_TORCH`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from . import MISSING, ensure_supported_torch

CHECKED_WITH_TORCH = ">=2.11.0,<2.16"
_lock = threading.RLock()


def op_dispatcher() -> Any:
    """DTensor's op dispatcher (holds the handler table and the sharding propagator)."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher


def op_handler_table() -> dict[Any, Callable[..., object]]:
    """DTensor's live table of ops whose whole dispatch a handler owns (read-only use)."""
    return op_dispatcher()._custom_op_handlers


# torch's own handlers that dt-core replaced, by op (what `torch_dispatch` runs). Module
# state of this area because DTensor's table it shadows is module state too; entries come
# and go with `swap_op_handler`, under `_lock`.
_torch_handlers: dict[Any, Callable[..., object]] = {}


def swap_op_handler(op: Any, handler: Callable[..., object] | Any) -> Any:
    """Put `handler` (or MISSING: remove) in DTensor's handler table; return what was there.

    When `handler` replaces torch's own (`torch_dispatch` needs it), that one is kept
    aside until the swap that puts it back."""
    with _lock:
        table = op_handler_table()
        previous = table.get(op, MISSING)
        if handler is MISSING:
            table.pop(op, None)
        else:
            table[op] = handler
        if _is_torchs(previous) and not _is_torchs(handler):
            _torch_handlers[op] = previous
        elif _is_torchs(handler) or handler is MISSING:
            _torch_handlers.pop(op, None)
        return previous


def _is_torchs(handler: object) -> bool:
    return handler is not MISSING and str(getattr(handler, "__module__", "")).startswith("torch.")


def torch_dispatch(op_call: Any, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
    """What torch alone does with this DTensor op call: its own handler for the op if it has
    one (dt-core replaced it), else its sharding propagation, redistribution and local
    compute. A plugin's handler hands over the placements torch gets right.

    Only for functional ops (no in-place or out= variants): the ops plugins own are.
    """
    with _lock:
        own = _torch_handlers.get(op_call)
    if own is not None:
        return own(op_call, args, kwargs)
    dispatcher = op_dispatcher()
    op_info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
    dispatcher.sharding_propagator.propagate(op_info)
    local_results = dispatcher._dispatch_get_local_results_slow_path(op_call, args, op_info)
    return dispatcher.wrap(local_results, op_info.output_sharding.output_spec)


def clear_sharding_caches() -> None:
    """Forget cached sharding decisions (Python LRU and the C++ fast path)."""
    import torch

    op_dispatcher().sharding_propagator.propagate_op_sharding.cache_clear()
    torch._C._clear_DTensor_sharding_propagator_cache()
