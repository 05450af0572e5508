"""Hookimpls of the `cp` plugin: SDPA op handlers, the sequence collectives, and rules for
torch's flex_attention higher-order operators, and the patch that lets torch's flex
front end pass CPU DTensors that need gradients on to those rules.

Light at import: handler modules import `torch.distributed.tensor`, whose first import
triggers the DTensor hooks, so they load on the first attention call instead.
"""

from __future__ import annotations

from typing import Any

from dt_core import HopRule, LibraryOps, OpHandler, Patch, hookimpl

# dt-core hook API this plugin is written for (1.1: dt_patches; 1.3: DT_SETTINGS)
DT_API = ">=1.3,<2"
DT_SETTINGS = "dt_cp.config"  # creates the settings store


def _forward(op_call: Any, args: tuple, kwargs: dict) -> object:
    from dt_cp.sdpa import forward_handler

    return forward_handler(op_call, args, kwargs)


def _backward(op_call: Any, args: tuple, kwargs: dict) -> object:
    from dt_cp.sdpa import backward_handler

    return backward_handler(op_call, args, kwargs)


def _flex_forward(*args: Any, **kwargs: Any) -> object:
    from dt_cp.flex_hop import hop_forward

    return hop_forward(*args, **kwargs)


def _flex_backward(*args: Any, **kwargs: Any) -> object:
    from dt_cp.flex_hop import hop_backward

    return hop_backward(*args, **kwargs)


def _define(lib: Any) -> None:
    from dt_cp.ops import define

    define(lib)


@hookimpl
def dt_library_ops() -> list[LibraryOps]:
    from dt_cp.ops import NAMESPACE, OP_NAMES

    return [LibraryOps(namespace=NAMESPACE, define=_define, ops=OP_NAMES)]


@hookimpl
def dt_op_handlers() -> list[OpHandler]:
    import torch

    aten = torch.ops.aten
    kernels = ("flash_attention_for_cpu", "flash_attention", "efficient_attention")
    handlers = []
    for kernel in (*kernels, "cudnn_attention"):
        forward = getattr(aten, f"_scaled_dot_product_{kernel}").default
        backward = getattr(aten, f"_scaled_dot_product_{kernel}_backward").default
        handlers += [OpHandler(forward, _forward), OpHandler(backward, _backward)]
    return handlers


@hookimpl
def dt_hop_rules() -> list[HopRule]:
    """torch's flex_attention (forward and backward operators) on sequence-sharded DTensors."""
    from dt_cp.compat.attention import flex_attention_hops

    forward, backward = flex_attention_hops()
    return [HopRule(forward, _flex_forward), HopRule(backward, _flex_backward)]


@hookimpl
def dt_patches() -> list[Patch]:
    """torch's flex front end refuses CPU inputs that need gradients before any dispatch;
    the patch (inert unless flex_attention_backward has a DTensor rule, ours from
    `dt_hop_rules`) lets sequence-sharded DTensors through to the rules."""
    from dt_cp.compat.attention import flex_cpu_backward_check_patch

    return [flex_cpu_backward_check_patch()]
