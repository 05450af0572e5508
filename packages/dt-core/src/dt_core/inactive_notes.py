"""Notes on failing ops: which installed plugin declares the op an error is about but is
inactive, why, and how to turn it on.

Installing a plugin must never change the user's torch, so while a plugin is inactive
nothing of dt-core sits in DTensor's dispatch to catch torch's error. The note is added
(`BaseException.add_note`: the error keeps its type and message) where dt-core's own
code is on the error's way: `explain_errors()` around user code, dt-core's test harness
(`simulated_ranks`, the rank processes of `run_on_ranks`), and the handlers dt-core
installs for active plugins. `explain(error)` adds it to an error at hand.

Finding the declarations imports the inactive plugins' modules and calls their hooks
(which change nothing, by the hook contract); it runs only for an error on its way out.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from types import TracebackType
from typing import Any, Literal

NOTE_PREFIX = "dt-core:"


def _op_names(item: Any) -> list[str]:
    """The names torch's messages use for the ops one contribution declares."""
    from .contributions import HopRule, LibraryOps, LocalTensorRule

    if isinstance(item, LibraryOps):  # "ns::name[.overload][@Key]"
        return [op.split("@")[0].replace("::", ".") for op in item.ops]
    if isinstance(item, LocalTensorRule):
        return [item.op.replace("::", ".")]
    if isinstance(item, HopRule):
        return [getattr(item.hop, "_name", None) or str(item.hop)]
    return [str(item.op)]  # OpHandler, ShardingStrategy


def _mentions(text: str, op: str) -> bool:
    """Whether `text` names `op` ("aten.conv.default"; a packet "aten.conv" names every
    overload), also as torch's C++ messages write it ("aten::conv")."""
    namespace, _, rest = op.partition(".")
    names = {op, f"{namespace}::{rest}", f"{namespace}::{rest.split('.')[0]}"} if rest else {op}
    return any(re.search(rf"(?<!\w){re.escape(name)}(?:\.\w+)?(?!\w|\.\w)", text) for name in names)


def declared_ops(record: Any, load: Any) -> list[str]:
    """The ops an inactive plugin declares, asking its hooks without recording anything
    (a hook that fails, e.g. naming an op its library defines, declares nothing)."""
    from .kinds import KINDS

    plugin = load(record)
    if plugin is None:
        return []
    found: list[str] = []
    for kind in KINDS:
        if kind.column != "ops":
            continue
        hook = getattr(plugin, kind.hook, None)
        if hook is None:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                items = list(hook() or ())
            found += [op for item in items for op in _op_names(item)]
        except Exception:  # noqa: BLE001, S112 - an explanation must never raise
            continue
    return found


def note_for(error: BaseException, op: object = None) -> str | None:
    """The note for `error` (about `op`, else the ops its message names), or None when
    no inactive plugin declares them."""
    from .activation import ACTIVATION
    from .inactive import why_inactive

    text = f"{error}\n{op}" if op is not None else str(error)
    registry = ACTIVATION.registry
    lines = []
    for record in registry.records():
        why = why_inactive(record.snapshot(), ACTIVATION.is_active())
        if why is None:
            continue
        ops = [
            name for name in declared_ops(record, registry.plugin_object) if _mentions(text, name)
        ]
        if ops:
            names = ", ".join(dict.fromkeys(ops))
            lines.append(
                f"{NOTE_PREFIX} installed plugin {record.name!r} handles {names} but is "
                f"inactive: {why.sentence()}"
            )
    return "\n".join(lines) or None


def explain(error: BaseException, op: object = None) -> BaseException:
    """Add the note on inactive plugins to `error` (once) and return it: the same object,
    so `raise dt_core.explain(error)` keeps torch's type and message."""
    if any(str(note).startswith(NOTE_PREFIX) for note in getattr(error, "__notes__", ())):
        return error
    try:
        note = note_for(error, op)
    except Exception:  # noqa: BLE001 - the user's error matters, not ours
        return error
    if note:
        add_note = getattr(error, "add_note", None)
        if add_note is not None:
            add_note(note)
        else:  # Python 3.10: kept where 3.11's tracebacks would show it
            error.__notes__ = [*getattr(error, "__notes__", ()), note]
    return error


class explain_errors(contextlib.ContextDecorator):  # noqa: N801 - used like a function
    """`with dt_core.explain_errors():` (or `@dt_core.explain_errors()`): an exception
    leaving the block gets the note on inactive plugins, keeping its type."""

    def __enter__(self) -> explain_errors:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        if isinstance(error, Exception):
            explain(error)
        return False
