"""What a benchmark result and a saved run look like: suites, labels, rows, releases.

Its own module because running the benchmarks (bench_runner.py), rendering the report
(bench_render.py) and comparing torches (bench_compare.py) all read the same shapes: a
result is one package's `benchmarks/*.py --json` output, a run is one torch's results.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The benchmark scripts a package may have, by suite: `run.py` times (the suite saved runs
# without a "suite" field belong to), `memory.py` per-rank memory.
SUITES = {"time": "run.py", "memory": "memory.py"}


def suite_of(result: dict[str, Any]) -> str:
    return str(result.get("suite", "time"))


def result_label(result: dict[str, Any]) -> str:
    """A result's package, with its suite unless it is the time suite: `dt-conv memory`."""
    suite = suite_of(result)
    return result["package"] if suite == "time" else f"{result['package']} {suite}"


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


def load_runs(folder: Path) -> list[dict[str, Any]]:
    """The latest saved run of every torch release, oldest release first."""
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("torch-*.json"))]
    return sorted(runs, key=_version_key)
