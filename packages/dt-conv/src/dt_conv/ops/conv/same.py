"""The common 'same' conv on one sharded dim, split at the seams in both directions.

For a stride-1 conv whose output rows are its input rows (padding `p`, reach `2p+1`),
the seams are all that differ from a local conv, so neither direction builds a window:

- forward: the local shard convolves in place (zero padding at the seams) while the
  halos travel; then only the `p` rows next to each seam are recomputed from a 3p-row
  window;
- backward: the general path (`engine.overlap.backward`) computes the input gradient
  over a whole window (a zero window stands in for its shape), sums its own rows out of
  it and assembles the input window for the weight gradient: three copies of the
  activation per conv, as large as the conv itself on a CPU. Here both gradients split
  at the seams instead:
  - input gradient: the conv padded by `p` gives its own rows' gradient from its own
    output rows; the `p` halo rows' gradients come from the `p` output rows next to each
    seam (a 3p-row conv), travel home and are added into the neighbours' edge rows;
  - weight gradient: bilinear in (window, output gradient), so the padded conv of the
    own rows (halo rows read as zeros) plus the halo rows' part (the `p` output rows
    next to each seam over a 3p-row window that is zero but for the halo).

The exchanges are the general path's, in its order (the input halo, then in backward
the gradient rows home), so ranks may take either path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ... import ranks
from ...engine.geometry import Affine
from ...engine.halo.backward import PendingScatter
from ...engine.halo.forward import PendingWindow
from ...engine.halo.plan import framed
from .channels import ChannelLayout
from .plan import ConvPlan, local_conv

aten = torch.ops.aten

Gradients = tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None"]


def same_conv_overlapped(
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


def same_conv_gradients(
    plan: ConvPlan,
    layout: ChannelLayout,
    g: torch.Tensor,
    xl: torch.Tensor,
    w: torch.Tensor,
    groups: int,
    mask: Sequence[bool],
) -> Gradients | None:
    """(input gradient rows, weight gradient, bias gradient or None) of this real rank;
    None if the conv is not a 'same' conv on one sharded dim with both gradients wanted,
    or this rank's shard is thinner than `2p` rows."""
    if ranks.simulated() or layout.kind != "none" or len(plan.splits) != 1:
        return None
    split = plan.splits[0]
    reach = split.reach
    if not (mask[0] and mask[1]) or not isinstance(reach, Affine) or reach.stride != 1:
        return None
    p = -reach.offset
    if split.out_size != split.size or p < 1 or reach.extent != 2 * p + 1:
        return None
    rank = plan.spatial.local_rank(split)
    o0, o1 = split.owned_out(rank)
    n, dim = o1 - o0, split.dim
    if n < 2 * p or 0 in xl.shape or g.numel() == 0 or not framed(split, rank, p):
        return None

    padded = list(plan.local_padding)
    padded[dim - 2] = p

    def grads(grad: torch.Tensor, x: torch.Tensor, pad: list[int], which: int) -> torch.Tensor:
        wanted = [which == 0, which == 1, False]
        out_pad = [0] * len(plan.stride)
        args = (plan.stride, pad, plan.dilation, False, out_pad, groups, wanted)
        return aten.convolution_backward(grad, x, w, None, *args)[which]

    def rows(t: torch.Tensor, start: int, length: int) -> torch.Tensor:
        return t.narrow(dim, start, length)

    def zeros(length: int) -> torch.Tensor:
        shape = list(xl.shape)
        shape[dim] = length
        return xl.new_zeros(shape)

    has_above, has_below = o0 > 0, o1 < split.size
    input_halo = PendingWindow(xl, split, plan.mesh, 0.0)
    grad_input = grads(g, xl, padded, 0)
    edges = (
        rows(grads(rows(g, 0, p), zeros(3 * p), plan.local_padding, 0), 0, p)
        if has_above
        else None,
        rows(grads(rows(g, n - p, p), zeros(3 * p), plan.local_padding, 0), 2 * p, p)
        if has_below
        else None,
    )
    going_home = PendingScatter.around(grad_input, edges, p, split, plan.mesh)
    grad_weight = grads(g, xl, padded, 1)
    input_halo.wait()
    if has_above:
        piece = torch.cat([input_halo.rows(0, p), zeros(2 * p)], dim)
        grad_weight = grad_weight + grads(rows(g, 0, p), piece, plan.local_padding, 1)
    if has_below:
        piece = torch.cat([zeros(2 * p), input_halo.rows(n + p, n + 2 * p)], dim)
        grad_weight = grad_weight + grads(rows(g, n - p, p), piece, plan.local_padding, 1)
    grad_bias = g.sum([d for d in range(g.ndim) if d != 1]) if mask[2] else None
    return going_home.finish(), grad_weight, grad_bias
