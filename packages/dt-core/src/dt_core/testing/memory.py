"""Per-rank memory of one training step, counted in tensor allocations, for the benchmarks.

A rank's peak is `held + rise`:

- `held`: the bytes of every CPU tensor storage alive in this process just before the step
  that Python can reach (its parameters, optimizer state, inputs: what the rank keeps
  between steps), each storage counted once (`live_tensor_bytes`);
- `rise`: the highest the bytes held by tensors allocated *within* the step climb, from
  torch's profiler with `profile_memory=True` (`step_peak_bytes`): every allocation and
  free through torch's CPU allocator is an event with its address, so an allocation is
  matched to its free exactly. Tensors alive before the step and freed during it are not
  subtracted, so `held + rise` is an upper bound of the true peak, tight when the step
  frees little of what it started with.

Why allocations and not the resident set: RSS also moves with malloc's caching and page
reuse, thread stacks, gloo's buffers and the interpreter, which do not scale with the
problem and differ from run to run; the profiler's memory view is what torch itself
allocated for tensors, the part that falls with P. (torch has no CPU counterpart of
`torch.cuda.max_memory_allocated`; the profiler is the one public allocator hook.)

The pure helpers (`peak_from_events`, `largest_fitting`, `fit_inverse_p`) are what the
unit tests check.
"""

from __future__ import annotations

import gc
import json
import math
import tempfile
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

MiB = 2**20


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


def measure_step(step: Callable[[], Any]) -> dict[str, int]:
    """`held` (live tensor bytes now), `rise` (the profiled step's peak over it) and
    `peak` = held + rise, for one step; also `rss_rise`, the resident set's high-water
    mark over its value before the step (Linux; 0 elsewhere), for comparison."""
    held = live_tensor_bytes()
    high = [0]

    def run() -> None:
        step()
        high[0] = _status_kib("VmHWM:")

    base = _status_kib("VmRSS:")
    _reset_rss_peak()
    rise = step_peak_bytes(run)
    rss_rise = max(0, high[0] - base) * 1024
    return {"held": held, "rise": rise, "peak": held + rise, "rss_rise": rss_rise}


def fit_inverse_p(ranks: Sequence[int], peaks: Sequence[float]) -> tuple[float, float]:
    """Least-squares `(a, b)` of peak(P) = a / P + b: `a` the part that falls like 1/P,
    `b` what every rank keeps whatever P (halos, a gathered layer, ring blocks in flight
    fall too, but slower; this is their share at these P)."""
    if len(ranks) != len(peaks) or len(ranks) < 2:
        raise ValueError("need at least two (P, peak) pairs")
    xs = [1.0 / p for p in ranks]
    n = len(xs)
    mx, my = sum(xs) / n, sum(peaks) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("need two different P")
    a = sum((x - mx) * (y - my) for x, y in zip(xs, peaks, strict=True)) / sxx
    return a, my - a * mx


def largest_fitting(size: int, peak: float, budget: float, exponent: float, multiple: int) -> int:
    """The largest problem size (a multiple of `multiple`) whose peak fits `budget`, from
    the `peak` measured at `size`, memory growing like size**exponent (an image's edge: 2;
    a sequence length under flash attention: 1; a model's width: 2). 0 when not even
    `multiple` fits."""
    if peak <= 0 or budget <= 0 or size <= 0 or multiple <= 0:
        raise ValueError("size, peak, budget and multiple must be positive")
    fit = size * (budget / peak) ** (1.0 / exponent)
    best = int(math.floor(fit / multiple + 1e-9)) * multiple
    # Rounding in the power must not admit a size over the budget.
    while best > 0 and peak * (best / size) ** exponent > budget * (1 + 1e-12):
        best -= multiple
    return best


def _mib(nbytes: float) -> float:
    return nbytes / MiB


