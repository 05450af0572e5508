"""Demo stage: one context-parallel causal attention step (forward + backward).

q, k, v are sequence-sharded DTensors (head-tail balanced); plain
`F.scaled_dot_product_attention(..., is_causal=True)` runs the ring algorithm. The
reference is the same step unsharded on one process; the baseline is what a user does
without the plugin: gather the whole sequence on every rank and run SDPA there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        import os

        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", dist.get_rank())))
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _gather_baseline(local: list[torch.Tensor], ranks: int, device: torch.device) -> float:
    """Without the plugin: all-gather q/k/v and run SDPA on the whole sequence everywhere."""
    dist.barrier()
    start = time.perf_counter()
    full = []
    for t in local:
        parts = [torch.empty_like(t) for _ in range(ranks)]
        dist.all_gather(parts, t.detach())
        full.append(torch.cat(parts, 2).requires_grad_())
    # The gathered order is head-tail permuted; the cost, not the mask, is the point here.
    y = F.scaled_dot_product_attention(full[0], full[1], full[2], is_causal=True)
    y.sum().backward()
    _sync(device)
    return time.perf_counter() - start


def _silent(text: str, note: str = "") -> None:
    """The phases of a stage run without the demo's console."""


def run_stage(small: bool = True, progress: Callable[..., None] = _silent) -> dict:
    """The demo's attention stage; `progress(text, note=...)` is told each phase as it
    starts, for the demo's console."""
    from dt_core.testing.demo_stage import stage_result
    from torch.distributed.device_mesh import init_device_mesh

    import dt_cp
    from dt_cp import sharding

    device = _device()
    ranks = dist.get_world_size()
    mesh = init_device_mesh(device.type, (ranks,))
    batch, heads, seq, dim = (1, 4, 512, 32) if small else (1, 8, 8192, 64)
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (
        torch.randn(batch, heads, seq, dim, generator=gen, dtype=torch.float32).to(device)
        for _ in range(4)
    )

    # Reference: the same step on one process, unsharded.
    progress(f"causal attention over {seq} tokens unsharded on one process (the reference)")
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    out_ref = F.scaled_dot_product_attention(ref[0], ref[1], ref[2], is_causal=True)
    (out_ref * g).sum().backward()

    progress(f"the same attention sequence-sharded over {ranks} ranks (ring, head-tail)")
    with dt_cp.settings(algorithm="ring", load_balancer="head_tail"):
        sq, sk, sv = (sharding.shard_sequence(t, mesh, 2) for t in (q, k, v))
        for t in (sq, sk, sv):
            t.requires_grad_()
        sharded = [sq, sk, sv]
        g_sharded = sharding.shard_sequence(g, mesh, 2)
        F.scaled_dot_product_attention(sq, sk, sv, is_causal=True).sum().backward()  # warm-up
        for t in sharded:
            t.grad = None
        _sync(device)
        dist.barrier()
        start = time.perf_counter()
        out = cast(DTensor, F.scaled_dot_product_attention(sq, sk, sv, is_causal=True))
        (out * g_sharded).sum().backward()
        _sync(device)
        elapsed = time.perf_counter() - start
        grads = [cast(DTensor, s.grad) for s in sharded]  # set by the backward above
        got = [sharding.unshard_sequence(t, 2) for t in (out, *grads)]
    want = [out_ref.detach(), *(cast(torch.Tensor, r.grad) for r in ref)]
    error = max((a - b).abs().max().item() for a, b in zip(got, want, strict=True))

    # Baseline: gather the sequence to every rank, run unsharded SDPA there.
    progress("the baseline without dt-cp: gather the sequence, attention on every rank")
    local = [s.to_local().detach().clone().requires_grad_() for s in sharded]
    for _ in range(2):  # the first round warms up, the second is timed
        baseline = _gather_baseline(local, ranks, device)

    block = batch * heads * (seq // ranks) * dim * 4  # bytes of one K (or V) shard
    # Ring: forward passes K+V P-1 times; backward passes K+V P-1 times and dK+dV P times.
    return stage_result(
        "context-parallel causal SDPA (ring, head-tail balanced), fwd+bwd",
        error=error,
        tolerance=1e-4,
        times=(elapsed, baseline),
        bytes_communicated=2 * block * ((ranks - 1) * 2 + ranks),
        size=f"B={batch} H={heads} S={seq} D={dim}",
        details=(
            f"B={batch} H={heads} S={seq} D={dim} fp32 on {device.type}; error is max over "
            "out/dq/dk/dv vs unsharded SDPA; baseline all-gathers q/k/v and runs full SDPA "
            "on every rank"
        ),
    )
