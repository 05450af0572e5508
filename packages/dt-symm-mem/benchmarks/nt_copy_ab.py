"""A/B of dt-symm-mem's non-temporal copy against plain memmove, in the same run.

    python packages/dt-symm-mem/benchmarks/nt_copy_ab.py [--ranks 2] [--rounds 12]
        [--repeats 3] [--json OUT.json]

Why: the non-temporal loop is native code, which costs a compiler at install time and a
platform-specific wheel; it is kept only if it pays. For each size (1-64 MiB per rank)
the streamed all-gather runs with the loop and with memmove in alternating rounds (one
sample of each per round, medians), on every rank at once, plus a bare copy of the
gathered size on every rank. `--repeats` runs the whole sweep again in the same world,
so the spread over a shared host shows. Gain = memmove time / non-temporal time - 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

MIB = 1024 * 1024
SIZES = [MIB, 4 * MIB, 16 * MIB, 64 * MIB]


def _alternate(fns: dict[str, Any], rounds: int) -> dict[str, float]:
    """Median seconds per call of each function, one sample of each per round."""
    import torch.distributed as dist

    samples: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            dist.barrier()
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def _rank_body(sizes: list[int], rounds: int, repeats: int) -> list[dict[str, Any]]:
    import ctypes

    import dt_symm_mem
    import torch
    import torch.distributed as dist
    from dt_symm_mem import ntcopy

    torch.set_num_threads(1)
    if not ntcopy.available():
        raise RuntimeError(f"no non-temporal copy here: {ntcopy.unavailable_reason}")
    loop = ntcopy._bulk
    group, world = dist.group.WORLD, dist.get_world_size()

    def with_loop(enabled: bool, fn: Any) -> Any:
        def run() -> None:
            ntcopy._bulk = loop if enabled else None
            try:
                fn()
            finally:
                ntcopy._bulk = loop

        return run

    results = []
    for repeat in range(repeats):
        for nbytes in sizes:
            x = torch.randn(nbytes // 4)
            out = torch.empty(world * x.numel())
            src = torch.randn(out.numel())
            dst = torch.empty_like(src)

            def gather(x: torch.Tensor = x, out: torch.Tensor = out) -> None:
                dt_symm_mem.low_contention_all_gather(x, group, out=out)

            def copy(dst: torch.Tensor = dst, src: torch.Tensor = src) -> None:
                ntcopy.copy(dst.data_ptr(), src.data_ptr(), src.numel() * 4)

            def memmove(dst: torch.Tensor = dst, src: torch.Tensor = src) -> None:
                ctypes.memmove(dst.data_ptr(), src.data_ptr(), src.numel() * 4)

            times = _alternate(
                {
                    "ag_nt": with_loop(True, gather),
                    "ag_memmove": with_loop(False, gather),
                    "copy_nt": copy,
                    "copy_memmove": memmove,
                },
                rounds,
            )
            expected = torch.empty_like(out)
            dist.all_gather_single(expected, x, group=group)
            if not torch.equal(out, expected) or not torch.equal(dst, src):
                raise RuntimeError(f"wrong bytes at {nbytes} bytes per rank")
            results.append({"repeat": repeat, "nbytes": nbytes, **times})
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    from dt_core.testing import get_world

    world = get_world(args.ranks)
    try:
        per_rank = world.run(_rank_body, SIZES, args.rounds, args.repeats, timeout=1800)
    finally:
        world.close()
    rows = []
    for i, row in enumerate(per_rank[0]):
        worst = {k: max(r[i][k] for r in per_rank) for k in row if k not in ("repeat", "nbytes")}
        rows.append({"repeat": row["repeat"], "nbytes": row["nbytes"], **worst})
        print(
            f"repeat {row['repeat']} {row['nbytes'] // MIB:3d} MiB/rank: all-gather "
            f"nt {worst['ag_nt'] * 1e3:7.2f} ms memmove {worst['ag_memmove'] * 1e3:7.2f} ms "
            f"gain {worst['ag_memmove'] / worst['ag_nt'] - 1:+6.1%} | copy of the output "
            f"nt {worst['copy_nt'] * 1e3:7.2f} ms memmove {worst['copy_memmove'] * 1e3:7.2f} "
            f"ms gain {worst['copy_memmove'] / worst['copy_nt'] - 1:+6.1%}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
