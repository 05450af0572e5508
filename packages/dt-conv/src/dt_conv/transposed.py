"""Transposed convolution on spatially sharded inputs: forward and backward by halo.

Output rows are owned by the chunk rule like every other op here. A rank gathers the
input rows whose taps land on its output rows (`geometry.Transposed`), runs the local
transposed conv with padding 0 along sharded dims, and keeps its owned rows; the bias is
added after the crop. On real ranks the output rows reading only own input rows are
computed while the halos travel, the rest after (`interior`), as for plain convs.
Backward puts the owned output gradient back into the local output's frame and calls
`convolution_backward` on the window: input gradients go home through the adjoint
exchange, weight and bias gradients are summed over the mesh dims that split the input
(each output row is owned by exactly one rank).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, cast

import torch
from dt_core.dtensors import as_dtensor
from dt_core.kit import Unsupported, replicated, reshard_like
from torch.distributed.tensor import DTensor, Replicate

from . import ranks
from .backward_overlap import overlapped_gradients, overlaps_here, staged_gradients
from .geometry import DimSplit, Range, Transposed, expand
from .halo import scatter_add_window
from .interior import Rows, exchange_order, output_block, overlapped_forward, rows_of
from .partial_sums import summed
from .plan import SpatialPlan, Splitter, plan_spatial
from .spatial import gather_windows, window_shape

aten = torch.ops.aten


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


def _local_out_shape(
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


def _owned_shape(plan: TransposedPlan, window: torch.Tensor) -> list[int]:
    shape = [window.shape[0], plan.spatial.out_shape[1], *plan.spatial.out_shape[2:]]
    for split in plan.spatial.splits:
        shape[split.dim] = plan.crop(split)[1]
    return shape


def forward(
    plan: TransposedPlan,
    x: DTensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    groups: int,
) -> DTensor:
    plan = plan.with_splits(exchange_order(plan.spatial.splits, _interior))
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
    read travel (`interior.overlapped_forward`).

    Output row `o` sums the taps of input rows `ceil((o+p-span)/s) .. floor((o+p)/s)`;
    it is interior if those that exist are this rank's own. None where this rank has
    no block to compute early (an empty shard, or one too thin for any interior): it
    then exchanges first, which issues the same exchanges in the same order, so every
    rank may decide alone.
    """
    sp = plan.spatial
    rows = _rows(plan, local)
    if rows is None:
        return None
    shape = _owned_shape(plan, local)
    block = functools.partial(_output_rows, plan, w, b, groups)
    return overlapped_forward(sp, local, rows, shape, block)


def _rows(plan: TransposedPlan, local: torch.Tensor) -> list[Rows] | None:
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
        rows.append(rows_of(split, rank, _interior(split, rank)))
    return rows


def _interior(split: DimSplit, chunk: int) -> Range:
    """Output rows of `chunk` whose existing input rows are all its own."""
    reach = cast(Transposed, split.reach)
    s, p, span = reach.stride, reach.padding, reach.span
    i0, i1 = split.owned_in(chunk)
    o0, o1 = split.owned_out(chunk)
    first = o0 if i0 == 0 else (i0 - 1) * s - p + span + 1  # reads nothing above i0
    last = o1 if i1 == split.size else i1 * s - p  # reads nothing from i1 on
    return (first, last) if i1 > i0 else (o0, o0)


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
    shape = _owned_shape(plan, piece)
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
    shape = _owned_shape(plan, window)
    if window.numel() == 0 or 0 in shape:
        out = window.new_zeros(shape)
    else:
        out = _crop(plan, aten.convolution(window, w, None, *plan.local_conv_args(groups)))
    if b is not None:
        out = out + b.reshape(1, -1, *([1] * (out.ndim - 2)))
    return out.contiguous()


def backward(
    plan: TransposedPlan,
    grad_out: DTensor,
    x: DTensor,
    weight: torch.Tensor,
    bias_sizes: object,
    groups: int,
    mask: Sequence[bool],
) -> tuple[DTensor | None, torch.Tensor | None, DTensor | None]:
    plan = plan.with_splits(exchange_order(plan.spatial.splits, _interior))  # as forward
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
        rows = _rows(plan, xl) if overlaps and len(sp.splits) > 1 else None
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
    """The weight gradient of output rows `region` (`_output_rows`' adjoint for the
    weight): their gradient placed in the frame of the piece's local transposed conv,
    zero elsewhere (rows it does not reach have no tap, nothing to add)."""
    full = g.new_zeros(_local_out_shape(plan, piece, w, groups))
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
    full = _uncrop(plan, g, _local_out_shape(plan, window, w, groups))
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
        full = _uncrop(plan, g, _local_out_shape(plan, window, w, groups))
        wanted = [mask[0], mask[1], False]
        gi, gw, _ = aten.convolution_backward(
            full, window, w, None, *plan.local_conv_args(groups), wanted
        )
    gb = _bias_gradient(g) if mask[2] else None
    gi = (gi if gi is not None else window.new_zeros(window.shape)) if mask[0] else None
    gw = (gw if gw is not None else w.new_zeros(w.shape)) if mask[1] else None
    return gi, gw, gb
