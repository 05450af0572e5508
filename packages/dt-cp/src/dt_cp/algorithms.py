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

from collections.abc import Callable
from typing import NamedTuple

import torch

from . import blocks, records
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
from .comm import group_of
from .exchange import (
    Incoming,
    Returning,
    exchange_items,
    item_ranges,
    peers_absent,
    slice_ranges,
)
from .layout import Range, Shards


def _gather(shards: Shards, kv: KV) -> KV:
    """K and V whole; the gather carries the layout, checked each time a compiled graph
    runs (`records.check_traced`)."""
    sizes, layout = shards.kv_layout.sizes(), records.encode(shards.kv_layout)
    gather = torch.ops.dt_cp.all_gather_seq
    return KV(*(gather(t.contiguous(), 2, sizes, shards.group, layout) for t in kv))


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
# rank, as a gather would hold, and kernels as large as the layout allows). Which chunk
# moves when, and the sends and receives that move it, are `exchange`'s.

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


def exchanged_forward(
    spec: AttentionSpec, shards: Shards, q: torch.Tensor, kv: KV, schedule: Schedule
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Own block first (while the others' arrive), then every other block as it comes."""
    acc = Accumulator(q, kv.v.shape[-1])
    q_ranges = shards.q_ranges()
    items = exchange_items(shards, spec.causal, schedule.chunks)
    pg, absent = group_of(shards.group), peers_absent(shards)
    incoming = Incoming(pg, kv, items, schedule.chunks, schedule.ahead, absent)
    rows = schedule.piece_rows
    block_forward(spec, acc, q, q_ranges, kv, shards.kv_layout.ranges(shards.rank), rows)
    for item in items:
        ranges = item_ranges(shards, item)
        block_forward(spec, acc, q, q_ranges, incoming.next(), ranges, schedule.chunk_piece_rows)
    return acc.result(q.dtype)


def exchanged_backward(
    spec: AttentionSpec, shards: Shards, saved: Saved, kv: KV, schedule: Schedule
) -> Grads:
    """K/V arrive again as in forward; each block's dK/dV share goes straight home.

    Per rank: dq, its own dK/dV (the results), the blocks or chunks in flight, and one
    share leaving and one arriving: no rank ever holds the whole dK/dV. Without
    `schedule.own_overlap`, nothing is in flight while the own block is computed.
    """
    pg = group_of(shards.group)
    absent = peers_absent(shards)
    q_ranges = shards.q_ranges()
    items = exchange_items(shards, spec.causal, schedule.chunks)
    dq = torch.zeros_like(saved.q)
    own = KV(torch.zeros_like(kv.k), torch.zeros_like(kv.v))
    own_ranges = shards.kv_layout.ranges(shards.rank)
    rows = schedule.piece_rows

    def own_rows(lo: int, hi: int) -> None:  # into `own` in place
        ranges = slice_ranges(own_ranges, lo, hi)
        into = own.rows(lo, hi)
        block_backward(spec, dq, saved, q_ranges, kv.rows(lo, hi), ranges, into, rows)

    n = kv.k.shape[2]
    if schedule.own_overlap:
        incoming = Incoming(pg, kv, items, schedule.chunks, schedule.ahead, absent)
        cut = _own_cut(spec, own_ranges, n, rows)
        own_rows(0, cut)  # while the other blocks arrive
    else:
        own_rows(0, n)  # before anything is posted
        incoming = Incoming(pg, kv, items, schedule.chunks, schedule.ahead, absent)
        cut = n
    returning = Returning(pg, own, schedule.chunks, absent)
    for item in items:
        ranges = item_ranges(shards, item)
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


class Exchanged(NamedTuple):
    """The eager executor of a path whose blocks travel point to point: the exchanged
    forward and backward, laid out by `schedule` for each call's shards."""

    schedule: Callable[[Shards], Schedule]

    def forward(
        self, spec: AttentionSpec, shards: Shards, q: torch.Tensor, kv: KV
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return exchanged_forward(spec, shards, q, kv, self.schedule(shards))

    def backward(self, spec: AttentionSpec, shards: Shards, saved: Saved, kv: KV) -> Grads:
        return exchanged_backward(spec, shards, saved, kv, self.schedule(shards))


RING = Exchanged(Schedule.ring)  # other blocks in small chunks, a few in flight
ALLGATHER = Exchanged(Schedule.allgather)  # whole blocks, all in flight from the start
ring_forward, ring_backward = RING.forward, RING.backward
allgather_forward, allgather_backward = ALLGATHER.forward, ALLGATHER.backward
