"""Render BENCHMARKS.md from saved runs: the tables, the memory section, the plots.

Its own module because rendering reads only saved runs (`--render-only` measures
nothing), and bench_unet_memory.py renders its own section with the same tables and plots.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from bench_results import _release, package_rows, result_label, suite_of

PLOTS = Path("docs") / "benchmarks"


def plot(series: dict[str, Any], path: Path) -> None:
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    for label, ys in series["lines"].items():
        # the series' reference lines (1/P, the floor) thin and dashed, over measured ones
        reference = label in series.get("reference_lines", ())
        ax.plot(
            series["x"],
            ys,
            marker="o",
            label=label,
            linestyle="--" if reference else "-",
            linewidth=1.2 if reference else 2,
            markersize=3 if reference else 6,
            zorder=3 if reference else 2,
        )
    ax.set_xscale("log" if series.get("log_x") else "linear")
    ax.set_yscale("log" if series.get("log_y") else "linear")
    if series.get("log_x") and len(series["x"]) <= 10:  # the measured x values, plainly
        from matplotlib.ticker import NullLocator

        ax.set_xticks(series["x"], [f"{v:g}" for v in series["x"]])
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(series["x_label"])
    ax.set_ylabel(series["y_label"])
    ax.set_title(textwrap.fill(series["title"], 64), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _num(v: Any) -> str:
    if isinstance(v, (int, float)):
        return f"{v:.4g}"
    return str(v)


def _rows(run: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """One run's rows keyed by (package, benchmark); a failed package is one row."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for result in run["results"]:
        if "error" in result:
            rows[(result_label(result), "FAILED")] = {"error": result["error"]}
            continue
        for key, row in package_rows(result).items():
            rows[(result_label(result), key)] = row
    return rows


def _cells(row: dict[str, Any] | None) -> list[str]:
    if row is None:
        return ["not run", "", ""]
    if "error" in row:
        return [f"FAILED: {row['error']}", "", ""]
    value = f"{_num(row['value'])} {row.get('unit', '')}".strip()
    baseline = f"{row['baseline']}: {_num(row['baseline_value'])}"
    return [value, baseline, f"**{_num(row['ratio'])}**"]


def _change(old: dict[str, Any] | None, new: dict[str, Any] | None) -> str:
    """The newer torch's value over the older one's (for times, below 1 is faster)."""
    if not old or not new or "error" in old or "error" in new:
        return ""
    a, b = old.get("value"), new.get("value")
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or a == 0:
        return ""
    return _num(b / a)


def _machine_lines(run: dict[str, Any]) -> list[str]:
    """Where and when each package's rows were measured: partial reruns leave a run's
    packages measured at different times, each result keeping its own machine lines."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for result in run["results"]:
        machine = tuple(result.get("machine") or run["machine"])
        groups.setdefault(machine, []).append(result_label(result))
    if len(groups) == 1:
        return list(next(iter(groups)))
    lines = []
    for machine, packages in groups.items():
        lines += [f"- {', '.join(packages)}:", *(f"  {line}" for line in machine)]
    return lines


MEMORY_HEADING = "## Per-rank memory as ranks grow"
MEMORY_INTRO = (
    "Written by `hatch run bench:report --suite memory` (each package's "
    "`benchmarks/memory.py`). A fixed whole problem, one training step (dt-symm-mem: a "
    "forward, its ops have no autograd), P spawned gloo ranks (one thread each) against one "
    "process with plain torch; the largest rank's peak. A "
    "rank's peak is the tensors it holds before the step plus its resident set's rise during "
    "the step, each process started with glibc's mmap threshold fixed at 64 KiB so every "
    "larger block is its own mapping, whose pages go back when it is freed "
    "(`dt_core.testing.memory`). Not torch's profiler alone: it records frees only on the "
    "thread it profiles, and gloo frees its collectives' copies of their inputs on its worker "
    "threads, so it counts some of them as held to the end of the step; its view (held + the "
    "profiler's rise) is in each floor row's notes. The ~266 MiB each rank process carries "
    "before any tensor (the interpreter, torch, gloo) is in neither. Each floor is a lower "
    'bound, computed as its notes and the benchmark\'s docstring say. "What fits" scales '
    "each measured peak by the size's power (edge², S, width², tokens) to a 1024 MiB "
    "per-rank budget."
)


def _by_suite(runs: list[dict[str, Any]], suite: str) -> list[dict[str, Any]]:
    """The runs with only `suite`'s results; runs without any are left out."""
    picked = []
    for run in runs:
        results = [r for r in run["results"] if suite_of(r) == suite]
        if results:
            picked.append({**run, "results": results})
    return picked


