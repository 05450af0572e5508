"""tools/affected.py picks the CI cells of real changes from this repository's history.

Each case is a commit of `git log` and the cells its diff against its first parent must
run, worked out by hand from `git show --stat`. CI checks out the full history
(fetch-depth 0), so these commits exist there.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

# what this module checks does not differ between torch releases (.ci/run: one axis only)
pytestmark = pytest.mark.ci_once

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "affected.py"
EVERYTHING = ["dt-core", "dt-conv", "dt-cp", "dt-fsdp-passes", "dt-symm-mem", "cross", "lint"]


def load_affected():
    spec = importlib.util.spec_from_file_location("affected", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REAL_CHANGES = [
    # README.md only: documentation, no test cell.
    ("2d0e5f1", ["lint"]),
    # BENCHMARKS.md only.
    ("1c0e96f", ["lint"]),
    # packages/dt-conv/src/dt_conv/forward.py: dt-conv and the cross-plugin tests.
    ("f2465ae", ["dt-conv", "cross", "lint"]),
    # packages/dt-symm-mem/src/dt_symm_mem/algorithms.py.
    ("62e0b74", ["dt-symm-mem", "cross", "lint"]),
    # BENCHMARKS.md, docs/ plots, dt-symm-mem's __init__ and tests/test_import_cost.py.
    ("acd5e33", ["dt-symm-mem", "cross", "lint"]),
    # packages/dt-core/src/dt_core/testing/pickling.py: dt-core reaches every cell.
    ("b750e80", EVERYTHING),
    # hatch.toml and tools/bench_*.py: shared tooling reaches every cell.
    ("24be4be", EVERYTHING),
    # The merge of branch dt-cp (dt-core and dt-cp files), against its first parent.
    ("97e3028", EVERYTHING),
]


def run_affected(*args: str) -> list[str]:
    """The cells `tools/affected.py ARGS --json` prints, run as CI runs it."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--json"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout)


def git_available(commit: str) -> bool:
    probe = ["git", "cat-file", "-e", f"{commit}^{{commit}}"]
    return subprocess.run(probe, cwd=ROOT, capture_output=True).returncode == 0


@pytest.mark.parametrize(("commit", "cells"), REAL_CHANGES)
def test_cells_of_real_commits(commit: str, cells: list[str]) -> None:
    assert git_available(commit), f"{commit} missing: CI must clone with fetch-depth 0"
    assert run_affected(f"{commit}^1", commit) == cells


def test_rules_on_paths() -> None:
    affected = load_affected()
    assert affected.cells_for([]) == []
    assert affected.cells_for(["packages/dt-cp/README.md"]) == ["dt-cp", "cross", "lint"]
    both = ["packages/dt-cp/src/dt_cp/sdpa.py", "packages/dt-conv/tests/test_plugin.py"]
    assert affected.cells_for(both) == ["dt-conv", "dt-cp", "cross", "lint"]
    assert affected.cells_for(["tests/test_demo.py"]) == ["cross", "lint"]
    for shared in (".github/workflows/ci.yml", ".ci/run", "ruff.toml", "tools/demo.py"):
        assert affected.cells_for([shared]) == EVERYTHING, shared
    # A package folder that is not (or no longer) a package: run everything.
    assert affected.cells_for(["packages/dt-new/pyproject.toml"]) == EVERYTHING
    assert affected.cells_for(["docs/benchmarks/dt-cp-0.png"]) == ["lint"]


def test_all_lists_every_cell() -> None:
    assert run_affected("--all") == EVERYTHING


def test_cells_match_the_hatch_test_matrix() -> None:
    """The workflow's cells are hatch environments: test.<torch>-<cell> for all but lint,
    on the same torch axis as hatch's matrix."""
    import re

    import tomllib

    affected = load_affected()
    matrix = tomllib.loads((ROOT / "hatch.toml").read_text())["envs"]["test"]["matrix"]
    assert sorted([*matrix[0]["package"], "lint"]) == sorted(affected.all_cells())
    workflow = (ROOT / ".github/workflows/ci.yml").read_text()
    assert "hatch run test.${{ matrix.torch }}-${{ matrix.cell }}:run" in workflow
    axis = re.search(r"^\s+torch: \[(.*)\]$", workflow, re.M)
    assert axis, "the workflow has no torch axis"
    assert [t.strip().strip('"') for t in axis.group(1).split(",")] == matrix[0]["torch"]
    assert "hatch run lint:check" in workflow
