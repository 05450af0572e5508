"""Point-to-point halo exchange along one mesh dim, and its adjoint for gradients.

Every rank derives all ranks' owned and needed windows from global shapes (`DimSplit`),
so each pair knows exactly which rows go where; thin shards whose halo spans several
neighbours need no special case. Uses the mesh dim's own process group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from .geometry import DimSplit, Range, intersect


def _rows(t: torch.Tensor, dim: int, rows: Range, origin: int) -> torch.Tensor:
    return t.narrow(dim, rows[0] - origin, rows[1] - rows[0])


def _resized(t: torch.Tensor, dim: int, length: int) -> list[int]:
    shape = list(t.shape)
    shape[dim] = length
    return shape


def _run(ops: list[dist.P2POp]) -> None:
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()


def _peers(mesh: DeviceMesh, split: DimSplit) -> tuple[dist.ProcessGroup, int, list[int]]:
    group = mesh.get_group(split.mesh_dim)
    me = mesh.get_local_rank(split.mesh_dim)
    ranks = [dist.get_global_rank(group, r) for r in range(split.parts)]
    return group, me, ranks


def gather_window(local: torch.Tensor, split: DimSplit, mesh: DeviceMesh) -> torch.Tensor:
    """This rank's needed input window along `split.dim`, zero-padded at global edges."""
    group, me, ranks = _peers(mesh, split)
    dim, mine, want = split.dim, split.owned_in(me), split.needed_data(me)
    ops: list[dist.P2POp] = []
    pieces: dict[int, torch.Tensor] = {}
    for r in range(split.parts):
        if r == me:
            continue
        give = intersect(mine, split.needed_data(r))
        if give[1] > give[0]:
            chunk = _rows(local, dim, give, mine[0]).contiguous()
            ops.append(dist.P2POp(dist.isend, chunk, ranks[r], group))
        take = intersect(split.owned_in(r), want)
        if take[1] > take[0]:
            pieces[r] = local.new_empty(_resized(local, dim, take[1] - take[0]))
            ops.append(dist.P2POp(dist.irecv, pieces[r], ranks[r], group))
    own = intersect(mine, want)
    if own[1] > own[0]:
        pieces[me] = _rows(local, dim, own, mine[0])
    _run(ops)
    window = split.needed(me)
    if window[1] <= window[0]:
        return local.new_zeros(_resized(local, dim, 0))
    parts = [pieces[r] for r in sorted(pieces)]
    if want[0] > window[0]:
        parts.insert(0, local.new_zeros(_resized(local, dim, want[0] - window[0])))
    if window[1] > want[1]:
        parts.append(local.new_zeros(_resized(local, dim, window[1] - want[1])))
    return torch.cat(parts, dim=dim)


def scatter_add_window(
    grad_window: torch.Tensor, split: DimSplit, mesh: DeviceMesh
) -> torch.Tensor:
    """Adjoint of `gather_window`: send window gradients home and sum them per owned row."""
    group, me, ranks = _peers(mesh, split)
    dim, mine, window = split.dim, split.owned_in(me), split.needed(me)
    out = grad_window.new_zeros(_resized(grad_window, dim, mine[1] - mine[0]))
    ops: list[dist.P2POp] = []
    received: list[tuple[Range, torch.Tensor]] = []
    for r in range(split.parts):
        give = intersect(split.owned_in(r), split.needed_data(me))
        if give[1] > give[0]:
            part = _rows(grad_window, dim, give, window[0])
            if r == me:
                _rows(out, dim, give, mine[0]).add_(part)
            else:
                ops.append(dist.P2POp(dist.isend, part.contiguous(), ranks[r], group))
        take = intersect(mine, split.needed_data(r))
        if r != me and take[1] > take[0]:
            buf = grad_window.new_empty(_resized(grad_window, dim, take[1] - take[0]))
            received.append((take, buf))
            ops.append(dist.P2POp(dist.irecv, buf, ranks[r], group))
    _run(ops)
    for rows, buf in received:
        _rows(out, dim, rows, mine[0]).add_(buf)
    return out
