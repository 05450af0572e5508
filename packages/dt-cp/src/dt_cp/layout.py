"""Which global sequence positions each rank holds, with and without load balancing.

Local shard sizes always follow DTensor's `Shard` rule (ceil(S/P) per rank, the last
ones shorter or empty), so a balanced tensor is an ordinary `Shard(seq_dim)` DTensor
whose sequence is permuted: "head_tail" gives rank r the r-th head piece and the r-th
tail piece from the end (rank 0 holds the first and the last positions), which evens
out causal work. Positions are contiguous ranges, so attention can use dense kernels.
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

    def sizes(self) -> list[int]:
        return shard_sizes(self.length, self.parts)

    def ranges(self, rank: int) -> list[Range]:
        """Global (start, length) ranges held by `rank`, in local order."""
        sizes = self.sizes()
        if self.balancer == "none":
            return [(sum(sizes[:rank]), sizes[rank])]
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
