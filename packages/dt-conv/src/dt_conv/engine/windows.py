"""Run a window-local op on sharded DTensors: halo exchange, local compute, adjoint.

Pooling, interpolation and padding all follow one recipe: gather each sharded dim's
window (`halo.forward.gather_window`), compute the op on the window with its own arguments
along the other dims, and wrap the owned output rows. Their backward ops apply the local
op's adjoint to the window (torch's own backward kernels where there is one) and send
the window gradient home (`halo.backward.scatter_add_window`). Handlers run below autograd, so
the adjoint is explicit rather than recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import torch
from dt_core.dtensors import as_dtensor
from torch.distributed.tensor import DTensor, Placement, Shard

from .. import ranks
from .halo.backward import scatter_add_window
from .halo.forward import gather_window
from .plan import SpatialPlan

LocalFn = Callable[[torch.Tensor], torch.Tensor]
LocalVjp = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (window, grad) -> grad


@dataclass(frozen=True)
class WindowOp:
    """A planned op: `local(window)` computes this rank's output block from its window."""

    plan: SpatialPlan
    local: LocalFn
    vjp: LocalVjp
    fill_value: float = 0.0
    grad_reads_input: bool = False  # max pooling: its gradient depends on the values


def shard_dim(p: Placement) -> int:
    """The tensor dim a free mesh dim shards (free mesh dims are the shard-like ones)."""
    return cast(Shard, p).dim


def local_shape(plan: SpatialPlan, shape: Sequence[int], local: Sequence[int]) -> list[int]:
    """This rank's block of a tensor with global `shape` laid out like the input."""
    out = list(shape)
    for mesh_dim in plan.free_mesh_dims:
        dim = shard_dim(plan.placements[mesh_dim]) % len(shape)
        out[dim] = local[dim]
    for s in plan.splits:
        lo, hi = s.owned_out(plan.local_rank(s))
        out[s.dim] = hi - lo
    return out


def window_shape(plan: SpatialPlan, local: Sequence[int]) -> list[int]:
    """The shape of this rank's window, given its local input block's shape."""
    shape = list(local)
    for s in plan.splits:
        lo, hi = s.needed(plan.local_rank(s))
        shape[s.dim] = hi - lo
    return shape


def gather_windows(plan: SpatialPlan, local: torch.Tensor, fill_value: float = 0.0) -> torch.Tensor:
    """This rank's window: the halo exchange along every split dim, one after another."""
    for split in plan.splits:
        local = gather_window(local, split, plan.mesh, fill_value)
    return local


def forward(op: WindowOp, x: DTensor) -> DTensor:
    """The op's output as a DTensor laid out like `x` (owned rows by the chunk rule)."""
    plan = op.plan
    with torch.no_grad():
        local = x.to_local()
        window = gather_windows(plan, local, op.fill_value)
        out = ranks.each_rank(plan.mesh, _forward_block, op, window, local)
    return as_dtensor(out, plan.mesh, plan.placements, plan.out_shape)


def _forward_block(op: WindowOp, window: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """This rank's output block from its window (per-rank code)."""
    shape = local_shape(op.plan, op.plan.out_shape, local.shape)
    if window.numel() == 0 or 0 in shape:
        return window.new_zeros(shape)
    return op.local(window)


def backward(
    op: WindowOp, grad_out: DTensor, x: DTensor | None, in_shape: Sequence[int]
) -> DTensor:
    """Gradient of `forward` w.r.t. its input, laid out like the input.

    `x` is the input when the gradient reads its values (`grad_reads_input`).
    """
    plan = op.plan
    g = grad_out.redistribute(plan.mesh, plan.placements).to_local()
    with torch.no_grad():
        window = None
        if op.grad_reads_input and x is not None:
            window = gather_windows(plan, x.to_local(), op.fill_value)
        grad_window = ranks.each_rank(plan.mesh, _backward_block, op, g, window, tuple(in_shape))
        for split in reversed(plan.splits):
            grad_window = scatter_add_window(grad_window, split, plan.mesh)
    return as_dtensor(grad_window, plan.mesh, plan.placements, in_shape)


def _backward_block(
    op: WindowOp, g: torch.Tensor, window: torch.Tensor | None, in_shape: tuple[int, ...]
) -> torch.Tensor:
    """This rank's window gradient (per-rank code). Linear ops read only the window's
    shape, so without `window` a zero one stands in."""
    if window is None:
        window = g.new_zeros(window_shape(op.plan, _local_shape_in(op.plan, in_shape, g)))
    if window.numel() == 0 or g.numel() == 0:
        return window.new_zeros(window.shape)
    return op.vjp(window, g)


def _local_shape_in(plan: SpatialPlan, in_shape: Sequence[int], g: torch.Tensor) -> list[int]:
    """This rank's input block, from the gradient's block and global shapes."""
    shape = list(in_shape)
    for mesh_dim in plan.free_mesh_dims:
        dim = shard_dim(plan.placements[mesh_dim]) % len(in_shape)
        shape[dim] = g.shape[dim]
    for s in plan.splits:
        lo, hi = s.owned_in(plan.local_rank(s))
        shape[s.dim] = hi - lo
    return shape
