"""Per-rank memory of one training step, for the benchmarks.

A rank's peak is `held + rise`:

- `held`: the bytes of every CPU tensor storage alive in this process just before the step
  that Python can reach (its parameters, optimizer state, inputs: what the rank keeps
  between steps), each storage counted once (`live_tensor_bytes`);
- `rise`: how far the resident set climbs during the step over its value just before,
  with every block of 64 KiB or more given its own mapping from the process's start
  (`large_blocks_mapped_alone`: glibc's mmap threshold fixed at 64 KiB), so a tensor's
  pages come when it is written and go back to the system when it is freed, whichever
  thread frees it.

Beside it, `alloc_rise` is torch's own view: the peak of the bytes held by tensors
allocated within the step, from the profiler's memory events (`step_peak_bytes`: every
allocation and free through torch's CPU allocator, matched by address). It is exact for
what the training thread allocates and frees, but the profiler records events only on
the thread it runs on: a buffer freed on another thread is never seen freed. gloo frees
the copies its collectives make of their inputs on its worker threads, after a race with
the caller's wait, so `alloc_rise` counts a varying number of those copies as held until
their address is reused, often to the end of the step (torch has no CPU counterpart of
`torch.cuda.max_memory_allocated`, and the profiler's all-threads mode records no memory
events). The resident rise with per-block mappings sees those frees; it also counts what
is not a tensor but grows with the step (gloo's own buffers, the autograd graph), which
a rank pays too.

The unit tests check the pure helpers (`peak_from_events`, `largest_fitting`,
`fit_inverse_p`, `scaling_report`) and that the resident rise sees a block freed on
another thread.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

# The report's pieces live in memory_report; the benchmarks import them from here too.
from dt_core.testing.memory_report import (
    PEAK_METRIC,
    Fits,
    MiB,
    allocation_note,
    fit_inverse_p,
    largest_fitting,
    measured_report,
    scaling_report,
)


def live_tensor_bytes() -> int:
    """Bytes of the CPU tensor storages alive in this process that Python reaches, each
    storage once (views and DTensors' local shards share their storage's bytes)."""
    import torch

    gc.collect()
    storages: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance on deprecated module attributes warns
        warnings.simplefilter("ignore")
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in tensors:
        try:  # wrapper subclasses (DTensor) and fake tensors have no storage to read
            storage = obj.untyped_storage()
            if storage.device.type != "cpu":
                continue
            key, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError, TypeError):
            continue
        if key:
            storages[key] = max(storages.get(key, 0), nbytes)
    return sum(storages.values())


def peak_from_events(events: Iterable[tuple[float, int, Any]]) -> int:
    """The peak of live bytes over allocation events `(time, bytes, address)`, bytes > 0
    an allocation and < 0 a free: only blocks whose allocation is among the events count
    (a free of an earlier block is ignored), so the result is the rise over what was
    alive before the first event. An allocation at the address of a block still held
    ends that block: two live blocks never share an address."""
    held: dict[Any, int] = {}
    live = peak = 0
    for _, nbytes, address in sorted(events, key=lambda e: e[0]):
        if nbytes > 0:
            # A block allocated where one is held was freed unseen (the profiler misses
            # frees on other threads, e.g. a gloo work's buffers): that one is gone.
            live += nbytes - held.get(address, 0)
            held[address] = nbytes
            peak = max(peak, live)
        elif address in held:
            live -= held.pop(address)
    return peak


def step_peak_bytes(step: Callable[[], Any]) -> int:
    """Run `step` once under torch's profiler (memory view) and return the peak of the
    bytes held by CPU tensors allocated within it (`peak_from_events`)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())["traceEvents"]
    return peak_from_events(
        (e["ts"], int(e["args"]["Bytes"]), e["args"].get("Addr"))
        for e in trace
        if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0
    )


