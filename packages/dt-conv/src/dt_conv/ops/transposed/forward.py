"""Transposed convolution on spatially sharded inputs, forward: a halo, then a local op.

A rank runs the local transposed conv of its window (`plan`) and keeps its owned rows;
the bias is added after the crop. On real ranks the output rows reading only own input
rows are computed while the halos travel, the rest after (`engine.overlap.forward`), as
for plain convs.
"""

from __future__ import annotations

import functools

import torch
from dt_core.dtensors import as_dtensor
from dt_core.kit import replicated
from torch.distributed.tensor import DTensor

from ... import ranks
from ...engine.geometry import Range
from ...engine.overlap.forward import overlapped_forward
from ...engine.windows import gather_windows
from .plan import TransposedPlan, in_exchange_order, overlap_rows, owned_shape

aten = torch.ops.aten


def forward(
    plan: TransposedPlan,
    x: DTensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    groups: int,
) -> DTensor:
    plan = in_exchange_order(plan)
    sp = plan.spatial
    w, b = replicated(weight), replicated(bias)
    with torch.no_grad():
        xl = x.to_local()
        # overlap is for real ranks: their choice is per rank
        out = None if ranks.simulated() else _interior_first(plan, xl, w, b, groups)
        if out is None:
            window = gather_windows(sp, xl)
            out = ranks.each_rank(sp.mesh, _forward_block, plan, window, w, b, groups)
    return as_dtensor(out, sp.mesh, sp.placements, sp.out_shape)


def _interior_first(
    plan: TransposedPlan,
    local: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    groups: int,
) -> torch.Tensor | None:
    """This rank's owned output rows, each block computed while the halos it does not
    read travel (`engine.overlap.forward`).

    Output row `o` sums the taps of input rows `ceil((o+p-span)/s) .. floor((o+p)/s)`;
    it is interior if those that exist are this rank's own. None where this rank has
    no block to compute early (an empty shard, or one too thin for any interior): it
    then exchanges first, which issues the same exchanges in the same order, so every
    rank may decide alone.
    """
    sp = plan.spatial
    rows = overlap_rows(plan, local)
    if rows is None:
        return None
    shape = owned_shape(plan, local)
    block = functools.partial(_output_rows, plan, w, b, groups)
    return overlapped_forward(sp, local, rows, shape, block)


def _output_rows(
    plan: TransposedPlan,
    w: torch.Tensor,
    b: torch.Tensor | None,
    groups: int,
    piece: torch.Tensor,
    starts: list[int],
    region: list[Range],
) -> torch.Tensor:
    """Output rows `region` (per sharded dim) from the input rows `piece` holds, which
    start at global rows `starts` and include every existing row those outputs read.

    The local transposed conv's row `r` is global row `start*s - p + r`; region rows it
    does not reach have no tap from any existing input row: zero (plus the bias).
    """
    splits = plan.spatial.splits
    shape = owned_shape(plan, piece)
    for split, (a, c) in zip(splits, region, strict=True):
        shape[split.dim] = c - a
    covered: list[tuple[int, int, int]] = []  # per dim: (first row, count, offset in y)
    y = None
    if 0 not in piece.shape:
        y = aten.convolution(piece, w, None, *plan.local_conv_args(groups))
        for split, start, (a, c) in zip(splits, starts, region, strict=True):
            y0 = start * plan.stride[split.dim - 2] - plan.padding[split.dim - 2]
            lo, hi = max(a, y0), min(c, y0 + y.shape[split.dim])
            covered.append((lo - a, max(0, hi - lo), lo - y0))
    if y is not None and all(n == c - a for (_, n, _), (a, c) in zip(covered, region, strict=True)):
        out = y
        for split, (_, n, offset) in zip(splits, covered, strict=True):
            out = out.narrow(split.dim, offset, n)
    else:
        out = piece.new_zeros(shape)
        if y is not None and all(n > 0 for _, n, _ in covered):
            target = out
            for split, (first, n, offset) in zip(splits, covered, strict=True):
                target = target.narrow(split.dim, first, n)
                y = y.narrow(split.dim, offset, n)
            target.copy_(y)
    if b is not None:
        out = out + b.reshape(1, -1, *([1] * (out.ndim - 2)))
    return out


def _forward_block(
    plan: TransposedPlan,
    window: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    groups: int,
) -> torch.Tensor:
    """This rank's owned output rows from its window (per-rank code)."""
    shape = owned_shape(plan, window)
    if window.numel() == 0 or 0 in shape:
        out = window.new_zeros(shape)
    else:
        out = _crop(plan, aten.convolution(window, w, None, *plan.local_conv_args(groups)))
    if b is not None:
        out = out + b.reshape(1, -1, *([1] * (out.ndim - 2)))
    return out.contiguous()


def _crop(plan: TransposedPlan, out: torch.Tensor) -> torch.Tensor:
    """The owned rows of the local output, zero rows where no tap reaches."""
    for split in plan.spatial.splits:
        first, count = plan.crop(split)
        have = out.shape[split.dim]
        take = out.narrow(split.dim, first, max(0, min(count, have - first)))
        if take.shape[split.dim] < count:
            shape = list(take.shape)
            shape[split.dim] = count - take.shape[split.dim]
            take = torch.cat([take, take.new_zeros(shape)], split.dim)
        out = take
    return out
