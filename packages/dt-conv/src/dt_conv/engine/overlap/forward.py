"""A forward conv computed while its halos travel: the interior first, the frame by stages.

Several sharded dims exchange one after another, each exchange carrying the windows of
the dims before it (corners included). Output rows split into blocks by what they read:

- stage 0, while dim 0's halos travel: rows interior on every dim (own input rows only);
- stage t, while dim t's halos travel: the slabs along dim t-1 outside its interior,
  owned rows on the dims before, interior rows on the dims after (they read the window
  of dims < t, which has arrived, and own rows of dims >= t);
- after the last wait: the slabs along the last dim outside its interior, from only the
  window rows they read.

The blocks tile the owned output exactly once. A dim whose interior is empty (a shard
thinner than the kernel's reach) only empties the blocks that need its interior, so a
rank thin along the first dim still computes during the later exchanges.

Plain and transposed convs share this; they differ in which rows are interior and in how
a block is computed from the input rows it reads (`BlockFn`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..geometry import DimSplit, Range
from ..halo.forward import PendingWindow
from ..halo.plan import anyone_exchanges
from ..plan import SpatialPlan

# (piece of input, global first input row of the piece per sharded dim, output rows
# per sharded dim) -> the output block of those rows
BlockFn = Callable[[torch.Tensor, list[int], list[Range]], torch.Tensor]


@dataclass(frozen=True)
class Rows:
    """One sharded dim of a conv, from this rank's point of view."""

    split: DimSplit
    owned: Range  # output rows this rank owns
    interior: Range  # those reading only this rank's input rows; may be empty
    own: Range  # input rows this rank holds
    window_start: int  # first (virtual) input row of its window

    @property
    def dim(self) -> int:
        return self.split.dim

    def reads(self, start: int, stop: int) -> Range:
        """Input rows (virtual) that output rows [start, stop) read."""
        return self.split.reach(start, stop)

    def sides(self) -> list[Range]:
        """The owned rows outside the interior: before it, after it (non-empty ones)."""
        (o0, o1), (a, b) = self.owned, self.interior
        return [s for s in ((o0, a), (b, o1)) if s[1] > s[0]]


def rows_of(split: DimSplit, rank: int, interior: Range) -> Rows:
    """`Rows` of `split` for chunk `rank`; `interior` is clamped into the owned rows (an
    empty one sits at its clamped start, so the two sides still tile the owned rows)."""
    o0, o1 = split.owned_out(rank)
    a = min(max(interior[0], o0), o1)
    b = min(max(interior[1], a), o1)
    return Rows(split, (o0, o1), (a, b), split.owned_in(rank), split.needed(rank)[0])


InteriorFn = Callable[[DimSplit, int], Range]  # (split, chunk) -> its interior rows


@functools.lru_cache(maxsize=512)
def _thin_chunks(split: DimSplit, interior: InteriorFn) -> int:
    """How many chunks own output rows but no interior ones along `split`."""
    thin = 0
    for chunk in range(split.parts):
        (o0, o1), (a, b) = split.owned_out(chunk), interior(split, chunk)
        thin += o1 > o0 and min(b, o1) <= max(a, o0)
    return thin


def exchange_order(splits: Sequence[DimSplit], interior: InteriorFn) -> tuple[DimSplit, ...]:
    """The splits in the order their halos are best exchanged for overlap: dims where
    more chunks have no interior first (ties keep the mesh order).

    A dim without interior empties the blocks computed during its own exchange and the
    ones before it, so thin dims go first. Read off global metadata (every chunk), so
    every rank picks the same order, as its exchanges must; the window a rank assembles
    is the same in any order.
    """
    return tuple(sorted(splits, key=lambda s: _thin_chunks(s, interior), reverse=True))


def _filled(r: Range) -> bool:
    return r[1] > r[0]


def overlapped_stages(rows: Sequence[Rows]) -> list[int]:
    """The exchanges (by dim index) during which this rank computes a block.

    Read off this rank's rows only, so ranks may differ: a rank where this is empty has
    nothing to compute before its last halo arrives and exchanges first, which issues
    the same exchanges in the same order as the overlapped path.
    """
    stages = []
    if all(_filled(r.interior) for r in rows):
        stages.append(0)
    for t in range(1, len(rows)):
        if rows[t - 1].sides() and all(_filled(r.interior) for r in rows[t:]):
            stages.append(t)
    return stages


