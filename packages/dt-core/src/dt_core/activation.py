"""Activation: install the plugins' contributions into torch, or take them out again.

One `Activation` object holds the state, driven by the kinds table (`dt_core.kinds`):
each part (a group of kinds) is installed when the torch module it targets is loaded,
library ops right away. `activate(lazy=True)` (what autoload does) arms those imports;
`activate()` installs every part now. Every installed contribution is logged with its
undo, so `deactivate()` restores exactly what was there. Which plugins exist and what
they contribute is the registry's business (`dt_core.registry`).
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from . import discovery, import_hooks
from .compat.torch_version import torch_version_problem, untested_torch_allowed
from .errors import PluginConflictError, UnsupportedTorchError
from .kinds import KINDS, PARTS, Kind, Part, kinds_of
from .records import PluginInfo
from .registry import PluginRegistry, describe

Conflict = tuple[str, str, str]  # (claim, first plugin, second plugin)


@dataclass(frozen=True)
class _Installed:
    """One installed contribution: which kind, whose, and how to take it out."""

    kind: Kind
    owner: str
    undo: Callable[[], None]


class Activation:
    """What of the plugins is installed in torch, and the operations that change it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.registry = PluginRegistry(self._lock, on_unusable=self._take_out)
        self._installed: list[_Installed] = []  # in install order
        self._parts_done: set[str] = set()
        self._active = False
        self._raise_conflicts = True

    # --- plugins ----------------------------------------------------------------------------

    def register_plugin(self, plugin: Any, name: str) -> None:
        """Add an in-process plugin (an object or module with hookimpls); takes effect on
        the next `activate()`. Entry points are the normal route; this serves tests."""
        with self._lock:
            self._refuse_while_active()
            self.registry.register(plugin, name)

    def unregister_plugin(self, name: str) -> None:
        with self._lock:
            self._refuse_while_active()
            self.registry.unregister(name)

    def _refuse_while_active(self) -> None:
        if self._active:
            raise RuntimeError("deactivate() before changing the registered plugins")

    def _take_out(self, name: str) -> None:
        """Undo everything of plugin `name` that is installed (it failed)."""
        mine = [entry for entry in self._installed if entry.owner == name]
        for entry in reversed(mine):
            self._installed.remove(entry)
            entry.undo()

    # --- conflicts --------------------------------------------------------------------------

    def _conflicts(self, part: Part) -> list[Conflict]:
        """(claim, first plugin, second plugin) for every key two usable plugins share
        within one kind. Kinds compose: an op handler that hands a call back to torch
        meets another plugin's sharding strategy for that op there."""
        found = []
        for kind in kinds_of(part):
            owners: dict[str, str] = {}
            for record in self.registry.usable():
                for claim in dict.fromkeys(record.claims([kind])):
                    if claim in owners:
                        found.append((claim, owners[claim], record.name))
                    else:
                        owners[claim] = record.name
        return found

    def _check_conflicts(self, part: Part) -> None:
        conflicts = self._conflicts(part)
        if not conflicts:
            return
        message = conflict_message(conflicts)
        if self._raise_conflicts:
            raise PluginConflictError(message)
        records = {record.name: record for record in self.registry.records()}
        for _, first, second in conflicts:
            for name in (first, second):
                if records[name].state != "failed":
                    self.registry.fail(records[name], f"conflict: {message}")

    # --- installation -----------------------------------------------------------------------

    def _install_part(self, part: Part) -> None:
        """Collect and install one part for every usable plugin (idempotent)."""
        with self._lock:
            if part.name in self._parts_done or not self._active:
                return
            kinds = kinds_of(part)
            for kind in kinds:
                self.registry.collect(kind)
            self._check_conflicts(part)
            self._parts_done.add(part.name)
            changed: set[Kind] = set()
            for record in self.registry.usable():
                for kind in kinds:
                    try:
                        for item in record.contributions.get(kind.name, ()):
                            undo = kind.install(record.name, item)
                            self._installed.append(_Installed(kind, record.name, undo))
                            changed.add(kind)
                    except Exception as error:  # noqa: BLE001
                        self.registry.fail(
                            record, f"installing {kind.name} failed: {describe(error)}"
                        )
                        break
            _after_change(changed)

    def _install_on_import(self, part: Part, _module: object) -> None:
        self._install_part_safely(part)

    def _install_part_safely(self, part: Part) -> None:
        """Lazy path: errors become warnings (an import in user code must not break)."""
        try:
            self._install_part(part)
        except Exception as error:  # noqa: BLE001
            warnings.warn(
                f"dt-core: activating plugins for {part.trigger or part.name} failed: "
                f"{describe(error)}",
                RuntimeWarning,
                stacklevel=2,
            )

    # --- public operations ------------------------------------------------------------------

    def activate(self, *, lazy: bool = False) -> list[PluginInfo]:
        """Install every enabled plugin's contributions; return the plugin table.

        lazy=True installs each part when its torch module is first imported (autoload
        uses this). With lazy=False everything is installed now and a conflict between
        two plugins raises PluginConflictError naming both.
        """
        with self._lock:
            self._start(lazy=lazy)
            return self.plugins()

    def arm(self) -> None:
        """`activate(lazy=True)` without building the plugin table: what autoload calls
        during `import torch`. The table would call every plugin hook, and so import what
        the lazy parts exist to defer."""
        with self._lock:
            self._start(lazy=True)

    def _start(self, *, lazy: bool) -> None:
        problem = torch_version_problem()
        if problem and not untested_torch_allowed():
            if not lazy:
                raise UnsupportedTorchError(problem)
            names = self.registry.fail_all_quietly(problem)
            if names:  # one warning for all plugins: the cause is torch, not any of them
                warnings.warn(
                    f"dt-core: {problem} (plugins left inactive: {', '.join(names)})",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return
        self._raise_conflicts = not lazy
        self._active = True
        for record in self.registry.usable():
            record.state, record.reason = "active", None
        if not lazy:
            try:
                for part in PARTS:
                    self._install_part(part)
            except PluginConflictError:
                self.deactivate()  # leave torch exactly as it was
                raise
            return
        for part in PARTS:
            if part.trigger is None:
                self._install_part_safely(part)
            else:
                import_hooks.when_imported(
                    part.trigger, functools.partial(self._install_on_import, part)
                )

    def deactivate(self) -> None:
        """Take every contribution out again, restoring what was there (the same objects)."""
        with self._lock:
            for part in PARTS:
                if part.trigger is not None:
                    import_hooks.cancel(part.trigger)
            changed = {entry.kind for entry in self._installed}
            errors = []
            while self._installed:
                entry = self._installed.pop()
                try:
                    entry.undo()
                except Exception as error:  # noqa: BLE001 - undo as much as possible
                    errors.append(f"{entry.owner}: {describe(error)}")
            _after_change(changed)
            self._parts_done.clear()
            self._active = False
            for record in self.registry.known():
                if record.state == "active":
                    record.state = "inactive"
            self.registry.forget_contributions()
            if errors:
                warnings.warn(
                    "dt-core: deactivate could not undo: " + "; ".join(errors),
                    RuntimeWarning,
                    stacklevel=3,
                )

    def load_settings(self) -> None:
        """Import every found plugin's settings modules (see `PluginRegistry.load_settings`)."""
        with self._lock:
            self.registry.load_settings()

    def is_active(self) -> bool:
        return self._active

    def plugins(self) -> list[PluginInfo]:
        """One PluginInfo per found plugin: name, distribution, version, claims, state."""
        with self._lock:
            # While inactive, hooks that name ops a plugin defines would fail: list what
            # can be known without installing anything.
            for kind in KINDS if self._active else kinds_of(PARTS[0]):
                self.registry.collect(kind)
            return [record.snapshot() for record in self.registry.records()]

    def conflicts(self) -> list[Conflict]:
        """Every (claim, plugin, plugin) claimed twice among usable plugins, in any part."""
        with self._lock:
            self.plugins()
            return [c for part in PARTS for c in self._conflicts(part)]


def _after_change(kinds: Iterable[Kind]) -> None:
    for hook in dict.fromkeys(k.after_change for k in kinds if k.after_change is not None):
        hook()


def conflict_message(conflicts: Iterable[Conflict]) -> str:
    lines = [
        f"plugins {first!r} and {second!r} both claim {claim}" for claim, first, second in conflicts
    ]
    hint = f"disable one of them, e.g. {discovery.DISABLE_ENV}=<name>"
    return "; ".join(lines) + f" ({hint})"


# The process-wide activation; the module-level functions are its operations.
ACTIVATION = Activation()
register_plugin = ACTIVATION.register_plugin
unregister_plugin = ACTIVATION.unregister_plugin
activate = ACTIVATION.activate
arm = ACTIVATION.arm
deactivate = ACTIVATION.deactivate
is_active = ACTIVATION.is_active
plugins = ACTIVATION.plugins
conflicts = ACTIVATION.conflicts
load_settings = ACTIVATION.load_settings
