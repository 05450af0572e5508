"""The halo exchange along one mesh dim: a rank's window, its own rows and its peers'.

`PendingWindow` starts the all-to-all and assembles window rows after the wait, so a
caller computes on its own rows while the halos travel (overlap); `gather_window` is
the plain exchange.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh

from ... import ranks
from ..geometry import DimSplit
from .exchange import AllToAll, packed_sends, received_rows, resized, select_rows
from .plan import FILL, OWN, Segment, anyone_exchanges, exchange_plan


def _piece(seg: Segment, source: torch.Tensor, dim: int) -> torch.Tensor:
    first, length = seg.rows()
    piece = source.narrow(dim, first, length)
    return piece.flip(dim) if seg.step < 0 and length > 1 else piece


def _window_pack(split: DimSplit, me: int, local: torch.Tensor) -> tuple[Any, ...]:
    """Rank `me`'s rows for each peer's window."""
    plan = exchange_plan(split, me)
    pieces = {r: select_rows(local, split.dim, rows) for r, rows in plan.sends}
    return packed_sends(local, split.dim, split.parts, pieces, dict(plan.recvs))


def _assemble(
    split: DimSplit,
    me: int,
    local: torch.Tensor,
    out: torch.Tensor | None,
    fill_value: float,
    start: int,
    stop: int | None,
) -> torch.Tensor:
    """Window rows [start, stop) (window-relative; None: to the end) of rank `me`,
    filled and assembled from its own rows and what the all-to-all brought."""
    plan, dim = exchange_plan(split, me), split.dim
    stop = plan.window_rows if stop is None else stop
    received = received_rows(out, dim, [dict(plan.recvs).get(r, 0) for r in range(split.parts)])
    buffers = [received[r] for r, _ in plan.recvs]
    pieces, offset = [], 0
    for seg in plan.segments:
        lo, hi = max(start, offset), min(stop, offset + seg.length)
        if lo < hi:
            if seg.source == FILL:
                pieces.append(local.new_full(resized(local, dim, hi - lo), fill_value))
            else:
                source = local if seg.source == OWN else buffers[seg.source]
                pieces.append(_piece(seg, source, dim).narrow(dim, lo - offset, hi - lo))
        offset += seg.length
    if len(pieces) == 1:
        return pieces[0]
    if not pieces:
        return local.new_empty(resized(local, dim, 0))
    return torch.cat(pieces, dim=dim)


class PendingWindow:
    """A halo exchange in flight; `rows(a, b)` assembles part of the window after `wait()`.

    Lets a caller compute on its own rows while the halos travel (overlap), then build
    only the few window rows it still needs.
    """

    def __init__(
        self, local: torch.Tensor, split: DimSplit, mesh: DeviceMesh, fill_value: float
    ) -> None:
        self.split, self.mesh, self.local, self.fill_value = split, mesh, local, fill_value
        self.me = ranks.local_rank(mesh, split.mesh_dim)
        self.received: torch.Tensor | None = None
        self.pending: AllToAll | None = None
        if anyone_exchanges(split):
            packed = ranks.each_rank(mesh, _window_pack, split, self.me, local)
            self.pending = AllToAll(mesh, split, packed)

    def wait(self) -> PendingWindow:
        if self.pending is not None:
            self.received = self.pending.wait()
            self.pending = None
        return self

    def rows(self, start: int, stop: int | None) -> torch.Tensor:
        """Window rows [start, stop) (window-relative; None: to the end), filled and
        assembled."""
        args = (self.split, self.me, self.local, self.received, self.fill_value, start, stop)
        return ranks.each_rank(self.mesh, _assemble, *args)

    def full(self) -> torch.Tensor:
        return self.rows(0, None)


def gather_window(
    local: torch.Tensor, split: DimSplit, mesh: DeviceMesh, fill_value: float = 0.0
) -> torch.Tensor:
    """This rank's window along `split.dim`: halo rows from peers, padding filled."""
    return PendingWindow(local, split, mesh, fill_value).wait().full()
