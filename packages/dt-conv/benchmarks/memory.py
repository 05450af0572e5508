"""dt-conv memory benchmark: per-rank peak of one fwd+bwd step as ranks grow, P = 1, 2, 4, 8.

    python packages/dt-conv/benchmarks/memory.py [--quick] --json OUT.json

A fixed whole problem: a 4-layer net of 3x3 convs (padding 1, 16 channels, fp32) on a
1x16x1024x1024 image sharded on H, the weights replicated; one forward + backward
(weight gradients). Each P runs in fresh spawned processes (gloo on 127.0.0.1, one thread
each), every rank allocating its own rows directly (`DTensor.from_local`).

A rank's peak (dt_core.testing.memory) is the tensors it holds before the step plus its
resident set's rise during the step, every block of 64 KiB or more mapped alone; largest
rank. The baseline is one process running the same net with plain
torch on the whole image. The floor at P is the same plain-torch net run on one rank's
rows alone (H/P rows, no communication: the local-only work, measured the same way) plus
the halo rows the method needs in flight: for one conv, a row from and to each neighbour,
forward and its adjoint (4 rows x 16 channels x W x 4 bytes per neighbour: 512 KiB at
W = 1024 on an interior rank, half that at P = 2, where each rank has one neighbour).
"""

from __future__ import annotations

from typing import Any

CHANNELS, LAYERS = 16, 4


def _net_step(x: Any, weights: list, local: bool) -> Any:
    import torch.nn.functional as F

    def step() -> None:
        out = x
        for w in weights:
            out = F.conv2d(out, w, padding=1)
        (out if local else out.to_local()).sum().backward()
        for w in weights:
            w.grad = None

    return step


def _weights(make: Any) -> list:
    import torch

    gen = torch.Generator().manual_seed(0)
    return [
        make(torch.randn(CHANNELS, CHANNELS, 3, 3, generator=gen) * 0.05).requires_grad_()
        for _ in range(LAYERS)
    ]


def plain(rows: int, width: int) -> dict[str, int]:
    """One process, plain torch: the net on a 1 x C x rows x width image."""
    import torch
    from dt_core.testing.memory import measure_step

    torch.set_num_threads(1)
    x = torch.randn(1, CHANNELS, rows, width, generator=torch.Generator().manual_seed(1))
    return measure_step(_net_step(x, _weights(lambda t: t), local=True))


def sharded(size: int) -> dict[str, int]:
    """On every rank: the net on the image sharded on H, dt-conv's halo exchange."""
    import torch
    import torch.distributed as dist
    from dt_core.testing import cpu_mesh
    from dt_core.testing.memory import measure_step
    from torch.distributed.tensor import DTensor, Replicate, Shard

    torch.set_num_threads(1)
    ranks = dist.get_world_size()
    mesh = cpu_mesh(ranks)
    gen = torch.Generator().manual_seed(1 + dist.get_rank())
    local = torch.randn(1, CHANNELS, size // ranks, size, generator=gen)
    x = DTensor.from_local(local, mesh, [Shard(2)], run_check=False)
    weights = _weights(lambda t: DTensor.from_local(t, mesh, [Replicate()], run_check=False))
    dist.barrier()
    return measure_step(_net_step(x, weights, local=False))


def halo_bytes(width: int, ranks: int) -> int:
    """The halo rows one conv keeps in flight on the rank with the most neighbours,
    forward and adjoint: a row from and to each neighbour, each way."""
    neighbours = min(2, ranks - 1)
    return 4 * neighbours * CHANNELS * width * 4


def run(quick: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from dt_core.testing.memory import (
        measure_one_process,
        measure_ranks,
        measured_report,
    )

    size = 256 if quick else 1024
    ranks = [2, 4] if quick else [2, 4, 8]
    reference = measure_one_process(plain, size, size)
    local = {p: measure_one_process(plain, size // p, size) for p in ranks}
    ours = measure_ranks(sharded, ranks, size)
    floors = {p: local[p]["peak"] + halo_bytes(size, p) for p in ranks}
    problem = f"1x{CHANNELS}x{size}x{size} fp32, {LAYERS} convs 3x3, sharded on H"
    return measured_report(
        "dt-conv",
        problem,
        reference,
        ours,
        floors,
        floor_note=(
            "floor: the same net in plain torch on one rank's H/P rows (measured) + the "
            "halo rows of one conv in flight (4 per neighbour)"
        ),
        targets={4: "<= 0.32"},
        fits={
            "size": size,
            "what": "image edge (square, 16 ch)",
            "unit": "px",
            "exponent": 2,
            "multiple": 64,
        },
    )


if __name__ == "__main__":
    from dt_core.testing.benchmarks import memory_main

    memory_main("dt-conv", __doc__, run, "a 256x256 image, P = 2, 4")
