"""`dt_core.testing.collectives.counting_collectives` on 2 gloo ranks: each collective a
DTensor redistribute or a `torch.distributed` call runs is counted once, by name, and
local work counts nothing."""

from __future__ import annotations

import pytest
import torch
from dt_core.testing import cpu_mesh


@pytest.mark.ranks(2)
def test_each_collective_is_counted_once_where_it_runs() -> None:
    import torch.distributed as dist
    from dt_core.testing.collectives import counting_collectives
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    mesh = cpu_mesh(2)
    x = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
    with counting_collectives() as local_only:
        y = (x * 2 + 1).relu()
    assert y.placements == (Shard(0),) and not local_only
    with counting_collectives() as counts:
        y.redistribute(mesh, [Replicate()])
        pending = torch.distributed.tensor.DTensor.from_local(torch.ones(2), mesh, [Partial()])
        pending.redistribute(mesh, [Replicate()])
        flat = torch.ones(3)
        dist.all_reduce(flat)
    assert counts == {"all_gather_into_tensor": 1, "all_reduce": 1, "allreduce_": 1}, counts
    # what one call sent: a rank's 2 x 2 rows, the pending 2, the 3 ones
    assert counts.largest == {"all_gather_into_tensor": 4, "all_reduce": 2, "allreduce_": 3}
    assert torch.equal(flat, torch.full((3,), 2.0))
