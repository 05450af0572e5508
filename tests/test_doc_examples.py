"""The Python examples of the READMEs and the documentation pages run, so they cannot rot.

Every ```python block of README.md, packages/*/README.md and docs/**/*.md is a whole
program. One whose first line is `# torchrun --nproc-per-node N ...` runs on a shared world
of N CPU ranks (dt-core's harness: the process group is already up, so the example's
`init_device_mesh` takes it); any other runs in a fresh interpreter. Fragments shown for
reading only (the guide pages' excerpts) are fenced as ```{code-block} python or ```text,
or pulled from tested files (`literalinclude`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

# the docs' examples, whose ops the exactness tests check on every release: run at the
# window's oldest and newest torch (.ci/run leaves them out between them)
pytestmark = pytest.mark.window_ends

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "packages").glob("*/README.md")),
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "examples" not in p.parts),
]
FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
TORCHRUN = re.compile(r"# torchrun --nproc-per-node (\d+)")


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    code: str

    @property
    def ranks(self) -> int | None:
        match = TORCHRUN.match(self.code)
        return int(match.group(1)) if match else None


def examples(page: Path) -> list[Example]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 2
        found.append(Example(str(page.relative_to(ROOT)), line, match.group(1)))
    return found


ALL = [example for page in PAGES for example in examples(page)]


def _run(code: str, name: str) -> None:
    """One rank's run of an example, as `python example.py` would run it."""
    exec(compile(code, name, "exec"), {"__name__": "__main__"})


def test_every_plugin_shows_an_example() -> None:
    """The README has one example per plugin; each package page at least one."""
    per_page: dict[str, int] = {}
    for example in ALL:
        per_page[example.page] = per_page.get(example.page, 0) + 1
    assert per_page.get("README.md", 0) >= 4
    for readme in (ROOT / "packages").glob("*/README.md"):
        assert per_page.get(str(readme.relative_to(ROOT)), 0) >= 1, readme


@pytest.mark.parametrize("example", ALL, ids=lambda e: f"{e.page}:{e.line}")
def test_example_runs(example: Example, dist_world) -> None:
    name = f"{example.page}:{example.line}"
    if example.ranks is None:
        from dt_core.testing.scripts import run_python

        run_python(example.code, timeout=120)
        return
    dist_world(example.ranks).run(_run, example.code, name, timeout=120)
