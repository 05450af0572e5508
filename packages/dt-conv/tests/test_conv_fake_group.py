"""Sharded convolutions under torch's fake backend (a dry run: one process standing in for
a world) run through, forward and backward, eager and compiled, with finite results: the
halos absent peers would send are zeros (the fake backend rejected the all-to-all of a
rank that receives halo rows but sends none, as in a valid or strided conv)."""

from __future__ import annotations

import pytest
from dt_core.testing.scripts import run_in_fake_world

CONVS = """
import os

import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

mesh = init_device_mesh("cpu", (dist.get_world_size(),))
NETS = {
    "same": lambda x, w: F.conv2d(F.relu(F.conv2d(x, w, padding=1)), w, padding=2, dilation=2),
    "valid": lambda x, w: F.conv2d(x, w),
    "strided": lambda x, w: F.max_pool2d(F.conv2d(x, w, stride=2, padding=1), 3, 2, 1),
}


def poison():
    # Freed memory full of NaN: uninitialized halos would then show as NaN.
    held = [torch.full((n,), float("nan")) for n in (1024, 256, 64) for _ in range(16)]
    del held


def finite(t):
    return bool(torch.isfinite(t.to_local()).all())


for compiled in (False, True):
    for name, net in NETS.items():
        torch.manual_seed(0)
        x = DTensor.from_local(torch.randn(2, 4, 8, 16), mesh, [Shard(2)]).requires_grad_()
        w = DTensor.from_local(torch.randn(4, 4, 3, 3), mesh, [Replicate()]).requires_grad_()
        # DT_TEST_BACKEND compiles the net with halos on both sides; the others, whose
        # absent peers' halos are the point, trace the same handlers through aot_eager
        backend = os.environ["DT_TEST_BACKEND"] if name == "same" else "aot_eager"
        fn = torch.compile(net, backend=backend, fullgraph=True) if compiled else net
        poison()
        out = fn(x, w)
        poison()
        out.to_local().sum().backward()
        shape = tuple(out.to_local().shape)
        print("CASE", compiled, name, shape, finite(out), finite(x.grad), finite(w.grad))
"""


def shapes(world: int) -> dict[str, str]:
    """This rank's (rank 0's) output: 8 of the 8 * world input rows; a valid conv's
    8 * world - 2 output rows are sharded as torch chunks them; stride 2 then pool 3/2/1
    halve twice."""
    valid_rows = -(-(8 * world - 2) // world)
    return {
        "same": "(2, 4, 8, 16)",
        "valid": f"(2, 4, {valid_rows}, 14)",
        "strided": "(2, 4, 2, 4)",
    }


# Inductor once (world 2, the "same" net); world 8 through aot_eager, which traces the same
# handlers and collectives: a cold Inductor compile of the three nets cost CI over a
# minute per world.
@pytest.mark.parametrize(
    ("world_size", "backend"),
    [pytest.param(2, "inductor", marks=pytest.mark.compile_heavy), (8, "aot_eager")],
)
def test_sharded_conv_forward_and_backward_run_through(world_size: int, backend: str) -> None:
    found = run_in_fake_world(CONVS, world_size, timeout=600, DT_TEST_BACKEND=backend)
    cases = [
        f"{compiled} {name} {shape} True True True"
        for compiled in (False, True)
        for name, shape in shapes(world_size).items()
    ]
    assert found["CASE"] == cases, found
