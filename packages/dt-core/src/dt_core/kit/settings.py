"""One settings convention for every plugin: a frozen dataclass, read from four places.

In order of precedence: an active `store.scoped(...)` block, `store.configure(...)`, the
environment (`DT_<PLUGIN>_<FIELD>`, e.g. `DT_CP_ALGORITHM=ring`), the field's default.
Field types say how an environment value is parsed (bool, int, float, str, `Literal`
choices, tuples of those, optional ones); the dataclass's `__post_init__` checks the
rest. Every store is registered, so `dt-plugins list --settings` can show them all; a
plugin names the module creating its store as `DT_SETTINGS` (see `dt_core.hookspecs`)
so that module need not load during `import torch`.

- Renamed variables: `aliases={field: "OLD_NAME"}` keeps an older variable working; it is
  read the same way, and the `DT_<PLUGIN>_<FIELD>` name wins when both are set.
- None: in the environment an Optional field is None when its variable is empty or
  `none`. In `configure()` / `scoped()` a None keyword keeps the current value, so a
  wrapper can pass its own keyword defaults straight through; a store created with
  `none_is_value=True` takes None as the value instead (how to unset an Optional field).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import threading
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_registry: dict[str, SettingsStore[Any]] = {}
_lock = threading.Lock()


def env_var(plugin: str, field: str) -> str:
    """`DT_<PLUGIN>_<FIELD>`, upper case, dashes as underscores."""
    return f"DT_{plugin}_{field}".upper().replace("-", "_")


def _parse(text: str, kind: Any, name: str) -> object:
    """An environment string as a value of type `kind`; ValueError naming `name`."""
    origin, params = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if text.strip().lower() in ("", "none"):
            if type(None) in params:
                return None
        errors = []
        for option in (p for p in params if p is not type(None)):
            try:
                return _parse(text, option, name)
            except ValueError as error:
                errors.append(str(error))
        raise ValueError("; ".join(errors))
    if origin is typing.Literal:
        spelled = text.strip()
        for choice in params:
            if str(choice) == spelled:
                return choice
        folded = [c for c in params if str(c).lower() == spelled.lower()]
        if len(folded) == 1:  # variables are often written in capitals: MODE=Ring
            return folded[0]
        raise ValueError(f"{name} must be one of {list(params)}, got {text!r}")
    if origin is tuple:
        item = params[0] if params else str
        parts = [p for p in text.split(",") if p.strip()]
        return tuple(_parse(p, item, name) for p in parts)
    if kind is bool:
        value = text.strip().lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name} must be a boolean (1/0, true/false), got {text!r}")
    if kind in (int, float, str):
        try:
            return kind(text.strip())
        except ValueError:
            raise ValueError(f"{name} must be {kind.__name__}, got {text!r}") from None
    raise TypeError(f"{name}: settings fields of type {kind!r} cannot come from the environment")


def _check_choice(value: object, kind: Any, name: str) -> None:
    """Literal fields reject values outside their choices, however they were set."""
    origin, params = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Literal and value not in params:
        raise ValueError(f"{name} must be one of {list(params)}, got {value!r}")
    if origin in (typing.Union, types.UnionType) and value is not None:
        literals = [p for p in params if typing.get_origin(p) is typing.Literal]
        if literals and len(literals) == len([p for p in params if p is not type(None)]):
            allowed = [c for p in literals for c in typing.get_args(p)]
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed} or None, got {value!r}")


class SettingsStore(Generic[T]):
    """The settings of one plugin: `schema` is a frozen dataclass with defaults.

    aliases: older variable names still read, by field (the current name wins).
    none_is_value: `configure(x=None)` / `scoped(x=None)` set x to None instead of
    keeping its current value.
    """

    def __init__(
        self,
        plugin: str,
        schema: type[T],
        *,
        aliases: Mapping[str, str] | None = None,
        none_is_value: bool = False,
    ) -> None:
        if not dataclasses.is_dataclass(schema):
            raise TypeError(f"settings of {plugin!r} must be a dataclass, got {schema!r}")
        self.plugin = plugin
        self.schema = schema
        self._types = typing.get_type_hints(schema)
        self.aliases: dict[str, str] = dict(aliases or {})
        unknown = sorted(set(self.aliases) - set(self.fields()))
        if unknown:
            raise TypeError(f"settings of {plugin!r}: aliases name unknown fields {unknown}")
        self.none_is_value = none_is_value
        self._configured: dict[str, object] = {}
        self._scoped: contextvars.ContextVar[T | None] = contextvars.ContextVar(
            f"dt_{plugin}_settings", default=None
        )
        with _lock:
            _registry[plugin] = self

    def fields(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self.schema)]  # type: ignore[arg-type]  # a dataclass: checked in __init__

    def env_var(self, field: str) -> str:
        return env_var(self.plugin, field)

    def _variable_set(self, field: str) -> str | None:
        """The variable this field is read from now: its own name, else its alias."""
        for name in (self.env_var(field), self.aliases.get(field)):
            if name is not None and name in os.environ:
                return name
        return None

    def _from_environment(self) -> dict[str, object]:
        values = {}
        used = {}
        for field in self.fields():
            name = self._variable_set(field)
            if name is not None:
                used[name] = os.environ[name]
                values[field] = _parse(used[name], self._types[field], name)
        if used:  # a value the dataclass refuses should name the variable it came from
            try:
                self._build(values)
            except ValueError as error:
                spelled = ", ".join(f"{name}={text!r}" for name, text in used.items())
                raise ValueError(f"{error} (from the environment: {spelled})") from None
        return values

    def _changes(self, changes: dict[str, object]) -> dict[str, object]:
        """Keyword changes to apply: None means "keep" unless the store takes it as a value."""
        if self.none_is_value:
            return dict(changes)
        return {k: v for k, v in changes.items() if v is not None}

    def _build(self, values: dict[str, object]) -> T:
        unknown = sorted(set(values) - set(self.fields()))
        if unknown:
            raise TypeError(f"dt-{self.plugin}: unknown settings {unknown}; known: {self.fields()}")
        for name, value in values.items():
            _check_choice(value, self._types[name], f"dt-{self.plugin} setting {name}")
        return self.schema(**values)

    def current(self) -> T:
        """The settings in force here and now."""
        scoped = self._scoped.get()
        if scoped is not None:
            return scoped
        return self._build({**self._from_environment(), **self._configured})

    def configure(self, **changes: object) -> T:
        """Set process-wide values (None: see `none_is_value`); returns the new settings.

        A call that fails changes nothing.
        """
        merged = {**self._configured, **self._changes(changes)}
        settings = self._build({**self._from_environment(), **merged})
        self._configured = merged
        return settings

    def reconfigure(self, **changes: object) -> T:
        """`configure` from a clean slate: earlier `configure` calls are forgotten first.

        A call that fails changes nothing."""
        fresh = self._changes(changes)
        settings = self._build({**self._from_environment(), **fresh})
        self._configured = fresh
        return settings

    def reset(self) -> None:
        """Forget `configure` calls (back to the environment and defaults)."""
        self._configured = {}

    @contextlib.contextmanager
    def scoped(self, **changes: object) -> Iterator[T]:
        """These values inside the block only (None: see `none_is_value`)."""
        current = self.current()
        # Shallow: asdict() would deep-copy fields such as tensors or balancer objects.
        base = {name: getattr(current, name) for name in self.fields()}
        base.update(self._changes(changes))
        token = self._scoped.set(self._build(base))
        try:
            yield self._scoped.get()  # type: ignore[misc]  # set just above: never None here
        finally:
            self._scoped.reset(token)

    def describe(self) -> list[dict[str, object]]:
        """One row per field: name, value now, default, environment variable, its older
        name (alias, or None), source."""
        current = self.current()
        env = self._from_environment()
        rows = []
        for f in dataclasses.fields(self.schema):  # type: ignore[arg-type]  # a dataclass (__init__)
            if self._scoped.get() is not None:
                source = "scoped"
            elif f.name in self._configured:
                source = "configure()"
            elif f.name in env:
                source = "environment"
            else:
                source = "default"
            rows.append(
                {
                    "name": f.name,
                    "value": getattr(current, f.name),
                    "default": f.default if f.default is not dataclasses.MISSING else None,
                    "env": self.env_var(f.name),
                    "alias": self.aliases.get(f.name),
                    "source": source,
                }
            )
        return rows


def registered_settings() -> dict[str, SettingsStore[Any]]:
    """Every plugin's settings store, by plugin name (stores register when created).

    The settings modules that found plugins declare (`DT_SETTINGS`) are imported first.
    """
    from ..activation import load_settings

    load_settings()
    with _lock:
        return dict(_registry)
