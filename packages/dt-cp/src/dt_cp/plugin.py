"""Hookimpls of the `cp` plugin.

Light at import: handler modules import `torch.distributed.tensor`, whose first import
triggers the DTensor hooks, so they load on the first attention call instead.
"""

from __future__ import annotations

from typing import Any

from dt_core import LibraryOps, OpHandler, hookimpl


def _cpu_forward(op_call: Any, args: tuple, kwargs: dict) -> object:
    from dt_cp.sdpa import cpu_forward

    return cpu_forward(op_call, args, kwargs)


def _cpu_backward(op_call: Any, args: tuple, kwargs: dict) -> object:
    from dt_cp.sdpa import cpu_backward

    return cpu_backward(op_call, args, kwargs)


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
    return [
        OpHandler(aten._scaled_dot_product_flash_attention_for_cpu.default, _cpu_forward),
        OpHandler(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, _cpu_backward),
    ]
