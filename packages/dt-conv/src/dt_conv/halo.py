"""Halo exchange along one mesh dim, and its adjoint for gradients.

Every rank derives all ranks' owned rows and windows from global shapes (`DimSplit`),
so each pair knows exactly which rows go where: a peer receives only the data rows its
window copies (thin shards whose halo spans several neighbours, reflected and wrapped
rows included), and fill rows travel nowhere. Uses the mesh dim's own process group.

Each exchange is one all-to-all (torch's functional collectives, through
`dt_core.compat.tracing`) with zero rows to and from non-neighbours: the same two ops,
start and wait, run eagerly and in a torch.compile graph, so a caller computing between
them overlaps the exchange in both.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from dt_core.compat import tracing
from dt_core.compat.process_groups import is_fake_group
from dt_core.dtensors import as_dtensor
from dt_core.kit import Counters
from dt_core.tracing import is_tracing, simulates_ranks
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from . import ranks
from .geometry import DimSplit

FILL, OWN = -1, -2  # segment sources besides "received buffer k"

# `bytes_sent`: bytes this process has sent in halo exchanges (both directions of
# autograd); the demo reads it, `dt-plugins stats` shows it.
counters = Counters("conv")


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
    sends: list[tuple[int, tuple[int, ...]]] = []
    recvs: list[tuple[int, int]] = []
    where: dict[int, tuple[int, int]] = {}
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


def _count(t: torch.Tensor) -> None:
    # a compiled graph sends at run time, not while traced; simulated ranks send nothing
    if not is_tracing(t) and not ranks.simulated():
        counters.add("bytes_sent", t.numel() * t.element_size())


@functools.lru_cache(maxsize=512)
def anyone_exchanges(split: DimSplit) -> bool:
    """Whether any rank of the split receives anything. All ranks agree (global
    metadata), so an exchange nobody needs issues no collective on any rank."""
    return any(exchange_plan(split, r).recvs for r in range(split.parts))


# Per-rank halves of an exchange. They read the rank `me` as a plain int, so under
# LocalTensorMode they run once per simulated rank (`ranks.each_rank`); the all-to-all
# between them runs at the mode's level. Each returns a flat tuple (tensors and ints),
# which the mode combines element by element.


def _packed(
    like: torch.Tensor, dim: int, parts: int, pieces: dict[int, Any], recvs: dict[int, int]
) -> tuple[Any, ...]:
    send_rows = [pieces[r].shape[dim] if r in pieces else 0 for r in range(parts)]
    recv_rows = [recvs.get(r, 0) for r in range(parts)]
    if pieces:
        source = torch.cat([pieces[r].movedim(dim, 0) for r in sorted(pieces)])
    else:
        source = like.movedim(dim, 0).narrow(0, 0, 0)
    if not is_tracing(source):
        return (source.contiguous(), *send_rows, *recv_rows)
    # Traced, each exchange sends from a buffer of its own (`torch.empty`, which graph CSE
    # never merges), filled from `like` even when empty and, in a backward handler, from
    # the gradient: two exchanges whose sends are equal on one rank (both empty, say) must
    # stay two collectives on every rank, and a send must depend on what its rank's
    # graph computes it from, or a partitioner moves it between forward and backward on
    # one rank only (see `traced_exchanges`).
    anchor = _GRADIENT.get()
    if anchor is not None:
        source = source + anchor.narrow(0, 0, 0).sum().to(source.dtype)
    send = torch.empty(source.shape, dtype=like.dtype, device=like.device)
    send.copy_(source)
    return (send, *send_rows, *recv_rows)


def _received(out: torch.Tensor | None, dim: int, recv_rows: list[int]) -> dict[int, torch.Tensor]:
    """Peer -> the rows it sent (laid out like the input), from the all-to-all's result."""
    received: dict[int, torch.Tensor] = {}
    offset = 0
    if out is None:
        return received
    for r, n in enumerate(recv_rows):
        if n:
            received[r] = out.narrow(0, offset, n).movedim(0, dim)
        offset += n
    return received


