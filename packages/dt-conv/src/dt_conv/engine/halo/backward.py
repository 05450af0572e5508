"""The adjoint of the halo exchange: window gradients sent home and summed per row.

`PendingScatter` sums the own rows and starts the all-to-all, `finish()` adds what the
peers sent, so a caller computes in between (overlap); `scatter_add_window` is the plain
adjoint of `forward.gather_window`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh

from ... import ranks
from ..geometry import DimSplit
from .exchange import AllToAll, packed_sends, received_rows, resized
from .plan import FILL, OWN, anyone_exchanges, exchange_plan


class PendingScatter:
    """Window gradients on their way home (`scatter_add_window` split in two halves).

    The own rows are summed and the exchange started at construction; `finish()` waits
    and adds what the peers sent. A caller computes something else in between (overlap).
    """

    def __init__(self, grad_window: torch.Tensor, split: DimSplit, mesh: DeviceMesh) -> None:
        self.split, self.mesh = split, mesh
        self.me = ranks.local_rank(mesh, split.mesh_dim)
        self.pending: AllToAll | None = None
        if anyone_exchanges(split):
            packed = ranks.each_rank(mesh, _scatter_pack, split, self.me, grad_window)
            self.out: torch.Tensor = packed[0]
            self.pending = AllToAll(mesh, split, packed[1:])
        else:
            self.out = ranks.each_rank(mesh, _own_rows, split, self.me, grad_window)

    @classmethod
    def around(
        cls,
        own: torch.Tensor,
        edges: tuple[torch.Tensor | None, torch.Tensor | None],
        above: int,
        split: DimSplit,
        mesh: DeviceMesh,
    ) -> PendingScatter:
        """The scatter of the window gradient `cat([edges[0], own, edges[1]])` without
        building it, on a real rank whose window is `framed(split, me, above)`: `own` is
        its own rows' gradient (peers' rows are added into it in place), `edges` the
        gradients of the `above` rows before and of the rows after (None where those are
        all padding). The same exchange as from the whole window gradient."""
        self = cls.__new__(cls)
        self.split, self.mesh, self.out, self.pending = split, mesh, own, None
        self.me = ranks.local_rank(mesh, split.mesh_dim)
        ranks.mode_level("a scatter of halo rows")
        if anyone_exchanges(split):
            packed = _edges_pack(split, self.me, own, edges, above)
            self.pending = AllToAll(mesh, split, packed)
        return self

    def finish(self) -> torch.Tensor:
        """This rank's rows of the gradient, everyone's contributions summed."""
        if self.pending is None:
            return self.out
        received = self.pending.wait()
        return ranks.each_rank(self.mesh, _add_received, self.split, self.me, self.out, received)


def _sum_segments(
    split: DimSplit, me: int, grad_window: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Rank `me`'s window gradient summed per source row: (own rows, rows per peer)."""
    plan, dim = exchange_plan(split, me), split.dim
    mine = split.owned_in(me)
    out = grad_window.new_zeros(resized(grad_window, dim, mine[1] - mine[0]))
    back = [grad_window.new_zeros(resized(grad_window, dim, n)) for _, n in plan.recvs]
    offset = 0
    for seg in plan.segments:
        part = grad_window.narrow(dim, offset, seg.length)
        offset += seg.length
        if seg.source == FILL:
            continue
        target = out if seg.source == OWN else back[seg.source]
        first, length = seg.rows()
        target.narrow(dim, first, length).add_(part.flip(dim) if seg.step < 0 else part)
    return out, back


def _edges_pack(
    split: DimSplit,
    me: int,
    own: torch.Tensor,
    edges: tuple[torch.Tensor | None, torch.Tensor | None],
    above: int,
) -> tuple[Any, ...]:
    """`_scatter_pack`'s rows for their owners, from a `framed` window's halo gradients."""
    plan, dim = exchange_plan(split, me), split.dim
    below_start = above + own.shape[dim]
    back = [own.new_zeros(resized(own, dim, n)) for _, n in plan.recvs]
    offset = 0
    for seg in plan.segments:
        if seg.source not in (FILL, OWN):
            edge = edges[0] if offset < above else edges[1]
            if edge is None:
                raise RuntimeError("dt-conv: a halo row's gradient was not computed")
            part = edge.narrow(dim, offset if offset < above else offset - below_start, seg.length)
            first, length = seg.rows()
            back[seg.source].narrow(dim, first, length).add_(
                part.flip(dim) if seg.step < 0 else part
            )
        offset += seg.length
    pieces = {r: b for (r, _), b in zip(plan.recvs, back, strict=True)}
    counts = {r: len(rows) for r, rows in plan.sends}
    return packed_sends(own, split.dim, split.parts, pieces, counts)


def _own_rows(split: DimSplit, me: int, grad_window: torch.Tensor) -> torch.Tensor:
    return _sum_segments(split, me, grad_window)[0]


def _scatter_pack(split: DimSplit, me: int, grad_window: torch.Tensor) -> tuple[Any, ...]:
    """(rank `me`'s own rows summed, then the `packed_sends` rows for their owners)."""
    plan = exchange_plan(split, me)
    out, back = _sum_segments(split, me, grad_window)
    pieces = {r: b for (r, _), b in zip(plan.recvs, back, strict=True)}
    counts = {r: len(rows) for r, rows in plan.sends}
    return (out, *packed_sends(grad_window, split.dim, split.parts, pieces, counts))


def _add_received(split: DimSplit, me: int, out: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    plan, dim = exchange_plan(split, me), split.dim
    counts = {r: len(rows) for r, rows in plan.sends}
    received = received_rows(flat, dim, [counts.get(r, 0) for r in range(split.parts)])
    for r, rows in plan.sends:
        out.index_add_(dim, torch.tensor(rows, device=out.device), received[r])
    return out


def scatter_add_window(
    grad_window: torch.Tensor, split: DimSplit, mesh: DeviceMesh
) -> torch.Tensor:
    """Adjoint of `gather_window`: send window gradients home and sum them per owned row."""
    return PendingScatter(grad_window, split, mesh).finish()
