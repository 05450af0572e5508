"""simple_fsdp's forward and backward under torch's LocalTensorMode (one process
simulating every rank): losses and gradients equal one process on the whole batch."""

from __future__ import annotations

import copy

import pytest
import torch
from dt_core.testing import rank_values, simulated_ranks
from torch import nn


@pytest.mark.parametrize("shape", [(2,), (4,), (2, 2)], ids=["fsdp2", "fsdp4", "hsdp2x2"])
def test_simple_fsdp_under_local_tensor_mode(shape: tuple[int, ...]) -> None:
    from dt_fsdp_passes import simple_fsdp
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)
    # 3 output rows shard unevenly over 2 and 4 ranks. With HSDP, torch 2.13's to_local
    # backward cannot hash the per-rank sizes of an uneven shard under LocalTensorMode
    # (TypeError: unhashable type: non-nested SymInt), so that case uses 4 rows.
    out = 4 if len(shape) == 2 else 3
    reference = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, out))
    world = 1
    for n in shape:
        world *= n
    x, y = torch.randn(2 * world, 6), torch.randn(2 * world, out)
    with simulated_ranks(world) as mode:
        names = ("replicate", "shard") if len(shape) == 2 else ("fsdp",)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        model = simple_fsdp(copy.deepcopy(reference), mesh)
        xs = mode.rank_map(lambda r: x.chunk(world)[r])
        ys = mode.rank_map(lambda r: y.chunk(world)[r])
        loss = ((model(xs) - ys) ** 2).mean()
        loss.backward()
        grads = {k: p.grad.full_tensor() for k, p in model.named_parameters()}
        losses = [float(v) for v in rank_values(loss.detach(), world)]
    want = ((reference(x) - y) ** 2).mean()
    want.backward()
    assert abs(sum(losses) / world - float(want)) < 1e-6, (losses, float(want))
    for name, p in reference.named_parameters():
        for got in rank_values(grads[name], world):
            assert torch.allclose(got, p.grad, atol=1e-6), name
