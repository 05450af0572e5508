"""A dry call of a sharding function, made as DTensor makes the op's first call, with
stand-ins for what DTensor passes: it finds a function written for one kind (a
placements function) registered as another (a strategy) before any model runs.

A stand-in answers no question. The first attribute the function reads of it ends the
dry call: one the real object (`OpSchema` for a strategy or rule, `DTensorSpec` for a
placements function's tensors) has means the function reads it as that object, the kind
fits; one it lacks raises the AttributeError the first real call would raise, the kind
does not fit. Whatever else happens (arithmetic on a size, a call into torch) decides
nothing and is not reported: the dry call reports only what would fail for certain.
"""

from __future__ import annotations

import warnings
from typing import Any

from .compat import op_schemas
from .contributions import ShardingStrategy


class _Fits(BaseException):
    """The function read an attribute the real object has: stop, the kind fits.
    A BaseException, so that a function's own `except Exception` does not swallow it."""


class _Misread(AttributeError):
    """The function read an attribute the real object lacks (what torch would raise).
    An AttributeError, so `hasattr` and `getattr(..., default)` answer as they would."""


class _StandIn:
    """Takes the place of a `type_name` object that has `attributes`."""

    __slots__ = ("_type_name", "_attributes")

    def __init__(self, type_name: str, attributes: frozenset[str]) -> None:
        self._type_name = type_name
        self._attributes = attributes

    def __getattr__(self, name: str) -> Any:
        if name in self._attributes:
            raise _Fits
        raise _Misread(f"'{self._type_name}' object has no attribute '{name}'")

    def __repr__(self) -> str:
        return f"<stand-in {self._type_name}>"


def _placements_arguments(op: Any) -> list[Any]:
    """The required positional arguments a placements function is called with: specs
    for tensors (a tuple of them for a tensor list), None for the rest."""
    spec = _StandIn("DTensorSpec", op_schemas.spec_attributes())
    values: list[Any] = []
    for arg in op_schemas.op_arguments(op):
        if arg.required and not arg.kwarg_only:
            values.append({0: None, 1: spec, 2: (spec, spec)}[arg.tensors])
    return values


def dry_call(strategy: ShardingStrategy) -> str | None:
    """The AttributeError message the first real call of `strategy.func` would raise
    because its kind does not fit, or None (it fits, or the dry call cannot tell)."""
    if strategy.kind == "placements":
        args = _placements_arguments(strategy.op)
    else:
        args = [_StandIn("OpSchema", op_schemas.op_schema_attributes())]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            strategy.func(*args)
    except _Fits:
        return None
    except _Misread as error:
        return str(error)
    except Exception:  # noqa: BLE001 - anything else: the dry call cannot tell
        return None
    return None