def _status_kib(field: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _reset_rss_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


MMAP_THRESHOLD_ENV = "MALLOC_MMAP_THRESHOLD_"
LARGE_BLOCK = 64 * 1024


ALLOCATOR_ENV = "DT_MEMORY_ALLOCATOR"


@contextlib.contextmanager
def _environment(values: dict[str, str | None]) -> Iterator[None]:
    old = {key: os.environ.get(key) for key in values}
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def large_blocks_mapped_alone() -> contextlib.AbstractContextManager[None]:
    """Processes started inside this block (a `World`'s ranks) have glibc serve every
    allocation of `LARGE_BLOCK` bytes or more with its own mapping: a fixed mmap
    threshold, read by glibc when a process starts (set later, freed heap chunks would
    still serve large blocks without a rise in the resident set). Elsewhere than glibc
    the variable does nothing and the resident rise also carries malloc's reuse."""
    return _environment({MMAP_THRESHOLD_ENV: str(LARGE_BLOCK), ALLOCATOR_ENV: None})


def glibc_defaults() -> contextlib.AbstractContextManager[None]:
    """Processes started inside this block keep glibc's default allocator settings (its
    mmap threshold rises with the blocks freed, and each thread's arena keeps what is
    freed in it): the resident memory a CPU user sees who sets nothing. `measure_step`
    then reports that resident rise, which also carries the blocks glibc kept."""
    return _environment({MMAP_THRESHOLD_ENV: None, ALLOCATOR_ENV: "glibc-defaults"})


def measure_step(step: Callable[[], Any]) -> dict[str, int]:
    """One step's memory (see the module docstring): `held`, `rise` (the resident set's
    high-water rise, blocks mapped alone), `peak` = held + rise, `alloc_rise` (the
    profiler's allocation view, from another run of the step, so the profiler's own
    records stay out of the resident rise) and `resident_high` (the process's highest
    resident set until the end of the measured step: see `resident_bytes`).

    The step runs once unmeasured first: what it creates to keep (optimizer state, caches,
    gloo's buffers) is then part of what the rank holds, not of the step's rise. Run it in
    a process started inside `large_blocks_mapped_alone` (or, to see what a user who sets
    nothing sees, inside `glibc_defaults`); elsewhere it raises, since the resident rise
    would silently mix both."""
    mapped = os.environ.get(MMAP_THRESHOLD_ENV) == str(LARGE_BLOCK)
    defaults = os.environ.get(ALLOCATOR_ENV) == "glibc-defaults"
    if mapped == defaults:
        raise RuntimeError(
            "measure_step: start this process inside large_blocks_mapped_alone() "
            f"({MMAP_THRESHOLD_ENV}={LARGE_BLOCK}), or its resident rise misses blocks "
            "that reuse freed heap (or inside glibc_defaults() to measure just that)"
        )
    step()
    held = live_tensor_bytes()
    base = _status_kib("VmRSS:")
    lifetime = _status_kib("VmHWM:")
    _reset_rss_peak()
    step()
    high = _status_kib("VmHWM:")
    rise = max(0, high - base) * 1024
    alloc_rise = step_peak_bytes(step)
    return {
        "held": held,
        "rise": rise,
        "peak": held + rise,
        "alloc_rise": alloc_rise,
        "resident_high": max(lifetime, high) * 1024,
    }


def resident_bytes() -> int:
    """This process's resident set now. Taken before a model is built, it is the base of
    `measure_step`'s `resident_high` (the process's highest resident set up to the end of
    the measured step): their difference is the memory a user sees the run take."""
    return _status_kib("VmRSS:") * 1024


def _allocator(mapped_alone: bool) -> contextlib.AbstractContextManager[None]:
    return large_blocks_mapped_alone() if mapped_alone else glibc_defaults()


def measure_one_process(
    fn: Callable[..., dict[str, int]], *args: Any, mapped_alone: bool = True
) -> dict[str, int]:
    """`fn(*args)` (which returns `measure_step`'s dict) in one fresh process whose large
    blocks are mapped alone (with `mapped_alone=False`: glibc's defaults): the
    one-process baseline, or a floor measured alone."""
    from dt_core.testing import World

    with _allocator(mapped_alone), World(1) as one:
        result: dict[str, int] = one.run(fn, *args, timeout=1800)[0]
    return result


def measure_ranks(
    fn: Callable[..., dict[str, int]],
    ranks: Sequence[int],
    *args: Any,
    mapped_alone: bool = True,
) -> dict[int, dict[str, int]]:
    """For each P in `ranks`: `fn(*args)` on P fresh spawned ranks (large blocks mapped
    alone, or glibc's defaults); each value is the measurement of the rank with the
    largest peak."""
    from dt_core.testing import World

    largest: dict[int, dict[str, int]] = {}
    for p in ranks:
        with _allocator(mapped_alone), World(p) as world:
            per_rank = world.run(fn, *args, timeout=1800)
        largest[p] = max(per_rank, key=lambda r: r["peak"])
        print(
            f"{getattr(fn, '__name__', 'step')} P={p}: {largest[p]['peak'] / MiB:.1f} MiB per rank",
            flush=True,
        )
    return largest


__all__ = [
    "ALLOCATOR_ENV",
    "LARGE_BLOCK",
    "MMAP_THRESHOLD_ENV",
    "PEAK_METRIC",
    "Fits",
    "MiB",
    "allocation_note",
    "fit_inverse_p",
    "glibc_defaults",
    "large_blocks_mapped_alone",
    "largest_fitting",
    "live_tensor_bytes",
    "measure_one_process",
    "measure_ranks",
    "measure_step",
    "measured_report",
    "peak_from_events",
    "resident_bytes",
    "scaling_report",
    "step_peak_bytes",
]
