"""What plugins remember from earlier calls, and one way to forget all of it.

Some checks need what an earlier call did: dt-cp's attention compares the sequence order
it is about to read with the order `dt_cp.shard_sequence` laid the sequence out in. Such
records are state a later, unrelated computation must not inherit, so a plugin registers
how to drop its records here (`on_forget`), and `forget()` drops everyone's: between
phases of a program that reuse a mesh, and between tests that share a process (dt-core's
pytest plugin and its rank processes call it after every test).
"""

from __future__ import annotations

from collections.abc import Callable

_forgetters: list[Callable[[], None]] = []


def on_forget(forget_fn: Callable[[], None]) -> Callable[[], None]:
    """Register `forget_fn` to run on `forget()` (once, however often registered)."""
    if forget_fn not in _forgetters:
        _forgetters.append(forget_fn)
    return forget_fn


def forget() -> None:
    """Drop every record plugins keep from earlier calls."""
    for forget_fn in list(_forgetters):
        forget_fn()
