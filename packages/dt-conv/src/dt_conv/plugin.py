"""Hookimpls of the `conv` plugin.

Light at import, and the hook itself imports only `torch`: the handler modules import
`torch.distributed.tensor`, whose first import is what triggers the hook, so they load
on the first convolution instead (importing them here would re-enter activation).
"""

from __future__ import annotations

from typing import Any

from dt_core import OpHandler, hookimpl


def _convolution(op_call: Any, args: tuple, kwargs: dict) -> object:
    from dt_conv.forward import convolution_handler

    return convolution_handler(op_call, args, kwargs)


def _convolution_backward(op_call: Any, args: tuple, kwargs: dict) -> object:
    from dt_conv.backward import convolution_backward_handler

    return convolution_backward_handler(op_call, args, kwargs)


@hookimpl
def dt_op_handlers() -> list[OpHandler]:
    import torch

    aten = torch.ops.aten
    return [
        OpHandler(aten.convolution.default, _convolution),
        OpHandler(aten.convolution_backward.default, _convolution_backward),
    ]
