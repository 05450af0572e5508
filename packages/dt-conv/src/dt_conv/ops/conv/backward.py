"""DTensor handler for `aten.convolution_backward.default`, the adjoint of `forward`.

grad_input: local input-gradient over the halo window, sent back to the row owners and
summed (reverse halo exchange). grad_weight / grad_bias: local contributions summed over
the mesh dims that split the input. Only gradients in `output_mask` are computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from dt_core.dtensors import as_dtensor
from dt_core.kit import Unsupported, bind_positional, replicated_fallback
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard

from ... import ranks
from ...engine.geometry import Range
from ...engine.halo.backward import scatter_add_window
from ...engine.overlap.backward import overlapped_gradients, overlaps_here, staged_gradients
from ...engine.overlap.forward import output_block
from ...engine.partial_sums import summed
from ...engine.windows import gather_windows, window_shape
from ..transposed import backward as transposed_backward
from ..transposed.plan import make_transposed_plan
from . import same
from .channels import (
    ChannelLayout,
    bias_gradient,
    grad_output_placements,
    local_groups,
    local_weight,
    weight_gradient,
)
from .plan import ConvPlan, layout_and_plan, overlap_rows

aten = torch.ops.aten


def convolution_backward_handler(
    op_call: torch._ops.OpOverload, args: tuple, kwargs: dict
) -> object:
    """Exact gradients for the layouts `forward` supports; replicated fallback else."""
    values = bind_positional(op_call, args, kwargs)
    # types as aten.convolution_backward's schema declares them
    grad_out, x = cast(DTensor, values[0]), cast(DTensor, values[1])
    weight, bias_sizes = cast(torch.Tensor, values[2]), values[3]
    stride, padding, dilation = (cast(list[int], v) for v in values[4:7])
    transposed, out_pad = cast(bool, values[7]), cast(list[int], values[8])
    groups, mask = cast(int, values[9]), cast(list[bool], values[10])
    if transposed:
        try:
            tplan = make_transposed_plan(
                x, weight.shape, stride, padding, dilation, out_pad, groups
            )
        except Unsupported as exc:
            reason = f"transposed convolution: {exc}"
            return replicated_fallback("conv", reason, op_call, args, kwargs, like=(x, weight))
        return transposed_backward.backward(tplan, grad_out, x, weight, bias_sizes, groups, mask)
    with torch.no_grad():
        try:
            layout, plan = layout_and_plan(x, weight, None, stride, padding, dilation, groups)
        except Unsupported as exc:
            return replicated_fallback("conv", str(exc), op_call, args, kwargs, like=(x, weight))
        mesh = plan.mesh
        g_placements = grad_output_placements(layout, plan.placements)
        g = grad_out.redistribute(mesh, g_placements).to_local()
        w = local_weight(layout, weight, x)
        groups = local_groups(layout, groups, x)
        xl = x.to_local()
        gi: torch.Tensor | None
        gw: torch.Tensor | None
        same_grads = same.same_conv_gradients(plan, layout, g, xl, w, groups, mask)
        if same_grads is not None:
            gi, gw, gb = same_grads
        elif overlaps_here(plan.spatial, xl, g, mask):
            gi, gw, gb = _overlapped_gradients(plan, layout, g, xl, w, bias_sizes, groups, mask)
        else:
            # peers may need this rank's rows even where it has nothing to compute
            window = gather_windows(plan.spatial, xl) if mask[1] else None
            args = (plan, g, xl, window, w, bias_sizes, groups, mask)
            gi, gw, gb = ranks.each_rank(mesh, _window_gradients, *args)
            gi = _home(plan, layout, gi, x.shape)
        grad_input = grad_weight = grad_bias = None
        if mask[0]:
            grad_input = as_dtensor(_wanted(gi), mesh, plan.placements, x.shape)
        if mask[1]:
            chunk = {"out": 0, "group": 0, "in": 1}.get(layout.kind)
            gw = _reduced(_wanted(gw), plan, layout, chunk, weight.shape)
            grad_weight = weight_gradient(layout, gw, weight, x)
        if mask[2]:
            chunk = {"out": 0, "group": 0}.get(layout.kind)
            gb = _reduced(_wanted(gb), plan, layout, chunk, cast(list[int], bias_sizes))
            grad_bias = bias_gradient(layout, gb, bias_sizes, weight, x)
        return grad_input, grad_weight, grad_bias


def _reduced(
    local: torch.Tensor,
    plan: ConvPlan,
    layout: ChannelLayout,
    chunk_dim: int | None,
    full_shape: Sequence[int],
) -> torch.Tensor:
    """A parameter gradient summed over the mesh dims that split the input (`summed`).

    Simulated ranks whose gradient is a chunk along `chunk_dim` on the channel mesh dim
    declare that layout, of the parameter's full shape: uneven chunks differ in size
    there, and a DTensor cannot take a per-rank global shape.
    """
    dims = plan.reduce_mesh_dims
    if chunk_dim is None or not dims or not ranks.simulated():
        return summed(local, plan.mesh, dims)
    target: list[Placement] = [Replicate()] * plan.mesh.ndim
    target[layout.mesh_dim] = Shard(chunk_dim)
    partial = [Partial() if m in dims else p for m, p in enumerate(target)]
    dt = as_dtensor(local, plan.mesh, partial, full_shape)
    return dt.redistribute(plan.mesh, target).to_local()


def _window_gradients(
    plan: ConvPlan,
    g: torch.Tensor,
    xl: torch.Tensor,
    window: torch.Tensor | None,
    w: torch.Tensor,
    bias_sizes: object,
    groups: int,
    mask: list[bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """This rank's gradients over its window (per-rank code); grad_input reads only the
    input's shape, so without `window` a zero-stride one stands in."""
    wshape = window_shape(plan.spatial, xl.shape)
    if 0 in wshape or g.numel() == 0:
        gi = xl.new_zeros(wshape) if mask[0] else None
        gw = w.new_zeros(w.shape) if mask[1] else None
        gb = g.sum([d for d in range(g.ndim) if d != 1]) if mask[2] else None
        return gi, gw, gb
    if window is None:
        window = xl.new_zeros(()).expand(wshape)
    return _local_backward(plan, g, window, w, bias_sizes, groups, mask)


