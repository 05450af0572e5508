"""DTensor handler for `aten.convolution_backward.default`, the adjoint of `forward`.

grad_input: local input-gradient over the halo window, sent back to the row owners and
summed (reverse halo exchange). grad_weight / grad_bias: local contributions summed over
the mesh dims that split the input. Only gradients in `output_mask` are computed.
"""

from __future__ import annotations

from typing import cast

import torch
from dt_core.dtensors import as_dtensor
from dt_core.kit import bind_positional, replicated_fallback
from torch.distributed.tensor import DTensor

from .backward_overlap import overlapped_gradients
from .channels import (
    ChannelLayout,
    bias_gradient,
    channel_layout,
    grad_output_placements,
    local_groups,
    local_weight,
    weight_gradient,
)
from .halo import scatter_add_window
from .partial_sums import summed
from .plan import ConvPlan, make_plan
from .spatial import gather_windows, window_shape

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
        from . import transposed as tr

        tplan = tr.make_transposed_plan(x, weight.shape, stride, padding, dilation, out_pad, groups)
        if not isinstance(tplan, str):
            return tr.backward(tplan, grad_out, x, weight, bias_sizes, groups, mask)
        reason = f"transposed convolution: {tplan}"
        return replicated_fallback("conv", reason, op_call, args, kwargs, like=(x, weight))
    layout = channel_layout(x, weight, None, groups)
    plan = make_plan(x, weight.shape, stride, padding, dilation, transposed, layout.splits_input)
    with torch.no_grad():
        if isinstance(plan, str):
            return replicated_fallback("conv", plan, op_call, args, kwargs, like=(x, weight))
        mesh = plan.mesh
        g_placements = grad_output_placements(layout, plan.placements)
        g = grad_out.redistribute(mesh, g_placements).to_local()
        w = local_weight(layout, weight, x)
        groups = local_groups(layout, groups)
        xl = x.to_local()
        wshape = window_shape(plan.spatial, xl.shape)
        if 0 in wshape or g.numel() == 0:
            if mask[1]:  # nothing to compute here, but peers may need this rank's rows
                gather_windows(plan.spatial, xl)
            gi = xl.new_zeros(wshape) if mask[0] else None
            gw = w.new_zeros(w.shape) if mask[1] else None
            gb = g.sum([d for d in range(g.ndim) if d != 1]) if mask[2] else None
            gi = _home(plan, layout, gi)
        elif plan.splits and mask[0] and mask[1]:
            gi, gw, gb = _overlapped_gradients(plan, layout, g, xl, w, bias_sizes, groups, mask)
        else:
            if mask[1]:
                window = gather_windows(plan.spatial, xl)
            else:  # grad_input reads only the input's shape
                window = xl.new_zeros(()).expand(wshape)
            gi, gw, gb = _local_backward(plan, g, window, w, bias_sizes, groups, mask)
            gi = _home(plan, layout, gi)
        grad_input = grad_weight = grad_bias = None
        if mask[0]:
            grad_input = as_dtensor(_wanted(gi), mesh, plan.placements, x.shape)
        if mask[1]:
            gw = summed(_wanted(gw), mesh, plan.reduce_mesh_dims)
            grad_weight = weight_gradient(layout, gw, weight, x)
        if mask[2]:
            gb = summed(_wanted(gb), mesh, plan.reduce_mesh_dims)
            grad_bias = bias_gradient(layout, gb, bias_sizes, weight, x)
        return grad_input, grad_weight, grad_bias


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


def _home(plan: ConvPlan, layout: ChannelLayout, gi: torch.Tensor | None) -> torch.Tensor | None:
    """The window's input gradient summed into the rows this rank owns."""
    if gi is None:
        return None
    if layout.kind == "out":  # every rank's filters contributed to the input gradient
        gi = summed(gi, plan.mesh, (layout.mesh_dim,))
    for split in reversed(plan.splits):
        gi = scatter_add_window(gi, split, plan.mesh)
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
    """Both gradients wanted: each exchange travels during a computation (`backward_overlap`)."""

    def input_grad(shape_only: torch.Tensor) -> torch.Tensor:
        gi, _, _ = _local_backward(plan, g, shape_only, w, bias_sizes, groups, [True, False, False])
        if layout.kind == "out":  # every rank's filters contributed to the input gradient
            return summed(_wanted(gi), plan.mesh, (layout.mesh_dim,))
        return _wanted(gi)

    def weight_grads(window: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        _, gw, gb = _local_backward(plan, g, window, w, bias_sizes, groups, [False, True, mask[2]])
        return gw, gb

    gi, (gw, gb) = overlapped_gradients(plan.spatial, xl, input_grad, weight_grads)
    return gi, gw, gb