def staged_regions(rows: Sequence[Rows]) -> list[tuple[int, list[Range]]]:
    """The blocks of `overlapped_forward` as (input exchanges they wait for, output rows
    per dim), empty ones left out: they tile this rank's owned output exactly once.

    A block waiting for `t` exchanges reads the window of dims < t and own rows of the
    others; one waiting for all of them reads only the window rows next to the last
    dim's sides.
    """
    last = len(rows) - 1
    regions = [(0, [r.interior for r in rows])]
    for t in range(1, last + 1):
        done, after = [r.owned for r in rows[: t - 1]], [r.interior for r in rows[t:]]
        regions += [(t, [*done, side, *after]) for side in rows[t - 1].sides()]
    regions += [(last + 1, [*(r.owned for r in rows[:last]), s]) for s in rows[last].sides()]
    return [(t, region) for t, region in regions if all(map(_filled, region))]


def input_piece(
    source: torch.Tensor, rows: Sequence[Rows], region: Sequence[Range], windowed: int
) -> tuple[torch.Tensor, list[int]]:
    """The input rows `region` reads, from `source` (windows on the first `windowed` dims,
    own rows on the others, clipped to them), and the global row each piece starts at."""
    starts = []
    for k, (r, (start, stop)) in enumerate(zip(rows, region, strict=True)):
        lo, hi = r.reads(start, stop)
        if k < windowed:
            base = r.window_start
        else:  # own rows: those outside add nothing to the region's rows
            base = r.own[0]
            lo = min(max(lo, r.own[0]), r.own[1])
            hi = min(max(hi, lo), r.own[1])
        source = source.narrow(r.dim, lo - base, hi - lo)
        starts.append(lo)
    return source, starts


def output_block(out: torch.Tensor, rows: Sequence[Rows], region: Sequence[Range]) -> torch.Tensor:
    """The part of this rank's output block holding output rows `region` (one per dim)."""
    for r, (start, stop) in zip(rows, region, strict=True):
        out = out.narrow(r.dim, start - r.owned[0], stop - start)
    return out


def overlapped_forward(
    plan: SpatialPlan,
    local: torch.Tensor,
    rows: Sequence[Rows],
    out_shape: Sequence[int],
    block: BlockFn,
) -> torch.Tensor | None:
    """This rank's output block (shape `out_shape`), each exchange overlapped with the
    blocks it does not feed; None if no block can be computed before the last wait, or
    no halo travels at all (then the plain local op is all there is)."""
    stages = overlapped_stages(rows)
    if not stages or not any(anyone_exchanges(r.split) for r in rows):
        return None
    out: list[torch.Tensor] = []  # allocated by the first block computed

    def put(region: list[Range], value: torch.Tensor) -> None:
        if not out:
            out.append(value.new_empty(out_shape))
        output_block(out[0], rows, region).copy_(value)

    def compute(source: torch.Tensor, region: list[Range], windowed: int) -> None:
        put(region, block(*input_piece(source, rows, region, windowed), region))

    last = len(rows) - 1
    pending = PendingWindow(local, rows[0].split, plan.mesh, 0.0)
    if 0 in stages:
        compute(local, [r.interior for r in rows], 0)
    for t in range(1, last + 1):  # later dims exchange the earlier dims' windows
        source = pending.wait().full()
        pending = PendingWindow(source, rows[t].split, plan.mesh, 0.0)
        if t in stages:
            done = [r.owned for r in rows[: t - 1]]
            after = [r.interior for r in rows[t:]]
            for side in rows[t - 1].sides():
                compute(source, [*done, side, *after], t)
    pending.wait()
    r = rows[last]
    for side in r.sides():  # assemble only the window rows the last slabs read
        lo, hi = r.reads(*side)
        piece = pending.rows(lo - r.window_start, hi - r.window_start)
        region = [q.owned for q in rows[:last]] + [side]
        trimmed, starts = input_piece(piece, rows[:last], region[:last], last)
        put(region, block(trimmed, [*starts, lo], region))
    return out[0]  # `stages` is not empty: some block was computed
