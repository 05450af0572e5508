"""The point-to-point exchange under both eager algorithms (`algorithms`): which chunk of
which rank's K/V block moves at each step, and the sends and receives that move them.

At step s a rank receives the block of rank - s straight from its owner and sends its
own block to rank + s, chunk by chunk, so nothing is relayed. Under a causal mask the
chunks go in an order that spreads each receiver's work evenly over the steps. Sender and
receiver compute every order from global layouts, so the exchanges pair up. Backward
sends each block's dK/dV share home the same way, the other direction.
"""

from __future__ import annotations

import collections
import functools
from typing import NamedTuple

import torch
import torch.distributed as dist
from dt_core.compat.process_groups import is_fake_group

from .blocks import KV
from .comm import RingStep
from .layout import Range, Shards


class Item(NamedTuple):
    """One exchange: at `step`, chunk `chunk` (rows [lo, hi)) of `source`'s block comes
    in, while chunk `sent` of this rank's block goes out to rank + step."""

    step: int
    source: int
    chunk: int
    lo: int
    hi: int
    sent: int


def chunk_bounds(n: int, chunks: int) -> list[int]:
    """Where `chunks` near-equal chunks of `n` rows start, and `n`."""
    return [n * i // chunks for i in range(chunks + 1)]


def slice_ranges(ranges: list[Range], lo: int, hi: int) -> list[Range]:
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
def chunk_order(
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
    bounds = chunk_bounds(shards.kv_layout.sizes()[source], chunks)
    q_ranges = shards.q_layout.ranges(receiver)
    kv = shards.kv_layout.ranges(source)
    work = [
        _causal_pairs(q_ranges, slice_ranges(kv, bounds[c], bounds[c + 1])) for c in range(chunks)
    ]
    mean = sum(work) / chunks
    order, done, left = [], 0, list(range(chunks))
    for i in range(chunks):
        best = min(left, key=lambda c: (abs(done + work[c] - (i + 1) * mean), c))
        left.remove(best)
        order.append(best)
        done += work[best]
    return tuple(order)


def exchange_items(shards: Shards, causal: bool, chunks: int) -> list[Item]:
    """Every exchange, in order: step by step, and within a step in each receiver's
    balanced order (`chunk_order`)."""
    sizes = shards.kv_layout.sizes()
    items = []
    for step in range(1, shards.parts):
        source = (shards.rank - step) % shards.parts
        target = (shards.rank + step) % shards.parts
        bounds = chunk_bounds(sizes[source], chunks)
        receive = chunk_order(shards, shards.rank, source, causal, chunks)
        send = chunk_order(shards, target, shards.rank, causal, chunks)
        for c, sent in zip(receive, send, strict=True):
            items.append(Item(step, source, c, bounds[c], bounds[c + 1], sent))
    return items


def item_ranges(shards: Shards, item: Item) -> list[Range]:
    """The global ranges of the rows `item` brings in."""
    return slice_ranges(shards.kv_layout.ranges(item.source), item.lo, item.hi)


def _buffers(like: KV, n: int, zeros: bool = False) -> list[torch.Tensor]:
    """Receive buffers for `n` rows of K/V (or of their gradients); `zeros`: zero-filled
    (for a fake group, whose peers never write them)."""
    new = torch.zeros if zeros else torch.empty
    return [
        new(t.shape[0], t.shape[1], n, t.shape[3], dtype=t.dtype, device=t.device) for t in like
    ]


def peers_absent(shards: Shards) -> bool:
    """Whether the sequence's group is torch's fake backend (a dry run in one process):
    nothing arrives from its peers, so their blocks and dK/dV shares are taken as zeros,
    not as uninitialized memory (NaN in the log-sum-exp merges). Asked once per call; a
    real group's buffers stay uninitialized, as every one of their rows is received."""
    return is_fake_group(shards.group)


class Incoming:
    """Posts the exchanges of `items` `ahead` in advance (this rank's block sent in
    `chunks` chunks); `next()` waits for one."""

    def __init__(
        self,
        pg: dist.ProcessGroup,
        kv: KV,
        items: list[Item],
        chunks: int,
        ahead: int,
        zeros: bool = False,
    ) -> None:
        self._pg, self._kv, self._items, self._zeros = pg, kv, items, zeros
        self._mine = chunk_bounds(kv.k.shape[2], chunks)
        self._ahead = ahead
        self._posted: collections.deque[RingStep] = collections.deque()
        self._next = 0
        self._fill()

    def _post(self, item: Item) -> RingStep:
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


class Returning:
    """dK/dV shares going home: each block's share leaves while the next is computed,
    and the other ranks' shares of this rank's chunks come in and are added to `own`."""

    def __init__(self, pg: dist.ProcessGroup, own: KV, chunks: int, zeros: bool = False) -> None:
        self._pg, self._own, self._zeros = pg, own, zeros
        self._mine = chunk_bounds(own.k.shape[2], chunks)
        self._pending: tuple[RingStep, int, int] | None = None

    def send(self, share: KV, item: Item) -> None:
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
