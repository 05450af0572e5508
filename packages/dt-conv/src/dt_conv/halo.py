"""Point-to-point halo exchange along one mesh dim, and its adjoint for gradients.

Every rank derives all ranks' owned rows and windows from global shapes (`DimSplit`),
so each pair knows exactly which rows go where: a peer receives only the data rows its
window copies (thin shards whose halo spans several neighbours, reflected and wrapped
rows included), and fill rows travel nowhere. Uses the mesh dim's own process group.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from .geometry import DimSplit

FILL, OWN = -1, -2  # segment sources besides "received buffer k"

# Bytes this process has sent in halo exchanges (both directions of autograd); the demo
# and benchmarks read it to report traffic.
traffic = {"bytes_sent": 0}


@dataclass(frozen=True)
class Segment:
    """Consecutive window rows copying rows start, start+step, ... of one source."""

    source: int  # FILL, OWN, or the index of a received buffer
    start: int
    length: int
    step: int  # +1, or -1 for reflected rows

    def rows(self) -> tuple[int, int]:
        """The source rows as a forward range (start, length) for `narrow`."""
        first = self.start if self.step > 0 else self.start - self.length + 1
        return first, self.length


@dataclass(frozen=True)
class Exchange:
    """What one rank sends, receives and assembles for one split."""

    sends: tuple[tuple[int, tuple[int, ...]], ...]  # (peer, my rows relative to my start)
    recvs: tuple[tuple[int, int], ...]  # (peer, number of rows)
    segments: tuple[Segment, ...]
    window_rows: int


def _rows_from(split: DimSplit, reader: int, owner: int) -> list[int]:
    lo, hi = split.owned_in(owner)
    return sorted({s for s in split.sources(reader) if s is not None and lo <= s < hi})


@functools.lru_cache(maxsize=512)
def exchange_plan(split: DimSplit, me: int) -> Exchange:
    mine = split.owned_in(me)
    sends, recvs, where = [], [], {}
    for r in range(split.parts):
        if r == me:
            continue
        give = _rows_from(split, r, me)
        if give:
            sends.append((r, tuple(g - mine[0] for g in give)))
        take = _rows_from(split, me, r)
        if take:
            where.update({row: (len(recvs), j) for j, row in enumerate(take)})
            recvs.append((r, len(take)))
    located = []
    for s in split.sources(me):
        if s is None:
            located.append((FILL, 0))
        elif mine[0] <= s < mine[1]:
            located.append((OWN, s - mine[0]))
        else:
            located.append(where[s])
    segments: list[Segment] = []
    for source, pos in located:
        if segments:
            last = segments[-1]
            step = last.step if last.length > 1 else (pos - last.start) or 1
            if (
                last.source == source
                and abs(step) == 1
                and (source == FILL or pos == last.start + step * last.length)
            ):
                segments[-1] = Segment(source, last.start, last.length + 1, step)
                continue
        segments.append(Segment(source, pos, 1, 1))
    return Exchange(tuple(sends), tuple(recvs), tuple(segments), len(located))


def _resized(t: torch.Tensor, dim: int, length: int) -> list[int]:
    shape = list(t.shape)
    shape[dim] = length
    return shape


def _select(t: torch.Tensor, dim: int, rows: tuple[int, ...]) -> torch.Tensor:
    if rows == tuple(range(rows[0], rows[0] + len(rows))):
        return t.narrow(dim, rows[0], len(rows)).contiguous()
    return t.index_select(dim, torch.tensor(rows, device=t.device))


def _count(ops: list[dist.P2POp]) -> None:
    for op in ops:
        if op.op is dist.isend:
            traffic["bytes_sent"] += op.tensor.numel() * op.tensor.element_size()


def _run(ops: list[dist.P2POp]) -> None:
    _count(ops)
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()


def _peers(mesh: DeviceMesh, split: DimSplit) -> tuple[dist.ProcessGroup, int, list[int]]:
    group = mesh.get_group(split.mesh_dim)
    me = mesh.get_local_rank(split.mesh_dim)
    ranks = [dist.get_global_rank(group, r) for r in range(split.parts)]
    return group, me, ranks


def _piece(seg: Segment, source: torch.Tensor, dim: int) -> torch.Tensor:
    first, length = seg.rows()
    piece = source.narrow(dim, first, length)
    return piece.flip(dim) if seg.step < 0 and length > 1 else piece


class PendingWindow:
    """A halo exchange in flight; `rows(a, b)` assembles part of the window after `wait()`.

    Lets a caller compute on its own rows while the halos travel (overlap), then build
    only the few window rows it still needs.
    """

    def __init__(
        self, local: torch.Tensor, split: DimSplit, mesh: DeviceMesh, fill_value: float
    ) -> None:
        group, me, ranks = _peers(mesh, split)
        self.plan, self.dim, self.local, self.fill_value = (
            exchange_plan(split, me),
            split.dim,
            local,
            fill_value,
        )
        ops = [
            dist.P2POp(dist.isend, _select(local, self.dim, rows), ranks[r], group)
            for r, rows in self.plan.sends
        ]
        self.buffers = [local.new_empty(_resized(local, self.dim, n)) for _, n in self.plan.recvs]
        ops += [
            dist.P2POp(dist.irecv, b, ranks[r], group)
            for (r, _), b in zip(self.plan.recvs, self.buffers, strict=True)
        ]
        _count(ops)
        self.requests = dist.batch_isend_irecv(ops) if ops else []

    def wait(self) -> PendingWindow:
        for req in self.requests:
            req.wait()
        self.requests = []
        return self

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Window rows [start, stop) (window-relative), filled and assembled."""
        pieces, offset, dim = [], 0, self.dim
        for seg in self.plan.segments:
            lo, hi = max(start, offset), min(stop, offset + seg.length)
            if lo < hi:
                if seg.source == FILL:
                    shape = _resized(self.local, dim, hi - lo)
                    pieces.append(self.local.new_full(shape, self.fill_value))
                else:
                    source = self.local if seg.source == OWN else self.buffers[seg.source]
                    piece = _piece(seg, source, dim)
                    pieces.append(piece.narrow(dim, lo - offset, hi - lo))
            offset += seg.length
        if len(pieces) == 1:
            return pieces[0]
        if not pieces:
            return self.local.new_empty(_resized(self.local, dim, 0))
        return torch.cat(pieces, dim=dim)

    def full(self) -> torch.Tensor:
        return self.rows(0, self.plan.window_rows)


