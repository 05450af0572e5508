"""dt-cp memory benchmark: per-rank peak of causal SDPA fwd+bwd as ranks grow, P = 1, 2, 4, 8.

    python packages/dt-cp/benchmarks/memory.py [--quick] --json OUT.json

A fixed whole problem: causal scaled-dot-product attention, B=1 H=4 D=64 fp32, q, k, v
sharded on the sequence with dt-cp's defaults (the ring, no load balancer), forward +
backward (dq, dk, dv), S = 32768 (`--seq` runs another length; memory grows linearly in S
under flash attention, so fixed per-rank costs weigh more at smaller S). Each P runs in
fresh spawned processes (gloo on 127.0.0.1, one thread each).

A rank's peak (dt_core.testing.memory) is the tensors it holds before the step (its q, k,
v shards) plus its resident set's rise during the step, every block of 64 KiB or more
mapped alone; largest rank. The baseline is one process running plain SDPA on the
whole sequence: 8 blocks of B*H*S*D*4 bytes at its peak (q, k, v, out, the gradient
of out, dq, dk, dv), measured. The floor at P is that local-only work on S/P rows (one
process's peak over P) plus the buffers the ring needs in flight: the chunk of K and V it
computes with and the `RING_PREFETCH_CHUNKS` chunks posted ahead of it, and that chunk's
dK/dV share on its way home (chunks of `RING_CHUNK_ROWS` rows; 4 MiB at the defaults,
whatever S and P). The ring never holds a foreign block whole, so the floor has no K/V
block in flight. (Plain SDPA run on S/P alone is no floor: its kernel's full-length
temporaries, e.g. a contiguous grad_out, make it ~0.5 blocks per P above the ring's
blockwise kernels.)

torch's own context parallel (`context_parallel()`) does not run on CPU without dt-cp:
its dispatcher has no rule for `aten._scaled_dot_product_flash_attention_for_cpu`
(NotImplementedError, torch 2.13), so there is no torch CP line here.
"""

from __future__ import annotations

from typing import Any

HEADS, DIM, SEQ = 4, 64, 32768


def _step(q: Any, k: Any, v: Any) -> Any:
    import torch.nn.functional as F

    def step() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        for t in (q, k, v):
            t.grad = None

    return step


def plain(seq: int) -> dict[str, int]:
    """One process, plain torch: causal SDPA fwd+bwd on a sequence of `seq`."""
    import torch
    from dt_core.testing.memory import measure_step

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, seq, DIM, generator=gen).requires_grad_() for _ in range(3))
    return measure_step(_step(q, k, v))


def sharded(seq: int) -> dict[str, int]:
    """On every rank: q, k, v sharded on the sequence with dt-cp's defaults."""
    import dt_cp
    import torch
    import torch.distributed as dist
    from dt_core.testing import cpu_mesh
    from dt_core.testing.memory import measure_step

    torch.set_num_threads(1)
    mesh = cpu_mesh(dist.get_world_size())
    gen = torch.Generator().manual_seed(0)
    qkv = []
    for _ in range(3):
        full = torch.randn(1, HEADS, seq, DIM, generator=gen)
        qkv.append(dt_cp.shard_sequence(full, mesh, 2).requires_grad_())
        del full  # only the shard stays: what a rank that loaded its own rows holds
    dist.barrier()
    return measure_step(_step(*qkv))


def ring_buffer_bytes() -> int:
    """The ring's chunks in flight (see the module docstring): K and V of the chunk computed
    with and of those posted ahead, and that chunk's dK/dV share."""
    from dt_cp.algorithms import RING_CHUNK_ROWS, RING_PREFETCH_CHUNKS

    chunk = HEADS * RING_CHUNK_ROWS * DIM * 4
    return 2 * (RING_PREFETCH_CHUNKS + 1) * chunk + 2 * chunk


def run(quick: bool, seq: int | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from dt_core.testing.memory import (
        MiB,
        measure_one_process,
        measure_ranks,
        measured_report,
    )

    seq = seq or (2048 if quick else SEQ)
    ranks = [2, 4] if quick else [2, 4, 8]
    reference = measure_one_process(plain, seq)
    ours = measure_ranks(sharded, ranks, seq)
    floors = {p: reference["peak"] / p + ring_buffer_bytes() for p in ranks}
    problem = f"causal SDPA fwd+bwd, B=1 H={HEADS} S={seq} D={DIM} fp32, ring"
    return measured_report(
        "dt-cp",
        problem,
        reference,
        ours,
        floors,
        floor_note=(
            "floor: one process's peak / P (8 blocks of S/P: q, k, v, out, its gradient, "
            f"dq, dk, dv) + the ring's chunks in flight ({ring_buffer_bytes() / MiB:.0f} MiB: "
            "K, V of the chunk computed with and those posted ahead, its dK/dV share)"
        ),
        targets={4: "<= 0.40"},
        fits={
            "size": seq,
            "what": f"sequence length (H={HEADS} D={DIM})",
            "unit": "tokens",
            "exponent": 1,
            "multiple": 1024,
        },
    )


if __name__ == "__main__":
    from dt_core.testing.benchmarks import memory_main

    memory_main("dt-cp", __doc__, run, "S = 2048, P = 2, 4", {"--seq": "another sequence length"})
