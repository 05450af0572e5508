"""Run every benchmark of the monorepo and write BENCHMARKS.md with tables and PNG plots.

Each package's `benchmarks/run.py --json OUT` (times) and, where it has one,
`benchmarks/memory.py --json OUT` (per-rank memory as ranks grow) report rows (a value
against a baseline measured in the same run, the ratio and the issue's target) and series
for plots; this tool runs them one after another (never in parallel: they time things),
adds dt-core's import-time benchmark, saves the run under build/bench/ by torch release,
and renders the latest run of every release side by side.

    hatch run bench:report [--quick] [--only dt-conv dt-cp] [--suite memory]
    hatch run bench.2.14:report --render-only                   # the table from saved runs

Running (bench_runner.py), the shape of results and saved runs (bench_results.py) and
rendering (bench_render.py) are modules of their own; their names are re-exported here,
where bench_compare.py, bench_unet_memory.py and the tests import them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench_render import (
    MEMORY_HEADING,
    _by_suite,
    _plots,  # noqa: F401 - re-exported for bench_unet_memory.py
    _table,  # noqa: F401 - re-exported for bench_unet_memory.py
    render,
    render_comparison,  # noqa: F401 - re-exported for the tests
    render_memory,
    replace_section,
)
from bench_results import (
    ROOT,
    SUITES,
    _release,
    load_runs,
    package_rows,  # noqa: F401 - re-exported for bench_compare.py
    result_label,
)
from bench_runner import (
    machine_info,
    run_benchmarks,
    run_package,  # noqa: F401 - re-exported for bench_compare.py and the tests
    run_streamed,  # noqa: F401 - re-exported for the tests
)
from heartbeat import DEFAULT_INTERVAL_S, Heartbeat


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