class _AllToAll:
    """One started all-to-all along a split's tensor dim: `packed` is a `_packed` tuple
    (per-rank values under LocalTensorMode); `wait()` gives the flat result, which
    per-rank code splits with `_received`.

    On torch's fake backend outside LocalTensorMode (a dry run: one process, its peers
    exist only in name) nothing is exchanged: the halos absent peers would send are zeros.
    The fake backend rejects an all-to-all that receives rows but sends none (a window
    reaching one way, as a valid or strided conv's), which torch alone never issues."""

    def __init__(self, mesh: DeviceMesh, split: DimSplit, packed: tuple[Any, ...]) -> None:
        ranks.mode_level("a halo exchange")
        send, sizes = packed[0], list(packed[1:])
        _count(send)
        send_rows, recv_rows = sizes[: split.parts], sizes[split.parts :]
        group = mesh.get_group(split.mesh_dim)
        self.absent = is_fake_group(group) and not simulates_ranks(send)
        if self.absent:
            self.started = send.new_zeros((sum(recv_rows), *send.shape[1:]))
        else:
            self.started = tracing.start_all_to_all(send, recv_rows, send_rows, group)

    def wait(self) -> torch.Tensor:
        out: torch.Tensor = self.started if self.absent else tracing.wait(self.started)
        kept = _RECEIVED.get()
        if kept is not None and out.shape[0] == 0 and is_tracing(out):
            kept.append(out)  # a rank that receives nothing never uses the result
        return out


# What this handler's traced exchanges received, and the gradient a backward handler was
# given (`traced_exchanges`); None outside a handler.
_RECEIVED: ContextVar[list[torch.Tensor] | None] = ContextVar("dt_conv_received", default=None)
_GRADIENT: ContextVar[torch.Tensor | None] = ContextVar("dt_conv_gradient", default=None)


@contextlib.contextmanager
def traced_exchanges(gradient: torch.Tensor | None) -> Iterator[list[torch.Tensor]]:
    """Keep a traced handler's exchanges where every rank puts them (the SPMD graphs torch's
    partitioner assumes); yields what they received, for `tie_to`.

    With uneven shards the ranks trace different graphs, and torch 2.14's partitioner
    moves or copies collectives by data dependence, rank by rank: an exchange that brings
    a rank nothing has an unused result there, and a dead collective whose inputs are
    available in the backward graph is copied into it; an exchange in a backward handler
    whose send does not depend on the gradient (input halos for the weight gradient) may
    move into the forward graph on one rank and not on another. Then the ranks'
    collectives stop matching and deadlock. So every empty received tensor (the others
    are used: a rank receives only rows it reads) is tied to the handler's output, and
    in a backward handler (`gradient`: its incoming gradient, local) every send depends
    on the gradient.
    """
    kept: list[torch.Tensor] = []
    tokens = (_RECEIVED.set(kept), _GRADIENT.set(gradient))
    try:
        yield kept
    finally:
        _GRADIENT.reset(tokens[1])
        _RECEIVED.reset(tokens[0])


def tie_to(result: Any, received: list[torch.Tensor]) -> Any:
    """`result` (a handler's DTensor output, or a tuple of them) with its first floating
    output made to depend on every tensor in `received`, adding an exact zero (a sum over
    no elements)."""
    if isinstance(result, tuple | list):
        items = list(result)
        for i, item in enumerate(items):
            if isinstance(item, DTensor) and item.dtype.is_floating_point:
                items[i] = tie_to(item, received)
                return type(result)(items)
        return result
    if not isinstance(result, DTensor) or not result.dtype.is_floating_point:
        return result
    local = result.to_local()
    zero = sum((r.narrow(0, 0, 0).sum() for r in received), local.new_zeros(()))
    return as_dtensor(local + zero, result.device_mesh, result.placements, result.shape)


def _piece(seg: Segment, source: torch.Tensor, dim: int) -> torch.Tensor:
    first, length = seg.rows()
    piece = source.narrow(dim, first, length)
    return piece.flip(dim) if seg.step < 0 and length > 1 else piece


