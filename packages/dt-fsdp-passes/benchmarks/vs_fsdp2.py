"""Benchmark: compiled simple_fsdp with the passes vs torch FSDP2 `fully_shard`.

    python packages/dt-fsdp-passes/benchmarks/vs_fsdp2.py [--quick] --json OUT.json

4 ranks (gloo on 127.0.0.1, one thread each). Same bias-free MLP, same batch, same SGD
step (harness.training_step); on a 1-D mesh of 4 (FSDP) and on a 2x2 dp x tp mesh
(sequence-parallel TP plan, then FSDP on dp). Variants: simple_fsdp compiled (bucketing +
overlap + dt-symm-mem fusion active) with the default settings (mode="auto": one bucket
per block, neighbours merged within the largest block; here one layer per bucket, FSDP2's
unit, since it shards each layer on its own) and with mode="size" at the 4 MB cap (the
whole 2 MiB model in one bucket: fewer collectives, more gathered at once); FSDP2 eager
and compiled.

Reports the median step time (slowest rank) and the peak memory of a steady-state step
(largest rank): the highest the bytes held by tensors allocated within one step rise,
from torch's profiler (harness.timed_steps), so malloc's page reuse, which the earlier
resident-memory growth measured, does not enter; as ratios against FSDP2 measured in
the same run.
"""

from __future__ import annotations

import json
from typing import Any

from harness import parse_args, write_json

WORLD = 4


def _build(kind: str, mesh_kind: str, width: int, depth: int) -> tuple[Any, Any]:
    import torch
    from dt_core.testing import cpu_mesh
    from dt_fsdp_passes import simple_fsdp
    from dt_fsdp_passes.models import MLP
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    model = MLP(width, depth)
    if mesh_kind == "1d":
        fsdp_mesh = cpu_mesh(WORLD)
    else:
        mesh = cpu_mesh((2, 2), ("dp", "tp"))
        fsdp_mesh = mesh["dp"]
        plan = {}
        for i in range(depth):
            plan[f"layers.{i}"] = (
                ColwiseParallel(input_layouts=Shard(0))
                if i % 2 == 0
                else RowwiseParallel(output_layouts=Shard(0))
            )
        parallelize_module(model, mesh["tp"], plan)
    if kind.startswith("simple_fsdp"):
        import dt_fsdp_passes

        dt_fsdp_passes.configure(reset=True, mode="size" if kind == "simple_fsdp_size" else "auto")
        simple_fsdp(model, fsdp_mesh)
        return model, torch.compile(model)
    for layer in model.layers:
        fully_shard(layer, mesh=fsdp_mesh)
    fully_shard(model, mesh=fsdp_mesh)
    return model, (torch.compile(model) if kind == "fsdp2_compiled" else model)


def _measure(kind: str, mesh_kind: str, width: int, depth: int, batch: int, steps: int) -> dict:
    import torch
    from harness import timed_steps, training_step

    torch.set_num_threads(1)
    torch._dynamo.reset()
    model, run = _build(kind, mesh_kind, width, depth)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width)

    return timed_steps(training_step(run, opt, x), steps, memory_steps=2)


OURS = ("simple_fsdp", "simple_fsdp_size")
BASELINES = ("fsdp2_eager", "fsdp2_compiled")
TARGETS = {"fsdp2_eager": ">= 1.3x", "fsdp2_compiled": ">= 1.0x"}


def main() -> None:
    args = parse_args(__doc__)
    from dt_core.testing import get_world, shutdown_worlds

    width, depth, batch = 256, (4 if args.quick else 8), 64
    steps = 5 if args.quick else 15
    world = get_world(WORLD)
    rows = []
    try:
        for mesh_kind in ("1d", "2x2"):
            results = {}
            for kind in OURS + BASELINES:
                per_rank = world.run(
                    _measure, kind, mesh_kind, width, depth, batch, steps, timeout=900
                )
                # The slowest rank's median step; the largest rank's peak.
                results[kind] = {
                    key: max(r[key] for r in per_rank) for key in ("median_s", "peak_step_bytes")
                }
                print(mesh_kind, kind, results[kind], flush=True)
            for ours in OURS:
                for base in BASELINES:
                    rows.append(_row(mesh_kind, ours, base, results[ours], results[base]))
    finally:
        shutdown_worlds()
    setup = {"world": WORLD, "width": width, "depth": depth, "batch_per_rank": batch}
    write_json(args.json, {"setup": setup, "rows": rows})
    for row in rows:
        print(json.dumps(row))


def _row(mesh_kind: str, ours: str, base: str, mine: dict, theirs: dict) -> dict:
    return {
        "mesh": mesh_kind,
        "variant": ours,
        "baseline": base,
        "step_ms": mine["median_s"] * 1e3,
        "baseline_step_ms": theirs["median_s"] * 1e3,
        "speedup": theirs["median_s"] / mine["median_s"],
        "target": TARGETS[base],
        "peak_step_kib": mine["peak_step_bytes"] / 1024,
        "baseline_peak_step_kib": theirs["peak_step_bytes"] / 1024,
        "memory_ratio": mine["peak_step_bytes"] / theirs["peak_step_bytes"],
        "memory_target": "<= 1.0x",
    }


if __name__ == "__main__":
    main()
