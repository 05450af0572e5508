"""A sharded convolution's plan: the spatial plan plus the local conv's arguments.

From global metadata only, like every plan (`engine.plan`); forward and backward both
read it, and the interior rows (those reading only a rank's own input rows) the overlap
schedules by (`engine.overlap`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import cast

import torch
from dt_core.kit import Unsupported
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement

from ...engine.geometry import Affine, DimSplit, Range, conv_out_size, conv_split, expand
from ...engine.overlap.forward import Rows, exchange_order, rows_of
from ...engine.plan import SpatialPlan, Splitter, plan_spatial
from .channels import ChannelLayout, channel_layout

aten = torch.ops.aten


@dataclass(frozen=True)
class ConvPlan:
    """A sharded convolution: the spatial plan plus the local conv's arguments."""

    spatial: SpatialPlan
    local_padding: list[int]  # conv padding with 0 on the sharded dims
    stride: list[int]
    dilation: list[int]

    @property
    def mesh(self) -> DeviceMesh:
        return self.spatial.mesh

    @property
    def placements(self) -> tuple[Placement, ...]:
        return self.spatial.placements

    @property
    def splits(self) -> tuple[DimSplit, ...]:
        return self.spatial.splits

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.spatial.out_shape

    @property
    def reduce_mesh_dims(self) -> tuple[int, ...]:
        """Mesh dims over which weight/bias gradients are partial sums."""
        split_dims = tuple(s.mesh_dim for s in self.splits)
        return tuple(sorted(self.spatial.free_mesh_dims + split_dims))


def make_plan(
    x: object,
    weight_shape: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    channels_owned: bool = False,
) -> ConvPlan:
    """A `ConvPlan`; `Unsupported` if the sharded path cannot be exact for this call.

    `channels_owned`: a channel layout (see `channels`) handles the input's channel sharding.
    """
    if not isinstance(x, DTensor):
        raise Unsupported("input is not a DTensor")
    if transposed:
        raise Unsupported("transposed convolution")
    nspatial = len(weight_shape) - 2
    if x.ndim != nspatial + 2:
        raise Unsupported("unbatched input")
    stride, padding = expand(stride, nspatial), expand(padding, nspatial)
    dilation = expand(dilation, nspatial)
    out_spatial = [
        conv_out_size(x.shape[d + 2], weight_shape[d + 2], stride[d], padding[d], dilation[d])
        for d in range(nspatial)
    ]
    if min(out_spatial) < 1:
        raise Unsupported("empty convolution output")

    def splitter(dim: int) -> Splitter:
        i = dim - 2
        args = (x.shape[dim], weight_shape[dim], stride[i], padding[i], dilation[i])
        return lambda mesh_dim, parts: conv_split(dim, mesh_dim, parts, *args)

    out_shape = (x.shape[0], weight_shape[0], *out_spatial)
    spatial = plan_spatial(
        x,
        out_shape,
        {d: splitter(d) for d in range(2, x.ndim)},
        blocked={} if channels_owned else {1: "input sharded on the channel dim"},
        owned=(1,) if channels_owned else (),
    )
    local_padding = list(padding)
    for s in spatial.splits:
        local_padding[s.dim - 2] = 0
    return ConvPlan(spatial, local_padding, stride, dilation)


def layout_and_plan(
    x: DTensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> tuple[ChannelLayout, ConvPlan]:
    """The channel layout and the plan of a convolution that is not transposed, its halos
    in exchange order: forward and backward both plan by this, so every path of either
    exchanges in one order. `Unsupported` as `make_plan`."""
    layout = channel_layout(x, weight, bias, groups)
    plan = make_plan(x, weight.shape, stride, padding, dilation, False, layout.splits_input)
    return layout, in_exchange_order(plan)


def local_out_shape(plan: ConvPlan, window: torch.Tensor) -> list[int]:
    """This rank's output block: owned output rows on sharded dims, everything else full."""
    shape = [window.shape[0], *plan.out_shape[1:]]
    for s in plan.splits:
        o0, o1 = s.owned_out(plan.spatial.local_rank(s))
        shape[s.dim] = o1 - o0
    return shape


def local_conv(
    plan: ConvPlan, w: torch.Tensor, b: torch.Tensor | None, groups: int
) -> Callable[..., torch.Tensor]:
    """This rank's conv: the plan's stride and dilation, padding 0 along sharded dims
    (pass `padding=` to override)."""
    return functools.partial(
        aten.convolution,
        weight=w,
        bias=b,
        stride=plan.stride,
        padding=plan.local_padding,
        dilation=plan.dilation,
        transposed=False,
        output_padding=[0] * len(plan.stride),
        groups=groups,
    )


def interior_rows(split: DimSplit, chunk: int) -> Range:
    """Output rows of `chunk` reading only its own input rows (an `Affine` reach)."""
    reach = cast(Affine, split.reach)
    i0, i1 = split.owned_in(chunk)
    first = -(-(i0 - reach.offset) // reach.stride)
    return first, (i1 - reach.extent - reach.offset) // reach.stride + 1


def in_exchange_order(plan: ConvPlan) -> ConvPlan:
    """The plan with its halos exchanged in the order that overlaps most (global)."""
    if len(plan.splits) < 2 or not all(isinstance(s.reach, Affine) for s in plan.splits):
        return plan
    splits = exchange_order(plan.splits, interior_rows)
    return replace(plan, spatial=replace(plan.spatial, splits=splits))


def overlap_rows(plan: ConvPlan) -> list[Rows] | None:
    """Each sharded dim's rows, or None if this rank owns no output rows."""
    rows = []
    for split in plan.splits:
        rank = plan.spatial.local_rank(split)
        o0, o1 = split.owned_out(rank)
        if o1 <= o0 or not isinstance(split.reach, Affine):
            return None
        rows.append(rows_of(split, rank, interior_rows(split, rank)))
    return rows
