"""Run every benchmark of the monorepo and write BENCHMARKS.md with tables and PNG plots.

Each package's `benchmarks/run.py --json OUT` (times) and, where it has one,
`benchmarks/memory.py --json OUT` (per-rank memory as ranks grow) report rows (a value
against a baseline measured in the same run, the ratio and the issue's target) and series
for plots; this tool runs them one after another (never in parallel: they time things),
adds dt-core's import-time benchmark, saves the run under build/bench/ by torch release,
and renders the latest run of every release side by side.

    hatch run bench:report [--quick] [--only dt-conv dt-cp] [--suite memory]
    hatch run bench.2.14:report --render-only                   # the table from saved runs
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from heartbeat import DEFAULT_INTERVAL_S, Heartbeat

ROOT = Path(__file__).resolve().parent.parent
PLOTS = Path("docs") / "benchmarks"
# The benchmark scripts a package may have, by suite: `run.py` times (the suite saved runs
# without a "suite" field belong to), `memory.py` per-rank memory.
SUITES = {"time": "run.py", "memory": "memory.py"}


def suite_of(result: dict[str, Any]) -> str:
    return str(result.get("suite", "time"))


def result_label(result: dict[str, Any]) -> str:
    """A result's package, with its suite unless it is the time suite: `dt-conv memory`."""
    suite = suite_of(result)
    return result["package"] if suite == "time" else f"{result['package']} {suite}"


def machine_info() -> list[str]:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f"{mem_kb / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        memory = "unknown"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return [
        f"- date: {datetime.date.today().isoformat()}",
        f"- CPU: {cpu}, {os.cpu_count()} cores, {memory} memory, no GPU"
        if not torch.cuda.is_available()
        else f"- CPU: {cpu}, {os.cpu_count()} cores; GPU: {torch.cuda.get_device_name()}",
        f"- Python {platform.python_version()}",
        f"- load average when the run started: {load:.2f} (other work on the machine adds noise)",
    ]


def run_streamed(
    cmd: list[str], timeout: float, say: Callable[[str], None]
) -> tuple[int | None, str, str]:
    """Run `cmd`, handing each line of its stdout to `say` as it comes (a benchmark's rows
    reach the console while it runs); its exit code (None: killed after `timeout` s),
    stdout and stderr."""
    expired = threading.Event()
    with (
        tempfile.TemporaryFile("w+") as err,
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1) as proc,
    ):

        def kill() -> None:
            expired.set()
            proc.kill()

        timer = threading.Timer(timeout, kill)
        timer.start()
        lines = []
        try:
            assert proc.stdout is not None  # piped above
            for line in proc.stdout:
                lines.append(line)
                say(line.rstrip("\n"))
            code = proc.wait()
        finally:
            timer.cancel()
        err.seek(0)
        return (None if expired.is_set() else code), "".join(lines), err.read()


def _ignore(line: str) -> None:
    """Where a benchmark's lines go when nobody watches (bench_compare's rounds)."""


def run_package(
    bench: Path,
    quick: bool,
    timeout: int,
    python: str = sys.executable,
    say: Callable[[str], None] = _ignore,
) -> dict[str, Any]:
    """One package's benchmark in a fresh interpreter (this one's torch unless `python` is
    another environment's), its printed lines handed to `say`; failures become a report
    row."""
    package = bench.parent.parent.name
    suite = next((s for s, name in SUITES.items() if name == bench.name), "time")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [python, str(bench), "--json", str(out)] + (["--quick"] if quick else [])
        start = time.perf_counter()
        code, stdout, stderr = run_streamed(cmd, timeout, say)
        if code is None:
            return {"package": package, "suite": suite, "error": f"timed out after {timeout} s"}
        elapsed = time.perf_counter() - start
        if code != 0 or not out.exists():
            tail = (stderr or stdout).strip().splitlines()[-3:]
            error = " / ".join(tail) or f"exit {code}"
            return {"package": package, "suite": suite, "error": error}
        result = json.loads(out.read_text())
    result["elapsed_s"] = elapsed
    result["suite"] = suite
    return result


