"""The two exact context-parallel algorithms on local shards: all-gather and ring.

Both take this rank's queries and its key/value shard (sequence on dim 2) and return
the exact attention of the local queries over the whole sequence, plus the gradients.

all-gather: every rank's K/V block comes whole, all at once; the rank attends to its own
block while they arrive, then to each; backward sends each block's dK/dV share straight
home while the next is computed (a point-to-point reduce-scatter). Holds the whole K/V on
every rank while it runs. Traced (torch.compile), it is one gather (`dt_cp::all_gather_seq`)
and one reduce-scatter (`dt_cp::reduce_scatter_seq`) around the same block computation.
ring: the same exchange in small chunks, a few in flight (merged by log-sum-exp as they
come): a rank holds its own block and a few chunks, never a foreign block whole.

Which of them runs is the plan's decision (`plan.choose_path`); `executors.py` maps it to
the functions here, so nothing in this module decides again.
"""

from __future__ import annotations

import collections
import functools
from typing import NamedTuple

import torch
import torch.distributed as dist
from dt_core.compat.process_groups import is_fake_group

from . import blocks
from .blocks import (
    KV,
    Accumulator,
    AttentionSpec,
    Grads,
    Saved,
    block_backward,
    block_forward,
    gathered_backward,
    gathered_forward,
    piece_starts,
)
from .comm import RingStep, group_of
from .layout import Range, Shards


def _gather(shards: Shards, kv: KV) -> KV:
    sizes = shards.kv_layout.sizes()
    return KV(*(torch.ops.dt_cp.all_gather_seq(t.contiguous(), 2, sizes, shards.group) for t in kv))


# --- all-gather, as one traceable computation -------------------------------------------


