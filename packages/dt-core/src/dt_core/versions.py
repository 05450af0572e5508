"""Version numbers and ranges ("2.13.0", ">=1.1,<2"), without a packaging dependency.

One comparison for every version question dt-core asks: is this torch inside the range
the compat layer was checked against, may this patch be applied to this torch, was this
plugin written for this core's hook API.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

_COMPARISONS: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}


@functools.cache  # the compat layer checks the torch version before each private call
def release(version: str) -> tuple[int, int, int]:
    """(major, minor, micro) of a version string; local parts and pre-release tags drop
    ("2.13.0a0+git123" -> (2, 13, 0)), missing parts count as 0."""
    parts = [0, 0, 0]
    for index, piece in enumerate(version.strip().split("+")[0].split(".")[:3]):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        parts[index] = int(digits) if digits else 0
    return parts[0], parts[1], parts[2]


@functools.cache
def parse_range(spec: str) -> tuple[tuple[str, tuple[int, int, int]], ...]:
    """Parse ">=1.1,<2" into ((">=", (1, 1, 0)), ("<", (2, 0, 0))); ValueError if malformed.
    An empty spec means any version."""
    clauses = []
    for raw in spec.split(","):
        clause = raw.strip()
        if not clause:
            continue
        for symbol in sorted(_COMPARISONS, key=len, reverse=True):
            if clause.startswith(symbol):
                number = clause[len(symbol) :].strip()
                if not number or not number.replace(".", "").isdigit():
                    raise ValueError(f"{spec!r} is not a version range (clause {clause!r})")
                clauses.append((symbol, release(number)))
                break
        else:
            raise ValueError(f"{spec!r} is not a version range (clause {clause!r})")
    return tuple(clauses)


def in_range(version: str, spec: str) -> bool:
    """Whether `version` satisfies every clause of `spec` (ValueError when malformed)."""
    have = release(version)
    return all(_COMPARISONS[symbol](have, bound) for symbol, bound in parse_range(spec))


def lower_bound(spec: str) -> tuple[int, int, int] | None:
    """The smallest release `spec` admits by its >= / > / == clauses, if it names one."""
    bounds = [b for symbol, b in parse_range(spec) if symbol in (">=", ">", "==")]
    return max(bounds) if bounds else None
