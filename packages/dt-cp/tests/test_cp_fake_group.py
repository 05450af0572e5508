"""Context-parallel SDPA and flex attention under torch's fake backend (a dry run: one
process standing in for a world): nothing arrives from the absent peers, and the merges
must stay finite (receive buffers were uninitialized memory, and NaN there made NaN losses)."""

from __future__ import annotations

import pytest
from dt_core.testing.scripts import run_in_fake_world

CP_SDPA = """
import os

import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from dt_cp import settings

mesh = init_device_mesh("cpu", (dist.get_world_size(),))
B, H, S, D = 2, 2, 16, 8  # S: this rank's rows
backend = os.environ["DT_TEST_BACKEND"]  # for the compiled cases


def poison():
    # Freed memory full of NaN, as a framework's earlier work may leave it: uninitialized
    # buffers then hold NaN, so a merge that reads them shows it.
    held = [torch.full((n,), float("nan")) for n in (B * H * S * D, 1024, 256) for _ in range(16)]
    del held


def finite(t):
    return bool(torch.isfinite(t.to_local()).all())


for compiled in (False, True):
    for algorithm in ("ring", "allgather"):
        for causal in (False, True):
            if compiled and algorithm == "allgather":
                continue  # traced, both are the same gather + reduce-scatter
            torch.manual_seed(0)
            q, k, v = (
                DTensor.from_local(torch.randn(B, H, S, D), mesh, [Shard(2)]).requires_grad_()
                for _ in "qkv"
            )

            def attend(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            fn = torch.compile(attend, backend=backend, fullgraph=True) if compiled else attend
            with settings(algorithm=algorithm):
                poison()
                out = fn(q, k, v)
                poison()
                out.to_local().sum().backward()
            shape = tuple(out.to_local().shape)
            grads = all(finite(t.grad) for t in (q, k, v))
            print("CASE", compiled, algorithm, causal, shape, finite(out), grads)

# flex attention: dt-cp's own front end and torch's (its HOP on DTensors), a causal
# sliding window given as a BlockMask over the whole (world x S) sequence
import dt_cp
from torch.nn.attention.flex_attention import flex_attention as torch_flex


def window(b, h, qi, ki):
    return (ki <= qi) & (qi - ki < 24)


n = S * dist.get_world_size()
block_mask = dt_cp.create_block_mask(window, None, None, n, n)
for front in ("dt_cp", "torch"):
    for algorithm in ("ring", "allgather"):
        torch.manual_seed(0)
        q, k, v = (
            DTensor.from_local(torch.randn(B, H, S, D), mesh, [Shard(2)]).requires_grad_()
            for _ in "qkv"
        )
        flex = dt_cp.flex_attention if front == "dt_cp" else torch_flex
        with settings(algorithm=algorithm):
            poison()
            out = flex(q, k, v, block_mask=block_mask)
            poison()
            out.to_local().sum().backward()
        grads = all(finite(t.grad) for t in (q, k, v))
        print("FLEX", front, algorithm, tuple(out.to_local().shape), finite(out), grads)
"""


# Inductor at 2; at 8 the ring's eight steps through aot_eager (the same traced graph,
# without Inductor's C++ code: 61 s of the cell on 2 cores, cold).
@pytest.mark.compile_heavy
@pytest.mark.parametrize(("world_size", "backend"), [(2, "inductor"), (8, "aot_eager")])
def test_cp_sdpa_forward_and_backward_are_finite(world_size: int, backend: str) -> None:
    found = run_in_fake_world(CP_SDPA, world_size, timeout=600, DT_TEST_BACKEND=backend)
    cases = [
        f"{compiled} {algorithm} {causal} (2, 2, 16, 8) True True"
        for compiled in (False, True)
        for algorithm in ("ring", "allgather")
        for causal in (False, True)
        if not (compiled and algorithm == "allgather")
    ]
    assert found["CASE"] == cases, found
    assert found["FLEX"] == [
        f"{front} {algorithm} (2, 2, 16, 8) True True"
        for front in ("dt_cp", "torch")
        for algorithm in ("ring", "allgather")
    ], found


UNEVEN = """
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from dt_cp import settings

mesh = init_device_mesh("cpu", (dist.get_world_size(),))
for algorithm in ("ring", "allgather"):
    for compiled in (False, True):
        q, k, v = (
            # the local chunk (src_data_rank=None): a fake world's scatter writes nothing
            # before torch 2.13, so rank 0's data would be left unset
            distribute_tensor(
                torch.randn(2, 2, 16, 8), mesh, [Shard(2)], src_data_rank=None
            ).requires_grad_()
            for _ in "qkv"
        )

        def attend(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        fn = torch.compile(attend, fullgraph=True) if compiled else attend
        with settings(algorithm=algorithm):
            out = fn(q, k, v)
            out.to_local().sum().backward()
        grads = all(bool(torch.isfinite(t.grad.to_local()).all()) for t in (q, k, v))
        finite = bool(torch.isfinite(out.to_local()).all())
        print("CASE", algorithm, compiled, tuple(out.to_local().shape), finite, grads)
"""


@pytest.mark.compile_heavy
def test_a_sequence_the_fake_world_does_not_divide_runs_through() -> None:
    """16 positions over a fake world of 3: rank 0 holds 6 (uneven shards, as on real
    ranks), forward and backward finite, eager and compiled."""
    found = run_in_fake_world(UNEVEN, 3, timeout=600)
    assert found["CASE"] == [
        f"{algorithm} {compiled} (2, 2, 6, 8) True True"
        for algorithm in ("ring", "allgather")
        for compiled in (False, True)
    ], found
