"""DTensor handler for `aten.convolution.default`: halo exchange, then a local conv."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import cast

import torch
from dt_core.dtensors import as_dtensor
from dt_core.kit import Unsupported, bind_positional, replicated_fallback
from torch.distributed.tensor import DTensor

from . import ranks
from .channels import (
    channel_layout,
    local_bias,
    local_groups,
    local_weight,
    output_placements,
)
from .geometry import Affine, DimSplit, Range
from .halo import PendingWindow
from .interior import Rows, exchange_order, overlapped_forward, rows_of
from .plan import ConvPlan, make_plan
from .spatial import gather_windows

aten = torch.ops.aten


def local_out_shape(plan: ConvPlan, window: torch.Tensor) -> list[int]:
    """This rank's output block: owned output rows on sharded dims, everything else full."""
    shape = [window.shape[0], *plan.out_shape[1:]]
    for s in plan.splits:
        o0, o1 = s.owned_out(plan.spatial.local_rank(s))
        shape[s.dim] = o1 - o0
    return shape


def convolution_handler(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    """Exact convolution for spatially and batch sharded inputs; replicated fallback else."""
    values = bind_positional(op_call, args, kwargs)
    # types as aten.convolution's schema declares them
    x, weight = cast(DTensor, values[0]), cast(torch.Tensor, values[1])
    bias = cast("torch.Tensor | None", values[2])
    stride, padding, dilation = (cast(list[int], v) for v in values[3:6])
    transposed, out_pad = cast(bool, values[6]), cast(list[int], values[7])
    groups = cast(int, values[8])
    if transposed:
        from . import transposed as tr

        try:
            tplan = tr.make_transposed_plan(
                x, weight.shape, stride, padding, dilation, out_pad, groups
            )
        except Unsupported as exc:
            return _fallback(f"transposed convolution: {exc}", op_call, args, kwargs, x)
        return tr.forward(tplan, x, weight, bias, groups)
    layout = channel_layout(x, weight, bias, groups)
    with torch.no_grad():
        try:
            plan = make_plan(
                x, weight.shape, stride, padding, dilation, transposed, layout.splits_input
            )
        except Unsupported as exc:
            return _fallback(str(exc), op_call, args, kwargs, x)
        plan = in_exchange_order(plan)
        w, b = local_weight(layout, weight, x), local_bias(layout, bias, weight, x)
        placements = output_placements(layout, plan.placements)
        groups = local_groups(layout, groups, x)
        if not ranks.simulated():  # overlap is for real ranks: their choice is per rank
            overlapped = _same_conv_overlapped(plan, x.to_local(), w, b, groups)
            if overlapped is None:
                overlapped = _interior_first(plan, x.to_local(), w, b, groups)
            if overlapped is not None:
                return as_dtensor(overlapped, plan.mesh, placements, plan.out_shape)
        window = gather_windows(plan.spatial, x.to_local())
        out = ranks.each_rank(plan.mesh, _conv_block, plan, window, w, b, groups)
        return as_dtensor(out, plan.mesh, placements, plan.out_shape)


def _conv_block(
    plan: ConvPlan, window: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, groups: int
) -> torch.Tensor:
    """This rank's output block from its whole window (per-rank code)."""
    shape = local_out_shape(plan, window)
    shape[1] = w.shape[0]
    if window.numel() == 0 or 0 in shape:
        out = window.new_zeros(shape)
        if b is not None and out.numel():  # no input channels here, but a bias to add
            out += b.reshape(-1, *[1] * (out.ndim - 2))
        return out
    return local_conv(plan, w, b, groups)(window)


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


def _same_conv_overlapped(
    plan: ConvPlan, local: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, groups: int
) -> torch.Tensor | None:
    """The common 'same' conv on one sharded dim, with the halo exchange overlapped.

    Output rows equal input rows there, so the local shard convolves in place (zero
    padding at the seams) while the halos travel; then only the `p` rows next to each
    seam are recomputed from a 3p-row window. No copy of the input; None if not this case.
    """
    if len(plan.splits) != 1:
        return None
    split = plan.splits[0]
    reach = split.reach
    if not isinstance(reach, Affine) or reach.stride != 1 or split.out_size != split.size:
        return None
    p = -reach.offset
    o0, o1 = split.owned_out(plan.spatial.local_rank(split))
    if p < 1 or reach.extent != 2 * p + 1 or o1 - o0 < 2 * p or 0 in local.shape:
        return None
    pending = PendingWindow(local, split, plan.mesh, 0.0)
    padding = list(plan.local_padding)
    padding[split.dim - 2] = p
    conv = local_conv(plan, w, b, groups)
    out = conv(local, padding=padding)
    pending.wait()
    dim, n = split.dim, o1 - o0
    if o0 > 0:  # a neighbour above: fix the first p rows
        out.narrow(dim, 0, p).copy_(conv(pending.rows(0, 3 * p)))
    if o1 < split.size:  # a neighbour below: fix the last p rows
        rows = pending.rows(n - p, n + 2 * p)
        out.narrow(dim, n - p, p).copy_(conv(rows))
    return out


def _interior_first(
    plan: ConvPlan, local: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, groups: int
) -> torch.Tensor | None:
    """Any conv on sharded dims: each block computed while the halos it does not read
    travel (`interior.overlapped_forward`). None where this rank has no such block: it
    then exchanges first, which issues the same exchanges in the same order, so every
    rank may decide alone."""
    rows = conv_rows(plan) if plan.splits and 0 not in local.shape else None
    if rows is None:
        return None
    shape = local_out_shape(plan, local)
    shape[1] = w.shape[0]
    conv = local_conv(plan, w, b, groups)
    return overlapped_forward(plan.spatial, local, rows, shape, lambda piece, _, __: conv(piece))


def _interior(split: DimSplit, chunk: int) -> Range:
    """Output rows of `chunk` reading only its own input rows (an `Affine` reach)."""
    reach = cast(Affine, split.reach)
    i0, i1 = split.owned_in(chunk)
    first = -(-(i0 - reach.offset) // reach.stride)
    return first, (i1 - reach.extent - reach.offset) // reach.stride + 1


def in_exchange_order(plan: ConvPlan) -> ConvPlan:
    """The plan with its halos exchanged in the order that overlaps most (global)."""
    if len(plan.splits) < 2 or not all(isinstance(s.reach, Affine) for s in plan.splits):
        return plan
    splits = exchange_order(plan.splits, _interior)
    return replace(plan, spatial=replace(plan.spatial, splits=splits))


def conv_rows(plan: ConvPlan) -> list[Rows] | None:
    """Each sharded dim's rows, or None if this rank owns no output rows."""
    rows = []
    for split in plan.splits:
        rank = plan.spatial.local_rank(split)
        o0, o1 = split.owned_out(rank)
        if o1 <= o0 or not isinstance(split.reach, Affine):
            return None
        rows.append(rows_of(split, rank, _interior(split, rank)))
    return rows


def _fallback(
    reason: str, op_call: torch._ops.OpOverload, args: tuple, kwargs: dict, x: object
) -> object:
    """The convolution on replicated inputs (exact), laid out like its input; a replicated
    DTensor where the input is plain (the output of an op on DTensor parameters)."""
    like = x if isinstance(x, DTensor) else None
    return replicated_fallback("conv", reason, op_call, args, kwargs, like=(like,))
