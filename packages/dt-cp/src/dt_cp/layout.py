"""Which global sequence positions each rank holds, with and without load balancing.

Local shard sizes always follow DTensor's `Shard` rule (ceil(S/P) per rank, the last
ones shorter or empty), so a balanced tensor is an ordinary `Shard(seq_dim)` DTensor
whose sequence is permuted: "head_tail" gives rank r the r-th head piece and the r-th
tail piece from the end (rank 0 holds the first and the last positions), which evens
out causal work. "document" does the same inside each document of a packed sequence
(document lengths given), so causal work within every document is spread evenly — with a
document mask, position-wise head-tail balances nothing (every document's work is local
to its documents). Positions are contiguous ranges, so attention can use dense kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Range = tuple[int, int]  # (global start, length)


def shard_sizes(length: int, parts: int) -> list[int]:
    """Local lengths of `Shard` on `parts` ranks (torch.chunk rule, uneven included)."""
    chunk = -(-length // parts) if length else 0
    sizes = []
    for i in range(parts):
        start = min(i * chunk, length)
        sizes.append(max(0, min(chunk, length - start)))
    return sizes


@dataclass(frozen=True)
class SequenceLayout:
    """Per-rank ranges of global positions for one sequence length and rank count."""

    length: int
    parts: int
    balancer: str = "none"
    documents: tuple[int, ...] | None = None  # document lengths, for balancer="document"
    # Per-rank ranges given outright, for balancer="explicit" (layouts chosen elsewhere,
    # e.g. by torch's context-parallel APIs): explicit[r] is rank r's ranges in order.
    explicit: tuple[tuple[Range, ...], ...] | None = None

    def __post_init__(self) -> None:
        if self.balancer == "explicit":
            ranks = self.explicit
            if ranks is None or len(ranks) != self.parts:
                raise ValueError("dt-cp: an explicit layout needs one range list per rank")
            if sum(n for rs in ranks for _, n in rs) != self.length:
                raise ValueError("dt-cp: explicit ranges do not cover the sequence length")
        if self.balancer == "document":
            docs = self.documents
            if docs is None:
                raise ValueError(
                    "dt-cp: load_balancer='document' needs the document lengths "
                    "(documents=[...], e.g. dt_cp.settings(load_balancer='document', "
                    "documents=lengths))"
                )
            if any(n < 0 for n in docs) or sum(docs) != self.length:
                raise ValueError(
                    f"dt-cp: document lengths must be >= 0 and sum to the sequence length "
                    f"{self.length}, got sum {sum(docs)}"
                )

    def sizes(self) -> list[int]:
        if self.balancer == "explicit":
            return [sum(n for _, n in rs) for rs in self.explicit or ()]
        return shard_sizes(self.length, self.parts)

    def ranges(self, rank: int) -> list[Range]:
        """Global (start, length) ranges held by `rank`, in local order."""
        if self.balancer == "explicit":
            return list(self.explicit[rank]) if self.explicit else []
        sizes = self.sizes()
        if self.balancer == "none":
            return [(sum(sizes[:rank]), sizes[rank])]
        if self.balancer == "document":
            return document_ranges(self.documents or (), sizes, rank)
        if self.balancer != "head_tail":
            raise ValueError(f"dt-cp: unknown load balancer {self.balancer!r}")
        heads = [(n + 1) // 2 for n in sizes]
        tails = [n - h for n, h in zip(sizes, heads, strict=True)]
        head_start = sum(heads[:rank])
        tail_start = sum(heads) + sum(tails[rank + 1 :])
        return [(head_start, heads[rank]), (tail_start, tails[rank])]

    def positions(self, rank: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Global positions of `rank`'s local rows, as an int64 tensor."""
        parts = [torch.arange(s, s + n, device=device) for s, n in self.ranges(rank)]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long, device=device)

    def permutation(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """Global positions in sharded order: `full.index_select(dim, perm)` then Shard."""
        return torch.cat([self.positions(r, device) for r in range(self.parts)])


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


def runs(positions: torch.Tensor) -> tuple[Range, ...]:
    """1-D global `positions` (in local order) as maximal contiguous (start, length) ranges."""
    if positions.numel() == 0:
        return ()
    breaks = torch.nonzero(positions[1:] - positions[:-1] != 1).flatten() + 1
    edges = [0, *breaks.tolist(), positions.numel()]
    starts = positions[edges[:-1]].tolist()
    return tuple((s, b - a) for s, a, b in zip(starts, edges[:-1], edges[1:], strict=True))


def from_permutation(permutation: torch.Tensor, sizes: list[int]) -> SequenceLayout:
    """The layout of `full.index_select(dim, permutation)` sharded with local lengths `sizes`."""
    permutation = permutation.reshape(-1).long().cpu()
    n = permutation.numel()
    if sum(sizes) != n or not torch.equal(torch.sort(permutation).values, torch.arange(n)):
        raise ValueError("dt-cp: a sequence permutation must hold every position once")
    pieces = torch.split(permutation, sizes)
    explicit = tuple(runs(p) for p in pieces)
    return SequenceLayout(n, len(sizes), "explicit", explicit=explicit)


def document_counts(lengths: tuple[int, ...], sizes: list[int]) -> list[list[int]]:
    """How many positions of each document each rank holds: counts[d][r].

    Each rank's share of every document follows its share of the whole sequence
    (`sizes[r] / total`), rounded so that running totals track the ideal (largest
    deficit first) and every rank ends with exactly `sizes[r]` positions.
    """
    total = sum(sizes)
    if total == 0:
        return [[0] * len(sizes) for _ in lengths]
    assigned = [0] * len(sizes)
    counts, seen = [], 0
    for n in lengths:
        seen += n
        # Ideal running total of rank r is sizes[r] * seen / total; scaled by total here.
        take = [max(0, s * seen // total - a) for s, a in zip(sizes, assigned, strict=True)]
        while sum(take) != n:
            more = sum(take) < n
            # (scaled deficit, rank) of every rank that can take one more / give one back
            room = [
                (s * seen - total * (a + c), r)
                for r, (s, a, c) in enumerate(zip(sizes, assigned, take, strict=True))
                if (a + c < s if more else c > 0)
            ]
            if more:
                take[max(room, key=lambda d: (d[0], -d[1]))[1]] += 1
            else:
                take[min(room, key=lambda d: (d[0], d[1]))[1]] -= 1
        counts.append(take)
        assigned = [a + c for a, c in zip(assigned, take, strict=True)]
    return counts


def document_ranges(lengths: tuple[int, ...], sizes: list[int], rank: int) -> list[Range]:
    """Head-tail inside every document: `rank`'s ranges, document by document.

    Within a document, rank r's share is split into a head piece (rank order from the
    document's start) and a tail piece (rank order from its end), so every rank gets
    early (cheap) and late (expensive) causal rows of every document.
    """
    out: list[Range] = []
    start = 0
    for n, counts in zip(lengths, document_counts(lengths, sizes), strict=True):
        heads = [(c + 1) // 2 for c in counts]
        tails = [c - h for c, h in zip(counts, heads, strict=True)]
        head_start = start + sum(heads[:rank])
        tail_start = start + n - sum(tails[: rank + 1])
        for piece in ((head_start, heads[rank]), (tail_start, tails[rank])):
            if piece[1] == 0:
                continue
            if out and out[-1][0] + out[-1][1] == piece[0]:  # contiguous: one range
                out[-1] = (out[-1][0], out[-1][1] + piece[1])
            else:
                out.append(piece)
        start += n
    return out or [(0, 0)]
