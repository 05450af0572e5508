"""Structural checks of the Markdown sources, run while the site builds.

A code fence that is never closed turns the rest of a page into one code block, and a
comment of the code that lost its fence (`# ...`) into a heading of the site's
navigation; myst-parser takes both without a warning. When the builder starts, this
extension reads every Markdown file named by `dt_docs_check_files` (glob patterns under
`dt_docs_check_root`: the site's pages and the files published elsewhere, README.md,
BENCHMARKS.md, packages/*/README.md) and warns at file:line (the build runs with -W, so a
warning fails it) on:

- **fence**: a fenced block (```, ~~~, or MyST's :::) that is never closed, by CommonMark's
  rules: a closing fence uses the opening's character, at least as many of them, and has
  no info string; a fence inside a list item also ends where the item ends.
- **heading**: a level-1 heading after the page's title (each page has one; a second is
  a `# comment` of code outside its block), or heading text that reads as a code comment
  (`noqa`, `type: ignore`, `pragma:`, `fmt:`, `torchrun ...`, `import x`, `from x import`).
- **empty-section**: a heading followed by a heading of the same or a higher level, or by
  the end of the page, with nothing in between.
- **one-block**: one code block holding more than 60% of the non-blank lines of a page
  of more than 40.

What it does not see: setext headings (underlined with === or ---), block quotes
(`> ` prefixes), indented (4-space) code blocks and raw HTML are read as ordinary lines;
list items are recognised only to find where a fence inside one must close.
`python docs/_ext/dt_docs_check.py FILE...` runs the same checks outside Sphinx.

How a page is read (fences, headings, content lines) is dt_docs_scan.py's; this module
holds the checks and the Sphinx glue.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dt_docs_scan import scan

if TYPE_CHECKING:
    from sphinx.application import Sphinx

# Heading text that only code writes.
_CODE_COMMENT = re.compile(
    r"\bnoqa\b|\btype:\s*ignore\b|\bpragma:|\bfmt:\s*(on|off|skip)\b|^torchrun\s"
    r"|^import\s+[\w.]+(\s+as\s+\w+)?\s*$|^from\s+[\w.]+\s+import\s"
)

MOSTLY_ONE_BLOCK = 0.6  # share of a page's non-blank lines one code block may not exceed
MOSTLY_MIN_LINES = 40  # pages of at most this many non-blank lines are not measured


@dataclass(frozen=True)
class Problem:
    """One finding: the 1-based line, which check, and what is wrong there."""

    line: int
    check: str
    message: str

    def format(self, path: str) -> str:
        return f"{path}:{self.line}: {self.message} [{self.check}]"


def check_lines(lines: Sequence[str]) -> list[Problem]:
    """Every problem of one page (its lines without line ends), in order of lines."""
    page = scan(lines)
    problems: list[Problem] = []
    for block in page.blocks:
        if block.end is None:
            rest = block.last - block.start
            problems.append(
                Problem(
                    block.start,
                    "fence",
                    f"the fence {block.fence}{block.info} opens a block that is never closed, "
                    f"so the {rest} line(s) after it render as "
                    f"{'code' if block.is_code else 'its body'}"
                    + (f" ({block.note})" if block.note else "")
                    + "; if it was meant to close a block, that block lost its opening fence",
                )
            )
    titles = [heading for heading in page.headings if heading.level == 1]
    for heading in titles[1:]:
        problems.append(
            Problem(
                heading.line,
                "heading",
                f"a second level-1 heading {heading.text!r} (the title is at line "
                f"{titles[0].line}): a code comment outside its code block?",
            )
        )
    for heading in page.headings:
        if heading.level > 1 and _CODE_COMMENT.search(heading.text):
            problems.append(
                Problem(
                    heading.line,
                    "heading",
                    f"the heading {heading.text!r} reads as a code comment outside its code block",
                )
            )
    events = sorted(
        [(h.line, h.level) for h in page.headings] + [(line, 0) for line in page.content]
    )
    for position, (line, level) in enumerate(events):
        if level == 0:
            continue
        following = events[position + 1] if position + 1 < len(events) else None
        if following is None:
            problems.append(
                Problem(line, "empty-section", "an empty section: the page ends after it")
            )
        elif 0 < following[1] <= level:
            problems.append(
                Problem(
                    line,
                    "empty-section",
                    f"an empty section: the heading at line {following[0]} follows it directly",
                )
            )
    if page.nonblank > MOSTLY_MIN_LINES:
        for block in page.blocks:
            if block.is_code and block.nonblank > MOSTLY_ONE_BLOCK * page.nonblank:
                problems.append(
                    Problem(
                        block.start,
                        "one-block",
                        f"one code block holds {block.nonblank} of the page's "
                        f"{page.nonblank} non-blank lines (lines {block.start}-{block.last})",
                    )
                )
    return sorted(problems, key=lambda problem: problem.line)


def check_text(text: str) -> list[Problem]:
    """Every problem of one page's Markdown source."""
    return check_lines(text.splitlines())


def source_files(root: Path, patterns: Iterable[str]) -> tuple[list[Path], list[str]]:
    """The files the patterns match under root (sorted, each once, none under a _build or
    hidden folder), and the patterns that match nothing."""
    found: dict[Path, None] = {}
    unmatched = []
    for pattern in patterns:
        matches = [
            path
            for path in sorted(root.glob(pattern))
            if path.is_file()
            and not any(part.startswith(("_build", ".")) for part in path.relative_to(root).parts)
        ]
        if not matches:
            unmatched.append(pattern)
        found.update(dict.fromkeys(matches))
    return list(found), unmatched


def _check_sources(app: Sphinx) -> None:
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    root = (Path(app.confdir) / app.config.dt_docs_check_root).resolve()
    files, unmatched = source_files(root, app.config.dt_docs_check_files)
    for pattern in unmatched:
        logger.warning(
            f"dt_docs_check_files: {pattern!r} matches no file under {root}",
            type="dt-docs-check",
            subtype="files",
        )
    for path in files:
        name = path.relative_to(root).as_posix()
        for problem in check_text(path.read_text(encoding="utf-8")):
            logger.warning(
                problem.message,
                location=f"{name}:{problem.line}",
                type="dt-docs-check",
                subtype=problem.check,
            )


def setup(app: Sphinx) -> dict[str, Any]:
    # by default the pages under the configuration folder; conf.py names more
    app.add_config_value("dt_docs_check_root", ".", "env", [str])
    app.add_config_value("dt_docs_check_files", ["**/*.md"], "env", [list])
    app.connect("builder-inited", _check_sources)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


def main(argv: Sequence[str]) -> int:
    status = 0
    for name in argv:
        for problem in check_text(Path(name).read_text(encoding="utf-8")):
            print(problem.format(name))
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
