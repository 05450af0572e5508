"""What the package's benchmarks share: their command line and the timed training loop.

Imported by `run.py` and `vs_fsdp2.py` (the benchmarks directory is on `sys.path` when a
script runs, and the ranks get the same `sys.path` from dt_core.testing's World).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WARMUP = 3  # steps before timing: compile, first-touch of buffers, optimizer state


def parse_args(doc: str | None) -> argparse.Namespace:
    """`--quick` (small sizes) and `--json OUT` (where the rows go), as bench_report calls."""
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a few steps")
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    return parser.parse_args()


def training_step(run: Callable[[Any], Any], opt: Any, x: Any) -> Callable[[], None]:
    """One step of the benchmarks' objective: mean square of the output, backward, optimizer
    step, gradients set to None (so each step allocates its own)."""

    def step() -> None:
        run(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    return step


def timed_steps(
    step: Callable[[], Any], steps: int, memory_steps: int = 0
) -> dict[str, float | None]:
    """Run `step` (forward, backward, optimizer step, zero_grad) WARMUP + `steps` times
    between barriers; the median time of the last `steps`.

    With `memory_steps`, that many more steps run under torch's profiler with memory
    profiling: `peak_step_bytes` is the largest rise, within one of them, of the bytes
    held by tensors the step allocated (every allocation through torch's CPU allocator:
    activations, gathered parameters, bucket buffers, gradients, collective outputs).
    Allocator caching and page reuse do not enter it, so variants compare fairly
    whatever malloc does with freed pages.
    """
    import torch.distributed as dist

    times = []
    for i in range(WARMUP + steps):
        dist.barrier()
        start = time.perf_counter()
        step()
        dist.barrier()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    peaks = [_peak_step_bytes(step) for _ in range(memory_steps)]
    return {
        "median_s": statistics.median(times),
        "peak_step_bytes": max(peaks) if peaks else None,
    }


def _peak_step_bytes(step: Callable[[], Any]) -> int:
    """Peak, over one profiled step, of the bytes held by tensors allocated within it.

    Only blocks whose allocation the trace saw count (matched by address), so what the
    step starts with (parameters, optimizer state, anything earlier runs left) does not:
    the result is what the step needs beyond that, the same base for every variant."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    dist.barrier()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    memory = sorted(
        (e["ts"], int(e["args"]["Bytes"]), e["args"].get("Addr"))
        for e in events
        if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0
    )
    held: dict[Any, int] = {}
    live = peak = 0
    for _, nbytes, address in memory:
        if nbytes > 0:
            held[address] = held.get(address, 0) + nbytes
            live += nbytes
            peak = max(peak, live)
        elif address in held:
            live -= held.pop(address)
    return peak


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2))