def scaling_report(
    label: str,
    problem: str,
    one_process: float,
    peaks: dict[int, float],
    floors: dict[int, float],
    *,
    floor_note: str,
    targets: dict[int, str] | None = None,
    others: dict[str, dict[int, float]] | None = None,
    fits: dict[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Report rows and one plot for a plugin's per-rank peak (bytes) at each P against one
    process on the whole problem, the floor (`floors`, bytes, P > 1) and `others` (e.g.
    torch's FSDP2, bytes by P). `fits` = {"size", "what", "unit", "exponent", "multiple",
    "budget"} adds the largest problem within `budget` bytes per rank at P = 1 and each P
    (`largest_fitting` from each measured peak)."""
    targets, others = targets or {}, others or {}
    ranks = sorted(peaks)
    rows: list[dict[str, Any]] = []
    for p in ranks:
        rows.append(
            {
                "name": f"per-rank peak memory, P={p}",
                "metric": "allocated bytes, one training step",
                "value": _mib(peaks[p]),
                "unit": "MiB",
                "baseline": "one process, the whole problem",
                "baseline_value": _mib(one_process),
                "ratio": peaks[p] / one_process,
                "target": targets.get(p, f"~1/{p} = {1 / p:.3g}"),
                "notes": f"{problem}; 1/P of one process: {_mib(one_process) / p:.1f} MiB",
            }
        )
    for p in ranks:
        rows.append(
            {
                "name": f"per-rank peak vs the floor, P={p}",
                "metric": "allocated bytes, one training step",
                "value": _mib(peaks[p]),
                "unit": "MiB",
                "baseline": "the floor",
                "baseline_value": _mib(floors[p]),
                "ratio": peaks[p] / floors[p],
                "target": "<= 1.15" if p == 4 else "",
                "notes": floor_note,
            }
        )
    for name, by_p in others.items():
        for p in sorted(by_p):
            rows.append(
                {
                    "name": f"{name} per-rank peak, P={p}",
                    "metric": "allocated bytes, one training step",
                    "value": _mib(by_p[p]),
                    "unit": "MiB",
                    "baseline": "one process, the whole problem",
                    "baseline_value": _mib(one_process),
                    "ratio": by_p[p] / one_process,
                    "target": "for reference",
                    "notes": f"{problem}; ours at P={p}: {_mib(peaks.get(p, math.nan)):.1f} MiB",
                }
            )
    if fits:
        budget = fits["budget"]
        sizes = {
            p: largest_fitting(fits["size"], peak, budget, fits["exponent"], fits["multiple"])
            for p, peak in [(1, one_process), *((p, peaks[p]) for p in ranks)]
        }
        for p in ranks:
            rows.append(
                {
                    "name": f"largest {fits['what']} within {_mib(budget):.0f} MiB per rank, P={p}",
                    "metric": "what fits",
                    "value": sizes[p],
                    "unit": fits["unit"],
                    "baseline": "one process",
                    "baseline_value": sizes[1],
                    "ratio": sizes[p] / sizes[1] if sizes[1] else float("nan"),
                    "target": f"~{p ** (1 / fits['exponent']):.3g}x",
                    "notes": f"from the peak measured at {fits['size']}, memory growing like "
                    f"size^{fits['exponent']}; multiples of {fits['multiple']}",
                }
            )
    xs = [1, *ranks]
    lines = {
        f"{label} (measured)": [_mib(one_process), *(_mib(peaks[p]) for p in ranks)],
        "one process / P": [_mib(one_process) / p for p in xs],
        "floor": [_mib(one_process), *(_mib(floors[p]) for p in ranks)],
    }
    for name, by_p in others.items():
        lines[name] = [_mib(by_p.get(p, float("nan"))) for p in xs]
    series = [
        {
            "title": f"{label}: per-rank peak memory vs ranks ({problem})",
            "x_label": "ranks P",
            "y_label": "per-rank peak, allocated (MiB)",
            "x": xs,
            "lines": lines,
            "log_x": True,
            "log_y": True,
        }
    ]
    return rows, series
