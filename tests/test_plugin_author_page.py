"""docs/plugin-authors.md, followed as an outside author follows it.

The page marks what it asks the reader to do with an HTML comment (invisible where the
page is rendered) right above a fenced block:

- `<!-- author-page: file PATH -->`: save the block as PATH (relative to the folder the
  commands are in; the page's own commands make its folders);
- `<!-- author-page: run -->` (`run, exits 1`): run the block's commands, in bash, in the
  folder the previous block left (a `cd` carries over, as in a terminal);
- `<!-- author-page: output -->`: what the block run last prints on stdout, exactly
  (but for the counts of dt-core's own plugin); `output excerpt`: lines it prints,
  whitespace aside;
- `<!-- author-page: not run: WHY -->`: a command the test cannot run (an upload).

The slow test does all of it in a fresh virtual environment, in an empty folder next to
a checkout named `dt-plugins` (this repository), with PIP_CONSTRAINT set to
tools/constraints.txt so pip keeps to the torch the page names. The files the page shows
must be docs/examples/third_party_plugin's, byte for byte, and that folder holds nothing
else but its README, so the example and the page cannot drift apart.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from fresh_venv import fresh_venv, in_shell

# what this checks does not differ between torch releases: the environment is its own
pytestmark = pytest.mark.ci_once

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "plugin-authors.md"
EXAMPLE = ROOT / "docs" / "examples" / "third_party_plugin"
# a fenced block, with the page's marker right above it when it has one
BLOCK = re.compile(
    r"^(?:<!-- author-page: (?P<marker>[^\n]*?) -->\n)?"
    r"(?P<fence>`{3,})(?P<lang>[^\n]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
MARKERS = re.compile(r"file \S+|run|run, exits 1|output|output excerpt|not run: .+")
# files of the example folder the page does not show, and what tools leave in it
NOT_ON_PAGE = {"README.md"}
LEFTOVERS = {"__pycache__", ".pytest_cache", "dist", "build", ".venv"}
# pip builds dt-core and installs torch 2.13.0 (CPU) from local files: about two minutes
# on 2 busy cores; the bound is for a loaded machine
COMMAND_TIMEOUT = 900
PLUGIN = re.compile(r"soft-clip|dt_soft_clip")


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    marker: str | None
    lang: str
    body: str

    @property
    def kind(self) -> str:
        return (self.marker or "").split(" ")[0].rstrip(",:")

    @property
    def argument(self) -> str:
        """What follows the kind: a file's path, a reason."""
        return (self.marker or "").partition(" ")[2]


def page_blocks() -> list[Block]:
    text = PAGE.read_text(encoding="utf-8")
    found = []
    for match in BLOCK.finditer(text):
        line = text.count("\n", 0, match.start("fence")) + 1
        found.append(Block(line, match["marker"], match["lang"].strip(), match["body"]))
    return found


def page_files() -> dict[str, str]:
    return {b.argument: b.body for b in page_blocks() if b.kind == "file"}


def example_files() -> dict[str, str]:
    files = {}
    for path in sorted(EXAMPLE.rglob("*")):
        relative = path.relative_to(EXAMPLE)
        if path.is_dir() or LEFTOVERS.intersection(relative.parts) or path.suffix == ".pyc":
            continue
        if any(part.endswith(".egg-info") for part in relative.parts):
            continue
        files[relative.as_posix()] = path.read_text(encoding="utf-8")
    return {name: text for name, text in files.items() if name not in NOT_ON_PAGE}


def test_every_code_block_says_what_the_reader_does_with_it() -> None:
    blocks = page_blocks()
    assert "{literalinclude}" not in PAGE.read_text(), "show code inline: forges render no include"
    for block in blocks:
        where = f"docs/plugin-authors.md:{block.line}"
        if block.marker is not None:
            assert MARKERS.fullmatch(block.marker), f"{where}: unknown marker {block.marker!r}"
        if block.lang in ("bash", "sh", "shell", "console"):
            assert block.kind in ("run", "not"), f"{where}: a command block needs run / not run"
        elif block.lang == "text":
            assert block.kind in ("", "output"), f"{where}: {block.marker!r} on a text block"
        else:  # code: a file the reader saves (so the test has it), never a loose fragment
            assert block.kind == "file", f"{where}: a {block.lang or 'plain'} block is not a file"
    for position, block in enumerate(blocks):
        if block.kind == "output":
            before = [b for b in blocks[:position] if b.kind in ("run", "output")]
            assert before and before[-1].kind == "run", f"line {block.line}: output of what?"
    runs = "\n".join(b.body for b in blocks if b.kind == "run")
    for command in ("dt-plugins list", "dt-plugins check", "python -m pytest tests"):
        assert re.search(rf"^{re.escape(command)}$", runs, re.MULTILINE), command


