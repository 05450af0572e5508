"""Backward with both gradients wanted: each halo exchange travels during a computation.

A conv's input gradient reads only the shape of the input window, never its values, so
it is computed while the input's halo travels along the first sharded dim; the weight
gradient, which needs the whole window, is computed while the input gradient's halo
travels home along the last sharded dim (the adjoint exchange runs in reverse dim order).
On one sharded dim both exchanges overlap; on several, the first input exchange and the
last gradient exchange do, and the others run in between.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from . import ranks
from .halo import PendingScatter, PendingWindow, scatter_add_window
from .plan import SpatialPlan
from .spatial import window_shape

WeightGrads = TypeVar("WeightGrads")


def overlaps_here(
    plan: SpatialPlan, local: torch.Tensor, grad_out: torch.Tensor, mask: Sequence[bool]
) -> bool:
    """Whether this (real) rank computes both gradients while its halos travel: both are
    wanted, and it has a window and an output gradient. Simulated ranks take the
    exchange-first path (overlap is per rank)."""
    if ranks.simulated() or not (plan.splits and mask[0] and mask[1]):
        return False
    return 0 not in window_shape(plan, local.shape) and grad_out.numel() > 0


def overlapped_gradients(
    plan: SpatialPlan,
    local: torch.Tensor,
    input_grad: Callable[[torch.Tensor], torch.Tensor],
    weight_grads: Callable[[torch.Tensor], WeightGrads],
) -> tuple[torch.Tensor, WeightGrads]:
    """(this rank's input gradient rows, `weight_grads(window)`).

    `input_grad(window)` is the window's input gradient from a window of the right shape
    (its values are not read); `local` is this rank's input block.
    """
    (first, *later), (*earlier, last) = plan.splits, plan.splits
    input_halo = PendingWindow(local, first, plan.mesh, 0.0)
    grad_window = input_grad(local.new_zeros(()).expand(window_shape(plan, local.shape)))
    for split in later:  # each later dim's exchange carries the earlier dims' windows
        input_halo = PendingWindow(input_halo.wait().full(), split, plan.mesh, 0.0)
    # issued after every input exchange, as ranks with nothing to compute issue them:
    # each mesh dim's group sees its exchanges in one order on every rank
    grad_going_home = PendingScatter(grad_window, last, plan.mesh)
    window = input_halo.wait().full()
    weights = weight_grads(window)
    grad = grad_going_home.finish()
    for split in reversed(earlier):
        grad = scatter_add_window(grad, split, plan.mesh)
    return grad, weights
