"""Speed of each GPU check's workload: sharded on simulated ranks / unsharded, same device.

    python tests/gpu/timings.py [--reps 7] [--warmup 3] [--json FILE]

Why a ratio and not a speed-up: simulated ranks run every rank's share in turn in one
process, through DTensor dispatch and the plugins' handlers, so the ratio measures what
the sharded path costs over the plain op on the same device. Each step is timed between
two device synchronizations; the median of `reps` runs after `warmup` runs is kept.
Checks for exactness are test_cuda_simulated.py's, on the same workloads (gpu_cases.py).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpu_cases as gc
import torch
from dt_core.testing import simulated_ranks
from torch.distributed.device_mesh import init_device_mesh


def median_ms(step: Callable[[], object], warmup: int, reps: int) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(reps):
        gc.synchronize()
        start = time.perf_counter()
        step()
        gc.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _case_times(case: gc.Case, warmup: int, reps: int) -> tuple[float, float]:
    """Forward + backward of the case's loss, unsharded and sharded (ms)."""
    full = median_ms(lambda: gc.unsharded_step(case), warmup, reps)
    with simulated_ranks(gc.WORLD):
        leaves = gc.distribute(case, init_device_mesh(gc.DEVICE.type, (gc.WORLD,)))
        sharded = median_ms(lambda: gc.sharded_step(case, leaves), warmup, reps)
    return full, sharded


def _sdpa_times(kernel: str, dtype: torch.dtype, warmup: int, reps: int) -> tuple[float, float]:
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([gc.sdpa_backend(kernel)]):
        return _case_times(gc.sdpa_case(kernel, dtype), warmup, reps)


def _symm_mem_times(warmup: int, reps: int) -> tuple[float, float]:
    """fused_all_gather_matmul against the all-gathered matmul it replaces (forward only)."""
    shards, b = gc.symm_mem_inputs()
    full = median_ms(lambda: torch.cat(shards) @ b, warmup, reps)
    with simulated_ranks(gc.WORLD) as mode:
        sharded = median_ms(lambda: gc.symm_mem_sharded(mode, shards, b), warmup, reps)
    return full, sharded


def _fsdp_times(warmup: int, reps: int) -> tuple[float, float]:
    """One SimpleFSDP training step (forward + backward) against the plain model's."""
    from dt_fsdp_passes import simple_fsdp

    reference, x, y = gc.fsdp_reference()
    full = median_ms(lambda: gc.mse_step(reference, x, y), warmup, reps)
    with simulated_ranks(gc.WORLD) as mode:
        mesh = init_device_mesh(gc.DEVICE.type, (gc.WORLD,), mesh_dim_names=("fsdp",))
        model = simple_fsdp(copy.deepcopy(reference), mesh)
        xs = mode.rank_map(lambda r: x.chunk(gc.WORLD)[r])
        ys = mode.rank_map(lambda r: y.chunk(gc.WORLD)[r])
        sharded = median_ms(lambda: gc.mse_step(model, xs, ys), warmup, reps)
    return full, sharded


Timer = Callable[[int, int], tuple[float, float]]  # (warmup, reps) -> (unsharded, sharded) ms


def workloads() -> list[tuple[str, Timer | str]]:
    """(name, timer) pairs; a string instead of a timer says why the workload is skipped."""
    found: list[tuple[str, Timer | str]] = [
        (gc.conv_case(dim).name, lambda w, r, d=dim: _case_times(gc.conv_case(d), w, r))
        for dim in (2, 3)
    ]
    for kernel in gc.SDPA_KERNELS:
        for dtype in gc.SDPA_DTYPES:
            name = f"sdpa {kernel} {gc.dtype_name(dtype)}"
            if dtype not in gc.SDPA_SUPPORTED[kernel]:
                found.append((name, "not supported by the kernel"))
            else:
                found.append((name, lambda w, r, k=kernel, t=dtype: _sdpa_times(k, t, w, r)))
    found.append(("symm-mem fused_all_gather_matmul", _symm_mem_times))
    found.append(("simple_fsdp step", _fsdp_times))
    return found


def run(warmup: int, reps: int) -> list[dict[str, Any]]:
    """Every workload's times; one that raises is reported with its error, not fatal."""
    gc.exact_math()
    results = []
    for name, timer in workloads():
        row: dict[str, Any] = {"name": name, "warmup": warmup, "reps": reps}
        if isinstance(timer, str):
            row["status"] = timer
        else:
            try:
                full, sharded = timer(warmup, reps)
            except Exception as exc:
                row["status"] = f"error: {type(exc).__name__}: {exc}"
            else:
                row.update(status="ok", unsharded_ms=full, sharded_ms=sharded)
                row["ratio"] = sharded / full
        print(f"timings: {_line(row)}", flush=True)
        results.append(row)
    return results


def _line(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return f"{row['name']}: {row['status']}"
    return (
        f"{row['name']}: unsharded {row['unsharded_ms']:.3f} ms, sharded "
        f"{row['sharded_ms']:.3f} ms, ratio {row['ratio']:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    print(f"timings on {gc.DEVICE.type}, {gc.WORLD} simulated ranks", flush=True)
    results = run(args.warmup, args.reps)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 1 if any(r["status"].startswith("error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
