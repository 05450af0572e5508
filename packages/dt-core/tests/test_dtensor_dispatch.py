"""The sample plugin's contributions at work on real DTensors, on 2 and 4 ranks.

Ranks import torch themselves, so this is the autoload path a user gets: nothing here
activates anything by hand.
"""

from __future__ import annotations

import pytest
import torch
from dt_core.testing import cpu_mesh


@pytest.mark.ranks(2)
@pytest.mark.parametrize("placement", ["shard0", "shard1", "replicate"])
def test_sample_op_follows_its_sharding_strategy(placement: str) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    chosen = {"shard0": Shard(0), "shard1": Shard(1), "replicate": Replicate()}[placement]
    full = torch.arange(35.0).reshape(5, 7)  # uneven on 2 ranks in both dims
    x = distribute_tensor(full, cpu_mesh(2), [chosen])
    y = torch.ops.dt_sample.scale(x, 1.5)
    assert y.placements == (chosen,)  # no redistribution: the strategy kept the input's
    assert torch.equal(y.full_tensor(), full * 1.5)  # same as on one process


@pytest.mark.ranks(4)
def test_sample_op_on_a_2d_mesh() -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    full = torch.randn(6, 10, generator=torch.Generator().manual_seed(0))
    x = distribute_tensor(full, cpu_mesh((2, 2)), [Shard(0), Shard(1)])
    y = torch.ops.dt_sample.scale(x, -2.0)
    assert y.placements == (Shard(0), Shard(1))
    assert torch.equal(y.full_tensor(), full * -2.0)


@pytest.mark.ranks(2)
def test_op_handler_takes_over_dispatch() -> None:
    from dt_sample_plugin import plugin
    from torch.distributed.tensor import Shard, distribute_tensor

    x = distribute_tensor(torch.ones(4, 4), cpu_mesh(2), [Shard(0)])
    before = len(plugin.handler_calls)
    assert torch.ops.aten.is_same_size(x, x)
    assert len(plugin.handler_calls) == before + 1


@pytest.mark.ranks(2)
def test_patch_wraps_torchs_own_repr() -> None:
    from dt_sample_plugin import plugin
    from torch.distributed.tensor import Shard, distribute_tensor

    x = distribute_tensor(torch.arange(4.0), cpu_mesh(2), [Shard(0)])
    before = len(plugin.repr_calls)
    text = repr(x)
    assert plugin.repr_calls[before:] == ["DTensor"]  # the patch ran ...
    assert text.startswith("DTensor(local_tensor=")  # ... and torch's own repr answered
