"""dt-fsdp-passes memory benchmark: per-rank peak of a training step as ranks grow, P = 1, 2, 4, 8.

    python packages/dt-fsdp-passes/benchmarks/memory.py [--quick] --json OUT.json

A fixed whole problem: 8 x Linear(1024, 1024) (no bias, ReLU between: models.MLP) fp32,
Adam, a global batch of 64 split across the ranks (64/P rows each); one step is forward,
backward, `opt.step()`, `opt.zero_grad()`, after one unmeasured step that creates Adam's
state. `simple_fsdp` with its defaults (reshard after forward), eager; torch's FSDP2
(`fully_shard` per layer, then the root, as vs_fsdp2.py) on the same job. Each P runs in
fresh spawned processes (gloo on 127.0.0.1, one thread each).

Memory is counted in tensor allocations (dt_core.testing.memory): what a rank holds
before the step (parameter shards, Adam's state, its batch) plus the peak of what the
step allocates (gradients, gathered weights, activations, the optimizer's temporaries),
from torch's profiler memory view, largest rank. The baseline is one process training
the plain model on the whole batch. The floor at P is the larger of two moments any FSDP
goes through: the optimizer step, one process's peak over P (parameters, gradients, Adam
state and its temporaries sharded; activations are 64/P rows); and the first layer's
backward, what one process holds between steps over P plus every gradient's shard, plus
that layer's gathered weight and its full gradient before the reduce-scatter (2 x 4 MiB).
"""

from __future__ import annotations

import argparse
from typing import Any

WIDTH, DEPTH, BATCH = 1024, 8, 64


def _train(kind: str, width: int, depth: int) -> dict[str, int]:
    """On every rank (or the one process, kind "plain"): build, one unmeasured step, one
    measured step."""
    import torch
    import torch.distributed as dist
    from dt_core.testing import cpu_mesh
    from dt_core.testing.memory import measure_step
    from dt_fsdp_passes.models import MLP

    torch.set_num_threads(1)
    torch.manual_seed(0)
    ranks = dist.get_world_size() if kind != "plain" else 1
    model = MLP(width, depth)
    if kind == "simple_fsdp":
        import dt_fsdp_passes

        dt_fsdp_passes.configure(reset=True)
        model = dt_fsdp_passes.simple_fsdp(model, cpu_mesh(ranks))
    elif kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        mesh = cpu_mesh(ranks)
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH // ranks, width)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    step()  # Adam's state is created here: part of what every later step starts with
    if kind != "plain":
        dist.barrier()
    return measure_step(step)


def layer_bytes(width: int) -> int:
    return width * width * 4


def run(quick: bool) -> dict[str, Any]:
    from dt_core.testing import World
    from dt_core.testing.memory import MiB, scaling_report

    width, depth = (256, 4) if quick else (WIDTH, DEPTH)
    ranks = [2, 4] if quick else [2, 4, 8]
    with World(1) as one:
        reference = one.run(_train, "plain", width, depth, timeout=900)[0]
    measured: dict[str, dict[int, float]] = {"simple_fsdp": {}, "fsdp2": {}}
    rss: dict[int, float] = {}
    for p in ranks:
        for kind in measured:
            with World(p) as world:
                per_rank = world.run(_train, kind, width, depth, timeout=900)
            measured[kind][p] = max(r["peak"] for r in per_rank)
            if kind == "simple_fsdp":
                rss[p] = max(r["rss_rise"] for r in per_rank)
            print(f"{kind} P={p}: {measured[kind][p] / MiB:.1f} MiB per rank", flush=True)
    grads = depth * layer_bytes(width)
    floors = {
        p: max(reference["peak"] / p, (reference["held"] + grads) / p + 2 * layer_bytes(width))
        for p in ranks
    }
    problem = f"{depth} x Linear({width}, {width}) fp32 + Adam, batch {BATCH}"
    rows, series = scaling_report(
        "dt-fsdp-passes",
        problem,
        reference["peak"],
        measured["simple_fsdp"],
        floors,
        floor_note=(
            "simple_fsdp eager, defaults; floor: max(one process's peak / P, (its state + "
            "gradients) / P + a gathered layer and its full gradient); RSS high-water rise "
            "per rank: "
            + ", ".join(f"P={p} {rss[p] / MiB:.0f} MiB" for p in ranks)
            + f" (one process {reference['rss_rise'] / MiB:.0f} MiB)"
        ),
        targets={4: "<= 0.33"},
        others={"torch FSDP2 (fully_shard per layer)": measured["fsdp2"]},
        fits={
            "size": width,
            "what": f"model width ({depth} square linears, Adam)",
            "unit": "features",
            "exponent": 2,
            "multiple": 64,
            "budget": 1024 * MiB,
        },
    )
    return {"package": "dt-fsdp-passes", "suite": "memory", "rows": rows, "series": series}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 x Linear(256), P = 2, 4")
    parser.add_argument("--json", required=True, help="where to write the results")
    args = parser.parse_args()
    result = run(args.quick)
    from dt_core.testing.benchmarks import write_report

    write_report(args.json, "dt-fsdp-passes", result["rows"], result["series"])


if __name__ == "__main__":
    main()
