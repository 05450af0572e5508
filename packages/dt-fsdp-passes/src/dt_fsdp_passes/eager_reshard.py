"""reshard_after_forward in eager mode: saved gathered weights are re-gathered in backward.

Under torch.compile the partitioner obeys the gather's recompute policy. In eager, the
ops that consume a gathered weight (linear, matmul) save it for backward, keeping the full
parameter alive (a plain tensor, or a DTensor on the parameter's own TP/spatial dims,
which DTensor's autograd saves as such; both are recognised by their data's storage).
Here the root module's forward runs under `saved_tensors_hooks`: a saved tensor that is a
gathered parameter is packed as a reference to its shard and gathered again when
backward unpacks it, so only shards stay alive between forward and backward.
Backward runs the same nodes in the same order on every rank, so the re-gathers match.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

# storage address of a gathered tensor -> (weakref to it, shard parameter, layout, mp policy)
_live: dict[int, tuple[weakref.ref, Any, Any, Any]] = {}


class _Regather:
    """What a saved gathered weight (or a view of it) is packed into: enough to gather it
    again and take the same view."""

    __slots__ = ("dtensor", "layout", "mp", "offset", "param", "size", "stride")

    def __init__(
        self, param: Any, layout: Any, mp: Any, local: torch.Tensor, dtensor: Any = None
    ) -> None:
        self.param = param
        self.layout = layout
        self.mp = mp
        self.size = tuple(local.size())
        self.stride = tuple(local.stride())
        self.offset = local.storage_offset()
        # A saved DTensor (a parameter with its own placements): how to wrap the local again.
        self.dtensor = (
            None
            if dtensor is None
            else (dtensor.device_mesh, dtensor.placements, dtensor.shape, dtensor.stride())
        )


def _address(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _local_of(tensor: Any) -> torch.Tensor | None:
    """The plain tensor holding the data: itself, or a DTensor's local tensor."""
    from torch.distributed.tensor import DTensor

    if type(tensor) is torch.Tensor:
        return tensor
    if isinstance(tensor, DTensor):
        with torch.no_grad():
            local = tensor.to_local()
        return local if type(local) is torch.Tensor else None
    return None


def remember(gathered: torch.Tensor, param: Any, layout: Any, mp: Any) -> None:
    """Mark `gathered` (a plain tensor, or a DTensor on the parameter's own dims) as the
    gathered copy of `param` (eager forward only)."""
    local = _local_of(gathered)
    if local is None:
        return
    key = _address(local)
    if key == 0:  # empty tensors share no storage: nothing to save anyway
        return

    def forget(ref: weakref.ref, key: int = key) -> None:
        if key in _live and _live[key][0] is ref:
            del _live[key]

    _live[key] = (weakref.ref(gathered, forget), param, layout, mp)


def _pack(tensor: torch.Tensor) -> Any:
    if tensor.layout != torch.strided:
        return tensor
    if tensor.requires_grad and tensor.grad_fn is None:  # a leaf (a parameter, an input)
        return tensor
    local = _local_of(tensor)
    if local is None:
        return tensor
    entry = _live.get(_address(local))
    if entry is None:
        return tensor
    gathered = entry[0]()
    if gathered is not None and gathered.dtype == tensor.dtype:
        dtensor = None if local is tensor else tensor
        return _Regather(entry[1], entry[2], entry[3], local, dtensor)
    return tensor


def _unpack(packed: Any) -> torch.Tensor:
    if isinstance(packed, _Regather):
        from dt_fsdp_passes.layout import gather

        with torch.no_grad():
            gathered = gather(packed.param.detach(), packed.layout, packed.mp)
            local = _local_of(gathered)
            if local is None:
                raise RuntimeError(
                    f"simple_fsdp: re-gathering a saved parameter gave {type(gathered)}"
                )
            view = local.as_strided(packed.size, packed.stride, packed.offset)
            if packed.dtensor is None:
                return view
            from torch.distributed.tensor import DTensor

            mesh, placements, shape, stride = packed.dtensor
            return DTensor.from_local(
                view, mesh, placements, run_check=False, shape=shape, stride=stride
            )
    return packed


def wrap_forward(module: nn.Module) -> None:
    """Run `module.forward` under the packing hooks when not compiling."""
    original: Callable[..., Any] = module.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling() or not torch.is_grad_enabled():
            return original(*args, **kwargs)
        with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
            return original(*args, **kwargs)

    module.forward = forward
