"""Which function handles each aten op dt-conv owns, and what every handler runs first.

The plugin's DTensor handlers import this module on the first call of any dt-conv op,
never while the hooks run: the handler modules import `torch.distributed.tensor`, whose
first import is what runs the hooks (`handled_ops` names the ops for them).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from dt_core.kit import hand_to_torch
from torch.distributed.tensor import DTensor

from . import ranks
from .engine.halo.exchange import tie_to, traced_exchanges
from .fallback import replicated_op
from .handled_ops import (
    AVG_POOL,
    CONSTANT_PAD,
    CONVOLUTION,
    MAX_POOL,
    MODE_PAD,
    UPSAMPLE,
    backward_of,
)
from .ops.conv.backward import convolution_backward_handler
from .ops.conv.forward import convolution_handler
from .ops.interpolate import upsample, upsample_backward
from .ops.padding import constant_pad, mode_pad, mode_pad_backward
from .ops.pooling import (
    avg_pool,
    avg_pool_backward,
    max_pool_with_indices,
    max_pool_with_indices_backward,
)
from .ownership import torch_owns
from .static_sizes import with_static_sizes
from .validate import raise_like_torch, simulated_ranks

Handler = Callable[[torch._ops.OpOverload, tuple, dict], object]

HANDLERS: dict[str, Handler] = {
    **dict.fromkeys(CONVOLUTION, convolution_handler),
    **dict.fromkeys(backward_of(CONVOLUTION), convolution_backward_handler),
    **dict.fromkeys(MAX_POOL, max_pool_with_indices),
    **dict.fromkeys(backward_of(MAX_POOL), max_pool_with_indices_backward),
    **dict.fromkeys(AVG_POOL, avg_pool),
    **dict.fromkeys(backward_of(AVG_POOL), avg_pool_backward),
    **dict.fromkeys(CONSTANT_PAD, constant_pad),
    **dict.fromkeys(MODE_PAD, mode_pad),
    **dict.fromkeys(backward_of(MODE_PAD), mode_pad_backward),
    **dict.fromkeys(UPSAMPLE, upsample),
    **dict.fromkeys(backward_of(UPSAMPLE), upsample_backward),
}


def handle_norm(
    family: str, direction: str, op_call: torch._ops.OpOverload, args: tuple, kwargs: dict
) -> object:
    """A normalization call dt-conv took (`ops.norm.<family>.takes_<direction>` said yes):
    torch's error first for bad arguments, then the sharded path (`ops.norm`)."""
    module = importlib.import_module(f"dt_conv.ops.norm.{family}")
    if direction == "forward":
        raise_like_torch(op_call, args, kwargs)
    run = getattr(module, direction)
    return run(op_call, args, kwargs)


def handle(name: str, op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    """`aten.<name>` on DTensors. Bad arguments raise torch's own error on every rank first
    (a backward op runs only after its forward passed the check); calls torch computes
    right go to torch (`ownership`). Under an enabled LocalTensorMode the handlers run
    sharded (`dt_conv.ranks`); LocalTensors outside an enabled mode have no mesh
    coordinate to read and take the replicated path. Traced, the exchanges stay where
    every rank puts them (`engine.halo.exchange.traced_exchanges`). Traced with dynamic
    shapes, every size but the batch is a number from here on (`static_sizes`)."""
    args = with_static_sizes(name, args)
    if not name.endswith("_backward"):
        raise_like_torch(op_call, args, kwargs)
    if torch_owns(name, args, kwargs):
        return hand_to_torch(op_call, args, kwargs)
    if simulated_ranks(args, kwargs) and not ranks.simulated():
        return replicated_op(str(op_call), op_call, args, kwargs)
    backward = name.endswith("_backward") and args and isinstance(args[0], DTensor)
    gradient = args[0].to_local() if backward else None
    with traced_exchanges(gradient) as received:
        result = HANDLERS[name](op_call, args, kwargs)
    return tie_to(result, received) if received else result
