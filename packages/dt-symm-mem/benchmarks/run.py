"""dt-symm-mem benchmark: shared-memory all-gather and fused all-gather + matmul vs gloo.

    python packages/dt-symm-mem/benchmarks/run.py [--quick] [--ranks 2] --json OUT.json

Spawns its own CPU ranks (dt-core's test world: gloo on 127.0.0.1, one thread each).
Baselines are measured in the same run, in alternating rounds with what they are compared
to (medians over the rounds): gloo's all_gather_single into a preallocated output (our
all-gather writes into a preallocated output too), gloo all_gather + mm for the layer,
and a plain memcpy of the gathered size on every rank at once (the limit).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

KIB = 1024
MIB = 1024 * KIB


def _time_alternating(fns: dict[str, Any], rounds: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each `fns[name]()`, measured in alternating rounds (one
    sample of every function per round), so a slow phase of the shared host hits all of
    them alike. A sample runs a function back to back enough times to last a few ms after
    a barrier, so the barrier's exit skew between ranks (~0.1 ms with gloo) does not
    dominate small messages; the count is agreed by all ranks."""
    import torch
    import torch.distributed as dist

    inner = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        start = time.perf_counter()
        fn()
        once = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(once, op=dist.ReduceOp.MAX)
        inner[name] = max(1, min(200, int(5e-3 / max(float(once), 1e-7))))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            dist.barrier()
            start = time.perf_counter()
            for _ in range(inner[name]):
                fn()
            samples[name].append((time.perf_counter() - start) / inner[name])
    return {name: statistics.median(values) for name, values in samples.items()}


