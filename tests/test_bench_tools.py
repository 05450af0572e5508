"""tools/bench_compare.py and bench_report.py: rounds are compared within themselves,
verdicts need every round, a partial rerun keeps the other packages' rows, repeated row
names are refused, and the report says when each package's rows were measured.

The inputs are hand-made results in the shape `benchmarks/run.py --json` writes; the
expected ratios are worked out by hand from them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tool_scripts import import_tools

# what this module checks does not differ between torch releases (.ci/run: one axis only)
pytestmark = pytest.mark.ci_once

OLD, NEW = "2.13.0+cpu", "2.14.1+cu130"


@pytest.fixture
def tools(monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, ModuleType]:
    bench_compare, bench_report = import_tools(monkeypatch, "bench_compare", "bench_report")
    return bench_compare, bench_report


def _result(package: str, **values: Any) -> dict[str, Any]:
    rows = [
        {"name": name, "metric": "time", "unit": "s", "value": value, "baseline": "b"}
        | {"baseline_value": 1.0, "ratio": value}
        for name, value in values.items()
    ]
    return {"package": package, "rows": rows}


def test_verdict_needs_every_round(tools: tuple[ModuleType, ModuleType]) -> None:
    compare, _ = tools
    assert compare.verdict([1.1, 1.02, 1.3]) == "**higher in every round**"
    assert compare.verdict([0.9, 0.99]) == "lower in every round"
    assert compare.verdict([1.2, 0.95, 1.1]) == "within noise (mixed rounds)"
    assert compare.verdict([1.0, 1.0]) == "same"
    assert compare.verdict([1.5]) == "one round: not enough to say"
    assert compare.verdict([]) == "no ratio: the older torch's value is 0"


def test_summarize_pairs_each_round_with_itself(tools: tuple[ModuleType, ModuleType]) -> None:
    compare, _ = tools
    rounds = [
        {OLD: [_result("dt-conv", step=2.0)], NEW: [_result("dt-conv", step=3.0)]},
        {OLD: [_result("dt-conv", step=4.0)], NEW: [_result("dt-conv", step=2.0)]},
    ]
    rounds[0][OLD][0]["rows"].append({"name": "shape", "metric": "m", "value": "n/a"})
    (row,) = compare.summarize(rounds, [OLD, NEW])
    assert row["benchmark"] == "step (time)"
    assert row["values"] == {OLD: [2.0, 4.0], NEW: [3.0, 2.0]}
    # 3/2 in round 1 and 2/4 in round 2, not the medians' 2.5/3
    assert row["ratios"] == [1.5, 0.5]
    assert row["verdict"] == "within noise (mixed rounds)"


def test_a_round_missing_a_row_is_not_paired_with_another_round(
    tools: tuple[ModuleType, ModuleType],
) -> None:
    compare, _ = tools
    rounds = [
        {OLD: [_result("dt-cp", ring=2.0)], NEW: [_result("dt-cp")]},  # not measured on NEW
        {OLD: [_result("dt-cp", ring=4.0)], NEW: [_result("dt-cp", ring=5.0)]},
    ]
    (row,) = compare.summarize(rounds, [OLD, NEW])
    assert row["values"] == {OLD: [2.0, 4.0], NEW: [5.0]}
    assert row["ratios"] == [1.25]  # round 2 only; not 5/2 across rounds
    assert row["verdict"] == "one round: not enough to say"


def test_partial_rerun_keeps_the_other_packages(
    tools: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    compare, _ = tools
    row = {"values": {}, "ratios": [], "verdict": "", "unit": "", "benchmark": "b"}
    first = {
        "packages": ["dt-conv", "dt-symm-mem"],
        "rows": [{**row, "package": "dt-conv"}, {**row, "package": "dt-symm-mem"}],
    }
    saved = tmp_path / "compare.json"
    saved.write_text(json.dumps({"torches": [OLD, NEW], "runs": [first]}))
    rerun = {"packages": ["dt-conv"], "rows": [{**row, "package": "dt-conv", "verdict": "new"}]}
    runs = compare.merged(saved, [OLD, NEW], rerun)["runs"]
    assert [r["packages"] for r in runs] == [["dt-symm-mem"], ["dt-conv"]]
    assert [r["package"] for r in runs[0]["rows"]] == ["dt-symm-mem"]
    assert runs[1]["rows"][0]["verdict"] == "new"
    # another pair of torches: the earlier comparison does not apply
    assert compare.merged(saved, [OLD, "2.15.0"], rerun)["runs"] == [rerun]


def test_report_section_lists_runs_and_rows(tools: tuple[ModuleType, ModuleType]) -> None:
    compare, report = tools
    rounds = [
        {OLD: [_result("dt-cp", ring=2.0)], NEW: [_result("dt-cp", ring=2.2)]},
        {NEW: [_result("dt-cp", ring=2.4)], OLD: [_result("dt-cp", ring=2.0)]},
    ]
    run = {
        "date": "2026-11-26",
        "rounds": 2,
        "mode": "full",
        "packages": ["dt-cp"],
        "load_average": [0.5, 1.0, 1.5],
        "rows": compare.summarize(rounds, [OLD, NEW]),
    }
    text = "\n".join(report.render_comparison({"torches": [OLD, NEW], "runs": [run]}))
    assert f"## Torch {NEW} against {OLD}" in text
    assert "- dt-cp: 2026-11-26, 2 rounds, full, load average 0.50-1.50" in text
    assert "| dt-cp | ring (time) | 2 (2-2) s | 2.3 (2.2-2.4) s | 1.15 (1.1-1.2) |" in text
    assert "**higher in every round**" in text


def test_two_rows_of_one_name_are_an_error(tools: tuple[ModuleType, ModuleType]) -> None:
    compare, report = tools
    twice = _result("dt-cp", work=1.0)
    twice["rows"].append({**twice["rows"][0], "baseline": "another"})
    with pytest.raises(ValueError, match="two benchmark rows named 'work \\(time\\)'"):
        compare.summarize([{OLD: [twice], NEW: [twice]}], [OLD, NEW])
    with pytest.raises(ValueError, match="dt-cp: two benchmark rows"):
        report.render([{"torch": OLD, "machine": [], "mode": "full", "results": [twice]}], Path())


def test_header_says_when_each_package_was_measured(tools: tuple[ModuleType, ModuleType]) -> None:
    _, report = tools
    first, rerun = ["- date: 2026-11-25", "- load 3.9"], ["- date: 2026-11-26", "- load 0.2"]
    results = [
        {**_result("dt-core", imp=1.0), "machine": first},
        {**_result("dt-cp", ring=2.0), "machine": rerun},
        _result("dt-conv", step=3.0),  # saved before results carried their machine lines
    ]
    run = {"torch": OLD, "machine": first, "mode": "full", "results": results}
    text = report.render([run], Path())
    expected = (
        "- dt-core, dt-conv:\n  - date: 2026-11-25\n  - load 3.9\n- dt-cp:\n  - date: 2026-11-26"
    )
    assert expected in text
    # one time for all of them: the plain lines
    run["results"] = results[:1]
    assert "torch 2.13.0+cpu:\n\n- date: 2026-11-25\n- load 3.9\n- mode: full" in report.render(
        [run], Path()
    )


FAKE_BENCH = """\
import json, sys
print("row one", flush=True)
print("row two", flush=True)
json.dump({"package": "dt-fake", "rows": []}, open(sys.argv[2], "w"))
"""


def test_a_benchmark_s_lines_reach_the_console_while_it_runs(
    tools: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    """bench:report shows each row a benchmark prints when it prints it (a benchmark runs
    for minutes), and still reads its JSON result."""
    _, report = tools
    bench = tmp_path / "packages" / "dt-fake" / "benchmarks" / "run.py"
    bench.parent.mkdir(parents=True)
    bench.write_text(FAKE_BENCH)
    seen: list[str] = []
    result = report.run_package(bench, quick=False, timeout=60, say=seen.append)
    assert seen == ["row one", "row two"]
    assert result["package"] == "dt-fake" and result["elapsed_s"] > 0


def test_a_benchmark_that_runs_too_long_is_stopped(
    tools: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    _, report = tools
    seen: list[str] = []
    command = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"]
    code, out, _ = report.run_streamed(command, timeout=1, say=seen.append)
    assert code is None and seen == ["started"] and out == "started\n"


def test_a_memory_result_is_its_own_suite(
    tools: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    """A package's memory.py result sits beside its run.py result: both in the table,
    labelled apart, and run_package names the suite from the script's file name."""
    _, report = tools
    results = [_result("dt-conv", step=1.0), {**_result("dt-conv", step=2.0), "suite": "memory"}]
    run = {"torch": OLD, "machine": [], "mode": "full", "results": results}
    text = report.render([run], Path())
    assert "| dt-conv | step (time) |" in text and "| dt-conv memory | step (time) |" in text
    memory_at = text.index(report.MEMORY_HEADING)
    assert text.index("| dt-conv | step (time) |") < memory_at
    assert text.index("| dt-conv memory | step (time) |") > memory_at
    bench = tmp_path / "packages" / "dt-fake" / "benchmarks" / "memory.py"
    bench.parent.mkdir(parents=True)
    bench.write_text(FAKE_BENCH)
    result = report.run_package(bench, quick=False, timeout=60)
    assert report.result_label(result) == "dt-fake memory"


def test_a_memory_rerun_replaces_only_the_memory_section(
    tools: tuple[ModuleType, ModuleType],
) -> None:
    _, report = tools
    before = "# Benchmarks\n\ntimes\n\n## Per-rank memory as ranks grow\n\nold\n\n## Next\n\nkept\n"
    after = report.replace_section(
        before, report.MEMORY_HEADING, [report.MEMORY_HEADING, "", "new"]
    )
    assert (
        after
        == "# Benchmarks\n\ntimes\n\n## Per-rank memory as ranks grow\n\nnew\n\n## Next\n\nkept\n"
    )
    # no memory section yet: appended; the last section: replaced to the end
    assert report.replace_section("# B\n", "## M", ["## M", "x"]) == "# B\n\n## M\nx\n\n"
    assert (
        report.replace_section("# B\n\n## M\nold\n", "## M", ["## M", "x"]) == "# B\n\n## M\nx\n\n"
    )
