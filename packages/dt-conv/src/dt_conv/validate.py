"""Bad arguments fail as they would unsharded, on every rank, before any exchange.

A rank that raised in the middle of a halo exchange would leave its peers waiting, and
an error raised by the local op would quote local shapes. So each forward handler first
runs torch's own op on meta tensors of the global shapes (shape checks only, no data);
if that fails, the op runs once more on zero-stride views of the global shapes, so the
error raised is torch's own eager one, word for word. All ranks decide from the same
global metadata, so they all raise together.

Tracing (torch.compile, make_fx, fake tensors) is refused the same way, before any
exchange: the halo exchange is eager point-to-point communication, which a tracer would
run on fake data and leave unmatched, and torch's own DTensor rules give wrong results
for spatially sharded inputs. A clear error beats both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor import DTensor


def _meta(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return torch.empty(a.shape, dtype=a.dtype, device="meta")
    return a


def _zero_view(a: Any) -> Any:
    """A full-size tensor that costs one element of memory: torch's checks see the shape."""
    if isinstance(a, DTensor):
        return a.to_local().new_zeros(()).expand(a.shape)
    if isinstance(a, torch.Tensor):
        return a.new_zeros(()).expand(a.shape)
    return a


def raise_like_torch(op_call: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """Raise torch's error if the unsharded op would reject these arguments."""
    try:
        op_call(*[_meta(a) for a in args], **{k: _meta(v) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001 - meta kernels word their errors differently; ask eager
        op_call(*[_zero_view(a) for a in args], **{k: _zero_view(v) for k, v in kwargs.items()})


def _is_traced(a: Any) -> bool:
    return isinstance(a, DTensor) and type(a.to_local()) is not torch.Tensor


def refuse_tracing(op_name: str, args: tuple, kwargs: dict) -> None:
    """Raise NotImplementedError when the call is being traced rather than run."""
    traced = torch.compiler.is_compiling() or any(_is_traced(a) for a in (*args, *kwargs.values()))
    if traced:
        raise NotImplementedError(
            f"dt-conv: {op_name} on DTensors cannot be traced yet (torch.compile, make_fx, "
            "fake tensors): its halo exchange runs eagerly only, and torch's own DTensor "
            "rule would give wrong results for sharded spatial dims. Run these layers "
            "eagerly, e.g. decorate their forward with torch.compiler.disable."
        )