def _table(runs: list[dict[str, Any]]) -> list[str]:
    """The runs' machine lines, then one row per (package, benchmark), a column group
    per torch (oldest first)."""
    lines: list[str] = []
    for run in runs:
        lines += [f"torch {run['torch']}:", "", *_machine_lines(run), f"- mode: {run['mode']}", ""]
    header = ["package", "benchmark", "target"]
    for run in runs:
        r = _release(run)
        header += [f"{r}: value", f"{r}: baseline", f"{r}: ratio"]
    if len(runs) > 1:
        header.append(f"value {_release(runs[-1])} / {_release(runs[0])}")
    header.append("notes")
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    by_run = [_rows(run) for run in runs]
    keys: list[tuple[str, str]] = []
    for rows in by_run:
        keys += [k for k in rows if k not in keys]
    for key in keys:
        found = [rows.get(key) for rows in by_run]
        first = next((r for r in found if r and "error" not in r), {})
        cells = [key[0], key[1], str(first.get("target", ""))]
        for row in found:
            cells += _cells(row)
        if len(runs) > 1:
            cells.append(_change(found[0], found[-1]))
        cells.append(str(first.get("notes", "")))
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _plots(runs: list[dict[str, Any]], out: Path) -> list[str]:
    lines: list[str] = []
    for run in runs:
        for result in run["results"]:
            for i, series in enumerate(result.get("series", [])):
                name = f"{result_label(result).replace(' ', '-')}-{i}-torch-{_release(run)}.png"
                title = f"{series['title']} (torch {_release(run)})"
                plot(series, out.parent / PLOTS / name)
                lines += [f"### {title}", "", f"![{title}]({PLOTS / name})", ""]
    return lines


def render_memory(runs: list[dict[str, Any]], out: Path) -> list[str]:
    """The memory section: its heading, how memory is counted, the table, the plots."""
    memory = _by_suite(runs, "memory")
    if not memory:
        return []
    return [MEMORY_HEADING, "", MEMORY_INTRO, "", *_table(memory), *_plots(memory, out)]


def replace_section(text: str, heading: str, section: list[str]) -> str:
    """`text` with the section under `heading` (up to the next `## ` heading) replaced by
    `section`'s lines, or `section` appended where `text` has no such heading."""
    new = "\n".join(section).rstrip("\n") + "\n\n"
    start = text.find(heading + "\n")
    if start < 0:
        return text.rstrip("\n") + "\n\n" + new
    end = text.find("\n## ", start + len(heading))
    return text[:start] + new + (text[end + 1 :] if end >= 0 else "")


def render(runs: list[dict[str, Any]], out: Path, comparison: dict[str, Any] | None = None) -> str:
    """BENCHMARKS.md from one run per torch release, side by side (oldest torch first):
    the time table, the memory section, then the interleaved comparison of the torches
    when one was run."""
    lines = [
        "# Benchmarks",
        "",
        "Written by `hatch run bench:report` (tools/bench_report.py), which runs every "
        "package's `benchmarks/run.py` one after another, on every torch of the test matrix "
        "(`hatch run bench.2.14:report` runs one; each run's results are kept in "
        "build/bench/ and the table shows the latest run of each torch). Every ratio is "
        "against a baseline measured in the same run on the same machine; targets come "
        "from the issues. Timed assertions never live in tests.",
        "",
    ]
    times = _by_suite(runs, "time")
    lines += _table(times)
    lines += render_memory(runs, out)
    if comparison:
        lines += render_comparison(comparison)
    lines += _plots(times, out)
    return "\n".join(lines) + "\n"


def _spread(values: list[float]) -> str:
    return f"{_num(statistics.median(values))} ({_num(min(values))}-{_num(max(values))})"


def render_comparison(compare: dict[str, Any]) -> list[str]:
    """The interleaved torch comparison (tools/bench_compare.py) as a section."""
    older, newer = compare["torches"][0], compare["torches"][-1]
    lines = [
        f"## Torch {newer} against {older}, interleaved rounds",
        "",
        "Written by `hatch run bench-compare:run` (tools/bench_compare.py): rounds that each "
        "run both torches one after the other, the order flipped every round. Values are "
        "medians over the rounds (lowest-highest); the last two columns compare the torches "
        "within each round. A row is higher or lower on the newer torch only if it was so in "
        "every round. Runs:",
        "",
    ]
    for run in compare["runs"]:
        low, mid, high = run["load_average"]
        lines.append(
            f"- {', '.join(run['packages'])}: {run['date']}, {run['rounds']} rounds, "
            f"{run['mode']}, load average {low:.2f}-{high:.2f} (median {mid:.2f})"
        )
    lines += [
        "",
        f"| package | benchmark | {older} | {newer} | {newer} / {older} per round | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for run in compare["runs"]:
        for row in run["rows"]:
            unit = f" {row['unit']}" if row["unit"] else ""
            cells = [row["package"], row["benchmark"]]
            cells += [_spread(row["values"][t]) + unit for t in (older, newer)]
            cells += [_spread(row["ratios"]) if row["ratios"] else "", row["verdict"]]
            lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]
