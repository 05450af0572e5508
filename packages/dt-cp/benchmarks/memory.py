"""dt-cp memory benchmark: per-rank peak of causal SDPA fwd+bwd as ranks grow, P = 1, 2, 4, 8.

    python packages/dt-cp/benchmarks/memory.py [--quick] --json OUT.json

A fixed whole problem: causal scaled-dot-product attention, B=1 H=4 D=64 fp32, q, k, v
sharded on the sequence with dt-cp's defaults (the ring, no load balancer), forward +
backward (dq, dk, dv). S = 16384, not the issue's 32768: one process takes ~45 s for one
step at 32768 on this shared 2-core machine, and allocations scale linearly in S under
flash attention (the ratios do not depend on S; `--seq` runs another length). Each P
runs in fresh spawned processes (gloo on 127.0.0.1, one thread each).

Memory is counted in tensor allocations (dt_core.testing.memory): what a rank holds
before the step (its q, k, v shards) plus the peak of what the step allocates, from
torch's profiler memory view, largest rank. The baseline is one process running plain
SDPA on the whole sequence. The floor at P counts blocks of B*H*(S/P)*D*4 bytes: the
local-only work's tensors, which every rank holds at the end of backward (its q, k, v,
out, dq, dk, dv: 7 blocks), plus the one buffer a ring cannot avoid, the K and V block
it computes with while its own travel (2 blocks): 9 blocks, a lower bound. (Plain SDPA
run on S/P alone is no floor: its kernel's full-length temporaries, e.g. a contiguous
grad_out, make it ~0.5 blocks per P above the ring's blockwise kernels.)

torch's own context parallel (`context_parallel()`) does not run on CPU without dt-cp:
its dispatcher has no rule for `aten._scaled_dot_product_flash_attention_for_cpu`
(NotImplementedError, torch 2.13), so there is no torch CP line here.
"""

from __future__ import annotations

import argparse
from typing import Any

HEADS, DIM = 4, 64


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


def floor_bytes(seq: int, ranks: int) -> int:
    """9 blocks: a rank's q, k, v, out, dq, dk, dv and the K, V block it computes with."""
    return 9 * HEADS * (seq // ranks) * DIM * 4


def run(quick: bool, seq: int | None) -> dict[str, Any]:
    from dt_core.testing import World
    from dt_core.testing.memory import MiB, scaling_report

    seq = seq or (2048 if quick else 16384)
    ranks = [2, 4] if quick else [2, 4, 8]
    with World(1) as one:
        reference = one.run(plain, seq, timeout=1800)[0]
    peaks, rss = {}, {}
    for p in ranks:
        with World(p) as world:
            per_rank = world.run(sharded, seq, timeout=1800)
        peaks[p] = max(r["peak"] for r in per_rank)
        rss[p] = max(r["rss_rise"] for r in per_rank)
        print(f"P={p}: {peaks[p] / MiB:.1f} MiB per rank", flush=True)
    floors = {p: floor_bytes(seq, p) for p in ranks}
    problem = f"causal SDPA fwd+bwd, B=1 H={HEADS} S={seq} D={DIM} fp32, ring"
    rows, series = scaling_report(
        "dt-cp",
        problem,
        reference["peak"],
        peaks,
        floors,
        floor_note=(
            "floor: 9 blocks of S/P (a rank's q, k, v, out, dq, dk, dv + the K, V block it "
            "computes with); RSS high-water rise per rank: "
            + ", ".join(f"P={p} {rss[p] / MiB:.0f} MiB" for p in ranks)
            + f" (one process {reference['rss_rise'] / MiB:.0f} MiB)"
        ),
        targets={4: "<= 0.40"},
        fits={
            "size": seq,
            "what": f"sequence length (H={HEADS} D={DIM})",
            "unit": "tokens",
            "exponent": 1,
            "multiple": 1024,
            "budget": 1024 * MiB,
        },
    )
    return {"package": "dt-cp", "suite": "memory", "rows": rows, "series": series}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="S = 2048, P = 2, 4")
    parser.add_argument("--seq", type=int, help="another sequence length")
    parser.add_argument("--json", required=True, help="where to write the results")
    args = parser.parse_args()
    result = run(args.quick, args.seq)
    from dt_core.testing.benchmarks import write_report

    write_report(args.json, "dt-cp", result["rows"], result["series"])


if __name__ == "__main__":
    main()