def test_the_install_names_torch_dt_core_and_the_test_extra() -> None:
    runs = [b.body for b in page_blocks() if b.kind == "run"]
    (install,) = [line for body in runs for line in body.splitlines() if "packages/dt-core" in line]
    assert install.startswith("pip install torch==2.13.0 "), install
    assert "packages/dt-core" in install and '".[test]"' in install, install
    assert "torch==2.13.0" in (ROOT / "tools" / "constraints.txt").read_text()


def test_the_page_shows_the_example_files_as_they_are() -> None:
    shown, example = page_files(), example_files()
    assert sorted(shown) == sorted(example), "the page's files and the example's differ"
    for name, text in example.items():
        assert shown[name] == text, f"docs/plugin-authors.md shows {name} unlike {EXAMPLE / name}"


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _as_compared(text: str) -> list[str]:
    """The lines of an output, numbers masked on those that do not name the page's plugin:
    the counts of dt-core's own plugin (torch-gaps) and the totals change with dt-core,
    while the plugin's row, its problems and every line's wording stay exact."""
    return [line if PLUGIN.search(line) else re.sub(r"\d+", "N", line) for line in _lines(text)]


def test_following_the_page_in_a_fresh_environment(tmp_path: Path) -> None:
    started = time.monotonic()
    env = fresh_venv(tmp_path / "venv")
    work = tmp_path / "work"
    work.mkdir()
    (work / "dt-plugins").symlink_to(ROOT)  # the checkout the page installs dt-core from
    cwd_file = tmp_path / "cwd"
    cwd = work
    last: subprocess.CompletedProcess[str] | None = None
    took: list[tuple[int, float]] = []
    for block in page_blocks():
        where = f"docs/plugin-authors.md:{block.line}"
        if block.kind == "file":
            path = cwd / block.argument
            assert path.parent.is_dir(), f"{where}: no folder {path.parent} made before"
            path.write_text(block.body, encoding="utf-8")
        elif block.kind == "run":
            script = f"trap 'pwd > {cwd_file}' EXIT\nset -e\n{block.body}"
            start = time.monotonic()
            last = in_shell(script, cwd, env, COMMAND_TIMEOUT)
            took.append((block.line, time.monotonic() - start))
            expected = 1 if block.marker == "run, exits 1" else 0
            assert last.returncode == expected, (
                f"{where}: exit {last.returncode}, not {expected}\n$ {block.body}\n"
                f"{last.stdout[-4000:]}\n{last.stderr[-4000:]}"
            )
            cwd = Path(cwd_file.read_text().strip())
        elif block.kind == "output":
            assert last is not None
            if block.marker == "output excerpt":
                printed = {" ".join(line.split()) for line in last.stdout.splitlines()}
                for line in _lines(block.body):
                    assert " ".join(line.split()) in printed, f"{where}: {line!r}\n{last.stdout}"
            else:
                assert _as_compared(last.stdout) == _as_compared(block.body), (
                    f"{where}: the page shows\n{block.body}\nthe command printed\n{last.stdout}"
                )

    # dt-core found the plugin by its entry point, from the wheel the page built
    listed = subprocess.run(
        ["dt-plugins", "list", "--json"], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr[-4000:]
    states = {p["name"]: (p["distribution"], p["state"]) for p in json.loads(listed.stdout)}
    assert states.get("soft-clip") == ("dt-soft-clip", "active"), states
    print(f"followed the page in {time.monotonic() - started:.0f} s; by command (line, s): ")
    print(", ".join(f"{line}: {seconds:.0f}" for line, seconds in took))
