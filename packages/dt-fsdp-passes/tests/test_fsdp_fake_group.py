"""simple_fsdp under torch's fake backend (a dry run: one process standing in for a world):
training steps run through, eager and compiled (with the bucketing passes under Inductor),
with a scalar loss and every parameter's gradient in its shard's shape. (Not the values:
a fake world's are arbitrary, and before torch 2.13 its reduce-scatter writes nothing.)"""

from __future__ import annotations

import pytest
from dt_core.testing.scripts import run_in_fake_world

STEPS = """
import os

from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from dt_fsdp_passes import simple_fsdp

mesh = init_device_mesh("cpu", (dist.get_world_size(),))
backend = os.environ["DT_TEST_BACKEND"]  # for the compiled steps
for compiled in (False, True):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    simple_fsdp(model, mesh)
    run = torch.compile(model, backend=backend, fullgraph=True) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        loss = run(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
    grads = all(p.grad.to_local().shape == p.to_local().shape for p in model.parameters())
    print("CASE", compiled, loss.shape == (), grads)
"""


# Inductor, with the bucketing passes, at 2; at 8 the same traced steps through aot_eager
# (Inductor's C++ code for them was 38 s of the cell on 2 cores, cold).
@pytest.mark.compile_heavy
@pytest.mark.parametrize(("world_size", "backend"), [(2, "inductor"), (8, "aot_eager")])
def test_simple_fsdp_steps_run_through_in_a_fake_world(world_size: int, backend: str) -> None:
    found = run_in_fake_world(STEPS, world_size, timeout=600, DT_TEST_BACKEND=backend)
    assert found["CASE"] == ["False True True", "True True True"], found
