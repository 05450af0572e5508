"""dt-fsdp-passes memory benchmark: per-rank peak of a training step as ranks grow, P = 1, 2, 4, 8.

    python packages/dt-fsdp-passes/benchmarks/memory.py [--quick] --json OUT.json

A fixed whole problem: 8 x Linear(1024, 1024) (no bias, ReLU between: models.MLP) fp32,
Adam, a global batch of 64 split across the ranks (64/P rows each); one step is forward,
backward, `opt.step()`, `opt.zero_grad()`, after one unmeasured step that creates Adam's
state. `simple_fsdp` with its defaults (reshard after forward), eager; torch's FSDP2
(`fully_shard` per layer, then the root, as vs_fsdp2.py) on the same job. Each P runs in
fresh spawned processes (gloo on 127.0.0.1, one thread each).

A rank's peak (dt_core.testing.memory) is the tensors it holds before the step (parameter
shards, Adam's state, its batch) plus its resident set's rise during the step (gradients,
gathered weights, activations, the optimizer's temporaries, gloo's copies), every block of
64 KiB or more mapped alone; largest rank. The baseline is one process training
the plain model on the whole batch. The floor at P is the larger of two moments any FSDP
goes through: the optimizer step, one process's peak over P (parameters, gradients, Adam
state and its temporaries sharded; activations are 64/P rows); and the backward of the
second layer, the last that needs its gathered weight (for its input's gradient; the first
layer's input needs none): what one process holds between steps over P, the gradient
shards of the six layers after it and its own reduce-scatter output (7 shards), its
gathered weight and its full gradient before the reduce-scatter (2 x 4 MiB).
"""

from __future__ import annotations

from typing import Any

WIDTH, DEPTH, BATCH = 1024, 8, 64


def _train(kind: str, width: int, depth: int) -> dict[str, int]:
    """On every rank (or the one process, kind "plain"): build, then `measure_step`."""
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

    if kind != "plain":
        dist.barrier()
    return measure_step(step)  # its unmeasured first step creates Adam's state


def layer_bytes(width: int) -> int:
    return width * width * 4


def run(quick: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from dt_core.testing.memory import Fits, measure_one_process, measure_ranks, measured_report

    width, depth = (256, 4) if quick else (WIDTH, DEPTH)
    ranks = [2, 4] if quick else [2, 4, 8]
    reference = measure_one_process(_train, "plain", width, depth)
    ours = measure_ranks(_train, ranks, "simple_fsdp", width, depth)
    fsdp2 = measure_ranks(_train, ranks, "fsdp2", width, depth)
    floors = {
        p: max(
            reference["peak"] / p,
            reference["held"] / p + (depth - 1) * layer_bytes(width) / p + 2 * layer_bytes(width),
        )
        for p in ranks
    }
    problem = f"{depth} x Linear({width}, {width}) fp32 + Adam, batch {BATCH}"
    return measured_report(
        "dt-fsdp-passes",
        problem,
        reference,
        ours,
        floors,
        floor_note=(
            "simple_fsdp eager, defaults; floor: max(one process's peak / P, its state / P + "
            f"{depth - 1} gradient shards + a gathered layer and its full gradient)"
        ),
        targets={4: "<= 0.33"},
        others={"torch FSDP2 (fully_shard per layer)": {p: r["peak"] for p, r in fsdp2.items()}},
        fits=Fits(
            width,
            f"model width ({depth} square linears, Adam)",
            "features",
            exponent=2,
            multiple=64,
        ),
    )


if __name__ == "__main__":
    from dt_core.testing.benchmarks import memory_main

    memory_main("dt-fsdp-passes", __doc__, run, "4 x Linear(256), P = 2, 4")
