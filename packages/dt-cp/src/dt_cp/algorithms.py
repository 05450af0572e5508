"""The two exact context-parallel algorithms on local shards: all-gather and ring.

Both take this rank's queries and its key/value shard (sequence on dim 2) and return
the exact attention of the local queries over the whole sequence, plus the gradients.

all-gather: gather K/V once (`dt_cp::all_gather_seq`), attend, and in backward gather
again and reduce-scatter dK/dV. Holds the whole K/V on every rank while it runs.
ring: K/V blocks travel around the ring (send the next while computing the current),
merged by log-sum-exp; backward sends the blocks round again with their dK/dV
accumulators, so no rank ever holds more than two K/V blocks (O(S/P)).
"""

from __future__ import annotations

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
    k_all, v_all = _gather(shards, k), _gather(shards, v)
    acc = Accumulator(q, v.shape[-1])
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
    dq = torch.zeros_like(q)
    dk_all, dv_all = block_backward(
        spec, dq, dout, q, shards.q_ranges(), k_all, v_all, shards.all_kv_ranges(), out, lse
    )
    return dq, _scatter(shards, dk_all), _scatter(shards, dv_all)


# --- ring -------------------------------------------------------------------------------


def _block_buffers(k: torch.Tensor, v: torch.Tensor, n: int) -> list[torch.Tensor]:
    return [k.new_empty(_kv_shape(k, n)), v.new_empty(_kv_shape(v, n))]


def ring_forward(
    spec: AttentionSpec, shards: Shards, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """P steps; the next K/V block is in flight while the current one is computed."""
    pg = group_of(shards.group)
    sizes = shards.kv_layout.sizes()
    parts = shards.parts
    acc = Accumulator(q, v.shape[-1])
    q_ranges = shards.q_ranges()
    owner = shards.rank
    current = [k, v]
    for step in range(parts):
        incoming = None
        if step < parts - 1:
            recv = _block_buffers(k, v, sizes[(owner - 1) % parts])
            incoming = RingStep(current, recv, pg, tag=1)
        block_forward(spec, acc, q, q_ranges, *current, shards.kv_layout.ranges(owner))
        if incoming is not None:
            current = incoming.wait()
            owner = (owner - 1) % parts
    return acc.out.to(q.dtype), acc.lse, acc.max


def _numel(like: torch.Tensor, n: int) -> int:
    return like.shape[0] * like.shape[1] * n * like.shape[3]


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
    """Blocks go round again; each carries its dK/dV accumulator, which ends at its owner.

    Per rank at most: the block in hand, the next block arriving, the accumulator in hand
    and the one arriving (each O(S/P)); the K/V prefetch overlaps the block's compute.
    """
    pg = group_of(shards.group)
    sizes = shards.kv_layout.sizes()
    parts = shards.parts
    q_ranges = shards.q_ranges()
    dq = torch.zeros_like(q)
    owner = shards.rank
    current = [k, v]
    grads_in: RingStep | None = None  # accumulator of the block in hand, from rank-1
    for step in range(parts):
        incoming = None
        if step < parts - 1:
            recv = _block_buffers(k, v, sizes[(owner - 1) % parts])
            incoming = RingStep(current, recv, pg, tag=1)
        if grads_in is None:
            grads = [torch.zeros_like(k), torch.zeros_like(v)]
        else:
            grads = grads_in.wait()
        block_backward(
            spec,
            dq,
            dout,
            q,
            q_ranges,
            *current,
            shards.kv_layout.ranges(owner),
            out,
            lse,
            dk=grads[0],
            dv=grads[1],
        )
        current = []  # done with this block: free it before the next buffers arrive
        recv_grads = _block_buffers(k, v, sizes[(owner - 1) % parts])
        grads_in = RingStep(grads, recv_grads, pg, tag=2)
        del grads
        if incoming is not None:
            current = incoming.wait()
        owner = (owner - 1) % parts
    if grads_in is None:
        raise RuntimeError("dt-cp: ring backward needs at least one rank")
    dk, dv = grads_in.wait()
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
    if algorithm == "ring" and shards.parts > 1:
        return ring_backward(spec, shards, dout, q, k, v, out, lse)
    return allgather_backward(spec, shards, dout, q, k, v, out, lse)


def local_rank(group: str) -> int:
    return dist.get_rank(group_of(group))
