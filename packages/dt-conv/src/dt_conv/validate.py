"""Bad arguments fail as they would unsharded, on every rank, before any exchange.

A rank that raised in the middle of a halo exchange would leave its peers waiting, and
an error raised by the local op would quote local shapes. So each forward handler first
runs torch's own op on meta tensors of the global shapes (shape checks only, no data);
if that fails, the op runs once more on zero-stride views of the global shapes, so the
error raised is torch's own eager one, word for word. All ranks decide from the same
global metadata, so they all raise together. The checks run with every dispatch mode
popped, so under torch.compile / make_fx they raise the same error and record nothing
into the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from dt_core.compat.tracing import no_dispatch_modes
from torch.distributed.tensor import DTensor


def _meta(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return torch.empty(a.shape, dtype=a.dtype, device="meta")
    return a


def _zero_view(a: Any) -> Any:
    """A full-size tensor that costs one element of memory: torch's checks see the shape."""
    if isinstance(a, torch.Tensor):
        return torch.zeros((), dtype=a.dtype, device=a.device).expand(a.shape)
    return a


def raise_like_torch(op_call: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """Raise torch's error if the unsharded op would reject these arguments."""
    with no_dispatch_modes():
        try:
            op_call(*[_meta(a) for a in args], **{k: _meta(v) for k, v in kwargs.items()})
        except Exception:  # noqa: BLE001 - meta kernels word their errors differently
            op_call(*[_zero_view(a) for a in args], **{k: _zero_view(v) for k, v in kwargs.items()})


def simulated_ranks(args: tuple, kwargs: dict) -> bool:
    """Whether these DTensors hold simulated ranks (torch's LocalTensorMode active, or
    LocalTensors inside). Under an enabled mode the handlers run sharded (`ranks`);
    LocalTensors outside their mode, where the mesh cannot say which rank is which, take
    the replicated path (exact)."""
    from dt_core.tracing import simulates_ranks

    return simulates_ranks(*(a for a in (*args, *kwargs.values()) if isinstance(a, DTensor)))
