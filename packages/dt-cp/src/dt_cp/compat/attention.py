"""Private torch APIs of flex_attention that dt-cp needs (dt-cp's own compat area).

Plain functions only; each checks the torch range before its first private access.
Checked against torch 2.11.x to 2.15.x (`CHECKED_WITH_TORCH`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dt_core.compat import ensure_supported_torch
from dt_core.contributions import Patch

CHECKED_WITH_TORCH = ">=2.11.0,<2.16"


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


def _has_subclass_backward(query: Any) -> bool:
    """Whether `query` is a DTensor and flex_attention_backward has a DTensor rule."""
    from torch._higher_order_ops.flex_attention import flex_attention_backward
    from torch.distributed.tensor import DTensor

    return isinstance(query, DTensor) and DTensor in flex_attention_backward.python_key_table


# torch's flex front end compiles even an eager call, and Dynamo's fake tensors cannot
# hold the per-rank values LocalTensorMode simulates: the one error for that, raised by
# dt-cp's HOP rule (torch 2.13, 2.14) or, before torch compiles, by the front end's
# device check below (2.15 fails inside Dynamo before the rule is reached).
SIMULATED_RANKS_FRONT_END = (
    "dt-cp: torch's flex_attention front end compiles its call, which cannot run "
    "on LocalTensorMode's simulated ranks; call dt_cp.flex_attention(q, k, v, ...) "
    "there (same arguments), which runs exactly under the mode"
)


def _front_end_compiles_simulated_ranks(query: Any) -> bool:
    """Whether torch's front end is about to compile a call on simulated ranks' DTensors
    (it runs the operator uncompiled only with its compile-debug switch off)."""
    import torch
    from dt_core.tracing import simulates_ranks
    from torch.distributed.tensor import DTensor
    from torch.nn.attention import flex_attention

    if not isinstance(query, DTensor) or torch.compiler.is_compiling():
        return False
    if getattr(flex_attention, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", False):
        return False
    return simulates_ranks(query)


def _deferring_cpu_backward_check(original: Callable[..., None]) -> Callable[..., None]:
    """torch's `_validate_device` (`original`), minus its CPU-backward refusal for DTensors
    that a DTensor flex_attention_backward rule will differentiate, plus dt-cp's error for
    a call torch would compile on simulated ranks."""

    def validate_device(query: Any, key: Any, value: Any) -> None:
        if _front_end_compiles_simulated_ranks(query):
            raise NotImplementedError(SIMULATED_RANKS_FRONT_END)
        if _has_subclass_backward(query):
            query, key, value = query.detach(), key.detach(), value.detach()
        original(query, key, value)

    return validate_device


def flex_cpu_backward_check_patch() -> Patch:
    """The patch dt-cp contributes (dt-core installs and restores it): torch 2.13's
    `flex_attention` front end refuses CPU inputs that need gradients before any dispatch,
    so no HOP rule could answer; the replacement skips only that refusal, and only for
    DTensors while flex_attention_backward has a DTensor rule. It also names dt-cp's
    limit on simulated ranks before torch compiles the call."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    return Patch(
        "torch.nn.attention.flex_attention",  # imported when dt-core installs the patch
        "_validate_device",
        _deferring_cpu_backward_check,
        torch_versions=CHECKED_WITH_TORCH,
        wrap_original=True,
    )