def gather_window(
    local: torch.Tensor, split: DimSplit, mesh: DeviceMesh, fill_value: float = 0.0
) -> torch.Tensor:
    """This rank's window along `split.dim`: halo rows from peers, padding filled."""
    return PendingWindow(local, split, mesh, fill_value).wait().full()


class PendingScatter:
    """Window gradients on their way home (`scatter_add_window` split in two halves).

    The own rows are summed and the sends posted at construction; `finish()` waits and
    adds what the peers sent. A caller computes something else in between (overlap).
    """

    def __init__(self, grad_window: torch.Tensor, split: DimSplit, mesh: DeviceMesh) -> None:
        group, me, ranks = _peers(mesh, split)
        plan, dim = exchange_plan(split, me), split.dim
        mine = split.owned_in(me)
        out = grad_window.new_zeros(_resized(grad_window, dim, mine[1] - mine[0]))
        back = [grad_window.new_zeros(_resized(grad_window, dim, n)) for _, n in plan.recvs]
        offset = 0
        for seg in plan.segments:
            part = grad_window.narrow(dim, offset, seg.length)
            offset += seg.length
            if seg.source == FILL:
                continue
            target = out if seg.source == OWN else back[seg.source]
            first, length = seg.rows()
            target.narrow(dim, first, length).add_(part.flip(dim) if seg.step < 0 else part)
        ops = [
            dist.P2POp(dist.isend, b, ranks[r], group)
            for (r, _), b in zip(plan.recvs, back, strict=True)
        ]
        self.received = [
            grad_window.new_empty(_resized(grad_window, dim, len(rows))) for _, rows in plan.sends
        ]
        ops += [
            dist.P2POp(dist.irecv, buf, ranks[r], group)
            for (r, _), buf in zip(plan.sends, self.received, strict=True)
        ]
        _count(ops)
        self.requests = dist.batch_isend_irecv(ops) if ops else []
        self.out, self.dim, self.sends = out, dim, plan.sends
        self.sending = back  # isend buffers must outlive the requests

    def finish(self) -> torch.Tensor:
        """This rank's rows of the gradient, everyone's contributions summed."""
        for req in self.requests:
            req.wait()
        for (_, rows), buf in zip(self.sends, self.received, strict=True):
            self.out.index_add_(self.dim, torch.tensor(rows, device=self.out.device), buf)
        return self.out


def scatter_add_window(
    grad_window: torch.Tensor, split: DimSplit, mesh: DeviceMesh
) -> torch.Tensor:
    """Adjoint of `gather_window`: send window gradients home and sum them per owned row."""
    return PendingScatter(grad_window, split, mesh).finish()
