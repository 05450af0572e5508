"""Private torch APIs of flex_attention that dt-cp needs (dt-cp's own compat area).

Plain functions only; each checks the torch range before its first private access.
Checked against torch 2.13.x and 2.14.x (`CHECKED_WITH_TORCH`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from dt_core.compat import ensure_supported_torch
from dt_core.contributions import Patch

CHECKED_WITH_TORCH = ">=2.13.0,<2.15"
_patch_lock = threading.Lock()


def install_hop_subclass_impl(hop: Any, subclass: type, fn: Callable[..., Any]) -> Any:
    """Make higher-order operator `hop` call `fn` for tensor subclass `subclass`.

    Returns what was registered before (or None) so `remove_hop_subclass_impl` can put
    it back; torch has no public way to take a HOP's subclass rule out again.
    """
    ensure_supported_torch(CHECKED_WITH_TORCH)
    table = hop.python_key_table
    previous = table.pop(subclass, None)
    hop.py_impl(subclass)(fn)
    return previous


def remove_hop_subclass_impl(hop: Any, subclass: type, previous: Any) -> None:
    """Undo `install_hop_subclass_impl`."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    table = hop.python_key_table
    table.pop(subclass, None)
    if previous is not None:
        table[subclass] = previous
    hop._dispatch_cache.clear()


def is_default_block_mask(block_mask: tuple) -> bool:
    """Whether `block_mask` (`BlockMask.as_tuple()`) is the one torch's flex_attention makes
    when called without a mask: one block of torch's "large" size over lengths (1, 1),
    meaning every query sees every key whatever the real lengths are."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch.nn.attention import flex_attention

    large = flex_attention._LARGE_SPARSE_BLOCK_SIZE
    return tuple(block_mask[:2]) == (1, 1) and tuple(block_mask[-3:-1]) == (large, large)


def flex_attention_hops() -> tuple[Any, Any]:
    """torch's flex_attention forward and backward higher-order operators."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch._higher_order_ops.flex_attention import flex_attention, flex_attention_backward

    return flex_attention, flex_attention_backward


# The wrapper `defer_flex_cpu_backward_check` installed and what it replaced.
_deferred: dict[str, Any] = {}
_DEFERS_MARK = "_dt_defers_cpu_backward"


def _has_subclass_backward(query: Any) -> bool:
    """Whether `query` is a DTensor and flex_attention_backward has a DTensor rule."""
    from torch._higher_order_ops.flex_attention import flex_attention_backward
    from torch.distributed.tensor import DTensor

    return isinstance(query, DTensor) and DTensor in flex_attention_backward.python_key_table


def _deferring_cpu_backward_check(original: Callable[..., None]) -> Callable[..., None]:
    """torch's `_validate_device` (`original`), minus its CPU-backward refusal for DTensors
    that a DTensor flex_attention_backward rule will differentiate."""

    def validate_device(query: Any, key: Any, value: Any) -> None:
        if _has_subclass_backward(query):
            query, key, value = query.detach(), key.detach(), value.detach()
        original(query, key, value)

    setattr(validate_device, _DEFERS_MARK, True)
    return validate_device


def flex_cpu_backward_check_patch() -> Patch:
    """The patch dt-cp contributes (dt-core installs and restores it): torch 2.13's
    `flex_attention` front end refuses CPU inputs that need gradients before any dispatch,
    so no HOP rule could answer; the replacement skips only that refusal, and only for
    DTensors while flex_attention_backward has a DTensor rule. See
    `defer_flex_cpu_backward_check` for the same change made by hand."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    return Patch(
        "torch.nn.attention.flex_attention",  # imported when dt-core installs the patch
        "_validate_device",
        _deferring_cpu_backward_check,
        torch_versions=CHECKED_WITH_TORCH,
        wrap_original=True,
    )


def defer_flex_cpu_backward_check() -> None:
    """Let torch's flex_attention front end accept CPU DTensors that need gradients.

    torch 2.13's `flex_attention` calls `_validate_device`, which raises "FlexAttention
    does not support backward on CPU" for any CPU input with `requires_grad`, before any
    dispatch (so no HOP rule can answer it). The wrapper installed here skips only that
    refusal, and only while flex_attention_backward has a DTensor rule registered and the
    inputs are DTensors; otherwise torch's check runs unchanged. Idempotent.
    """
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch.nn.attention.flex_attention as front_end

    with _patch_lock:
        if getattr(front_end._validate_device, _DEFERS_MARK, False):
            return  # already deferred (here, or by dt-cp's patch through dt-core)
        _deferred["original"] = front_end._validate_device
        _deferred["wrapper"] = _deferring_cpu_backward_check(front_end._validate_device)
        front_end._validate_device = _deferred["wrapper"]


def restore_flex_cpu_backward_check() -> None:
    """Undo `defer_flex_cpu_backward_check` (torch's own check back in place)."""
    import torch.nn.attention.flex_attention as front_end

    with _patch_lock:
        if _deferred and front_end._validate_device is _deferred["wrapper"]:
            front_end._validate_device = _deferred.pop("original")
            _deferred.clear()
