"""tools/support_table.py: a limit line names the releases where the run found it, not the
ones the reason's own words name (a reason written on 2.13 reads "torch 2.13 ..." on every
release that has the same failure)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

# what this module checks does not differ between torch releases (.ci/run: one axis only)
pytestmark = pytest.mark.ci_once

TOOLS = Path(__file__).resolve().parent.parent / "tools"


@pytest.fixture
def support_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    monkeypatch.syspath_prepend(str(TOOLS))
    sys.modules.pop("support_table", None)
    import support_table

    monkeypatch.setattr(support_table, "RESULTS", tmp_path)
    return support_table


def _xfailed(path: Path, reason: str) -> None:
    case = f'<testcase classname="t" name="c"><skipped type="pytest.xfail" message="{reason}"/>'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<testsuites><testsuite>{case}</testcase></testsuite></testsuites>")


def test_a_limit_names_the_releases_the_run_found_it_on(support_table, tmp_path: Path) -> None:
    for release in ("2.11.0", "2.15.0"):
        _xfailed(tmp_path / f"torch-{release}" / "cross.xml", "torch 2.13 LocalTensorMode: x")
        _xfailed(tmp_path / f"torch-{release}" / "dt-conv.xml", "torch's view op refuses it")
    _xfailed(tmp_path / "torch-2.11.0" / "dt-fsdp-passes.xml", "torch 2.11 / 2.12 Inductor: y")
    text = support_table.table()
    found = text.split("Limits found by the same run:\n\n")[1].split("\n\nFrom ")[0]
    assert found.splitlines() == [
        "- torch 2.11.0, 2.15.0: LocalTensorMode: x",
        "- torch 2.11.0, 2.15.0: torch's view op refuses it",  # no release named: kept whole
        "- torch 2.11.0: Inductor: y",
    ]
