"""Collectives of context parallelism: sequence all-gather / reduce-scatter and the ring.

The all-gather and reduce-scatter are torch.library ops (see `ops.py`) so they trace
under torch.compile; these are their eager kernels. Ring steps use batched async
point-to-point sends, which gloo and NCCL both run while the caller computes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from dt_core.compat.process_groups import is_fake_group, resolve_process_group


def group_of(name: str) -> dist.ProcessGroup:
    return resolve_process_group(name)


def _pad_to(x: torch.Tensor, dim: int, length: int) -> torch.Tensor:
    if x.shape[dim] == length:
        return x.contiguous()
    shape = list(x.shape)
    shape[dim] = length - x.shape[dim]
    return torch.cat([x, x.new_zeros(shape)], dim).contiguous()


def all_gather_seq(x: torch.Tensor, dim: int, sizes: Sequence[int], group: str) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim`; rank i contributes `sizes[i]` rows."""
    pg = group_of(group)
    longest = max(sizes)
    padded = _pad_to(x, dim, longest)
    # A fake group's peers write nothing: what they "send" is zeros, never garbage.
    new = torch.zeros_like if is_fake_group(pg) else torch.empty_like
    buffers = [new(padded) for _ in sizes]
    dist.all_gather(buffers, padded, group=pg)
    return torch.cat([b.narrow(dim, 0, n) for b, n in zip(buffers, sizes, strict=True)], dim)


def reduce_scatter_seq(x: torch.Tensor, dim: int, sizes: Sequence[int], group: str) -> torch.Tensor:
    """Sum `x` over ranks and keep this rank's `sizes[rank]` rows along `dim`."""
    pg = group_of(group)
    rank, parts = dist.get_rank(pg), len(sizes)
    starts = [sum(sizes[:i]) for i in range(parts)]
    if dist.get_backend(pg) == "gloo":
        # gloo has no reduce_scatter, and an all-reduce would move every rank's rows to
        # every rank: send each rank only its own rows, point to point, all at once.
        def rows(i: int) -> torch.Tensor:
            return x.narrow(dim, starts[i], sizes[i])

        mine = rows(rank)
        exchanges = [
            RingStep([rows((rank + s) % parts)], [x.new_empty(mine.shape)], pg, shift=s)
            for s in range(1, parts)
        ]
        total = mine.clone(memory_format=torch.contiguous_format)
        for exchange in exchanges:
            total += exchange.wait()[0]
        return total
    longest = max(sizes)
    pieces = [_pad_to(x.narrow(dim, starts[i], n), dim, longest) for i, n in enumerate(sizes)]
    # One piece per rank along a new leading dim: the backend splits its input into
    # contiguous chunks (NCCL by flat offset, the fake backend along dim 0), so each
    # chunk must be one rank's piece whole (concatenating along `dim` interleaves them).
    stacked = torch.stack(pieces)
    out = (torch.zeros_like if is_fake_group(pg) else torch.empty_like)(stacked[:1])
    dist.reduce_scatter_tensor(out, stacked, group=pg)
    return out[0].narrow(dim, 0, sizes[rank]).clone()


# Most messages one tensor of an exchange is split into (see `RingStep`); a tensor with
# more leading (batch, head) rows than this goes as one contiguous copy instead.
MAX_MESSAGES_PER_TENSOR = 16


def _messages(t: torch.Tensor, leading: int) -> list[torch.Tensor]:
    """`t` as contiguous messages: one per index of its first `leading` dims where there
    are at most `MAX_MESSAGES_PER_TENSOR` of them (a row slice of a contiguous (B, H, S, D)
    block is then sent without a copy, and a receive buffer is filled in place), else whole.
    Both sides decide from the leading sizes alone, which they share."""
    if leading == 0 or t.dim() <= leading or t.shape[:leading].numel() > MAX_MESSAGES_PER_TENSOR:
        return [t.contiguous()]
    return [part.contiguous() for part in t.flatten(0, leading - 1)]


class RingStep:
    """One async exchange: send tensors to rank+shift, receive as many from rank-shift.

    Tensors go as separate messages, and with `leading` > 0 each is split over its first
    `leading` dims (see `_messages`): no packing copy, since the ring's point is memory.
    Every rank posts the same sequence of exchanges, so each send meets its receive.
    """

    def __init__(
        self,
        send: Sequence[torch.Tensor],
        recv: Sequence[torch.Tensor],
        pg: dist.ProcessGroup,
        tag: int = 0,
        shift: int = 1,
        leading: int = 0,
    ) -> None:
        rank, size = dist.get_rank(pg), dist.get_world_size(pg)
        self.recv = list(recv)
        if not all(t.is_contiguous() for t in self.recv):
            # A message of a strided buffer would be a copy, and what it received lost.
            raise ValueError("dt_cp: RingStep receive buffers must be contiguous")
        # Kept alive until the sends complete (copies, where a message needed one).
        self._send = [m for t in send for m in _messages(t, leading)]
        into = [m for t in self.recv for m in _messages(t, leading)]
        ops = [
            dist.P2POp(dist.isend, t, group=pg, group_peer=(rank + shift) % size, tag=tag)
            for t in self._send
            if t.numel()
        ] + [
            dist.P2POp(dist.irecv, t, group=pg, group_peer=(rank - shift) % size, tag=tag)
            for t in into
            if t.numel()
        ]
        self._works = dist.batch_isend_irecv(ops) if ops else []

    def wait(self) -> list[torch.Tensor]:
        for work in self._works:
            work.wait()
        self._works = []
        self._send = []
        return self.recv