def traced_forward(
    spec: AttentionSpec, shards: Shards, q: torch.Tensor, kv: KV
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All-gather under torch.compile: functional collectives (`dt_cp::all_gather_seq`)."""
    return gathered_forward(spec, shards, q, _gather(shards, kv))


def traced_backward(spec: AttentionSpec, shards: Shards, saved: Saved, kv: KV) -> Grads:
    """Gather again, and reduce-scatter the dK/dV shares (`dt_cp::reduce_scatter_seq`)."""
    dq, dk_all, dv_all = gathered_backward(spec, shards, saved, _gather(shards, kv))
    sizes = shards.kv_layout.sizes()
    dk, dv = (
        torch.ops.dt_cp.reduce_scatter_seq(t, 2, sizes, shards.group) for t in (dk_all, dv_all)
    )
    return Grads(dq, dk, dv)


# --- blocks exchanged point to point: the ring, and the all-gather run eagerly -----------
#
# Both run one schedule: a rank attends to its own block while the others' blocks arrive
# straight from their owners, then to each arrived block in turn; backward sends each
# block's dK/dV share straight home while the next one is computed. They differ in
# granularity only: the ring moves blocks in small chunks, a few in flight (O(S/P) of K/V
# per rank), the all-gather moves whole blocks, all in flight at once (the whole K/V per
# rank, as a gather would hold, and kernels as large as the layout allows).

# Rows of K/V per ring message. Blocks travel in chunks of at most this many rows, so a
# rank holds its own block plus a few chunks, whatever the sequence length.
RING_CHUNK_ROWS = 512
# Ring chunks in flight ahead of the one being computed. Two absorb the step-to-step
# differences in work between partners (lockstep stalls) for one extra chunk of memory.
RING_PREFETCH_CHUNKS = 2
# Whether the ring's backward computes its own block while exchanges are in flight. Its
# messages are small, so there is little transfer time to hide, while holding them during
# the own block's largest kernel calls sets the peak (2 MB of 31 at S=8k, P=2): off, the
# own block runs first with nothing posted, and the last dK/dV share is settled before
# returning. The all-gather always overlaps (whole blocks travel: that is its point).
RING_OWN_BLOCK_OVERLAP = False


class Schedule(NamedTuple):
    """How the other ranks' blocks travel (in how many chunks each, how many in flight),
    the longest kernel call on the own block (`piece_rows`) and on a received chunk
    (`chunk_piece_rows`; None: `blocks.MAX_RANGE_ROWS`), and whether the own block's
    backward overlaps the exchanges (`own_overlap`)."""

    chunks: int
    ahead: int
    piece_rows: int | None = None
    chunk_piece_rows: int | None = None
    own_overlap: bool = True

    @classmethod
    def ring(cls, shards: Shards) -> Schedule:
        """Chunks of at most `RING_CHUNK_ROWS` (the same count on every rank)."""
        longest = max(shards.kv_layout.sizes())
        chunks = max(1, -(-longest // RING_CHUNK_ROWS))
        rows = blocks.RING_RANGE_ROWS, blocks.RING_CHUNK_RANGE_ROWS
        return cls(chunks, RING_PREFETCH_CHUNKS, *rows, RING_OWN_BLOCK_OVERLAP)

    @classmethod
    def allgather(cls, shards: Shards) -> Schedule:
        """Whole blocks, every one in flight from the start; the gathered path's kernels."""
        rows = blocks.GATHERED_RANGE_ROWS
        return cls(1, max(1, shards.parts - 1), rows, rows)


class _Item(NamedTuple):
    """One exchange: at `step`, chunk `chunk` (rows [lo, hi)) of `source`'s block comes
    in, while chunk `sent` of this rank's block goes out to rank + step."""

    step: int
    source: int
    chunk: int
    lo: int
    hi: int
    sent: int


def _chunk_bounds(n: int, chunks: int) -> list[int]:
    return [n * i // chunks for i in range(chunks + 1)]


def _slice_ranges(ranges: list[Range], lo: int, hi: int) -> list[Range]:
    """Global ranges of local rows [lo, hi) of a block laid out as `ranges`."""
    out, offset = [], 0
    for start, n in ranges:
        a, b = max(lo, offset), min(hi, offset + n)
        if a < b:
            out.append((start + a - offset, b - a))
        offset += n
    return out


def _causal_pairs(q_ranges: list[Range], k_ranges: list[Range]) -> int:
    """(query, key) pairs with key position <= query position, over two range lists."""
    total = 0
    for q0, qn in q_ranges:
        for k0, kn in k_ranges:
            # For query i: keys k0..min(i, k0+kn-1) are visible.
            lo, hi = q0, q0 + qn - 1  # query positions
            full_from = k0 + kn - 1  # queries >= this see the whole key range
            part_hi = min(hi, full_from - 1)
            if part_hi >= max(lo, k0):  # queries seeing part of the range
                a = max(lo, k0)
                total += (part_hi - a + 1) * (a - k0 + 1 + part_hi - k0 + 1) // 2
            if hi >= full_from:
                total += (hi - max(lo, full_from) + 1) * kn
    return total


@functools.lru_cache(maxsize=256)
def _chunk_order(
    shards: Shards, receiver: int, source: int, causal: bool, chunks: int
) -> tuple[int, ...]:
    """The order `receiver` gets `source`'s chunks in, spreading its work evenly over steps.

    Chunks are exchanged in lockstep, so a rank whose work comes in a burst (e.g.
    head-tail: every early chunk fully visible, every late one hidden) stalls its
    partner, then idles while the partner catches up. Greedy: each next chunk keeps the
    running work closest to its even share. Sender and receiver compute the same order
    from global layouts, so the exchange still pairs up.
    """
    if not causal or chunks == 1:
        return tuple(range(chunks))
    bounds = _chunk_bounds(shards.kv_layout.sizes()[source], chunks)
    q_ranges = shards.q_layout.ranges(receiver)
    kv = shards.kv_layout.ranges(source)
    work = [
        _causal_pairs(q_ranges, _slice_ranges(kv, bounds[c], bounds[c + 1])) for c in range(chunks)
    ]
    mean = sum(work) / chunks
    order, done, left = [], 0, list(range(chunks))
    for i in range(chunks):
        best = min(left, key=lambda c: (abs(done + work[c] - (i + 1) * mean), c))
        left.remove(best)
        order.append(best)
        done += work[best]
    return tuple(order)


def _items(shards: Shards, causal: bool, chunks: int) -> list[_Item]:
    """Every exchange, in order.

    At step s a rank receives the block of rank - s straight from its owner (and sends
    its own block to rank + s), chunk by chunk, so nothing is relayed. Chunks go in each
    receiver's balanced order.
    """
    sizes = shards.kv_layout.sizes()
    items = []
    for step in range(1, shards.parts):
        source = (shards.rank - step) % shards.parts
        target = (shards.rank + step) % shards.parts
        bounds = _chunk_bounds(sizes[source], chunks)
        receive = _chunk_order(shards, shards.rank, source, causal, chunks)
        send = _chunk_order(shards, target, shards.rank, causal, chunks)
        for c, sent in zip(receive, send, strict=True):
            items.append(_Item(step, source, c, bounds[c], bounds[c + 1], sent))
    return items


def _item_ranges(shards: Shards, item: _Item) -> list[Range]:
    return _slice_ranges(shards.kv_layout.ranges(item.source), item.lo, item.hi)


def _buffers(like: KV, n: int, zeros: bool = False) -> list[torch.Tensor]:
    """Receive buffers for `n` rows of K/V (or of their gradients); `zeros`: zero-filled
    (for a fake group, whose peers never write them)."""
    new = torch.zeros if zeros else torch.empty
    return [
        new(t.shape[0], t.shape[1], n, t.shape[3], dtype=t.dtype, device=t.device) for t in like
    ]


def _peers_absent(shards: Shards) -> bool:
    """Whether the sequence's group is torch's fake backend (a dry run in one process):
    nothing arrives from its peers, so their blocks and dK/dV shares are taken as zeros,
    not as uninitialized memory (NaN in the log-sum-exp merges). Asked once per call; a
    real group's buffers stay uninitialized, as every one of their rows is received."""
    return is_fake_group(shards.group)


class _Incoming:
    """Posts the exchanges of `items` `schedule.ahead` in advance; `next()` waits for one."""

    def __init__(
        self,
        pg: dist.ProcessGroup,
        kv: KV,
        items: list[_Item],
        schedule: Schedule,
        zeros: bool = False,
    ) -> None:
        self._pg, self._kv, self._items, self._zeros = pg, kv, items, zeros
        self._mine = _chunk_bounds(kv.k.shape[2], schedule.chunks)
        self._ahead = schedule.ahead
        self._posted: collections.deque[RingStep] = collections.deque()
        self._next = 0
        self._fill()

    def _post(self, item: _Item) -> RingStep:
        """Send this rank's chunk `item.sent` to rank + step; receive the item's chunk."""
        a, b = self._mine[item.sent], self._mine[item.sent + 1]
        recv = _buffers(self._kv, item.hi - item.lo, self._zeros)
        return RingStep(self._kv.rows(a, b), recv, self._pg, tag=1, shift=item.step, leading=2)

    def _fill(self) -> None:
        while self._next < len(self._items) and len(self._posted) < self._ahead:
            self._posted.append(self._post(self._items[self._next]))
            self._next += 1

    def next(self) -> KV:
        received = self._posted.popleft().wait()
        self._fill()
        return KV(*received)


def exchanged_forward(
    spec: AttentionSpec, shards: Shards, q: torch.Tensor, kv: KV, schedule: Schedule
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Own block first (while the others' arrive), then every other block as it comes."""
    acc = Accumulator(q, kv.v.shape[-1])
    q_ranges = shards.q_ranges()
    items = _items(shards, spec.causal, schedule.chunks)
    incoming = _Incoming(group_of(shards.group), kv, items, schedule, _peers_absent(shards))
    rows = schedule.piece_rows
    block_forward(spec, acc, q, q_ranges, kv, shards.kv_layout.ranges(shards.rank), rows)
    for item in items:
        ranges = _item_ranges(shards, item)
        block_forward(spec, acc, q, q_ranges, incoming.next(), ranges, schedule.chunk_piece_rows)
    return acc.result(q.dtype)


class _Returning:
    """dK/dV shares going home: each block's share leaves while the next is computed,
    and the other ranks' shares of this rank's chunks come in and are added to `own`."""

    def __init__(self, pg: dist.ProcessGroup, own: KV, chunks: int, zeros: bool = False) -> None:
        self._pg, self._own, self._zeros = pg, own, zeros
        self._mine = _chunk_bounds(own.k.shape[2], chunks)
        self._pending: tuple[RingStep, int, int] | None = None

    def send(self, share: KV, item: _Item) -> None:
        """My share of `item`'s chunk goes to its owner (rank - step); rank + step's share
        of the chunk I sent it comes in (every rank runs the same schedule)."""
        self.settle()
        a, b = self._mine[item.sent], self._mine[item.sent + 1]
        recv = _buffers(self._own, b - a, self._zeros)
        exchange = RingStep(share, recv, self._pg, tag=2, shift=-item.step, leading=2)
        self._pending = (exchange, a, b)

    def settle(self) -> None:
        if self._pending is not None:
            exchange, a, b = self._pending
            self._pending = None
            for total, part in zip(self._own, exchange.wait(), strict=True):
                total[:, :, a:b] += part


def exchanged_backward(
    spec: AttentionSpec, shards: Shards, saved: Saved, kv: KV, schedule: Schedule
) -> Grads:
    """K/V arrive again as in forward; each block's dK/dV share goes straight home.

    Per rank: dq, its own dK/dV (the results), the blocks or chunks in flight, and one
    share leaving and one arriving: no rank ever holds the whole dK/dV. Without
    `schedule.own_overlap`, nothing is in flight while the own block is computed.
    """
    pg = group_of(shards.group)
    absent = _peers_absent(shards)
    q_ranges = shards.q_ranges()
    items = _items(shards, spec.causal, schedule.chunks)
    dq = torch.zeros_like(saved.q)
    own = KV(torch.zeros_like(kv.k), torch.zeros_like(kv.v))
    own_ranges = shards.kv_layout.ranges(shards.rank)
    rows = schedule.piece_rows

    def own_rows(lo: int, hi: int) -> None:  # into `own` in place
        ranges = _slice_ranges(own_ranges, lo, hi)
        into = own.rows(lo, hi)
        block_backward(spec, dq, saved, q_ranges, kv.rows(lo, hi), ranges, into, rows)

    n = kv.k.shape[2]
    if schedule.own_overlap:
        incoming = _Incoming(pg, kv, items, schedule, absent)
        cut = _own_cut(spec, own_ranges, n, rows)
        own_rows(0, cut)  # while the other blocks arrive
    else:
        own_rows(0, n)  # before anything is posted
        incoming = _Incoming(pg, kv, items, schedule, absent)
        cut = n
    returning = _Returning(pg, own, schedule.chunks, absent)
    for item in items:
        ranges = _item_ranges(shards, item)
        chunk = incoming.next()
        share = block_backward(
            spec, dq, saved, q_ranges, chunk, ranges, rows=schedule.chunk_piece_rows
        )
        returning.send(share, item)
        del chunk, share  # the exchange keeps the share only until sent
    if cut < n:
        own_rows(cut, n)  # while the last share goes home
    returning.settle()
    return Grads(dq, *own)


# Share of a rank's own block whose backward runs last, while the last dK/dV share travels
# home (a whole block's in the all-gather at P=2); the rest runs first, while K/V arrive.
OWN_BLOCK_LAST = 0.5


def _own_cut(spec: AttentionSpec, ranges: list[Range], n: int, rows: int | None) -> int:
    """The local row splitting the own block's backward: on the kernel grid (the same
    kernel calls as uncut), as near `OWN_BLOCK_LAST` from the end as the grid allows."""
    target = n * (1 - OWN_BLOCK_LAST)
    return min([*piece_starts(spec, ranges, rows), n], key=lambda row: abs(row - target))


# --- the eager executors, one per path (`executors.EXECUTORS`) --------------------------


def ring_forward(
    spec: AttentionSpec, shards: Shards, q: torch.Tensor, kv: KV
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ring: other blocks in small chunks, a few in flight."""
    return exchanged_forward(spec, shards, q, kv, Schedule.ring(shards))


def ring_backward(spec: AttentionSpec, shards: Shards, saved: Saved, kv: KV) -> Grads:
    return exchanged_backward(spec, shards, saved, kv, Schedule.ring(shards))


def allgather_forward(
    spec: AttentionSpec, shards: Shards, q: torch.Tensor, kv: KV
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The all-gather run eagerly: whole blocks, all in flight from the start."""
    return exchanged_forward(spec, shards, q, kv, Schedule.allgather(shards))


def allgather_backward(spec: AttentionSpec, shards: Shards, saved: Saved, kv: KV) -> Grads:
    return exchanged_backward(spec, shards, saved, kv, Schedule.allgather(shards))