def _local_backward(
    plan: ConvPlan,
    g: torch.Tensor,
    window: torch.Tensor,
    w: torch.Tensor,
    bias_sizes: object,
    groups: int,
    mask: list[bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    nspatial = len(plan.stride)
    # the local bias gradient has this rank's output channels, not the global bias's
    # (eager kernels ignore the sizes; traced ones shape the result by them)
    local_bias_sizes = [g.shape[1]] if bias_sizes is not None else None
    return aten.convolution_backward(
        g,
        window,
        w,
        local_bias_sizes,
        plan.stride,
        plan.local_padding,
        plan.dilation,
        False,
        [0] * nspatial,
        groups,
        mask,
    )


def _wanted(gradient: torch.Tensor | None) -> torch.Tensor:
    """A gradient its `output_mask` entry asked for: the kernels return one for those."""
    if gradient is None:
        raise RuntimeError("dt-conv: convolution_backward returned no gradient it was asked for")
    return gradient


def _home(
    plan: ConvPlan, layout: ChannelLayout, gi: torch.Tensor | None, in_shape: Sequence[int]
) -> torch.Tensor | None:
    """The window's input gradient summed into the rows this rank owns.

    In the output-channel layout every rank's filters contributed to it, so it is also
    summed over that mesh dim: on real ranks first (as `_overlapped_gradients` does, so
    all ranks issue their collectives in one order); simulated ranks sum the owned rows
    afterwards, as a DTensor of the input's global shape (per-rank window shapes differ
    there, and a DTensor cannot take a per-rank shape).
    """
    if gi is None:
        return None
    simulated = ranks.simulated()
    if layout.kind == "out" and not simulated:
        gi = summed(gi, plan.mesh, (layout.mesh_dim,))
    for split in reversed(plan.splits):
        gi = scatter_add_window(gi, split, plan.mesh)
    if layout.kind == "out" and simulated:
        partial = [Partial() if m == layout.mesh_dim else p for m, p in enumerate(plan.placements)]
        dt = as_dtensor(gi, plan.mesh, partial, in_shape)
        gi = dt.redistribute(plan.mesh, plan.placements).to_local()
    return gi


def _overlapped_gradients(
    plan: ConvPlan,
    layout: ChannelLayout,
    g: torch.Tensor,
    xl: torch.Tensor,
    w: torch.Tensor,
    bias_sizes: object,
    groups: int,
    mask: list[bool],
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Both gradients wanted: each exchange travels during a computation
    (`engine.overlap.backward`); on several sharded dims the weight gradient is computed
    by blocks of output rows."""

    def input_grad(shape_only: torch.Tensor) -> torch.Tensor:
        gi, _, _ = _local_backward(plan, g, shape_only, w, bias_sizes, groups, [True, False, False])
        if layout.kind == "out":  # every rank's filters contributed to the input gradient
            return summed(_wanted(gi), plan.mesh, (layout.mesh_dim,))
        return _wanted(gi)

    def weight_grads(window: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        _, gw, gb = _local_backward(plan, g, window, w, bias_sizes, groups, [False, True, mask[2]])
        return gw, gb

    rows = overlap_rows(plan) if len(plan.splits) > 1 else None
    if rows is None:
        gi, (gw, gb) = overlapped_gradients(plan.spatial, xl, input_grad, weight_grads)
        return gi, gw, gb

    def weight_block(piece: torch.Tensor, _starts: list[int], region: list[Range]) -> torch.Tensor:
        block = output_block(g, rows, region)
        _, gw, _ = _local_backward(plan, block, piece, w, None, groups, [False, True, False])
        return _wanted(gw)

    gi, gw = staged_gradients(plan.spatial, xl, rows, input_grad, weight_block)
    gb = g.sum([d for d in range(g.ndim) if d != 1]) if mask[2] else None
    return gi, gw, gb
