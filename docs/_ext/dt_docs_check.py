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
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sphinx.application import Sphinx

# A fence line: indentation, three or more of one fence character, the info string.
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,}|:{3,})(?P<info>.*)$")
# An ATX heading: up to 3 spaces, 1-6 '#', then a space or the end of the line.
_HEADING = re.compile(r"^ {0,3}(?P<marks>#{1,6})(?:[ \t]+(?P<text>.*?))?(?:[ \t]+#+)?[ \t]*$")
# A list item's first line: its marker and the spaces after it.
_LIST_ITEM = re.compile(r"^(?P<indent> *)(?P<marker>[-*+]|\d{1,9}[.)])(?P<gap> +)\S")
# Lines that render nothing: a MyST target `(name)=` or a one-line HTML comment.
_INVISIBLE = re.compile(r"^\s*(\([^()\s]+\)=|<!--.*-->)\s*$")
# Heading text that only code writes.
_CODE_COMMENT = re.compile(
    r"\bnoqa\b|\btype:\s*ignore\b|\bpragma:|\bfmt:\s*(on|off|skip)\b|^torchrun\s"
    r"|^import\s+[\w.]+(\s+as\s+\w+)?\s*$|^from\s+[\w.]+\s+import\s"
)

# Directives whose fenced body is Markdown again (checked for fences of its own); the
# code directives count as code blocks, like a fence with a language or none.
_MARKDOWN_DIRECTIVES = frozenset(
    "admonition attention caution danger dropdown error hint important note seealso "
    "sidebar tip topic warning".split()
)
_CODE_DIRECTIVES = frozenset({"code-block", "code", "sourcecode", "code-cell"})

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


@dataclass(frozen=True)
class Block:
    """A fenced block: `start` and `end` are the lines of its fences (1-based); `end` is
    None when nothing closes it (it runs to `last`, the last line it holds)."""

    start: int
    end: int | None
    last: int
    fence: str
    info: str
    nonblank: int  # non-blank lines from the opening fence to `last`, both included
    note: str = ""  # why it is unclosed, where that is more than "no closing fence"

    @property
    def directive(self) -> str | None:
        match = re.match(r"\{([^}]*)\}", self.info)
        return match.group(1).strip() if match else None

    @property
    def is_code(self) -> bool:
        """Code (a language, none, or a code directive), not a directive's Markdown body,
        an include or a toctree."""
        if self.fence[0] == ":":
            return False
        directive = self.directive
        return directive is None or directive in _CODE_DIRECTIVES

    @property
    def holds_markdown(self) -> bool:
        return self.fence[0] == ":" or self.directive in _MARKDOWN_DIRECTIVES


@dataclass(frozen=True)
class Heading:
    line: int
    level: int
    text: str


@dataclass(frozen=True)
class Page:
    """What one scan of a page finds, in order of lines."""

    blocks: tuple[Block, ...]
    headings: tuple[Heading, ...]
    content: tuple[int, ...]  # lines outside headings that render something
    nonblank: int


def _width(line: str) -> int:
    """Columns of leading whitespace (a tab to the next multiple of 4)."""
    stripped = line.lstrip(" \t")
    return len(line[: len(line) - len(stripped)].expandtabs(4))


def _opening(line: str) -> re.Match[str] | None:
    match = _FENCE.match(line)
    if match is None or (match["fence"][0] == "`" and "`" in match["info"]):
        return None  # a backtick fence's info string has no backtick (else: inline code)
    return match


def _container_column(lines: Sequence[str], index: int, indent: int) -> int:
    """The content column of the list item a fence indented by `indent` sits in (0 when
    it is not in one): the nearest earlier line indented less, if it starts an item."""
    if indent == 0:
        return 0
    for previous in reversed(lines[:index]):
        if not previous.strip() or _width(previous) >= indent:
            continue
        item = _LIST_ITEM.match(previous.expandtabs(4))
        if item is None:
            return 0
        gap = len(item["gap"]) if len(item["gap"]) <= 4 else 1
        column = len(item["indent"]) + len(item["marker"]) + gap
        return column if column <= indent <= column + 3 else 0
    return 0


def _front_matter_end(lines: Sequence[str]) -> int:
    """Index of the first line after a YAML front matter block (0 without one)."""
    if lines and lines[0].rstrip() == "---":
        for index in range(1, len(lines)):
            if lines[index].rstrip() in ("---", "..."):
                return index + 1
    return 0


def _near_misses(
    lines: Sequence[str], first: int, stop: int, fence: str, column: int, offset: int
) -> Iterator[str]:
    """Lines inside an unclosed block (indices first..stop-1) that look like its closing
    fence but are not one: too few fence characters, or text after them."""
    for index in range(first, stop):
        match = _FENCE.match(lines[index])
        if match is None or match["fence"][0] != fence[0] or _width(lines[index]) > column + 3:
            continue
        if len(match["fence"]) < len(fence):
            yield (
                f"line {offset + index + 1} has {len(match['fence'])} {fence[0]!r}, fewer than the "
                f"{len(fence)} that opened the block"
            )
        elif match["info"].strip():
            yield (
                f"line {offset + index + 1} has text after its fence ({match['info'].strip()!r}); "
                "a closing fence takes no info string"
            )


def scan(lines: Sequence[str], offset: int = 0) -> Page:
    """Fenced blocks, headings and content lines of a page, as CommonMark reads them.

    `offset` is added to every line number (for a directive's body scanned on its own).
    """
    blocks: list[Block] = []
    headings: list[Heading] = []
    content: list[int] = []
    index = _front_matter_end(lines)
    nonblank = sum(1 for line in lines[index:] if line.strip())
    while index < len(lines):
        line = lines[index]
        opening = _opening(line)
        if opening is None:
            heading = _HEADING.match(line)
            if heading is not None:
                text = (heading["text"] or "").strip()
                headings.append(Heading(offset + index + 1, len(heading["marks"]), text))
            elif line.strip() and not _INVISIBLE.match(line):
                content.append(offset + index + 1)
            index += 1
            continue
        content.append(offset + index + 1)
        fence, info = opening["fence"], opening["info"].strip()
        column = _container_column(lines, index, _width(line))
        end: int | None = None
        note = ""
        cursor = index + 1
        while cursor < len(lines):
            inner = lines[cursor]
            if inner.strip() and _width(inner) < column:
                note = f"the list item it sits in ends at line {offset + cursor + 1}"
                break
            closing = _FENCE.match(inner)
            if (
                closing is not None
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
                and _width(inner) <= column + 3
            ):
                end = cursor
                break
            cursor += 1
        last = end if end is not None else cursor - 1
        body = lines[index + 1 : last if end is not None else last + 1]
        if end is None:
            misses = list(_near_misses(lines, index + 1, last + 1, fence, column, offset))
            note = "; ".join(filter(None, [note, *misses[:2]]))
        held = sum(1 for text in lines[index : last + 1] if text.strip())
        block = Block(
            offset + index + 1,
            None if end is None else offset + end + 1,
            offset + last + 1,
            fence,
            info,
            held,
            note,
        )
        blocks.append(block)
        if block.holds_markdown:
            # the body is Markdown again: its own fences must balance inside it
            body_lines = [text[min(_width(text), column) :] for text in body]
            blocks += scan(body_lines, offset + index + 1).blocks
        index = last + 1
        if end is not None:
            content.append(offset + end + 1)
    return Page(tuple(blocks), tuple(headings), tuple(sorted(content)), nonblank)


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
