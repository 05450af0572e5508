"""The two exact context-parallel algorithms on local shards: all-gather and ring.

Both take this rank's queries and its key/value shard (sequence on dim 2) and return
the exact attention of the local queries over the whole sequence, plus the gradients.

all-gather: gather K/V once (`dt_cp::all_gather_seq`), attend, and in backward gather
again and reduce-scatter dK/dV. Holds the whole K/V on every rank while it runs.
ring: each rank attends to its own block, then receives every other rank's block straight
from its owner in chunks (the next chunk in flight while the current one is computed),
merged by log-sum-exp; backward receives the chunks again and sends each chunk's dK/dV
share straight home. A rank holds its own block and a few chunks: no foreign block whole.
"""

from __future__ import annotations

import collections
import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .blocks import Accumulator, AttentionSpec, block_backward, block_forward
from .comm import RingStep, group_of
from .layout import Range, SequenceLayout


@dataclass(frozen=True)
class Shards:
    """Who holds which positions: the query and key layouts over one process group."""

    q_layout: SequenceLayout
    kv_layout: SequenceLayout
    group: str  # process group name (the mesh dim that shards the sequence)
    rank: int
    # Under LocalTensorMode only: the global ranks of every group along the sequence's
    # mesh dim, each in group-rank order (see `simulated.py`). None: real processes.
    rank_groups: tuple[tuple[int, ...], ...] | None = None

    @classmethod
    def local(cls, q_len: int, kv_len: int) -> Shards:
        """No sequence sharding: the whole sequence on this rank."""
        return cls(SequenceLayout(q_len, 1), SequenceLayout(kv_len, 1), "", 0)

    @property
    def parts(self) -> int:
        return self.kv_layout.parts

    def q_ranges(self) -> list[Range]:
        return self.q_layout.ranges(self.rank)

    def all_kv_ranges(self) -> list[Range]:
        return [r for j in range(self.parts) for r in self.kv_layout.ranges(j)]


def _gather(shards: Shards, t: torch.Tensor) -> torch.Tensor:
    if shards.parts == 1:
        return t
    sizes = shards.kv_layout.sizes()
    return torch.ops.dt_cp.all_gather_seq(t.contiguous(), 2, sizes, shards.group)


def _scatter(shards: Shards, t: torch.Tensor) -> torch.Tensor:
    if shards.parts == 1:
        return t
    sizes = shards.kv_layout.sizes()
    return torch.ops.dt_cp.reduce_scatter_seq(t, 2, sizes, shards.group)


def _kv_shape(like: torch.Tensor, n: int) -> list[int]:
    return [like.shape[0], like.shape[1], n, like.shape[3]]


# --- all-gather -------------------------------------------------------------------------


