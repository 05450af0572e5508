"""Under torch's fake backend (one process standing in for a world: dry runs) the fused
ops take the group's ordinary collectives: no shared-memory workspace is set up, as it
would wait for peers that do not exist (SymmMemTimeoutError after the timeout)."""

from __future__ import annotations

import pytest
from dt_core.testing.scripts import run_in_fake_world

# A regression waits this long for an absent peer, then raises SymmMemTimeoutError: well
# inside the subprocess timeout, so the test fails with the error, not a hang. (No timed
# assertion: the first backward compiles, which a slow machine may take seconds over.)
PEER_TIMEOUT_S = "20"

ASYNC_TP_MLP = """
import torch._inductor.config as inductor_config
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from dt_symm_mem import ops, workspace

world = dist.get_world_size()
inductor_config._micro_pipeline_tp = True
mesh = init_device_mesh("cpu", (world,))
model = nn.Sequential(nn.Linear(16, 32, bias=False), nn.ReLU(), nn.Linear(32, 16, bias=False))
plan = {
    "0": ColwiseParallel(input_layouts=Shard(0)),
    "2": RowwiseParallel(output_layouts=Shard(0)),
}
parallelize_module(model, mesh, plan)
compiled = torch.compile(model, fullgraph=True)
x = torch.randn(4, 16, requires_grad=True)  # this rank's rows (Shard(0) input)
out = compiled(x)
out = compiled(x)
out.sum().backward()
print("OUT", tuple(out.shape))
print("GRAD", tuple(x.grad.shape))
print("CALLS", ops.counters.get("fused_all_gather_matmul"),
      ops.counters.get("fused_matmul_reduce_scatter"))
print("SEGMENTS", ops.counters.get("workspace_segments"))
print("REASON", workspace.fallback_reason(mesh.get_group()) == workspace.FAKE_GROUP_REASON)
"""


@pytest.mark.compile_heavy
@pytest.mark.parametrize("world_size", [2, 8])
def test_compiled_async_tp_mlp_runs_through(world_size: int) -> None:
    found = run_in_fake_world(
        ASYNC_TP_MLP, world_size, timeout=300, DT_SYMM_MEM_TIMEOUT=PEER_TIMEOUT_S
    )
    # Rows: this rank's 4 gathered from the world, scattered back; 16 output features.
    # (Shapes only: the values of a fake world are arbitrary. Before 2.13 the fake
    # backend leaves the output buffers of Inductor's compiled collectives unwritten.)
    assert found["OUT"] == ["(4, 16)"], found
    assert found["GRAD"] == ["(4, 16)"], found
    # Fused (the micro-pipeline pass fired) and run twice forward, twice in backward...
    ag, rs = (float(n) for n in found["CALLS"][0].split())
    assert ag >= 2 and rs >= 2, found
    # ...with no shared-memory workspace ever created.
    assert found["SEGMENTS"] == ["0"], found
    assert found["REASON"] == ["True"], found


EAGER_OPS = """
import torch.distributed._symmetric_memory  # defines torch.ops.symm_mem.*
from dt_symm_mem import ops

world = dist.get_world_size()
name = dist.group.WORLD.group_name
sm = torch.ops.symm_mem
A = torch.randn(3, 8)
B = torch.randn(8, 5)
gathered, (ag,) = sm.fused_all_gather_matmul(A, [B], 0, name)
print("AG", tuple(gathered.shape), tuple(ag.shape), bool(torch.isfinite(ag).all()))
rs = sm.fused_matmul_reduce_scatter(torch.randn(2 * world, 8), B, "sum", 0, name)
print("RS", tuple(rs.shape), bool(torch.isfinite(rs).all()))
low = sm._low_contention_all_gather(A, name)
print("LOW", tuple(low.shape), bool(torch.isfinite(low).all()))
print("SEGMENTS", ops.counters.get("workspace_segments"))
"""


@pytest.mark.parametrize("world_size", [2, 8])
def test_eager_fused_ops_run_through(world_size: int) -> None:
    found = run_in_fake_world(
        EAGER_OPS, world_size, timeout=120, DT_SYMM_MEM_TIMEOUT=PEER_TIMEOUT_S
    )
    w = world_size
    assert found["AG"] == [f"({3 * w}, 8) ({3 * w}, 5) True"], found
    assert found["RS"] == ["(2, 5) True"], found
    assert found["LOW"] == [f"({3 * w}, 8) True"], found
    assert found["SEGMENTS"] == ["0"], found
