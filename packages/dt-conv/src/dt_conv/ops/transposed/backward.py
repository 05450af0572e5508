"""Transposed convolution on spatially sharded inputs, backward: the adjoint of `forward`.

Backward puts the owned output gradient back into the local output's frame and calls
`convolution_backward` on the window: input gradients go home through the adjoint
exchange, weight and bias gradients are summed over the mesh dims that split the input
(each output row is owned by exactly one rank). Both gradients wanted on a real rank,
each exchange travels during a computation (`engine.overlap.backward`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from dt_core.dtensors import as_dtensor
from dt_core.kit import replicated, reshard_like
from torch.distributed.tensor import DTensor, Replicate

from ... import ranks
from ...engine.geometry import Range
from ...engine.halo.backward import scatter_add_window
from ...engine.overlap.backward import overlapped_gradients, overlaps_here, staged_gradients
from ...engine.overlap.forward import Rows, output_block
from ...engine.partial_sums import summed
from ...engine.windows import gather_windows, window_shape
from .plan import TransposedPlan, in_exchange_order, local_out_shape, overlap_rows

aten = torch.ops.aten


def backward(
    plan: TransposedPlan,
    grad_out: DTensor,
    x: DTensor,
    weight: torch.Tensor,
    bias_sizes: object,
    groups: int,
    mask: Sequence[bool],
) -> tuple[DTensor | None, torch.Tensor | None, DTensor | None]:
    plan = in_exchange_order(plan)  # as forward
    sp = plan.spatial
    mesh = sp.mesh
    g = grad_out.redistribute(mesh, sp.placements).to_local()
    w = replicated(weight)
    with torch.no_grad():
        xl = x.to_local()
        gi: Any
        gw: Any
        gb: Any  # each a tensor where `mask` asks for it
        overlaps = overlaps_here(sp, xl, g, mask)  # a real rank: its own rows are known
        rows = overlap_rows(plan, xl) if overlaps and len(sp.splits) > 1 else None
        if rows is not None:
            block = functools.partial(_weight_rows, plan, g, rows, w, groups)
            input_grad = functools.partial(_local_gradient, plan, g, w=w, groups=groups, which=0)
            gi, gw = staged_gradients(sp, xl, rows, input_grad, block)
            gb = _bias_gradient(g) if mask[2] else None
        elif overlaps:
            gi, gw = overlapped_gradients(
                sp,
                xl,
                lambda window: _local_gradient(plan, g, window, w, groups, 0),
                lambda window: _local_gradient(plan, g, window, w, groups, 1),
            )
            gb = _bias_gradient(g) if mask[2] else None
        else:
            window = gather_windows(sp, xl) if mask[1] else None
            args = (plan, g, xl, window, w, groups, mask)
            gi, gw, gb = ranks.each_rank(mesh, _window_gradients, *args)
            if mask[0]:
                for split in reversed(sp.splits):
                    gi = scatter_add_window(gi, split, mesh)
        grad_input = grad_weight = grad_bias = None
        if mask[0]:
            grad_input = as_dtensor(gi, mesh, sp.placements, x.shape)
        if mask[1]:
            grad_weight = reshard_like(summed(gw, mesh, plan.reduce_mesh_dims), mesh, weight)
        if mask[2]:
            full_b = summed(gb, mesh, plan.reduce_mesh_dims)
            grad_bias = as_dtensor(full_b, mesh, [Replicate()] * mesh.ndim, full_b.shape)
    return grad_input, grad_weight, grad_bias


def _weight_rows(
    plan: TransposedPlan,
    g: torch.Tensor,
    rows: Sequence[Rows],
    w: torch.Tensor,
    groups: int,
    piece: torch.Tensor,
    starts: list[int],
    region: list[Range],
) -> torch.Tensor:
    """The weight gradient of output rows `region` (`forward._output_rows`' adjoint for the
    weight): their gradient placed in the frame of the piece's local transposed conv,
    zero elsewhere (rows it does not reach have no tap, nothing to add)."""
    full = g.new_zeros(local_out_shape(plan, piece, w, groups))
    target, grad = full, output_block(g, rows, region)
    for split, start, (a, c) in zip(plan.spatial.splits, starts, region, strict=True):
        y0 = start * plan.stride[split.dim - 2] - plan.padding[split.dim - 2]
        lo, hi = max(a, y0), min(c, y0 + full.shape[split.dim])
        if hi <= lo or 0 in piece.shape:
            return w.new_zeros(w.shape)
        target = target.narrow(split.dim, lo - y0, hi - lo)
        grad = grad.narrow(split.dim, lo - a, hi - lo)
    target.copy_(grad)
    wanted = [False, True, False]
    return aten.convolution_backward(full, piece, w, None, *plan.local_conv_args(groups), wanted)[1]


def _bias_gradient(g: torch.Tensor) -> torch.Tensor:
    dims = [d for d in range(g.ndim) if d != 1]
    return g.sum(dims) if g.numel() else g.new_zeros(g.shape[1])


def _local_gradient(
    plan: TransposedPlan,
    g: torch.Tensor,
    window: torch.Tensor,
    w: torch.Tensor,
    groups: int,
    which: int,
) -> torch.Tensor:
    """The input (0) or weight (1) gradient of this rank's transposed conv of `window`;
    the input gradient reads only the window's shape."""
    full = _uncrop(plan, g, local_out_shape(plan, window, w, groups))
    wanted = [which == 0, which == 1, False]
    grads = aten.convolution_backward(full, window, w, None, *plan.local_conv_args(groups), wanted)
    return grads[which]


def _window_gradients(
    plan: TransposedPlan,
    g: torch.Tensor,
    xl: torch.Tensor,
    window: torch.Tensor | None,
    w: torch.Tensor,
    groups: int,
    mask: Sequence[bool],
) -> tuple[Any, Any, Any]:
    """This rank's (window input gradient, weight gradient, bias gradient), each a tensor
    where `mask` asks for it, else None (per-rank code). grad_input reads only the
    input's shape, so without `window` a zero one stands in."""
    if window is None:
        window = xl.new_zeros(window_shape(plan.spatial, xl.shape))
    gi = gw = None
    if window.numel() and g.numel() and (mask[0] or mask[1]):
        full = _uncrop(plan, g, local_out_shape(plan, window, w, groups))
        wanted = [mask[0], mask[1], False]
        gi, gw, _ = aten.convolution_backward(
            full, window, w, None, *plan.local_conv_args(groups), wanted
        )
    gb = _bias_gradient(g) if mask[2] else None
    gi = (gi if gi is not None else window.new_zeros(window.shape)) if mask[0] else None
    gw = (gw if gw is not None else w.new_zeros(w.shape)) if mask[1] else None
    return gi, gw, gb


def _uncrop(plan: TransposedPlan, grad: torch.Tensor, local_shape: Sequence[int]):
    """Adjoint of `_crop`: owned-row gradients placed in the local output's frame."""
    full = grad.new_zeros(local_shape)
    target = full
    for split in plan.spatial.splits:
        first, count = plan.crop(split)
        target = target.narrow(split.dim, first, max(0, min(count, local_shape[split.dim] - first)))
        grad = grad.narrow(split.dim, 0, target.shape[split.dim])
    target.copy_(grad)
    return full
