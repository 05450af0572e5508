"""Demo stage: a compiled SimpleFSDP training step with bucketed collectives.

Compared with the same compiled step unbucketed (what torch gives without the plugin's
passes: one all-gather / reduce-scatter per parameter) for time, and with the unsharded
model's step on one process for values.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        import os

        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", dist.get_rank())))
    return torch.device("cpu")


_INDUCTOR_NOTE = "slow on a first run on this machine; Inductor caches its code for the next run"


def _silent(text: str, note: str = "") -> None:
    """The phases of a stage run without the demo's console."""


def _train(
    reference: torch.nn.Module, mode: str, batches: list, device: torch.device, lr: float
) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    """Compile and train a sharded copy of `reference`; return step times, losses, state."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh

    import dt_fsdp_passes

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.compiler.reset()
    dt_fsdp_passes.configure(mode=mode)
    mesh = init_device_mesh(device.type, (world,))
    model = dt_fsdp_passes.simple_fsdp(copy.deepcopy(reference).to(device), mesh)
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    times: list[float] = []
    losses: list[float] = []
    try:
        for x, y in batches:
            xs, ys = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
            dist.barrier()
            start = time.perf_counter()
            loss = ((compiled(xs) - ys) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            dist.barrier()
            times.append(time.perf_counter() - start)
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(mean.item() / world)
    finally:
        dt_fsdp_passes.configure(reset=True)
    return times, losses, dt_fsdp_passes.gathered_state(model)


def run_stage(small: bool = True, progress: Callable[..., None] = _silent) -> dict:
    """Run on every rank of an initialised process group; returns the same dict on each.
    `progress(text, note=...)` is told each phase as it starts, for the demo's console."""
    from dt_fsdp_passes.models import MLP
    from dt_fsdp_passes.passes import pass_log

    device = _device()
    world = dist.get_world_size()
    width, depth, steps = (16, 4, 3) if small else (64, 24, 12)
    lr = 0.05
    torch.manual_seed(0)
    reference = MLP(width, depth)
    batches = [(torch.randn(4 * world, width), torch.randn(4 * world, width)) for _ in range(steps)]

    log_start = len(pass_log())
    what = f"compiling and training a {depth}-layer MLP under SimpleFSDP"
    progress(f"{what}, collectives bucketed", note=_INDUCTOR_NOTE)
    times, losses, state = _train(reference, "size", batches, device, lr)
    log = [r for r in pass_log()[log_start:] if r["pass"] == "bucket"]
    progress(f"{what}, unbucketed (the baseline without the passes)")
    base_times, _, _ = _train(reference, "off", batches, device, lr)
    progress("the same steps unsharded on one process (the reference)")

    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr)
    errors = []
    for (x, y), loss in zip(batches, losses, strict=True):
        ref_loss = ((reference(x) - y) ** 2).mean()
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        errors.append(abs(loss - ref_loss.item()))
    for name, p in reference.named_parameters():
        errors.append((state[name].cpu() - p.detach()).abs().max().item())

    # Step 0 compiles; the others are timed. Same numbers on every rank: take the max.
    summary = torch.tensor(
        [max(errors), statistics.median(times[1:]), statistics.median(base_times[1:])],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(summary, op=dist.ReduceOp.MAX)
    max_error, time_s, baseline_s = summary.tolist()
    tolerance = 1e-5 if device.type == "cpu" else 1e-3
    param_bytes = sum(p.numel() * p.element_size() for p in reference.parameters())
    # Per rank per step: gather forward, gather again in backward (reshard), reduce-scatter.
    communicated = int(3 * param_bytes * (world - 1) / world)
    after = [(r["all_gather_total_after"], r["reduce_scatter_total_after"]) for r in log]
    before = [(r["all_gather_total_before"], r["reduce_scatter_total_before"]) for r in log]
    counts = (
        f"collectives per graph (all_gather, reduce_scatter) bucketed: {after}, "
        f"unbucketed: {before}"
        if log
        else "graphs served from Inductor's FX graph cache (passes ran in an earlier compile)"
    )
    return {
        "feature": "SimpleFSDP compiled step with bucketed + overlapped FSDP collectives",
        "ranks": world,
        "max_error": max_error,
        "tolerance": tolerance,
        "ok": bool(max_error <= tolerance),
        "time_s": time_s,
        "baseline_time_s": baseline_s,
        "bytes_communicated": communicated,
        "size": f"{depth}-layer MLP width {width}, batch {4 * world}",
        "details": f"{depth}-layer MLP width {width} on {device.type}; baseline: same compiled "
        f"step unbucketed (mode='off'); {counts}",
    }


def running_mean_batches(
    steps: int, batch: int, seq: int, dim: int, seed: int = 1
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A learnable sequence task: each position's target is the mean of the inputs up to
    it. It needs causal attention across the whole sequence, so under context
    parallelism every rank's targets depend on tokens another rank holds; fresh random
    inputs every step, so a falling loss means the block learned the rule."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.arange(1, seq + 1, dtype=torch.float32).view(1, seq, 1)
    batches = []
    for _ in range(steps):
        x = torch.randn(batch, seq, dim, generator=gen)
        batches.append((x, x.cumsum(1) / counts))
    return batches


def run_stack_stage(small: bool = True, progress: Callable[..., None] = _silent) -> dict:
    """FSDP x TP x CP, compiled, on a multiple of 4 ranks: loss curve vs one process.

    Mesh (dp, cp, tp) = (world / 4, 2, 2): heads over tp (Colwise q/k/v/fc1, Rowwise
    wo/fc2), sequence over cp (context-parallel attention, dt-cp), simple_fsdp over the
    flattened dp x cp mesh (torchtitan's recipe), the whole block under torch.compile
    with the bucketing passes. It learns `running_mean_batches` with Adam, so the loss
    falls step by step, sharded exactly as on one process.
    """
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        RowwiseParallel,
        parallelize_module,
    )

    import dt_fsdp_passes
    from dt_fsdp_passes.models import ParallelBlock

    world = dist.get_world_size()
    if world % 4:
        raise ValueError(f"the FSDP x TP x CP stage needs a multiple of 4 ranks, got {world}")
    device = _device()
    dim, heads, seq, steps, lr = (16, 4, 16, 8, 0.02) if small else (64, 8, 64, 16, 0.01)
    torch.manual_seed(0)
    reference = ParallelBlock(dim, heads)
    batches = running_mean_batches(steps, world // 2, seq, dim)
    mesh = init_device_mesh(device.type, (world // 4, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
    from dt_fsdp_passes.compat import flatten_mesh

    fsdp_mesh = flatten_mesh(mesh["dp", "cp"], "dp_cp_demo_stack")
    torch.compiler.reset()
    model = copy.deepcopy(reference).to(device)
    plan: dict[str, ParallelStyle] = {n: ColwiseParallel() for n in ("wq", "wk", "wv", "fc1")}
    plan.update({n: RowwiseParallel() for n in ("wo", "fc2")})
    parallelize_module(model, mesh["tp"], plan)
    dt_fsdp_passes.simple_fsdp(model, fsdp_mesh)
    compiled = torch.compile(model)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    dp, cp = mesh["dp"].get_local_rank(), mesh["cp"].get_local_rank()
    losses, times = [], []
    progress(
        f"training the FSDP x TP x CP block {steps} steps; the first compiles it with Inductor",
        note=_INDUCTOR_NOTE,
    )
    for x, y in batches:
        xs, ys = (t.chunk(world // 4)[dp].chunk(2, dim=1)[cp].to(device) for t in (x, y))
        dist.barrier()
        start = time.perf_counter()
        loss = ((compiled(xs, mesh["cp"], 2) - ys) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # tp ranks hold the same loss: average over all ranks
        losses.append(mean.item() / world)
    progress("the same steps unsharded on one process (the reference)")
    ref_losses = []
    ref_opt = torch.optim.Adam(reference.parameters(), lr=lr)
    for x, y in batches:
        ref_loss = ((reference(x) - y) ** 2).mean()
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(ref_loss.item())
    state = dt_fsdp_passes.gathered_state(model)
    errors = [abs(a - b) for a, b in zip(losses, ref_losses, strict=True)]
    errors += [
        (state[n].cpu() - p.detach()).abs().max().item() for n, p in reference.named_parameters()
    ]
    summary = torch.tensor(
        [max(errors), statistics.median(times[1:])], dtype=torch.float64, device=device
    )
    dist.all_reduce(summary, op=dist.ReduceOp.MAX)
    tolerance = 1e-5 if device.type == "cpu" else 1e-3
    curve = ", ".join(f"{a:.5f}/{b:.5f}" for a, b in zip(losses, ref_losses, strict=True))
    mesh_shape = f"mesh (dp, cp, tp) = ({world // 4}, 2, 2)"
    return {
        "feature": "FSDP x TP x CP block, compiled: loss curve equals one process",
        "ranks": world,
        "max_error": float(summary[0]),
        "tolerance": tolerance,
        "ok": bool(summary[0] <= tolerance),
        "time_s": float(summary[1]),
        "losses": losses,
        "reference_losses": ref_losses,
        "size": f"{mesh_shape}, dim {dim}, {heads} heads, seq {seq}, batch {world // 2}, "
        f"Adam lr {lr}",
        "details": f"{mesh_shape}; attention + MLP block, dim {dim}, seq {seq}, learning the "
        f"running mean of its inputs; loss per step sharded/one process: {curve}",
    }


__all__: list[Any] = ["run_stack_stage", "run_stage"]
