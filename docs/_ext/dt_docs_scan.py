"""Read a Markdown page as CommonMark does: its fenced blocks, headings and content lines.

Its own module because reading a page (where fences open and close, inside list items
and directive bodies) is apart from the checks that judge what was read
(dt_docs_check.py, which lists what this reading does not see).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

# A fence line: indentation, three or more of one fence character, the info string.
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,}|:{3,})(?P<info>.*)$")
# An ATX heading: up to 3 spaces, 1-6 '#', then a space or the end of the line.
_HEADING = re.compile(r"^ {0,3}(?P<marks>#{1,6})(?:[ \t]+(?P<text>.*?))?(?:[ \t]+#+)?[ \t]*$")
# A list item's first line: its marker and the spaces after it.
_LIST_ITEM = re.compile(r"^(?P<indent> *)(?P<marker>[-*+]|\d{1,9}[.)])(?P<gap> +)\S")
# Lines that render nothing: a MyST target `(name)=` or a one-line HTML comment.
_INVISIBLE = re.compile(r"^\s*(\([^()\s]+\)=|<!--.*-->)\s*$")

# Directives whose fenced body is Markdown again (checked for fences of its own); the
# code directives count as code blocks, like a fence with a language or none.
_MARKDOWN_DIRECTIVES = frozenset(
    "admonition attention caution danger dropdown error hint important note seealso "
    "sidebar tip topic warning".split()
)
_CODE_DIRECTIVES = frozenset({"code-block", "code", "sourcecode", "code-cell"})


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