def _rounds(nbytes: int, quick: bool) -> int:
    base = 30 if nbytes <= MIB else 12
    return max(5, base // (4 if quick else 1))


def _rank_body(quick: bool, sizes: list[int], layer: dict[str, int]) -> dict[str, Any]:
    import dt_symm_mem
    import torch
    import torch.distributed as dist

    group = dist.group.WORLD
    world = dist.get_world_size()
    out: dict[str, Any] = {"ag": {}, "memcpy": {}}
    for nbytes in sizes:
        x = torch.randn(nbytes // 4)
        gathered = torch.empty(world * x.numel())
        reference = torch.empty_like(gathered)
        src = torch.randn(gathered.numel())
        times = _time_alternating(
            {
                "shm": lambda x=x, o=gathered: dt_symm_mem.low_contention_all_gather(
                    x, group, out=o
                ),
                "gloo": lambda x=x, o=reference: dist.all_gather_single(o, x, group=group),
                "memcpy": lambda o=gathered, s=src: o.copy_(s),
            },
            _rounds(nbytes, quick),
        )
        dist.all_gather_single(reference, x, group=group)
        dt_symm_mem.low_contention_all_gather(x, group, out=gathered)
        if not torch.equal(gathered, reference):
            raise RuntimeError(f"shm all-gather differs from gloo at {nbytes} bytes")
        out["ag"][nbytes] = (times["shm"], times["gloo"])
        out["memcpy"][nbytes] = times["memcpy"]

    tokens, hidden, n_out = layer["tokens"], layer["hidden"], layer["out"]
    gen = torch.Generator().manual_seed(dist.get_rank())
    A_shard = torch.randn(tokens // world, hidden, generator=gen)
    B = torch.randn(hidden, n_out, generator=torch.Generator().manual_seed(7))
    A_full = torch.empty(tokens, hidden)

    def baseline() -> torch.Tensor:
        dist.all_gather_single(A_full, A_shard, group=group)
        return A_full @ B

    def fused() -> torch.Tensor:
        return dt_symm_mem.fused_all_gather_matmul(A_shard, [B], 0, group, return_A=False)[1][0]

    times = _time_alternating({"fused": fused, "baseline": baseline}, 3 if quick else 10)
    out["layer"] = (times["fused"], times["baseline"])
    out["layer_error"] = float((fused() - baseline()).abs().max())
    out["summed"] = _summed_reduce_scatter(group, layer, quick)
    return out


def _fused_sum(a: Any, b: Any, B1: Any, B2: Any, group: Any) -> Any:
    import torch.distributed._functional_collectives as funcol

    return funcol.reduce_scatter_tensor(a @ B1 + b @ B2, "sum", 0, group)


def _kept(a: Any, b: Any, B1: Any, B2: Any, group: Any) -> Any:  # _fused_sum's twin: its own
    import torch.distributed._functional_collectives as funcol  # Dynamo cache entry

    return funcol.reduce_scatter_tensor(a @ B1 + b @ B2, "sum", 0, group)


def _summed_reduce_scatter(group: Any, layer: dict[str, int], quick: bool) -> dict[str, float]:
    """SwiGLU's input gradient `g1 @ W1 + g3 @ W3`, reduce-scattered over the sequence,
    compiled: the sum fused into dt_symm_mem::fused_matmuls_reduce_scatter (default) vs
    kept as it is."""
    import torch
    from dt_symm_mem import ops
    from dt_symm_mem.settings import settings

    tokens, hidden, n_out = layer["tokens"], layer["hidden"], layer["out"]
    gen = torch.Generator().manual_seed(11)
    a, b = (torch.randn(tokens, hidden, generator=gen) for _ in range(2))
    B1, B2 = (torch.randn(hidden, n_out, generator=gen) for _ in range(2))
    fused = torch.compile(_fused_sum, fullgraph=True)
    kept = torch.compile(_kept, fullgraph=True)
    before = ops.counters.snapshot()
    fused(a, b, B1, B2, group)  # compiles with the fusion (the default)
    fused_calls = ops.counters.changes(before).get("fused_matmuls_reduce_scatter", 0)
    with settings.scoped(merge_summed_matmuls=False):
        kept(a, b, B1, B2, group)  # compiles without it
    times = _time_alternating(
        {"fused": lambda: fused(a, b, B1, B2, group), "kept": lambda: kept(a, b, B1, B2, group)},
        3 if quick else 10,
    )
    error = float((fused(a, b, B1, B2, group) - kept(a, b, B1, B2, group)).abs().max())
    return {**times, "error": error, "fused_calls": float(fused_calls)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)

    from dt_core.testing import get_world
    from dt_core.testing.benchmarks import write_report

    if args.quick:
        sizes = [4 * KIB, 64 * KIB, MIB, 16 * MIB]
    else:
        sizes = [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB]
    layer = {"tokens": 2048, "hidden": 2048, "out": 128}
    world = get_world(args.ranks)
    try:
        results = world.run(_rank_body, args.quick, sizes, layer, timeout=600)
    finally:
        world.close()
    rank0 = results[0]

    def worst(kind: str, key: Any, index: int | None = None) -> float:
        values = [r[kind][key] if index is None else r[kind][key][index] for r in results]
        return max(values)

    rows = []
    targets = {64 * KIB: "≥10×", 16 * MIB: "≥8×"}
    for nbytes in sizes:
        shm, gloo = worst("ag", nbytes, 0), worst("ag", nbytes, 1)
        copy = worst("memcpy", nbytes)
        gathered = args.ranks * nbytes
        label = f"{nbytes // KIB} KiB" if nbytes < MIB else f"{nbytes // MIB} MiB"
        rows.append(
            {
                "name": f"all_gather {label}/rank, {args.ranks} ranks",
                "metric": "time",
                "value": shm * 1e6,
                "baseline": "gloo all_gather_single (same output preallocated)",
                "baseline_value": gloo * 1e6,
                "ratio": gloo / shm,
                "target": targets.get(nbytes, "faster than gloo"),
                "unit": "us",
                "notes": (
                    f"shm {gathered / shm / 2**30:.2f} GiB/s of output vs memcpy of the "
                    f"output {gathered / copy / 2**30:.2f} GiB/s on every rank at once: "
                    f"{copy / shm:.2f} of the memcpy limit"
                ),
            }
        )
    fused, base = max(r["layer"][0] for r in results), max(r["layer"][1] for r in results)
    rows.append(
        {
            "name": (
                f"fused_all_gather_matmul, A {layer['tokens']}x{layer['hidden']} gathered on "
                f"dim 0, B {layer['hidden']}x{layer['out']}, fp32, {args.ranks} ranks"
            ),
            "metric": "time",
            "value": fused * 1e3,
            "baseline": "gloo all_gather_single + mm",
            "baseline_value": base * 1e3,
            "ratio": base / fused,
            "target": "≥1.5×",
            "unit": "ms",
            "notes": f"max abs difference {max(r['layer_error'] for r in results):.2e}",
        }
    )
    summed = {k: max(r["summed"][k] for r in results) for k in ("fused", "kept", "error")}
    rows.append(
        {
            "name": (
                f"compiled reduce-scatter of a summed matmul pair (SwiGLU input gradient), "
                f"2 x A {layer['tokens']}x{layer['hidden']} @ B {layer['hidden']}x{layer['out']},"
                f" fp32, {args.ranks} ranks"
            ),
            "metric": "time",
            "value": summed["fused"] * 1e3,
            "baseline": "the sum kept (merge_summed_matmuls=False): 2 mm + add + gloo RS",
            "baseline_value": summed["kept"] * 1e3,
            "ratio": summed["kept"] / summed["fused"],
            "target": "faster",
            "unit": "ms",
            "notes": (
                f"fused_matmuls_reduce_scatter, terms never joined "
                f"({int(rank0['summed']['fused_calls'])} fused call per compile check); "
                f"max abs difference {summed['error']:.2e}"
            ),
        }
    )
    bandwidth = {
        "shm": [args.ranks * s / worst("ag", s, 0) / 2**30 for s in sizes],
        "gloo": [args.ranks * s / worst("ag", s, 1) / 2**30 for s in sizes],
        "memcpy": [args.ranks * s / worst("memcpy", s) / 2**30 for s in sizes],
    }
    series = [
        {
            "title": f"all_gather bandwidth, {args.ranks} CPU ranks on one host",
            "x_label": "message size per rank (bytes)",
            "y_label": "gathered bytes per second (GiB/s)",
            "x": sizes,
            "lines": bandwidth,
            "log_x": True,
            "log_y": True,
        }
    ]
    write_report(args.json, "dt-symm-mem", rows, series)
    del rank0
    return 0


if __name__ == "__main__":
    sys.exit(main())
