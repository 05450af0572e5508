"""The README's table of supported torch releases, from the test run itself.

    python tools/support_table.py            # print the table
    python tools/support_table.py --write    # put it into README.md between its markers

Reads what each cell of `hatch run test:run` wrote (`tools/run_cell.py`:
`build/test-results/torch-<release>/<cell>.xml`, JUnit, and a note of the scope it ran
in) and renders one row per cell, one column per torch release: how many tests passed,
failed, errored, were expected failures, and which marked tests CI's scope left out
(`compile_heavy` on every release, `ci_once` on all but one, `window_ends` between the
oldest and the newest). Below it, each release's
limits as the run found them: the reasons of its expected failures (torch bugs a strict
xfail names) and what tests recorded as `torch_limit` (a feature that raises a clear
error there), each line naming the releases where the run found it; a reason's own
opening "torch 2.13 ..." is dropped, since the run, not the test's words, says where it
holds. A cell that did not run shows as such; nothing in the table is typed by hand.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from junit_outcomes import outcome

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "build" / "test-results"
README = ROOT / "README.md"
CELLS = ["dt-core", "dt-conv", "dt-cp", "dt-symm-mem", "dt-fsdp-passes", "cross"]
START, END = "<!-- support-table:start -->", "<!-- support-table:end -->"


def release_key(name: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", name))


def counts(xml: Path) -> dict[str, int]:
    """passed / failed / errors / skipped / xfailed of one JUnit file."""
    found = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "xfailed": 0}
    for case in ET.parse(xml).getroot().iter("testcase"):
        result, _ = outcome(case)
        found["errors" if result == "error" else result] += 1
    return found


def cell_text(xml: Path) -> str:
    if not xml.exists():
        return "not run"
    c = counts(xml)
    parts = [f"{c['passed']} passed"]
    parts += [f"{c[k]} {k}" for k in ("failed", "errors", "skipped", "xfailed") if c[k]]
    note_file = xml.with_suffix(".json")
    note = json.loads(note_file.read_text()) if note_file.exists() else {}
    if note.get("deselected"):
        parts.append(f"CI scope ({note['deselected']} left out)")
    return ", ".join(parts)


LIMIT = "torch_limit"


def limits(xml: Path) -> list[str]:
    """What one JUnit file says a release cannot do: xfail reasons and recorded limits."""
    if not xml.exists():
        return []
    found = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        result, message = outcome(case)
        if result == "xfailed" and message:
            found.append(message.removeprefix("reason: "))
        found += [p.get("value", "") for p in case.iter("property") if p.get("name") == LIMIT]
    return found


# "torch 2.13 ", "torch 2.11 / 2.12 ": the releases a reason names at its start
NAMED_RELEASES = re.compile(r"^torch \d+\.\d+(\.\d+)?(\s*(/|,|and|to)\s*\d+\.\d+(\.\d+)?)* ")


def limits_text(releases: list[str]) -> list[str]:
    """One line per limit, naming the releases where the run found it (not the ones its
    text names: a reason written on one release reads "torch 2.13 ..." on every other)."""
    where: dict[str, list[str]] = {}
    for release in releases:
        for xml in sorted((RESULTS / f"torch-{release}").glob("*.xml")):
            for reason in limits(xml):
                text = NAMED_RELEASES.sub("", reason)
                if release not in where.setdefault(text, []):
                    where[text].append(release)
    lines = [f"- torch {', '.join(found)}: {text}" for text, found in where.items()]
    return ["", "Limits found by the same run:", "", *lines] if lines else []


def table() -> str:
    releases = sorted((p.name[len("torch-") :] for p in RESULTS.glob("torch-*")), key=release_key)
    if not releases:
        raise SystemExit("support_table: no results in build/test-results (run the tests first)")
    header = "| cell | " + " | ".join(f"torch {r}" for r in releases) + " |"
    rule = "|---" * (len(releases) + 1) + "|"
    rows = [
        f"| {cell} | "
        + " | ".join(cell_text(RESULTS / f"torch-{r}" / f"{cell}.xml") for r in releases)
        + " |"
        for cell in CELLS
    ]
    newest = max(x.stat().st_mtime for x in RESULTS.glob("torch-*/*.xml"))
    when = datetime.date.fromtimestamp(newest).isoformat()
    machine = f"{platform.machine()}, Python {platform.python_version()}"
    source = f"From `hatch run test:run` (last cell {when}, {machine}; `tools/support_table.py`)."
    return "\n".join([header, rule, *rows, *limits_text(releases), "", source])


def write(readme: Path, text: str) -> None:
    content = readme.read_text()
    if START not in content or END not in content:
        raise SystemExit(f"support_table: {readme} has no {START} ... {END} markers")
    head, rest = content.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{text}\n{END}{tail}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update README.md in place")
    args = parser.parse_args(argv)
    text = table()
    if args.write:
        write(README, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
