"""The plugin's tests, with dt-core's pytest plugin: `@pytest.mark.ranks(2)` runs a test
on 2 CPU processes; `simulated_ranks(2)` runs 2 ranks inside this one."""

from __future__ import annotations

import pytest
import torch


def test_dt_core_found_and_activated_the_plugin() -> None:
    import dt_core

    (info,) = [p for p in dt_core.plugins() if p.name == "soft-clip"]
    assert info.state == "active", info.reason
    assert info.distribution == "dt-soft-clip"
    assert "dt_soft_clip::soft_clip" in info.ops


def test_plain_tensors() -> None:
    x = torch.tensor([-100.0, 0.0, 1.0])
    y = torch.ops.dt_soft_clip.soft_clip(x, 2.0)
    torch.testing.assert_close(y, 2.0 * torch.tanh(x / 2.0))


@pytest.mark.ranks(2)
@pytest.mark.parametrize("dim", [0, 1])
def test_sharded_input_stays_sharded(dim: int) -> None:
    from dt_core.testing import cpu_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = cpu_mesh(2)  # a 1-D mesh over the 2 ranks, made once per rank process
    full = torch.arange(24.0).reshape(4, 6) - 12
    y = torch.ops.dt_soft_clip.soft_clip(distribute_tensor(full, mesh, [Shard(dim)]), 5.0)
    assert y.placements == (Shard(dim),)
    torch.testing.assert_close(y.full_tensor(), torch.ops.dt_soft_clip.soft_clip(full, 5.0))


def test_partial_input_is_reduced_first() -> None:
    from dt_core.testing import simulated_ranks
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial

    expected = 3.0 * torch.tanh(torch.full((3,), 4.0) / 3.0)
    with simulated_ranks(2):
        mesh = init_device_mesh("cpu", (2,))
        local = torch.full((3,), 2.0)  # each rank holds 2: the pending sum is 4
        x = DTensor.from_local(local, mesh, [Partial()])
        y = torch.ops.dt_soft_clip.soft_clip(x, 3.0)
        assert not any(p.is_partial() for p in y.placements)  # reduced (or reduce-scattered)
        torch.testing.assert_close(y.full_tensor(), expected)