def allgather_forward(
    spec: AttentionSpec, shards: Shards, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return gathered_forward(spec, shards, q, _gather(shards, k), _gather(shards, v))


def gathered_forward(
    spec: AttentionSpec,
    shards: Shards,
    q: torch.Tensor,
    k_all: torch.Tensor,
    v_all: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The all-gather algorithm once K/V of every rank are here (in rank order)."""
    acc = Accumulator(q, v_all.shape[-1])
    block_forward(spec, acc, q, shards.q_ranges(), k_all, v_all, shards.all_kv_ranges())
    return acc.out.to(q.dtype), acc.lse, acc.max


def allgather_backward(
    spec: AttentionSpec,
    shards: Shards,
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    k_all, v_all = _gather(shards, k), _gather(shards, v)
    dq, dk_all, dv_all = gathered_backward(spec, shards, dout, q, k_all, v_all, out, lse)
    return dq, _scatter(shards, dk_all), _scatter(shards, dv_all)


def gathered_backward(
    spec: AttentionSpec,
    shards: Shards,
    dout: torch.Tensor,
    q: torch.Tensor,
    k_all: torch.Tensor,
    v_all: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq and this rank's share of dK/dV for the whole gathered sequence (to be summed)."""
    dq = torch.zeros_like(q)
    dk_all, dv_all = block_backward(
        spec, dq, dout, q, shards.q_ranges(), k_all, v_all, shards.all_kv_ranges(), out, lse
    )
    return dq, dk_all, dv_all


# --- ring -------------------------------------------------------------------------------

# Rows of K/V per message. Blocks travel in chunks of at most this many rows, so a rank
# holds its own block plus a few chunks, whatever the sequence length.
RING_CHUNK_ROWS = 512


def _block_buffers(k: torch.Tensor, v: torch.Tensor, n: int) -> list[torch.Tensor]:
    return [k.new_empty(_kv_shape(k, n)), v.new_empty(_kv_shape(v, n))]


def _chunk_count(sizes: list[int]) -> int:
    """Chunks per block, the same on every rank (chunks of shorter blocks are shorter)."""
    return max(1, -(-max(sizes) // RING_CHUNK_ROWS))


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
def _chunk_order(shards: Shards, receiver: int, source: int, causal: bool) -> tuple[int, ...]:
    """The order `receiver` gets `source`'s chunks in, spreading its work evenly over steps.

    Chunks are exchanged in lockstep (one in flight), so a rank whose work comes in a burst
    (e.g. head-tail: every early chunk fully visible, every late one hidden) stalls its
    partner, then idles while the partner catches up. Greedy: each next chunk keeps the
    running work closest to its even share. Sender and receiver compute the same order
    from global layouts, so the exchange still pairs up.
    """
    sizes = shards.kv_layout.sizes()
    chunks = _chunk_count(sizes)
    if not causal or chunks == 1:
        return tuple(range(chunks))
    bounds = _chunk_bounds(sizes[source], chunks)
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


def _ring_items(shards: Shards, causal: bool) -> list[tuple[int, int, int, int, int, int]]:
    """(step, source rank, chunk received, first row, end row, chunk sent) in order.

    At step s a rank receives the block of rank - s straight from its owner (and sends
    its own block to rank + s), chunk by chunk, so nothing is relayed and no rank ever
    holds a foreign block whole. Chunks go in each receiver's balanced order.
    """
    sizes = shards.kv_layout.sizes()
    chunks = _chunk_count(sizes)
    items = []
    for step in range(1, shards.parts):
        source = (shards.rank - step) % shards.parts
        target = (shards.rank + step) % shards.parts
        bounds = _chunk_bounds(sizes[source], chunks)
        receive = _chunk_order(shards, shards.rank, source, causal)
        send = _chunk_order(shards, target, shards.rank, causal)
        for c, sent in zip(receive, send, strict=True):
            items.append((step, source, c, bounds[c], bounds[c + 1], sent))
    return items


def _post_chunk(
    shards: Shards, pg: dist.ProcessGroup, k: torch.Tensor, v: torch.Tensor, item: tuple
) -> RingStep:
    """Send this rank's chunk for `item` to rank + step; receive the item's chunk."""
    step, _source, _c, lo, hi, sent = item
    mine = _chunk_bounds(k.shape[2], _chunk_count(shards.kv_layout.sizes()))
    a, b = mine[sent], mine[sent + 1]
    send = [k[:, :, a:b], v[:, :, a:b]]
    return RingStep(send, _block_buffers(k, v, hi - lo), pg, tag=1, shift=step)


# K/V chunks in flight ahead of the one being computed. Two absorb the step-to-step
# differences in work between partners (lockstep stalls) for one extra chunk of memory.
RING_PREFETCH_CHUNKS = 2


class _Prefetch:
    """Posts the ring's chunk exchanges `RING_PREFETCH_CHUNKS` ahead; `next()` waits."""

    def __init__(
        self, shards: Shards, pg: dist.ProcessGroup, k: torch.Tensor, v: torch.Tensor, items: list
    ) -> None:
        self._post = lambda item: _post_chunk(shards, pg, k, v, item)
        self._items = items
        self._posted: collections.deque[RingStep] = collections.deque()
        self._next = 0
        self._fill()

    def _fill(self) -> None:
        while self._next < len(self._items) and len(self._posted) < RING_PREFETCH_CHUNKS:
            self._posted.append(self._post(self._items[self._next]))
            self._next += 1

    def next(self) -> list[torch.Tensor]:
        received = self._posted.popleft().wait()
        self._fill()
        return received


def ring_forward(
    spec: AttentionSpec, shards: Shards, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Own block first, then every other rank's block chunk by chunk (next one in flight)."""
    pg = group_of(shards.group)
    acc = Accumulator(q, v.shape[-1])
    q_ranges = shards.q_ranges()
    items = _ring_items(shards, spec.causal)
    incoming = _Prefetch(shards, pg, k, v, items)
    block_forward(spec, acc, q, q_ranges, k, v, shards.kv_layout.ranges(shards.rank))
    for item in items:
        current = incoming.next()
        _, source, _, lo, hi, _ = item
        ranges = _slice_ranges(shards.kv_layout.ranges(source), lo, hi)
        block_forward(spec, acc, q, q_ranges, current[0], current[1], ranges)
        del current
    return acc.out.to(q.dtype), acc.lse, acc.max


def ring_backward(
    spec: AttentionSpec,
    shards: Shards,
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K/V chunks come again; each chunk's dK/dV share goes straight back to its owner.

    Per rank: dq, its own dk/dv (the results), and a few chunks in flight (K/V arriving,
    gradient shares leaving and arriving); no foreign block is ever held whole.
    """
    pg = group_of(shards.group)
    q_ranges = shards.q_ranges()
    items = _ring_items(shards, spec.causal)
    chunks = _chunk_count(shards.kv_layout.sizes())
    mine = _chunk_bounds(k.shape[2], chunks)
    dq = torch.zeros_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    incoming = _Prefetch(shards, pg, k, v, items)
    block_backward(
        spec, dq, dout, q, q_ranges, k, v, shards.kv_layout.ranges(shards.rank), out, lse, dk, dv
    )
    returning: tuple[RingStep, int, int] | None = None  # shares for my chunk, in flight

    def settle() -> None:
        if returning is not None:
            exchange, a, b = returning
            share_k, share_v = exchange.wait()
            dk[:, :, a:b] += share_k
            dv[:, :, a:b] += share_v

    for item in items:
        current = incoming.next()
        step, source, _c, lo, hi, sent = item
        ranges = _slice_ranges(shards.kv_layout.ranges(source), lo, hi)
        kc, vc = current
        share = block_backward(spec, dq, dout, q, q_ranges, kc, vc, ranges, out, lse)
        del kc, vc
        del current
        settle()
        # My share of the chunk of rank - step goes home; rank + step's share of the chunk
        # I sent it comes in (every rank runs the same schedule, so the exchange pairs up).
        a, b = mine[sent], mine[sent + 1]
        exchange = RingStep(share, _block_buffers(k, v, b - a), pg, tag=2, shift=-step)
        returning = (exchange, a, b)
        del share
    settle()
    return dq, dk, dv


def run_forward(
    algorithm: str,
    spec: AttentionSpec,
    shards: Shards,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, lse, max score) of the local queries; max is -inf unless the math kernel ran."""
    from . import simulated

    if simulated.active(q):
        return simulated.forward(algorithm, spec, shards, q, k, v)
    if algorithm == "ring" and shards.parts > 1:
        return ring_forward(spec, shards, q, k, v)
    return allgather_forward(spec, shards, q, k, v)


def run_backward(
    algorithm: str,
    spec: AttentionSpec,
    shards: Shards,
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from . import simulated

    if simulated.active(q):
        return simulated.backward(algorithm, spec, shards, dout, q, k, v, out, lse)
    if algorithm == "ring" and shards.parts > 1:
        return ring_backward(spec, shards, dout, q, k, v, out, lse)
    return allgather_backward(spec, shards, dout, q, k, v, out, lse)


def local_rank(group: str) -> int:
    return dist.get_rank(group_of(group))
