"""Run one test cell's pytest: `python tools/run_cell.py PATHS... [pytest args]`.

Every cell runs every test, except when `DT_TEST_SCOPE=ci` (what `.ci/run` sets): then
the cells of a torch axis in the middle of the window (hatch.toml marks the oldest and
newest with `DT_TORCH_EDGE=1`) deselect the tests marked `compile_heavy`, whose cost is
Inductor compiling what another test already checks exactly. Those run in full on the
oldest and newest torch, so each release still runs every package's exactness tests and
every compiled feature is compiled with the releases that bound the window. pytest
prints how many it deselected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "build" / "test-results"

HEAVY = "compile_heavy"


def selection(scope: str, edge: bool) -> list[str]:
    """pytest arguments that narrow a cell for `scope` ("ci" or "full") on an axis that is
    (`edge`) or is not the oldest or newest of the window."""
    if scope == "ci" and not edge:
        return ["-m", f"not {HEAVY}"]
    return []


def cell_name(paths: list[str]) -> str:
    """The matrix cell a run's test paths belong to: the package of packages/<name>/...,
    or "cross" for tests/."""
    for path in paths:
        parts = Path(path).parts
        if len(parts) >= 2 and parts[0] == "packages":
            return parts[1]
        if parts and parts[0] == "tests":
            return "cross"
    return "other"


def results_file(paths: list[str]) -> Path:
    import torch

    release = torch.__version__.split("+")[0]
    return RESULTS / f"torch-{release}" / f"{cell_name(paths)}.xml"


def main(argv: list[str]) -> int:
    scope = os.environ.get("DT_TEST_SCOPE", "full")
    if scope not in ("full", "ci"):
        print(f"run_cell: DT_TEST_SCOPE={scope!r} is neither 'full' nor 'ci'", file=sys.stderr)
        return 2
    edge = os.environ.get("DT_TORCH_EDGE", "1") == "1"
    narrowed = selection(scope, edge)
    if narrowed:
        print(f"run_cell: CI scope on a middle torch axis: {HEAVY} tests deselected", flush=True)
    paths = [a for a in argv if not a.startswith("-") and Path(a).exists()]
    xml = results_file(paths)
    xml.parent.mkdir(parents=True, exist_ok=True)
    scope_note = {"scope": scope, "deselected": HEAVY if narrowed else None}
    xml.with_suffix(".json").write_text(json.dumps(scope_note) + "\n")
    # xunit1 keeps the properties tests record (`torch_limit`: tools/support_table.py)
    junit = ["-o", "junit_family=xunit1", f"--junitxml={xml}"]
    command = [sys.executable, "-m", "pytest", "-n", "2", *junit, *argv, *narrowed]
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
