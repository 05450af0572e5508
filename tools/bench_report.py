"""Run every benchmark of the monorepo and write BENCHMARKS.md with tables and PNG plots.

Each package's `benchmarks/run.py --json OUT` reports rows (a value against a baseline
measured in the same run, the ratio and the issue's target) and series for plots; this
tool runs them one after another (never in parallel: they time things), adds dt-core's
import-time benchmark, and renders the results.

    hatch run bench:report [--quick] [--only dt-conv dt-cp]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PLOTS = Path("docs") / "benchmarks"


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
        f"- Python {platform.python_version()}, torch {torch.__version__}",
        f"- load average when the run started: {load:.2f} (other work on the machine adds noise)",
    ]


def run_package(bench: Path, quick: bool, timeout: int) -> dict[str, Any]:
    """One package's benchmark in a fresh interpreter; failures become a report row."""
    package = bench.parent.parent.name
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, str(bench), "--json", str(out)] + (["--quick"] if quick else [])
        start = time.perf_counter()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"package": package, "error": f"timed out after {timeout} s"}
        elapsed = time.perf_counter() - start
        if done.returncode != 0 or not out.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return {"package": package, "error": " / ".join(tail) or f"exit {done.returncode}"}
        result = json.loads(out.read_text())
    result["elapsed_s"] = elapsed
    return result


def import_time(quick: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(ROOT / "tools" / "bench_import_time.py"), "--json", "-"]
    cmd += ["--runs", "5" if quick else "21"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        return {"package": "dt-core", "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def plot(series: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    for label, ys in series["lines"].items():
        ax.plot(series["x"], ys, marker="o", label=label)
    ax.set_xscale("log" if series.get("log_x") else "linear")
    ax.set_yscale("log" if series.get("log_y") else "linear")
    ax.set_xlabel(series["x_label"])
    ax.set_ylabel(series["y_label"])
    ax.set_title(series["title"], fontsize=10)
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


def render(results: list[dict[str, Any]], machine: list[str], quick: bool, out: Path) -> str:
    lines = [
        "# Benchmarks",
        "",
        "Written by `hatch run bench:report` (tools/bench_report.py), which runs every "
        "package's `benchmarks/run.py` one after another. Every ratio is against a baseline "
        "measured in the same run on the same machine; targets come from the issues. Timed "
        "assertions never live in tests.",
        "",
        *machine,
        f"- mode: {'quick (small sizes)' if quick else 'full'}",
        "",
        "| package | benchmark | value | baseline | ratio | target | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        if "error" in result:
            lines.append(f"| {result['package']} | FAILED | {result['error']} | | | | |")
            continue
        for row in result["rows"]:
            lines.append(
                f"| {result['package']} | {row['name']} ({row['metric']}) "
                f"| {_num(row['value'])} {row.get('unit', '')} "
                f"| {row['baseline']}: {_num(row['baseline_value'])} "
                f"| **{_num(row['ratio'])}** | {row.get('target', '')} | {row.get('notes', '')} |"
            )
    lines.append("")
    for result in results:
        for i, series in enumerate(result.get("series", [])):
            name = f"{result['package']}-{i}.png"
            plot(series, out.parent / PLOTS / name)
            lines += [f"### {series['title']}", "", f"![{series['title']}]({PLOTS / name})", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a few minutes")
    parser.add_argument("--only", nargs="*", help="packages to run (default: all)")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per package")
    args = parser.parse_args()
    out = Path(args.out)
    machine = machine_info()
    results = []
    benches = sorted(ROOT.glob("packages/*/benchmarks/run.py"))
    if not args.only or "dt-core" in args.only:
        print("dt-core: import time ...", flush=True)
        results.append(import_time(args.quick))
    for bench in benches:
        package = bench.parent.parent.name
        if args.only and package not in args.only:
            continue
        print(f"{package} ...", flush=True)
        results.append(run_package(bench, args.quick, args.timeout))
        status = results[-1].get("error") or f"{results[-1]['elapsed_s']:.0f} s"
        print(f"{package}: {status}", flush=True)
    out.write_text(render(results, machine, args.quick, out))
    print(f"wrote {out}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
