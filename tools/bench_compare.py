"""Is a plugin slower on the newer torch? Its benchmarks, run in rounds that alternate torches.

Why: `hatch run bench:report` runs each torch once, one after the other. On a small shared
machine one run moves by 10% or more with the machine's load, so a single pair of runs
cannot tell a 7% slowdown from a busier quarter of an hour. This tool runs the chosen
packages' `benchmarks/run.py` in rounds, every torch of the matrix once per round, the
order flipped each round (A B, B A, ...) so that drift hits both, and keeps every value.
A row is called slower (or faster) on the newer torch only when it was so in every round;
otherwise the difference is within what the machine does between runs. The summary goes
to build/bench/compare.json, and `bench_report.py` renders it under BENCHMARKS.md's table.

    hatch run bench-compare:run -- --only dt-conv dt-symm-mem [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomllib
from bench_report import ROOT, package_rows, run_package


def torch_axis() -> list[str]:
    """The bench environments' torch axis as hatch.toml declares it (oldest first)."""
    config = tomllib.loads((ROOT / "hatch.toml").read_text())
    (matrix,) = config["envs"]["bench"]["matrix"]
    return list(matrix["torch"])


def interpreter(axis: str) -> str:
    """The Python of `bench.<axis>`, created and given the packages through hatch."""
    subprocess.run(["hatch", "run", f"bench.{axis}:install"], check=True)
    found = subprocess.run(
        ["hatch", "env", "find", f"bench.{axis}"], capture_output=True, text=True, check=True
    )
    return str(Path(found.stdout.strip()) / "bin" / "python")


def torch_version(python: str) -> str:
    done = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def verdict(ratios: list[float]) -> str:
    """newer/older per round -> what can be said of the newer torch."""
    if not ratios:
        return "no ratio: the older torch's value is 0"
    if all(abs(r - 1.0) < 1e-9 for r in ratios):
        return "same"
    if len(ratios) < 2:
        return "one round: not enough to say"
    if all(r > 1.0 for r in ratios):
        return "**higher in every round**"
    if all(r < 1.0 for r in ratios):
        return "lower in every round"
    return "within noise (mixed rounds)"


def _numbers(results: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[float, str]]:
    """One torch's numeric rows in one round: (package, benchmark) -> (value, unit)."""
    return {
        (result["package"], name): (row["value"], row.get("unit", ""))
        for result in results
        for name, row in package_rows(result).items()
        if isinstance(row.get("value"), (int, float))
    }


def summarize(
    rounds: list[dict[str, list[dict[str, Any]]]], torches: list[str]
) -> list[dict[str, Any]]:
    """Per benchmark row: each torch's values over the rounds and newer/older per round
    (a round counts for a row only if both torches measured it in that round).

    `rounds[i][torch]` is that round's results (one per package, as run.py writes them)."""
    older, newer = torches[0], torches[-1]
    measured = [{torch: _numbers(one_round[torch]) for torch in torches} for one_round in rounds]
    keys = dict.fromkeys(key for m in measured for torch in torches for key in m[torch])
    summary = []
    for key in keys:
        ratios = [
            m[newer][key][0] / m[older][key][0]
            for m in measured
            if key in m[older] and key in m[newer] and m[older][key][0] != 0
        ]
        unit = next(m[torch][key][1] for m in measured for torch in torches if key in m[torch])
        summary.append(
            {
                "package": key[0],
                "benchmark": key[1],
                "unit": unit,
                "values": {t: [m[t][key][0] for m in measured if key in m[t]] for t in torches},
                "ratios": ratios,
                "verdict": verdict(ratios),
            }
        )
    return summary


def merged(saved: Path, torches: list[str], run: dict[str, Any]) -> dict[str, Any]:
    """The saved comparison with `run` in it: earlier runs of the same torches keep the
    packages this run did not compare (a rerun of some packages replaces only theirs)."""
    kept: list[dict[str, Any]] = []
    if saved.exists():
        old = json.loads(saved.read_text())
        if old.get("torches") == torches:
            for earlier in old["runs"]:
                rest = [p for p in earlier["packages"] if p not in run["packages"]]
                if rest:
                    rows = [r for r in earlier["rows"] if r["package"] in rest]
                    kept.append({**earlier, "packages": rest, "rows": rows})
    return {"torches": torches, "runs": [*kept, run]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", required=True, help="packages to compare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="the benchmarks' small sizes")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per package run")
    parser.add_argument("--runs", default=str(ROOT / "build" / "bench"), help="saved runs")
    args = parser.parse_args()
    benches = {p.parent.parent.name: p for p in ROOT.glob("packages/*/benchmarks/run.py")}
    unknown = [p for p in args.only if p not in benches]
    if unknown:
        parser.error(f"no benchmarks/run.py in: {', '.join(unknown)}")
    axis_order = torch_axis()
    pythons = {axis: interpreter(axis) for axis in axis_order}
    versions = {axis: torch_version(python) for axis, python in pythons.items()}
    torches = [versions[axis] for axis in axis_order]
    loads: list[float] = []
    rounds: list[dict[str, list[dict[str, Any]]]] = []
    for i in range(args.rounds):
        order = axis_order if i % 2 == 0 else axis_order[::-1]
        results: dict[str, list[dict[str, Any]]] = {}
        for axis in order:
            loads.append(os.getloadavg()[0])
            results[versions[axis]] = []
            for package in args.only:
                print(
                    f"round {i + 1}/{args.rounds}, torch {versions[axis]}: {package} ...",
                    flush=True,
                )
                result = run_package(benches[package], args.quick, args.timeout, pythons[axis])
                if "error" in result:
                    print(f"{package} failed on torch {versions[axis]}: {result['error']}")
                    return 1
                results[versions[axis]].append(result)
        rounds.append(results)
    out = Path(args.runs) / "compare.json"
    run = {
        "date": datetime.date.today().isoformat(),
        "rounds": args.rounds,
        "mode": "quick (small sizes)" if args.quick else "full",
        "packages": args.only,
        "load_average": [min(loads), statistics.median(loads), max(loads)],
        "rows": summarize(rounds, torches),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged(out, torches, run), indent=1))
    print(f"wrote {out}; `hatch run bench.2.13:report -- --render-only` puts it in BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
