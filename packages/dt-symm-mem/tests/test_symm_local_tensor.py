"""The six ops under torch's LocalTensorMode (one process simulating 2-8 ranks).

torch alone refuses `symm_mem` ops there; with dt-symm-mem each simulated rank gets what
a real rank gets. References are plain torch on the full tensors, built from every rank's
inputs outside the mode. Small-integer inputs keep every result exact in any order.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem.*, as in torch)
from dt_core.testing import rank_values, simulated_ranks
from test_symm_scaled import REFUSED, torch_takes_row_scales

FP8 = torch.float8_e4m3fn


def ints(shape: tuple, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, shape, generator=gen).to(dtype)


def chunk_of(full: torch.Tensor, world: int, dim: int, rank: int) -> torch.Tensor:
    return full.chunk(world, dim=dim)[rank]


def reduced(parts: list[torch.Tensor], reduce_op: str) -> torch.Tensor:
    total = torch.stack([p.double() for p in parts]).sum(0)
    return (total if reduce_op == "sum" else total / len(parts)).to(parts[0].dtype)


WORLDS = (2, 4, 8)


@pytest.mark.parametrize("world", WORLDS)
def test_fused_all_gather_matmul(world: int) -> None:
    for shape, dim, return_A in itertools.product([(3, 4), (2, 3, 4)], [0, 1, -1], [True, False]):
        dim = dim % len(shape)
        shards = [ints(shape, r) for r in range(world)]
        Bs = [
            ints((shape[-1] * (world if dim == len(shape) - 1 else 1), 5), 50 + i) for i in range(2)
        ]
        with simulated_ranks(world) as mode:
            A = mode.rank_map(lambda r: shards[r])
            got_A, got = torch.ops.symm_mem.fused_all_gather_matmul(
                A, Bs, dim, dist.group.WORLD.group_name, return_A=return_A
            )
        full = torch.cat(shards, dim=dim)
        for r in range(world):
            if return_A:
                assert torch.equal(rank_values(got_A, world)[r], full)
            else:
                assert got_A is None
            for B, out in zip(Bs, got, strict=True):
                assert torch.equal(rank_values(out, world)[r], full @ B), (shape, dim, r)


@pytest.mark.parametrize("world", WORLDS)
def test_fused_matmul_reduce_scatter_and_low_contention(world: int) -> None:
    name_cases = itertools.product(
        [(world * 2, 4), (world, 2 * world, 4)], [0, 1, -1], ["sum", "avg"]
    )
    for shape, dim, op in name_cases:
        dim = dim % len(shape)
        n = 2 * world
        As = [ints(shape, r) for r in range(world)]
        B = ints((shape[-1], n), 9)
        with simulated_ranks(world) as mode:
            got = torch.ops.symm_mem.fused_matmul_reduce_scatter(
                mode.rank_map(lambda r: As[r]), B, op, dim, dist.group.WORLD.group_name
            )
        total = reduced([a @ B for a in As], op)
        for r in range(world):
            assert torch.equal(rank_values(got, world)[r], chunk_of(total, world, dim, r))
    xs = [ints((world * 3, 2), 30 + r, torch.bfloat16) for r in range(world)]
    with simulated_ranks(world) as mode:
        name = dist.group.WORLD.group_name
        x = mode.rank_map(lambda r: xs[r])
        gathered = torch.ops.symm_mem._low_contention_all_gather(x, name)
        summed = torch.ops.symm_mem._low_contention_reduce_scatter(x, "sum", name)
    for r in range(world):
        assert torch.equal(rank_values(gathered, world)[r], torch.cat(xs))
        assert torch.equal(rank_values(summed, world)[r], chunk_of(reduced(xs, "sum"), world, 0, r))


@pytest.mark.parametrize("world", (2, 4))
def test_summed_matmuls_reduce_scatter(world: int) -> None:
    """dt-symm-mem's own op: the sum of each rank's products, reduce-scattered."""
    cases = itertools.product([(world * 2, 4), (world, 2 * world, 4)], [0, 1, -1], ["sum", "avg"])
    for shape, dim, op in cases:
        dim = dim % len(shape)
        As = [[ints(shape, 10 * t + r) for r in range(world)] for t in range(2)]
        Bs = [ints((shape[-1], 2 * world), 90 + t) for t in range(2)]
        with simulated_ranks(world) as mode:
            got = torch.ops.dt_symm_mem.fused_matmuls_reduce_scatter(
                [mode.rank_map(lambda r, t=t: As[t][r]) for t in range(2)],
                Bs,
                op,
                dim,
                dist.group.WORLD.group_name,
            )
        total = reduced([As[0][r] @ Bs[0] + As[1][r] @ Bs[1] for r in range(world)], op)
        for r in range(world):
            assert torch.equal(rank_values(got, world)[r], chunk_of(total, world, dim, r))


@pytest.mark.parametrize("world", (2, 4))
@pytest.mark.parametrize("mode_name", ["tensor", "row-sharded", "row-replicated"])
def test_scaled_variants(world: int, mode_name: str, record_property: Any) -> None:
    shape, dim = (2, 4, 16), 1
    shards = [ints(shape, r).to(FP8) for r in range(world)]
    B = ints((16, 8), 77).to(FP8).t().contiguous().t()
    full = torch.cat(shards, dim=dim)
    if mode_name == "tensor":
        scales = [torch.tensor(0.5)] * world
        full_scale = scales[0]
    elif mode_name == "row-sharded":
        scales = [torch.full((*shape[:-1], 1), 2.0 ** (r - 1)) for r in range(world)]
        full_scale = torch.cat(scales, dim=dim)
    else:
        full_scale = 2.0 ** ints((*full.shape[:-1], 1), 5).clamp(min=-1)
        scales = [full_scale] * world
    B_scale = torch.tensor(2.0) if mode_name == "tensor" else torch.full((1, 8), 0.25)
    if mode_name != "tensor" and not torch_takes_row_scales():  # torch 2.11
        record_property(
            "torch_limit",
            "dt-symm-mem's fused scaled matmuls with row-wise scales on CPU raise "
            "NotImplementedError: torch's CPU _scaled_mm takes tensor-wise scales only",
        )
        with simulated_ranks(world) as mode, pytest.raises(NotImplementedError, match=REFUSED):
            torch.ops.symm_mem.fused_all_gather_scaled_matmul(
                mode.rank_map(lambda r: shards[r]), [B], mode.rank_map(lambda r: scales[r]),
                [B_scale], dim, dist.group.WORLD.group_name, [None], [None], [torch.bfloat16],
                [False],
            )  # fmt: skip
        return
    flat_scale = full_scale if mode_name == "tensor" else full_scale.flatten(0, -2)
    want = torch._scaled_mm(
        full.flatten(0, -2), B, flat_scale, B_scale, out_dtype=torch.bfloat16
    ).unflatten(0, full.shape[:-1])
    rs_in = [ints((world * 2, 16), 40 + r).to(FP8) for r in range(world)]
    rs_want = reduced(
        [torch._scaled_mm(a, B, torch.tensor(0.5), torch.tensor(2.0), out_dtype=torch.bfloat16)
         for a in rs_in], "sum"
    )  # fmt: skip
    with simulated_ranks(world) as mode:
        name = dist.group.WORLD.group_name
        got_A, got = torch.ops.symm_mem.fused_all_gather_scaled_matmul(
            mode.rank_map(lambda r: shards[r]), [B], mode.rank_map(lambda r: scales[r]),
            [B_scale], dim, name, [None], [None], [torch.bfloat16], [False],
        )  # fmt: skip
        rs = torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(
            mode.rank_map(lambda r: rs_in[r]), B, torch.tensor(0.5), torch.tensor(2.0),
            "sum", 0, 0, name, [world * 2, 8], out_dtype=torch.bfloat16,
        )  # fmt: skip
    for r in range(world):
        assert torch.equal(rank_values(got_A, world)[r].float(), full.float())
        assert torch.equal(rank_values(got[0], world)[r], want)
        assert torch.equal(rank_values(rs, world)[r], chunk_of(rs_want, world, 0, r))


def test_bad_arguments_get_the_kernels_messages() -> None:
    with simulated_ranks(2) as mode:
        name = dist.group.WORLD.group_name
        x = mode.rank_map(lambda r: torch.ones(4, 2))
        with pytest.raises(ValueError, match="reduce_op must be sum or avg"):
            torch.ops.symm_mem._low_contention_reduce_scatter(x, "max", name)
        with pytest.raises(ValueError, match="Invalid gather_dim"):
            torch.ops.symm_mem.fused_all_gather_matmul(x, [torch.ones(2, 2)], 5, name)
        with pytest.raises(ValueError, match=r"must be divisible by the group size"):
            torch.ops.symm_mem._low_contention_reduce_scatter(
                mode.rank_map(lambda r: torch.ones(3, 2)), "sum", name
            )
        summed = torch.ops.dt_symm_mem.fused_matmuls_reduce_scatter
        B = torch.ones(2, 2)
        with pytest.raises(ValueError, match="As and Bs must be of one non-zero length"):
            summed([x], [B, B], "sum", 0, name)
        with pytest.raises(ValueError, match="every term A @ B must have the same shape"):
            summed([x, x], [B, torch.ones(2, 3)], "sum", 0, name)
        with pytest.raises(ValueError, match="every A and B must have one dtype"):
            summed([x, x], [B, B.double()], "sum", 0, name)
    # the fake kernel (what Inductor's graphs carry) checks the same
    meta = torch.ones(4, 2, device="meta")
    with pytest.raises(ValueError, match="every term A @ B must have the same shape"):
        torch.ops.dt_symm_mem.fused_matmuls_reduce_scatter(
            [meta, meta], [B.to("meta"), torch.ones(2, 3, device="meta")], "sum", 0, "0"
        )


def test_rules_leave_with_the_plugin() -> None:
    """Deactivated, torch's own refusal is back; activated again, the rules are too."""
    import dt_core

    dt_core.deactivate()
    try:
        with simulated_ranks(2) as mode:
            x = mode.rank_map(lambda r: torch.ones(2, 2))
            with pytest.raises(NotImplementedError):
                torch.ops.symm_mem._low_contention_all_gather(x, dist.group.WORLD.group_name)
    finally:
        dt_core.activate()
    with simulated_ranks(2) as mode:
        x = mode.rank_map(lambda r: torch.full((2, 2), float(r)))
        y = torch.ops.symm_mem._low_contention_all_gather(x, dist.group.WORLD.group_name)
    assert torch.equal(rank_values(y, 2)[1], torch.cat([torch.zeros(2, 2), torch.ones(2, 2)]))
