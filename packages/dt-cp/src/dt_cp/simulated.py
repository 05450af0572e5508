"""dt-cp under torch's LocalTensorMode: one process holds the shards of every simulated rank.

There the process group is fake (collectives move no data) and a rank is a per-rank
integer, not a Python int. So attention runs per simulated rank on plain tensors, as the
all-gather algorithm runs on a real rank: the K/V every rank of its group holds are all
here, the rank's own ranges and offsets are plain ints, and the dK/dV shares are summed
over the group. The arithmetic is a real rank's, so results are exact. The ring's
point-to-point sends have no counterpart there; "ring" runs the all-gather algorithm,
said once by the plan, which picks this path (`plan.choose_path`; its values are the
same; `test_sweep.py` checks the ring on real processes).
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

import torch
from dt_core.compat import local_tensor as compat

from .blocks import KV, AttentionSpec, Grads, Saved, gathered_backward, gathered_forward
from .layout import Shards

Record = TypeVar("Record", KV, Saved)

SEQ_DIM = 2


def _values(t: torch.Tensor, ranks: list[int]) -> dict[int, torch.Tensor]:
    if compat.is_local_tensor(t):
        return compat.rank_values(t)
    return {r: t for r in ranks}


def _per_rank(record: Record, ranks: list[int]) -> dict[int, Record]:
    """A record (KV, Saved) of LocalTensors as one record of plain tensors per rank."""
    fields = [_values(t, ranks) for t in record]
    return {r: type(record)(*(f[r] for f in fields)) for r in ranks}


def _group_of(shards: Shards, rank: int) -> tuple[int, ...]:
    """The global ranks of `rank`'s group along the sequence's mesh dim, in group order."""
    if shards.parts == 1 or shards.rank_groups is None:
        return (rank,)
    for group in shards.rank_groups:
        if rank in group:
            return group
    raise ValueError(f"dt-cp: simulated rank {rank} is not on the mesh sharding the sequence")


def _on_rank(
    spec: AttentionSpec, shards: Shards, kvs: dict[int, KV], rank: int
) -> tuple[AttentionSpec, Shards, KV]:
    """spec and shards as `rank` sees them (its own ints and mask), and the K/V of every
    rank of its group, gathered in rank order."""
    mask = spec.attn_mask
    if mask is not None and compat.is_local_tensor(mask):
        mask = compat.rank_values(mask)[rank]
    spec = dataclasses.replace(
        spec,
        attn_mask=mask,
        batch_offset=int(compat.int_on_rank(spec.batch_offset, rank)),
        head_offset=int(compat.int_on_rank(spec.head_offset, rank)),
    )
    group = _group_of(shards, rank)
    kv_all = KV(*(torch.cat([kvs[j][i] for j in group], SEQ_DIM) for i in range(len(KV._fields))))
    return spec, dataclasses.replace(shards, rank=group.index(rank)), kv_all


def forward(
    spec: AttentionSpec, shards: Shards, q: torch.Tensor, kv: KV
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The all-gather for every simulated rank at once (LocalTensors in, LocalTensors out)."""
    mode = compat.enabled_mode()
    ranks = compat.simulated_ranks_of(mode)
    qs, kvs = _values(q, ranks), _per_rank(kv, ranks)
    results: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    with compat.mode_disabled(mode):
        for r in ranks:
            spec_r, shards_r, kv_all = _on_rank(spec, shards, kvs, r)
            results[r] = gathered_forward(spec_r, shards_r, qs[r], kv_all)
    return _combine(results)


def backward(spec: AttentionSpec, shards: Shards, saved: Saved, kv: KV) -> Grads:
    """The all-gather's backward for every simulated rank: dK/dV shares summed over each
    group."""
    mode = compat.enabled_mode()
    ranks = compat.simulated_ranks_of(mode)
    saveds, kvs = _per_rank(saved, ranks), _per_rank(kv, ranks)
    with compat.mode_disabled(mode):
        shares: dict[int, Grads] = {}
        for r in ranks:
            spec_r, shards_r, kv_all = _on_rank(spec, shards, kvs, r)
            shares[r] = gathered_backward(spec_r, shards_r, saveds[r], kv_all)
        dq = {r: shares[r].dq for r in ranks}
        dk, dv = ({r: _reduce_scatter(shares, g, shards, r) for r in ranks} for g in ("dk", "dv"))
        grads = (compat.local_tensor_from(_same_strides(t)) for t in (dq, dk, dv))
        return Grads(*grads)


def _same_strides(values: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Per-rank gradients as views of equal-length buffers, so every rank's strides agree.

    Uneven shards give contiguous locals different strides, which LocalTensorMode makes
    per-rank SymInts; DTensor's `to_local` backward puts the global stride it derives
    from them into a spec it hashes, and torch cannot hash those (TypeError). Views of
    a buffer padded to the longest shard keep the values and give plain int strides.
    """
    longest = max(t.shape[SEQ_DIM] for t in values.values())
    if all(t.shape[SEQ_DIM] == longest for t in values.values()):
        return values
    padded = {}
    for r, t in values.items():
        shape = list(t.shape)
        shape[SEQ_DIM] = longest
        buffer = t.new_zeros(shape)
        buffer.narrow(SEQ_DIM, 0, t.shape[SEQ_DIM]).copy_(t)
        padded[r] = buffer.narrow(SEQ_DIM, 0, t.shape[SEQ_DIM])
    return padded


def _reduce_scatter(shares: dict[int, Grads], name: str, shards: Shards, rank: int) -> torch.Tensor:
    """`rank`'s rows of the sum of its group's gathered-sequence gradients `name`."""
    group = _group_of(shards, rank)
    total = getattr(shares[group[0]], name).clone()
    for j in group[1:]:
        total += getattr(shares[j], name)
    if len(group) == 1:
        return total
    sizes = shards.kv_layout.sizes()
    me = group.index(rank)
    return total.narrow(SEQ_DIM, sum(sizes[:me]), sizes[me]).clone()


def _combine(
    results: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-rank (out, lse, max) as three LocalTensors."""
    out, lse, top = (
        compat.local_tensor_from({r: v[i] for r, v in results.items()}) for i in range(3)
    )
    return out, lse, top