def import_time(quick: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(ROOT / "tools" / "bench_import_time.py"), "--json", "-"]
    cmd += ["--runs", "5" if quick else "21"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        return {"package": "dt-core", "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


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


def _release(run: dict[str, Any]) -> str:
    return str(run["torch"]).split("+")[0]


def _version_key(run: dict[str, Any]) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in _release(run).split("."))


def package_rows(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One package's rows by benchmark name; two rows of one name would hide one of them
    in every table keyed by it, so that is an error naming the row."""
    rows: dict[str, dict[str, Any]] = {}
    for row in result.get("rows", []):
        key = f"{row['name']} ({row['metric']})"
        if key in rows:
            raise ValueError(f"{result['package']}: two benchmark rows named {key!r}")
        rows[key] = row
    return rows


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


def run_benchmarks(
    only: list[str] | None,
    quick: bool,
    timeout: int,
    beat: Heartbeat,
    suites: tuple[str, ...] = tuple(SUITES),
) -> list[dict[str, Any]]:
    """Every chosen benchmark, one after another; the console names each while it runs
    (compiles inside a benchmark print nothing for minutes) and shows the rows it prints."""
    results = []
    if (not only or "dt-core" in only) and "time" in suites:
        beat.phase("measuring import time", prefix="dt-core: ")
        results.append(import_time(quick))
    benches = [b for s in suites for b in ROOT.glob(f"packages/*/benchmarks/{SUITES[s]}")]
    for bench in sorted(benches, key=lambda b: (b.parent.parent.name, b.name != "run.py")):
        package = bench.parent.parent.name
        if only and package not in only:
            continue
        where = bench.relative_to(ROOT)
        beat.phase(f"running {where}", note="compiles print nothing", prefix=f"{package}: ")
        results.append(run_package(bench, quick, timeout, say=beat.say))
        status = results[-1].get("error") or f"{results[-1]['elapsed_s']:.0f} s"
        beat.phase(f"done, {status}" if "error" not in results[-1] else f"FAILED: {status}")
    beat.quiet_phase("writing the report", prefix="")
    return results


def load_runs(folder: Path) -> list[dict[str, Any]]:
    """The latest saved run of every torch release, oldest release first."""
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("torch-*.json"))]
    return sorted(runs, key=_version_key)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a few minutes")
    parser.add_argument("--only", nargs="*", help="packages to run (default: all)")
    parser.add_argument(
        "--suite",
        choices=["all", *SUITES],
        default="all",
        help="run.py (time), memory.py (memory) or both (default)",
    )
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per package")
    parser.add_argument(
        "--render-only", action="store_true", help="rewrite the report from saved runs"
    )
    parser.add_argument("--runs", default=str(ROOT / "build" / "bench"), help="saved runs")
    parser.add_argument(
        "--heartbeat",
        type=float,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help="longest quiet stretch: then the running benchmark is named with its time",
    )
    args = parser.parse_args()
    out, saved = Path(args.out), Path(args.runs)
    results: list[dict[str, Any]] = []
    if not args.render_only:
        import torch

        machine = machine_info()
        with Heartbeat(interval=args.heartbeat) as beat:
            suites = tuple(SUITES) if args.suite == "all" else (args.suite,)
            results += run_benchmarks(args.only, args.quick, args.timeout, beat, suites)
        run = {
            "torch": torch.__version__,
            "machine": machine,
            "mode": "quick (small sizes)" if args.quick else "full",
            "results": results,
        }
        saved.mkdir(parents=True, exist_ok=True)
        path = saved / f"torch-{_release(run)}.json"
        for result in results:
            result["machine"] = machine
        partial = args.only or args.suite != "all"
        if partial and path.exists():  # a partial rerun replaces only its packages' suites
            old = json.loads(path.read_text())
            if old.get("mode") == run["mode"]:
                fresh = {result_label(r): r for r in results}
                kept = [fresh.pop(result_label(r), r) for r in old["results"]]
                for result in kept:  # results saved before they carried their own lines
                    result.setdefault("machine", old.get("earlier_machine", old["machine"]))
                run["results"] = kept + list(fresh.values())
        path.write_text(json.dumps(run, indent=1))
    compare = saved / "compare.json"
    comparison = json.loads(compare.read_text()) if compare.exists() else None
    runs = load_runs(saved)
    if out.exists() and not _by_suite(runs, "time"):
        # Only memory runs are saved here (the time runs were measured elsewhere): rewrite
        # the memory section and keep the rest of the report as it is.
        text = replace_section(out.read_text(), MEMORY_HEADING, render_memory(runs, out))
    else:
        text = render(runs, out, comparison)
    out.write_text(text)
    print(f"wrote {out}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
