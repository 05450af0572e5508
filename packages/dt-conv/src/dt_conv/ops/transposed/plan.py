"""A sharded transposed conv's plan: which input rows a rank's output rows read.

Output rows are owned by the chunk rule like every other op here. A rank gathers the
input rows whose taps land on its output rows (`geometry.Transposed`) and runs the local
transposed conv with padding 0 along sharded dims; its owned rows are a crop of that
conv's output (`TransposedPlan.crop`). From global metadata only; forward and backward
read it, and the interior rows (those whose existing input rows are all the rank's own)
the overlap schedules by (`engine.overlap`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import cast

import torch
from dt_core.kit import Unsupported
from torch.distributed.tensor import DTensor

from ...engine.geometry import DimSplit, Range, Transposed, expand
from ...engine.overlap.forward import Rows, exchange_order, rows_of
from ...engine.plan import SpatialPlan, Splitter, plan_spatial


def transposed_out_size(n: int, k: int, s: int, p: int, d: int, op: int) -> int:
    return (n - 1) * s - 2 * p + d * (k - 1) + op + 1


class TransposedPlan:
    """Everything a rank needs for one sharded transposed conv (global metadata only)."""

    def __init__(
        self,
        spatial: SpatialPlan,
        stride: list[int],
        padding: list[int],
        dilation: list[int],
        out_pad: list[int],
    ) -> None:
        self.spatial, self.stride, self.dilation = spatial, stride, dilation
        self.padding = padding
        self.local_padding, self.local_out_pad = list(padding), list(out_pad)
        for s in spatial.splits:
            self.local_padding[s.dim - 2] = self.local_out_pad[s.dim - 2] = 0

    def crop(self, split: DimSplit) -> tuple[int, int]:
        """(first local output row owned, number owned) along `split.dim`."""
        rank = self.spatial.local_rank(split)
        o0, o1 = split.owned_out(rank)
        lo, _ = split.needed(rank)
        return o0 + self.padding[split.dim - 2] - lo * self.stride[split.dim - 2], o1 - o0

    def local_conv_args(self, groups: int) -> tuple:
        """`aten.convolution`'s arguments after the bias for this rank's transposed conv of
        its window (padding 0 along sharded dims), which backward differentiates."""
        return (self.stride, self.local_padding, self.dilation, True, self.local_out_pad, groups)

    def with_splits(self, splits: Sequence[DimSplit]) -> TransposedPlan:
        """The same plan exchanging its halos in the order of `splits` (global, see
        `interior.exchange_order`)."""
        other = copy.copy(self)
        other.spatial = replace(self.spatial, splits=tuple(splits))
        return other

    @property
    def reduce_mesh_dims(self) -> tuple[int, ...]:
        split_dims = tuple(s.mesh_dim for s in self.spatial.splits)
        return tuple(sorted(self.spatial.free_mesh_dims + split_dims))


def make_transposed_plan(
    x: object,
    weight_shape: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    out_pad: Sequence[int],
    groups: int,
) -> TransposedPlan:
    """A `TransposedPlan`; `Unsupported` if the sharded path cannot be exact for this call."""
    if not isinstance(x, DTensor):
        raise Unsupported("input is not a DTensor")
    n = len(weight_shape) - 2
    if x.ndim != n + 2:
        raise Unsupported("unbatched input")
    stride, padding = expand(stride, n), expand(padding, n)
    dilation, out_pad = expand(dilation, n), expand(out_pad, n)
    sizes = [
        transposed_out_size(
            x.shape[i + 2], weight_shape[i + 2], stride[i], padding[i], dilation[i], out_pad[i]
        )
        for i in range(n)
    ]
    if min(sizes) < 1:
        raise Unsupported("empty convolution output")

    def splitter(dim: int) -> Splitter:
        i = dim - 2
        reach = Transposed(stride[i], padding[i], dilation[i] * (weight_shape[dim] - 1))
        return lambda mesh_dim, parts: DimSplit(dim, mesh_dim, parts, x.shape[dim], sizes[i], reach)

    out_shape = (x.shape[0], weight_shape[1] * groups, *sizes)
    spatial = plan_spatial(
        x,
        out_shape,
        {d: splitter(d) for d in range(2, x.ndim)},
        blocked={1: "input sharded on the channel dim"},
    )
    return TransposedPlan(spatial, stride, padding, dilation, out_pad)


def local_out_shape(
    plan: TransposedPlan, window: torch.Tensor, weight: torch.Tensor, groups: int
) -> list[int]:
    shape = [window.shape[0], weight.shape[1] * groups]
    for i in range(window.ndim - 2):
        k = weight.shape[i + 2]
        shape.append(
            transposed_out_size(
                window.shape[i + 2],
                k,
                plan.stride[i],
                plan.local_padding[i],
                plan.dilation[i],
                plan.local_out_pad[i],
            )
        )
    return shape


def owned_shape(plan: TransposedPlan, window: torch.Tensor) -> list[int]:
    shape = [window.shape[0], plan.spatial.out_shape[1], *plan.spatial.out_shape[2:]]
    for split in plan.spatial.splits:
        shape[split.dim] = plan.crop(split)[1]
    return shape


def overlap_rows(plan: TransposedPlan, local: torch.Tensor) -> list[Rows] | None:
    """Each sharded dim's rows; None if this rank holds no input or owns no output."""
    sp = plan.spatial
    if not sp.splits or 0 in local.shape:
        return None
    rows = []
    for split in sp.splits:
        rank = sp.local_rank(split)
        o0, o1 = split.owned_out(rank)
        if o1 <= o0:
            return None
        rows.append(rows_of(split, rank, interior_rows(split, rank)))
    return rows


def interior_rows(split: DimSplit, chunk: int) -> Range:
    """Output rows of `chunk` whose existing input rows are all its own."""
    reach = cast(Transposed, split.reach)
    s, p, span = reach.stride, reach.padding, reach.span
    i0, i1 = split.owned_in(chunk)
    o0, o1 = split.owned_out(chunk)
    first = o0 if i0 == 0 else (i0 - 1) * s - p + span + 1  # reads nothing above i0
    last = o1 if i1 == split.size else i1 * s - p  # reads nothing from i1 on
    return (first, last) if i1 > i0 else (o0, o0)


def in_exchange_order(plan: TransposedPlan) -> TransposedPlan:
    """The plan with its halos exchanged in the order that overlaps most (global); forward
    and backward both exchange in it."""
    return plan.with_splits(exchange_order(plan.spatial.splits, interior_rows))