def _window_pack(split: DimSplit, me: int, local: torch.Tensor) -> tuple[Any, ...]:
    """Rank `me`'s rows for each peer's window."""
    plan = exchange_plan(split, me)
    pieces = {r: _select(local, split.dim, rows) for r, rows in plan.sends}
    return _packed(local, split.dim, split.parts, pieces, dict(plan.recvs))


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
    received = _received(out, dim, [dict(plan.recvs).get(r, 0) for r in range(split.parts)])
    buffers = [received[r] for r, _ in plan.recvs]
    pieces, offset = [], 0
    for seg in plan.segments:
        lo, hi = max(start, offset), min(stop, offset + seg.length)
        if lo < hi:
            if seg.source == FILL:
                pieces.append(local.new_full(_resized(local, dim, hi - lo), fill_value))
            else:
                source = local if seg.source == OWN else buffers[seg.source]
                pieces.append(_piece(seg, source, dim).narrow(dim, lo - offset, hi - lo))
        offset += seg.length
    if len(pieces) == 1:
        return pieces[0]
    if not pieces:
        return local.new_empty(_resized(local, dim, 0))
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
        self.pending: _AllToAll | None = None
        if anyone_exchanges(split):
            packed = ranks.each_rank(mesh, _window_pack, split, self.me, local)
            self.pending = _AllToAll(mesh, split, packed)

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


class PendingScatter:
    """Window gradients on their way home (`scatter_add_window` split in two halves).

    The own rows are summed and the exchange started at construction; `finish()` waits
    and adds what the peers sent. A caller computes something else in between (overlap).
    """

    def __init__(self, grad_window: torch.Tensor, split: DimSplit, mesh: DeviceMesh) -> None:
        self.split, self.mesh = split, mesh
        self.me = ranks.local_rank(mesh, split.mesh_dim)
        self.pending: _AllToAll | None = None
        if anyone_exchanges(split):
            packed = ranks.each_rank(mesh, _scatter_pack, split, self.me, grad_window)
            self.out: torch.Tensor = packed[0]
            self.pending = _AllToAll(mesh, split, packed[1:])
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
            self.pending = _AllToAll(mesh, split, packed)
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
    return out, back


def framed(split: DimSplit, me: int, above: int) -> bool:
    """Whether rank `me`'s window along `split` is `above` rows of halo or padding, its own
    rows in order, then halo or padding again (no own row repeated in the halo, as
    reflected or wrapped padding would): the layout `PendingScatter.around` takes."""
    lo, hi = split.owned_in(me)
    offset = 0
    for seg in exchange_plan(split, me).segments:
        if seg.source == OWN:
            if (offset, seg.start, seg.length, seg.step) != (above, 0, hi - lo, 1):
                return False
        elif offset < above + hi - lo and offset + seg.length > above:
            return False  # a halo or padding row among the own ones
        offset += seg.length
    return True


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
    back = [own.new_zeros(_resized(own, dim, n)) for _, n in plan.recvs]
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
    return _packed(own, split.dim, split.parts, pieces, counts)


def _own_rows(split: DimSplit, me: int, grad_window: torch.Tensor) -> torch.Tensor:
    return _sum_segments(split, me, grad_window)[0]


def _scatter_pack(split: DimSplit, me: int, grad_window: torch.Tensor) -> tuple[Any, ...]:
    """(rank `me`'s own rows summed, then the `_packed` rows for their owners)."""
    plan = exchange_plan(split, me)
    out, back = _sum_segments(split, me, grad_window)
    pieces = {r: b for (r, _), b in zip(plan.recvs, back, strict=True)}
    counts = {r: len(rows) for r, rows in plan.sends}
    return (out, *_packed(grad_window, split.dim, split.parts, pieces, counts))


def _add_received(split: DimSplit, me: int, out: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    plan, dim = exchange_plan(split, me), split.dim
    counts = {r: len(rows) for r, rows in plan.sends}
    received = _received(flat, dim, [counts.get(r, 0) for r in range(split.parts)])
    for r, rows in plan.sends:
        out.index_add_(dim, torch.tensor(rows, device=out.device), received[r])
    return out


def scatter_add_window(
    grad_window: torch.Tensor, split: DimSplit, mesh: DeviceMesh
) -> torch.Tensor:
    """Adjoint of `gather_window`: send window gradients home and sum them per owned row."""
    return PendingScatter(grad_window, split, mesh).finish()
