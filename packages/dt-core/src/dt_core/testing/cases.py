"""Many cases in one spawned world: each sharded case checked against the same computation
on one process, and none allowed to take a plugin's replicated fallback.

A sweep reports every wrong case at once (not just the first), and a case that passes only
because it fell back to replicated inputs counts as a failure of the sharded path.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable

Check = Callable[[], "str | None"]  # a description of what differs, or None


def expect_exact(plugin: str, checks: Iterable[Check]) -> None:
    """Run every check; raise AssertionError listing the wrong ones, or naming the
    fallback warnings of `dt-<plugin>` raised meanwhile."""
    checks = list(checks)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        failures = [f for check in checks if (f := check()) is not None]
    fell_back = sorted({str(w.message) for w in caught if f"dt-{plugin}" in str(w.message)})
    if fell_back:
        raise AssertionError(f"fell back: {fell_back}")
    if failures:
        raise AssertionError(f"{len(failures)}/{len(checks)} cases wrong:\n" + "\n".join(failures))
