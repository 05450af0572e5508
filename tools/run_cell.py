"""Run one test cell's pytest: `python tools/run_cell.py PATHS... [pytest args]`.

Every cell runs every test, except when `DT_TEST_SCOPE=ci` (what `.ci/run` sets, to fit
its 90 minutes on 2 cores): then every cell deselects the tests marked `compile_heavy`
(their cost is Inductor compiling what another test checks exactly); the cells of every
torch axis but one (hatch.toml marks it with `DT_CI_ONCE=1`: 2.13, the CPU build, whose
torch a fresh interpreter imports fastest) also those marked `ci_once` (what they check
does not differ between releases, or they are the larger twin of a case every release
runs); and the cells of the axes between the
window's oldest (`DT_TORCH_OLDEST=1`) and newest also those marked `window_ends` (the
project's own machinery seen through fresh interpreters: autoload, the CLI, the docs'
examples, the harness; what torch changes under them shows at the window's ends). So
each release still runs every package's exactness tests, eager and compiled. pytest
prints how many it deselected. The forge workflow runs every test on every release.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "build" / "test-results"

FORGE_ONLY = ("compile_heavy",)
ONCE_ONLY = ("ci_once",)
ENDS_ONLY = ("window_ends",)


def left_out(
    scope: str, newest: bool, oldest: bool = False, once: bool | None = None
) -> tuple[str, ...]:
    """The markers whose tests a cell leaves out for `scope` ("ci" or "full") on an axis
    that is the window's `newest`, its `oldest`, or neither (an axis between them), and
    that runs the `ci_once` tests or not (`once`; by default the newest does)."""
    if scope != "ci":
        return ()
    once = newest if once is None else once
    return FORGE_ONLY + (() if once else ONCE_ONLY) + (() if newest or oldest else ENDS_ONLY)


def selection(
    scope: str, newest: bool, oldest: bool = False, once: bool | None = None
) -> list[str]:
    """pytest arguments that leave those tests out."""
    markers = left_out(scope, newest, oldest, once)
    return ["-m", " and ".join(f"not {marker}" for marker in markers)] if markers else []


def cell_name(paths: list[str]) -> str:
    """The matrix cell a run's test paths belong to: the package of packages/<name>/...,
    "cross" for tests/, "models" for tests/models; "together" for paths of several cells
    (every package's tests in one run, `hatch run test.<torch>-cross:together`)."""
    cells = list(dict.fromkeys(_cell_of(path) for path in paths))
    if len(cells) > 1:
        return "together"
    return cells[0] if cells else "other"


def _cell_of(path: str) -> str:
    parts = Path(path).parts
    if len(parts) >= 2 and parts[0] == "packages":
        return parts[1]
    if parts[:2] == ("tests", "models"):
        return "models"
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
    newest = os.environ.get("DT_TORCH_NEWEST", "1") == "1"
    oldest = os.environ.get("DT_TORCH_OLDEST", "0") == "1"
    once = os.environ.get("DT_CI_ONCE", "1") == "1"
    narrowed = selection(scope, newest, oldest, once)
    deselected = ", ".join(left_out(scope, newest, oldest, once))
    if narrowed:
        print(f"run_cell: CI scope: {deselected} tests deselected", flush=True)
    paths = [a for a in argv if not a.startswith("-") and Path(a).exists()]
    xml = results_file(paths)
    xml.parent.mkdir(parents=True, exist_ok=True)
    scope_note = {"scope": scope, "deselected": deselected or None}
    xml.with_suffix(".json").write_text(json.dumps(scope_note) + "\n")
    # xunit1 keeps the properties tests record (`torch_limit`: tools/support_table.py)
    junit = ["-o", "junit_family=xunit1", f"--junitxml={xml}"]
    # Paths of several packages share the repository's root as pytest's rootdir (else the
    # first package's folder is, and the others' test ids read as if they lay in it).
    rootdir = ["--rootdir", str(ROOT)] if cell_name(paths) == "together" else []
    command = [sys.executable, "-m", "pytest", "-n", "2", *junit, *rootdir, *argv, *narrowed]
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
