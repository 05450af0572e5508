"""DTensor handler for `aten.convolution.default`: halo exchange, then a local conv."""

from __future__ import annotations

from typing import cast

import torch
from dt_core.dtensors import as_dtensor
from dt_core.kit import Unsupported, bind_positional, replicated_fallback
from torch.distributed.tensor import DTensor

from ... import ranks
from ...engine.overlap.forward import overlapped_forward
from ...engine.windows import gather_windows
from ..transposed import forward as transposed_forward
from ..transposed.plan import make_transposed_plan
from . import same
from .channels import local_bias, local_groups, local_weight, output_placements
from .plan import ConvPlan, layout_and_plan, local_conv, local_out_shape, overlap_rows


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
        try:
            tplan = make_transposed_plan(
                x, weight.shape, stride, padding, dilation, out_pad, groups
            )
        except Unsupported as exc:
            return _fallback(f"transposed convolution: {exc}", op_call, args, kwargs, x)
        return transposed_forward.forward(tplan, x, weight, bias, groups)
    with torch.no_grad():
        try:
            layout, plan = layout_and_plan(x, weight, bias, stride, padding, dilation, groups)
        except Unsupported as exc:
            return _fallback(str(exc), op_call, args, kwargs, x)
        w, b = local_weight(layout, weight, x), local_bias(layout, bias, weight, x)
        placements = output_placements(layout, plan.placements)
        groups = local_groups(layout, groups, x)
        if not ranks.simulated():  # overlap is for real ranks: their choice is per rank
            overlapped = same.same_conv_overlapped(plan, x.to_local(), w, b, groups)
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


def _interior_first(
    plan: ConvPlan, local: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, groups: int
) -> torch.Tensor | None:
    """Any conv on sharded dims: each block computed while the halos it does not read
    travel (`engine.overlap.forward`). None where this rank has no such block: it
    then exchanges first, which issues the same exchanges in the same order, so every
    rank may decide alone."""
    rows = overlap_rows(plan) if plan.splits and 0 not in local.shape else None
    if rows is None:
        return None
    shape = local_out_shape(plan, local)
    shape[1] = w.shape[0]
    conv = local_conv(plan, w, b, groups)
    return overlapped_forward(plan.spatial, local, rows, shape, lambda piece, _, __: conv(piece))


def _fallback(
    reason: str, op_call: torch._ops.OpOverload, args: tuple, kwargs: dict, x: object
) -> object:
    """The convolution on replicated inputs (exact), laid out like its input; a replicated
    DTensor where the input is plain (the output of an op on DTensor parameters)."""
    like = x if isinstance(x, DTensor) else None
    return replicated_fallback("conv", reason, op_call, args, kwargs, like=(like,))
