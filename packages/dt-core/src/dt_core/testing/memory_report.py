"""The rows and plot of a memory benchmark's report, from the measurements
(`dt_core.testing.memory`): each per-rank peak against one process and the floor, what
fits in a per-rank budget, torch's allocation view in the notes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

MiB = 2**20


def allocation_note(one_process: dict[str, int], by_p: dict[int, dict[str, int]]) -> str:
    """The profiler's allocation view beside the headline (notes of a report's rows)."""
    per_p = ", ".join(
        f"P={p} {_mib(r['held'] + r['alloc_rise']):.1f}" for p, r in sorted(by_p.items())
    )
    return (
        f"torch's allocation view (held + profiler rise), MiB: {per_p} (one process "
        f"{_mib(one_process['held'] + one_process['alloc_rise']):.1f}); it counts buffers "
        "freed on gloo's threads as held"
    )


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


PEAK_METRIC = "tensors held + resident rise, one training step"


def _peak_row(
    name: str, value: float, baseline: str, baseline_value: float, target: str, notes: str
) -> dict[str, Any]:
    """A report row comparing a per-rank peak (bytes) with a baseline (bytes), in MiB."""
    return {
        "name": name,
        "metric": PEAK_METRIC,
        "value": _mib(value),
        "unit": "MiB",
        "baseline": baseline,
        "baseline_value": _mib(baseline_value),
        "ratio": value / baseline_value,
        "target": target,
        "notes": notes,
    }


class Fits(NamedTuple):
    """The largest problem within a per-rank budget, as a report shows it: the problem
    `size` the peaks were measured at, what that size counts (`what`, in `unit`), memory
    growing like size**`exponent` (`largest_fitting`), sizes in steps of `multiple`."""

    size: int
    what: str
    unit: str
    exponent: float
    multiple: int
    budget: float = 1024 * MiB  # bytes per rank


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
    fits: Fits | dict[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Report rows and one plot for a plugin's per-rank peak (bytes) at each P against one
    process on the whole problem, the floor (`floors`, bytes, P > 1) and `others` (e.g.
    torch's FSDP2, bytes by P). `fits` (a `Fits`, or a dict of its fields) adds the largest
    problem within its budget per rank at P = 1 and each P (`largest_fitting` from each
    measured peak)."""
    targets, others = targets or {}, others or {}
    ranks = sorted(peaks)
    per_p = ", ".join(f"P={p} {_mib(one_process) / p:.1f}" for p in ranks)
    rows = [
        _peak_row(
            f"per-rank peak memory, P={p}",
            peaks[p],
            "one process, the whole problem",
            one_process,
            targets.get(p, f"~1/{p} = {1 / p:.3g}"),
            f"{problem}; one process / P, MiB: {per_p}",
        )
        for p in ranks
    ]
    rows += [
        _peak_row(
            f"per-rank peak vs the floor, P={p}",
            peaks[p],
            "the floor",
            floors[p],
            "<= 1.15" if p == 4 else "",
            floor_note,
        )
        for p in ranks
    ]
    for name, by_p in others.items():
        rows += [
            _peak_row(
                f"{name} per-rank peak, P={p}",
                by_p[p],
                "one process, the whole problem",
                one_process,
                "for reference",
                f"{problem}; ours at P={p}: {_mib(peaks.get(p, math.nan)):.1f} MiB",
            )
            for p in sorted(by_p)
        ]
    if isinstance(fits, dict):
        fits = Fits(**fits)
    if fits is not None:
        sizes = {
            p: largest_fitting(fits.size, peak, fits.budget, fits.exponent, fits.multiple)
            for p, peak in [(1, one_process), *((p, peaks[p]) for p in ranks)]
        }
        within = f"within {_mib(fits.budget):.0f} MiB per rank"
        for p in ranks:
            rows.append(
                {
                    "name": f"largest {fits.what} {within}, P={p}",
                    "metric": "what fits",
                    "value": sizes[p],
                    "unit": fits.unit,
                    "baseline": "one process",
                    "baseline_value": sizes[1],
                    "ratio": sizes[p] / sizes[1] if sizes[1] else float("nan"),
                    "target": f"~{p ** (1 / fits.exponent):.3g}x",
                    "notes": f"from the peak measured at {fits.size}, memory growing like "
                    f"size^{fits.exponent}; multiples of {fits.multiple}",
                }
            )
    xs = [1, *ranks]
    reference_lines = {
        "one process / P": [_mib(one_process) / p for p in xs],
        "floor": [_mib(one_process), *(_mib(floors[p]) for p in ranks)],
    }
    lines = {
        f"{label} (measured)": [_mib(one_process), *(_mib(peaks[p]) for p in ranks)],
        **reference_lines,
    }
    for name, by_p in others.items():
        lines[name] = [_mib(by_p.get(p, float("nan"))) for p in xs]
    series = [
        {
            "title": f"{label}: per-rank peak memory vs ranks ({problem})",
            "x_label": "ranks P",
            "y_label": "per-rank peak (MiB)",
            "x": xs,
            "lines": lines,
            "log_x": True,
            "log_y": True,
            "reference_lines": list(reference_lines),
        }
    ]
    return rows, series


def measured_report(
    label: str,
    problem: str,
    reference: dict[str, int],
    ours: dict[int, dict[str, int]],
    floors: dict[int, float],
    *,
    floor_note: str,
    **options: Any,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`scaling_report` from what `measure_one_process` (`reference`) and `measure_ranks`
    (`ours`) returned: their peaks, and torch's allocation view after the floor's note.
    `options`: `scaling_report`'s `targets`, `others`, `fits`."""
    return scaling_report(
        label,
        problem,
        reference["peak"],
        {p: r["peak"] for p, r in ours.items()},
        floors,
        floor_note=f"{floor_note}; {allocation_note(reference, ours)}",
        **options,
    )
