"""simple_fsdp under torch's fake backend (a dry run: one process standing in for a world):
training steps run through, eager and compiled with the bucketing passes, with finite
losses and gradients."""

from __future__ import annotations

import pytest
from dt_core.testing.scripts import run_in_fake_world

STEPS = """
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from dt_fsdp_passes import simple_fsdp

mesh = init_device_mesh("cpu", (dist.get_world_size(),))
for compiled in (False, True):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    simple_fsdp(model, mesh)
    run = torch.compile(model, fullgraph=True) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        loss = run(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
    grads = all(bool(torch.isfinite(p.grad.to_local()).all()) for p in model.parameters())
    print("CASE", compiled, bool(torch.isfinite(loss).all()), grads)
"""


@pytest.mark.parametrize("world_size", [2, 8])
def test_simple_fsdp_steps_run_through_in_a_fake_world(world_size: int) -> None:
    found = run_in_fake_world(STEPS, world_size, timeout=600)
    assert found["CASE"] == ["False True True", "True True True"], found
