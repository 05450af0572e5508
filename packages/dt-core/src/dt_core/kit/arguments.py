"""Op arguments by name, as the op's schema declares them.

Handlers receive `(op_call, args, kwargs)` as DTensor dispatch calls them: positional
prefix, keywords for the rest, defaults omitted. Binding against the schema once gives
every argument by name with defaults filled in, whatever way the caller spelled it.
"""

from __future__ import annotations

from typing import Any


def op_name(op_call: Any) -> str:
    """`op_call`'s aten name with its overload, "native_batch_norm.default": the key of
    tables that map an op's overloads to what their handlers do."""
    return f"{op_call._schema.name.split('::')[1]}.{op_call._overloadname}"


def bind_arguments(
    op_call: Any, args: tuple[object, ...], kwargs: dict[str, object]
) -> dict[str, object]:
    """Every argument of `op_call` (a torch `OpOverload`) by name, defaults filled in."""
    values: dict[str, object] = {}
    for i, argument in enumerate(op_call._schema.arguments):
        if i < len(args):
            values[argument.name] = args[i]
        elif argument.name in kwargs:
            values[argument.name] = kwargs[argument.name]
        else:
            values[argument.name] = argument.default_value
    return values


def bind_positional(
    op_call: Any, args: tuple[object, ...], kwargs: dict[str, object]
) -> list[object]:
    """Every argument of `op_call` in schema order, defaults filled in."""
    return list(bind_arguments(op_call, args, kwargs).values())
