"""Handing an op call back to torch: a plugin owns only the placements torch gets wrong.

A handler that finds a case torch's own DTensor dispatch computes exactly (no spatially
sharded dim for a convolution, a zero pad of a Partial input) returns
`hand_to_torch(op_call, args, kwargs)`: the result, placements and communication are
torch's own on this torch release, not the replicated fallback's.
"""

from __future__ import annotations

from typing import Any


def hand_to_torch(op_call: Any, args: tuple[object, ...], kwargs: dict[str, object]) -> Any:
    """What torch alone returns for this DTensor op call (its own handler for the op, or
    its sharding propagation)."""
    from ..compat.dispatch import torch_dispatch

    return torch_dispatch(op_call, tuple(args), dict(kwargs))
