"""Op handlers that take only some calls of an op, and share it with other handlers.

DTensor's handler table holds one function per op. A handler with `takes` joins the op's
`SharedOp` there: each call is offered to the sharing handlers in the order they were
installed, and a call none of them takes goes to what handles the op otherwise (a
handler without `takes`, torch's own handler, or torch's sharding propagation). So
dt-core's fix for one placement of an op and a plugin's handler for another placement
coexist, without either knowing the other. Each undo takes out exactly what it put in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .compat import MISSING
from .contributions import OpHandler

Undo = Callable[[], None]


class SharedOp:
    """DTensor's handler for an op that handlers with `takes` share."""

    def __init__(self, op: Any, otherwise: Any) -> None:
        self.op = op
        self.sharing: list[OpHandler] = []
        self.otherwise = otherwise  # MISSING: torch's sharding propagation

    def __call__(self, op_call: Any, args: tuple, kwargs: dict) -> object:
        for entry in self.sharing:
            if entry.takes is not None and entry.takes(args, kwargs):
                return entry.handler(op_call, args, kwargs)
        try:
            if self.otherwise is MISSING:
                from .compat.dispatch import torch_dispatch

                return torch_dispatch(op_call, args, kwargs)
            return self.otherwise(op_call, args, kwargs)
        except Exception as error:  # a call none takes: name the inactive plugins for it
            # dt_core's lazy attribute, not a direct import: the notes read the activation,
            # which installs these handlers (an import cycle)
            import dt_core

            dt_core.explain(error, op_call)
            raise


def install(handler: OpHandler) -> Undo:
    """Put `handler` in DTensor's table (alone, or into the op's `SharedOp`)."""
    from .compat import dispatch

    current = dispatch.op_handler_table().get(handler.op, MISSING)
    if handler.takes is None:
        if isinstance(current, SharedOp):
            return _replace_otherwise(current, handler.handler)
        previous = dispatch.swap_op_handler(handler.op, handler.handler)
        return lambda: dispatch.swap_op_handler(handler.op, previous)
    shared = current if isinstance(current, SharedOp) else SharedOp(handler.op, current)
    if shared is not current:
        dispatch.swap_op_handler(handler.op, shared)
    shared.sharing.append(handler)

    def undo() -> None:
        shared.sharing.remove(handler)
        if not shared.sharing:  # the last one out puts back what was there before
            dispatch.swap_op_handler(handler.op, shared.otherwise)

    return undo


def _replace_otherwise(shared: SharedOp, fn: Callable[..., object]) -> Undo:
    before = shared.otherwise
    shared.otherwise = fn

    def undo() -> None:
        shared.otherwise = before

    return undo
