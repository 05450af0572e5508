"""Backward with both gradients wanted: each halo exchange travels during a computation.

A conv's input gradient reads only the shape of the input window, never its values, so
it is computed while the input's halo travels along the first sharded dim; the weight
gradient, which needs the whole window, is computed while the input gradient's halo
travels home along the last sharded dim (the adjoint exchange runs in reverse dim order).
On one sharded dim both exchanges overlap (`overlapped_gradients`).

On several (`staged_gradients`) the weight gradient is also split into the blocks of
output rows `forward` stages for the forward pass (a block reads the input rows its output
rows read, so the blocks' weight gradients sum to the whole one): each block is computed
while a later exchange travels, once the input halos it reads have arrived.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from ... import ranks
from ..geometry import Range
from ..halo.backward import PendingScatter, scatter_add_window
from ..halo.forward import PendingWindow
from ..plan import SpatialPlan
from ..windows import window_shape
from .forward import Rows, input_piece, staged_regions

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


# (input piece, global first input row of the piece per sharded dim, output rows per
# sharded dim) -> the weight gradient of those output rows
WeightBlock = Callable[[torch.Tensor, list[int], list[Range]], torch.Tensor]
# (exchange: "input" or "grad", its tensor dim) -> output rows of the weight-gradient
# blocks computed while it travels
Schedule = list[tuple[tuple[str, int], list[list[Range]]]]


def backward_schedule(rows: Sequence[Rows]) -> Schedule:
    """Which weight-gradient blocks each exchange after the first overlaps.

    The exchanges run in the order every rank issues them: the input halos dim by dim,
    then the input gradient's halos home in reverse. The first input exchange carries
    the input gradient; each later one, and each gradient exchange but the last, the
    first block whose input halos have arrived (one waits for `t` input exchanges; a
    gradient exchange starts after all of them); the last takes what is left. Blocks
    are halved (by output rows) until there is one per exchange where they can be. Read off
    this rank's rows only: where an exchange gets no block, it runs with nothing beside
    it, which changes no exchange, so ranks may differ.
    """
    k = len(rows)
    later = [("input", r.dim) for r in rows[1:]] + [("grad", r.dim) for r in reversed(rows)]
    waited = [*range(1, k), *[k] * k]  # input exchanges waited for before each starts
    blocks = _split_to(staged_regions(rows), len(later))
    schedule: Schedule = []
    for n, (exchange, ready) in enumerate(zip(later, waited, strict=True)):
        if n == len(later) - 1:
            now, blocks = blocks, []
        else:
            now = next(([b] for b in blocks if b[0] <= ready), [])
            blocks = [b for b in blocks if b not in now]
        schedule.append((exchange, [region for _, region in now]))
    return schedule


def _split_to(blocks: list[tuple[int, list[Range]]], count: int) -> list[tuple[int, list[Range]]]:
    """`blocks` with the latest-ready, largest ones halved along their longest dim until
    there are `count` or none has two rows along any dim; each half is a block of output
    rows like any other (it reads part of what the whole reads)."""

    def longest(region: list[Range]) -> int:
        return max(range(len(region)), key=lambda d: region[d][1] - region[d][0])

    def extent(region: list[Range]) -> int:
        start, stop = region[longest(region)]
        return stop - start

    blocks = list(blocks)
    while len(blocks) < count:
        splittable = [b for b in blocks if extent(b[1]) > 1]
        if not splittable:
            break
        ready, region = max(splittable, key=lambda b: (b[0], extent(b[1])))
        d = longest(region)
        (start, stop), at = region[d], blocks.index((ready, region))
        middle = (start + stop) // 2
        halves = [
            [*region[:d], half, *region[d + 1 :]] for half in ((start, middle), (middle, stop))
        ]
        blocks[at : at + 1] = [(ready, h) for h in halves]
    return blocks


def staged_gradients(
    plan: SpatialPlan,
    local: torch.Tensor,
    rows: Sequence[Rows],
    input_grad: Callable[[torch.Tensor], torch.Tensor],
    weight_block: WeightBlock,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(this rank's input gradient rows, its weight gradient) on several sharded dims,
    every exchange overlapped where this rank has a block for it (`backward_schedule`).

    Exchanges as `overlapped_gradients` issues them; `rows` are `plan.splits`' rows.
    """
    schedule = backward_schedule(rows)
    k, mesh = len(rows), plan.mesh
    weight: list[torch.Tensor] = []

    def compute(source: torch.Tensor, windowed: int, regions: list[list[Range]]) -> None:
        for region in regions:
            part = weight_block(*input_piece(source, rows, region, windowed), region)
            weight[:] = [weight[0] + part] if weight else [part]

    pending = PendingWindow(local, rows[0].split, mesh, 0.0)
    grad_window = input_grad(local.new_zeros(()).expand(window_shape(plan, local.shape)))
    for t in range(1, k):  # each later dim's exchange carries the earlier dims' windows
        source = pending.wait().full()
        pending = PendingWindow(source, rows[t].split, mesh, 0.0)
        compute(source, t, schedule[t - 1][1])
    window = pending.wait().full()
    grad = grad_window
    for n, r in enumerate(reversed(rows)):
        going_home = PendingScatter(grad, r.split, mesh)
        compute(window, k, schedule[k - 1 + n][1])
        grad = going_home.finish()
    return grad, weight[0]  # the blocks tile the owned output, which is not empty
