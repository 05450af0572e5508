"""Who sends which rows to whom in one halo exchange, from global metadata only.

Every rank derives all ranks' owned rows and windows from global shapes (`DimSplit`),
so each pair knows exactly which rows go where: a peer receives only the data rows its
window copies (thin shards whose halo spans several neighbours, reflected and wrapped
rows included), and fill rows travel nowhere. Torch-free, like `geometry`, and cached:
every exchange of a split reads the same plan.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..geometry import DimSplit

FILL, OWN = -1, -2  # segment sources besides "received buffer k"


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


@functools.lru_cache(maxsize=512)
def anyone_exchanges(split: DimSplit) -> bool:
    """Whether any rank of the split receives anything. All ranks agree (global
    metadata), so an exchange nobody needs issues no collective on any rank."""
    return any(exchange_plan(split, r).recvs for r in range(split.parts))


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
