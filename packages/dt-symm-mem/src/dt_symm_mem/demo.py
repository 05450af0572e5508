"""Demo stage: a tensor-parallel MLP block with fused all-gather-matmul (sequence-parallel
input gathered into a column-parallel layer) and fused matmul-reduce-scatter (row-parallel
layer back to sequence-parallel), against gloo all_gather + mm / mm + reduce_scatter, and
checked against the unsharded block on one process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from dt_symm_mem.collectives import all_gather_single, reduce_scatter_single


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        import os

        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _timed(fn: Any, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _silent(text: str, note: str = "") -> None:
    """The phases of a stage run without the demo's console."""


def run_stage(small: bool = True, progress: Callable[..., None] = _silent) -> dict:
    """One TP MLP step (x -> relu(x W1) W2) with the plugin, unsharded, and with gloo;
    `progress(text, note=...)` is told each phase as it starts, for the demo's console."""
    from dt_core.testing.demo_stage import stage_result

    import dt_symm_mem

    rank, world = dist.get_rank(), dist.get_world_size()
    device = _device()
    tokens, hidden, ffn = (
        (64 * world, 256, 128 * world)
        if small
        else (
            512 * world,
            1024,
            512 * world,
        )
    )
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=gen, dtype=torch.float64)
    W1 = torch.randn(hidden, ffn, generator=gen, dtype=torch.float64) / hidden**0.5
    W2 = torch.randn(ffn, hidden, generator=gen, dtype=torch.float64) / ffn**0.5
    progress(f"the MLP block on {tokens}x{hidden} unsharded on one process (the reference)")
    reference = (torch.relu(x @ W1) @ W2).chunk(world)[rank]  # unsharded, one process

    dtype = torch.float32
    x_shard = x.chunk(world)[rank].to(device, dtype)  # sequence-parallel input
    W1_shard = W1.chunk(world, dim=1)[rank].to(device, dtype).contiguous()  # column-parallel
    W2_shard = W2.chunk(world, dim=0)[rank].to(device, dtype).contiguous()  # row-parallel
    group = dist.group.WORLD

    def with_plugin() -> torch.Tensor:
        _, (h,) = dt_symm_mem.fused_all_gather_matmul(x_shard, [W1_shard], 0, group, return_A=False)
        return dt_symm_mem.fused_matmul_reduce_scatter(torch.relu(h), W2_shard, "sum", 0, group)

    x_full = torch.empty(tokens, hidden, device=device, dtype=dtype)
    y_shard = torch.empty(tokens // world, hidden, device=device, dtype=dtype)

    def without_plugin() -> torch.Tensor:
        all_gather_single(x_full, x_shard, group=group)
        partial = torch.relu(x_full @ W1_shard) @ W2_shard
        reduce_scatter_single(y_shard, partial, group=group)
        return y_shard

    progress(f"fused all-gather-matmul and matmul-reduce-scatter over {world} ranks")
    error = float((with_plugin().double().cpu() - reference).abs().max())
    repeats = 3 if small else 5
    progress(f"timing {repeats} steps with the fused ops and with gather + matmul")
    times = (_timed(with_plugin, repeats), _timed(without_plugin, repeats))
    elem = torch.empty((), dtype=dtype).element_size()
    # all-gather receives (world-1) shards of x; reduce-scatter sends (world-1) chunks
    return stage_result(
        "fused all-gather-matmul + matmul-reduce-scatter (TP MLP, shared memory)",
        error=error,
        tolerance=1e-4,
        times=times,
        bytes_communicated=2 * (world - 1) * (tokens // world) * hidden * elem,
        size=f"x {tokens}x{hidden}, W1 {hidden}x{ffn}",
        details=(
            f"x {tokens}x{hidden} sequence-sharded, W1 {hidden}x{ffn} column-parallel, "
            f"W2 {ffn}x{hidden} row-parallel, fp32 vs float64 unsharded reference; baseline "
            f"{dist.get_backend()} all_gather + mm and mm + reduce_scatter"
        ),
    )
