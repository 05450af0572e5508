"""Global statistics of a sharded tensor from per-rank partial ones.

`global_moments`: mean and (biased) variance over the reduced dims. Each rank takes the
count, mean and sum of squared deviations of its own rows (`torch.var_mean`, in float32
at least), one all-gather over the reducing mesh dims brings every rank's three to all,
and each rank combines them in rank order with Chan's update. Unlike a sum and a sum of
squares, this loses nothing when the mean is large against the spread.
`global_sums`: per-rank partial sums summed over the reducing mesh dims (one all-reduce
for several sums, stacked). Both keep the tensor's shards of the kept dims.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from dt_core.dtensors import as_dtensor
from torch.distributed.tensor import Placement, Replicate, Shard

from ... import ranks
from .layout import NormLayout


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype statistics accumulate in: float32 for 16-bit floats, as torch's kernels."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _shifted(placements: Sequence[Placement], by: int) -> list[Placement]:
    return [Shard(p.dim + by) if isinstance(p, Shard) else p for p in placements]


def _local_moments(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """This rank's (count, mean, sum of squared deviations), stacked, reduced dims kept."""
    stat = [1 if d in dims else s for d, s in enumerate(x.shape)]
    count = 1
    for d in dims:
        count *= x.shape[d]
    if count == 0:  # a rank without rows contributes nothing
        return x.new_zeros((3, *stat))
    var, mean = torch.var_mean(x, dims, correction=0, keepdim=True)
    return torch.stack([torch.full_like(mean, count), mean, var * count])


def global_moments(x: torch.Tensor, layout: NormLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, biased variance) of this rank's `x` over `layout.reduced` and every other
    rank's rows, in `accumulation_dtype`, reduced dims kept as size 1."""
    x = x.to(accumulation_dtype(x.dtype))
    local = ranks.each_rank(layout.mesh, _local_moments, x, layout.reduced)
    reducing = layout.reduce_mesh_dims
    if not reducing:
        count, mean, m2 = local.unbind(0)
        return mean, m2 / count.clamp(min=1)
    lead = len(reducing)
    placements = [
        Shard(reducing.index(i)) if i in reducing else p
        for i, p in enumerate(_shifted(layout.placements, lead + 1))
    ]
    mesh_sizes = [layout.mesh.size(i) for i in reducing]
    stat_shape = (*mesh_sizes, 3, *layout.stat_shape())
    stacked = local.reshape((1,) * lead + tuple(local.shape))
    gathered = as_dtensor(stacked, layout.mesh, placements, stat_shape)
    every = [Replicate() if i in reducing else p for i, p in enumerate(placements)]
    parts = gathered.redistribute(layout.mesh, every).to_local()
    ranks_reducing = 1
    for size in mesh_sizes:
        ranks_reducing *= size
    parts = parts.reshape(ranks_reducing, *parts.shape[lead:])  # a row per rank, in order
    counts, means, m2s = parts.unbind(1)
    total = counts.sum(0)
    mean = (counts * means).sum(0) / total
    m2 = (m2s + counts * (means - mean) ** 2).sum(0)
    return mean, m2 / total


def global_sums(parts: Sequence[torch.Tensor], layout: NormLayout) -> list[torch.Tensor]:
    """Each of `parts` (this rank's partial sums, laid out like a statistic of `layout`)
    summed over the reducing mesh dims, with one all-reduce."""
    if not layout.reduce_mesh_dims:
        return list(parts)
    from torch.distributed.tensor import Partial

    stacked = torch.stack(list(parts))
    placements = _shifted(layout.stat_placements(Partial()), 1)
    pending = as_dtensor(stacked, layout.mesh, placements, (len(parts), *layout.stat_shape()))
    done = [Replicate() if isinstance(p, Partial) else p for p in placements]
    return list(pending.redistribute(layout.mesh, done).to_local().unbind(0))
