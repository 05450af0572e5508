"""tools/run_cell.py and support_table.py: which tests a cell leaves out in CI's scope,
where it files its results, and the README table rendered from those results.

The JUnit inputs are hand-made; the expected cells are counted by hand from them."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from tool_scripts import import_tools

# what this module checks does not differ between torch releases (.ci/run: one axis only)
pytestmark = pytest.mark.ci_once


@pytest.fixture
def tools(monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, ModuleType]:
    run_cell, support_table = import_tools(monkeypatch, "run_cell", "support_table")
    return run_cell, support_table


def test_ci_scope_leaves_compile_heavy_out_and_ci_once_below_the_newest_release(tools) -> None:
    run_cell, _ = tools
    oldest = run_cell.selection("ci", newest=False, oldest=True)
    assert oldest == ["-m", "not compile_heavy and not ci_once"]
    assert run_cell.selection("ci", newest=True) == ["-m", "not compile_heavy"]
    assert run_cell.selection("full", newest=False) == []
    assert run_cell.selection("full", newest=True) == []
    assert run_cell.selection("full", newest=False, oldest=True) == []


def test_ci_once_tests_run_on_the_axis_marked_for_them(tools) -> None:
    """The ci_once tests run where the axis says so (DT_CI_ONCE), whether it is the newest
    or not; the window_ends ones still follow the window's ends. hatch.toml marks exactly
    one axis of the test matrix, so CI runs them once."""
    import tomllib

    run_cell, _ = tools
    assert run_cell.selection("ci", newest=False, once=True) == [
        "-m",
        "not compile_heavy and not window_ends",
    ]
    assert run_cell.selection("ci", newest=True, once=False) == [
        "-m",
        "not compile_heavy and not ci_once",
    ]
    hatch = tomllib.loads((Path(__file__).parent.parent / "hatch.toml").read_text())
    env_vars = hatch["envs"]["test"]["overrides"]["matrix"]["torch"]["env-vars"]
    marks = [v for v in env_vars if v["key"] == "DT_CI_ONCE"]
    axes = hatch["envs"]["test"]["matrix"][0]["torch"]
    once = [axis for v in marks if v["value"] == "1" for axis in v["if"]]
    others = [axis for v in marks if v["value"] == "0" for axis in v["if"]]
    assert len(once) == 1 and sorted(once + others) == sorted(axes), marks


def test_ci_scope_leaves_window_ends_out_between_the_oldest_and_newest_release(tools) -> None:
    run_cell, _ = tools
    between = run_cell.selection("ci", newest=False, oldest=False)
    assert between == ["-m", "not compile_heavy and not ci_once and not window_ends"]
    assert run_cell.left_out("ci", newest=False) == ("compile_heavy", "ci_once", "window_ends")


def test_a_cell_is_named_by_its_test_paths(tools) -> None:
    run_cell, _ = tools
    assert run_cell.cell_name(["packages/dt-conv/tests"]) == "dt-conv"
    assert run_cell.cell_name(["packages/dt-core/tests/test_autoload.py"]) == "dt-core"
    assert run_cell.cell_name(["tests"]) == "cross"
    assert run_cell.cell_name(["tests/models"]) == "models"
    every = ["packages/dt-core/tests", "packages/dt-conv/tests", "tests"]
    assert run_cell.cell_name(every) == "together"


def _junit(path: Path, outcomes: list[str]) -> None:
    cases = []
    for i, outcome in enumerate(outcomes):
        inner = {
            "passed": "",
            "failed": '<failure message="boom"/>',
            "error": '<error message="setup"/>',
            "xfailed": '<skipped type="pytest.xfail" message="torch bug"/>',
            "skipped": '<skipped type="pytest.skip" message="no"/>',
        }[outcome]
        cases.append(f'<testcase classname="t" name="c{i}">{inner}</testcase>')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<testsuites><testsuite>{''.join(cases)}</testsuite></testsuites>")


def test_the_table_counts_each_cell_per_release_and_says_what_was_left_out(
    tools, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, support_table = tools
    monkeypatch.setattr(support_table, "RESULTS", tmp_path)
    _junit(tmp_path / "torch-2.13.0" / "dt-conv.xml", ["passed"] * 3 + ["failed", "xfailed"])
    _junit(tmp_path / "torch-2.9.1" / "dt-conv.xml", ["passed", "error"])
    _junit(tmp_path / "torch-2.13.0" / "cross.xml", ["passed", "passed"])
    note = {"scope": "ci", "deselected": "compile_heavy, ci_once"}
    (tmp_path / "torch-2.13.0" / "cross.json").write_text(json.dumps(note))
    lines = support_table.table().splitlines()
    assert lines[0] == "| cell | torch 2.9.1 | torch 2.13.0 |"  # releases in numeric order
    rows = {line.split(" | ")[0].strip("| "): line for line in lines[2:8]}
    assert rows["dt-conv"] == "| dt-conv | 1 passed, 1 errors | 3 passed, 1 failed, 1 xfailed |"
    expected = "| cross | not run | 2 passed, CI scope (compile_heavy, ci_once left out) |"
    assert rows["cross"] == expected
    assert rows["dt-cp"] == "| dt-cp | not run | not run |"


def test_write_replaces_only_the_marked_block(tools, tmp_path: Path) -> None:
    _, support_table = tools
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{support_table.START}\nold\n{support_table.END}\nrest\n")
    support_table.write(readme, "| new |")
    assert readme.read_text() == (
        f"intro\n{support_table.START}\n| new |\n{support_table.END}\nrest\n"
    )
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="markers"):
        support_table.write(readme, "| new |")


def test_each_release_lists_its_xfail_reasons_and_recorded_limits(
    tools, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, support_table = tools
    monkeypatch.setattr(support_table, "RESULTS", tmp_path)
    _junit(tmp_path / "torch-2.11.0" / "dt-conv.xml", ["passed", "xfailed", "xfailed"])
    limit = (
        '<testcase classname="t" name="r"><properties>'
        '<property name="torch_limit" value="row-wise scales refused"/>'
        '<property name="other" value="not a limit"/></properties></testcase>'
    )
    (tmp_path / "torch-2.11.0" / "dt-symm-mem.xml").write_text(
        f"<testsuites><testsuite>{limit}</testsuite></testsuites>"
    )
    _junit(tmp_path / "torch-2.13.0" / "dt-conv.xml", ["passed", "xfailed"])
    text = support_table.table()
    found = text.split("Limits found by the same run:\n\n")[1].split("\n\nFrom ")[0]
    # a reason is listed once with every release that has it; another property is no limit
    assert found.splitlines() == [
        "- torch 2.11.0, 2.13.0: torch bug",
        "- torch 2.11.0: row-wise scales refused",
    ]
    _junit(tmp_path / "torch-2.13.0" / "dt-conv.xml", ["passed"])
    _junit(tmp_path / "torch-2.11.0" / "dt-conv.xml", ["passed"])
    (tmp_path / "torch-2.11.0" / "dt-symm-mem.xml").unlink()
    assert "Limits" not in support_table.table()
