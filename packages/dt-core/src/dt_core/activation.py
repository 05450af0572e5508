"""Activation: collect plugins' contributions and install them into torch, or take them out.

One `Activation` object holds all the state, driven by the kinds table (`dt_core.kinds`):
each part (a group of kinds) is installed when the torch module it targets is loaded,
library ops right away. `activate(lazy=True)` (what autoload does) arms those imports;
`activate()` installs every part now. Every change is recorded with its undo, so
`deactivate()` restores exactly what was there.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pluggy

from . import discovery, hookspecs, import_hooks, plugin_api
from .compat.torch_version import torch_version_problem, untested_torch_allowed
from .errors import PluginConflictError, UnsupportedTorchError
from .kinds import KINDS, PARTS, Kind, Part, kinds_of
from .records import PluginInfo, PluginRecord

Conflict = tuple[str, str, str]  # (claim, first plugin, second plugin)


@dataclass(frozen=True)
class _Installed:
    """One installed contribution: which kind, whose, and how to take it out."""

    kind: Kind
    owner: str
    undo: Callable[[], None]


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class Activation:
    """Found plugins, what of them is installed, and the operations on that state."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._records: dict[str, PluginRecord] = {}
        self._manager: pluggy.PluginManager | None = None
        self._in_process: dict[str, Any] = {}  # plugins registered with register_plugin()
        self._installed: list[_Installed] = []  # in install order
        self._parts_done: set[str] = set()
        self._active = False
        self._raise_conflicts = True

    # --- discovery ------------------------------------------------------------------------

    def register_plugin(self, plugin: Any, name: str) -> None:
        """Add an in-process plugin (an object or module with hookimpls); takes effect on
        the next `activate()`. Entry points are the normal route; this serves tests."""
        with self._lock:
            self._in_process[name] = plugin
            self._reset_discovery()

    def unregister_plugin(self, name: str) -> None:
        with self._lock:
            self._in_process.pop(name, None)
            self._reset_discovery()

    def _reset_discovery(self) -> None:
        if self._active:
            raise RuntimeError("deactivate() before changing the registered plugins")
        self._records.clear()
        self._manager = None

    def _set_unusable(self, record: PluginRecord, state: Any, reason: str) -> None:
        """Mark a plugin failed (or incompatible), take out whatever of it was installed,
        and warn once."""
        record.state, record.reason = state, reason
        self._rollback(record.name)
        if not record.warned:
            record.warned = True
            what = "failed" if state == "failed" else "is incompatible"
            warnings.warn(
                f"dt-core: plugin {record.name!r} {what} and is skipped: {reason}",
                RuntimeWarning,
                stacklevel=4,
            )

    def _fail(self, record: PluginRecord, reason: str) -> None:
        self._set_unusable(record, "failed", reason)

    def _rollback(self, name: str) -> None:
        mine = [entry for entry in self._installed if entry.owner == name]
        for entry in reversed(mine):
            self._installed.remove(entry)
            entry.undo()

    def _admit(self, manager: pluggy.PluginManager, record: PluginRecord, plugin: Any) -> None:
        """Check the plugin's hook-API range, then register its hooks."""
        try:
            record.api = plugin_api.declared_api(plugin)
            problem = plugin_api.incompatibility(record.api, record.distribution)
        except plugin_api.InvalidApiRange as error:
            self._fail(record, f"{error}; fix the plugin's DT_API (e.g. '>=1.0,<2')")
            return
        if problem:
            self._set_unusable(record, "incompatible", problem)
            return
        try:
            manager.register(plugin, name=record.name)
            manager.check_pending()
        except Exception as error:  # noqa: BLE001 - isolate one plugin's mistakes
            if manager.is_registered(plugin):
                manager.unregister(plugin)
            self._fail(record, f"invalid hooks: {_describe(error)}")
            return
        record.module = plugin

    def discover(self) -> pluggy.PluginManager:
        """Find plugins (entry points and in-process ones) and import them, once."""
        with self._lock:
            if self._manager is not None:
                return self._manager
            manager = pluggy.PluginManager(hookspecs.PROJECT)
            manager.add_hookspecs(hookspecs)
            disabled = discovery.disabled_names()
            candidates: list[tuple[PluginRecord, Callable[[], Any]]] = []
            for entry_point in discovery.plugin_entry_points():
                dist, version = discovery.distribution_of(entry_point)
                record = PluginRecord(entry_point.name, dist, version)
                candidates.append((record, lambda ep=entry_point: discovery.load_plugin(ep)))
            for name, plugin in self._in_process.items():
                candidates.append((PluginRecord(name, None, None), lambda plugin=plugin: plugin))
            for record, load in candidates:
                self._records[record.name] = record
                if discovery.is_disabled(record.name, disabled):
                    record.state, record.reason = "disabled", f"listed in {discovery.DISABLE_ENV}"
                    continue
                try:
                    plugin = load()
                except discovery.PluginLoadError as error:
                    self._fail(record, str(error))
                    continue
                self._admit(manager, record, plugin)
            self._manager = manager
            return manager

    # --- collection -----------------------------------------------------------------------

    def _usable(self) -> list[PluginRecord]:
        return [record for record in self._records.values() if record.usable]

    def _collect(self, kind: Kind) -> None:
        """Call one kind's hook per plugin (not through pluggy's fan-out) so that each
        result, and each failure, belongs to the plugin that produced it."""
        manager = self.discover()
        impls = {i.plugin_name: i for i in getattr(manager.hook, kind.hook).get_hookimpls()}
        for record in self._usable():
            if kind.name in record.contributions:
                continue
            impl = impls.get(record.name)
            try:
                result = list(impl.function() or ()) if impl is not None else []
                wrong = [item for item in result if not isinstance(item, kind.record_type)]
                if wrong:
                    raise TypeError(
                        f"expected {kind.record_type.__name__} records, got {wrong[0]!r}"
                    )
            except Exception as error:  # noqa: BLE001
                self._fail(record, f"{kind.hook}() raised {_describe(error)}")
                continue
            record.contributions[kind.name] = result

    def _conflicts(self, part: Part) -> list[Conflict]:
        """(claim, first plugin, second plugin) for every key two usable plugins share."""
        owners: dict[str, str] = {}
        found = []
        for record in self._usable():
            for claim in dict.fromkeys(record.claims(kinds_of(part))):
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
        for _, first, second in conflicts:
            for name in (first, second):
                if self._records[name].state != "failed":
                    self._fail(self._records[name], f"conflict: {message}")

    # --- installation ---------------------------------------------------------------------

    def _install_part(self, part: Part) -> None:
        """Collect and install one part for every usable plugin (idempotent)."""
        with self._lock:
            if part.name in self._parts_done or not self._active:
                return
            kinds = kinds_of(part)
            for kind in kinds:
                self._collect(kind)
            self._check_conflicts(part)
            self._parts_done.add(part.name)
            changed: set[Kind] = set()
            for record in self._usable():
                try:
                    for kind in kinds:
                        for item in record.contributions.get(kind.name, ()):
                            undo = kind.install(record.name, item)
                            self._installed.append(_Installed(kind, record.name, undo))
                            changed.add(kind)
                except Exception as error:  # noqa: BLE001
                    self._fail(record, f"installing {kind.name} failed: {_describe(error)}")
            _run_after_change(changed)

    def _install_part_safely(self, part: Part) -> None:
        """Lazy path: errors become warnings (an import in user code must not break)."""
        try:
            self._install_part(part)
        except Exception as error:  # noqa: BLE001
            warnings.warn(
                f"dt-core: activating plugins for {part.trigger or part.name} failed: "
                f"{_describe(error)}",
                RuntimeWarning,
                stacklevel=2,
            )

    # --- public operations ----------------------------------------------------------------

    def activate(self, *, lazy: bool = False) -> list[PluginInfo]:
        """Install every enabled plugin's contributions; return the plugin table.

        lazy=True installs each part when its torch module is first imported (autoload
        uses this). With lazy=False everything is installed now and a conflict between
        two plugins raises PluginConflictError naming both.
        """
        with self._lock:
            problem = torch_version_problem()
            if problem and not untested_torch_allowed():
                if not lazy:
                    raise UnsupportedTorchError(problem)
                self.discover()
                for record in self._usable():
                    self._fail(record, problem)
                return self.plugins()
            self.discover()
            self._raise_conflicts = not lazy
            self._active = True
            for record in self._usable():
                record.state, record.reason = "active", None
            if not lazy:
                try:
                    for part in PARTS:
                        self._install_part(part)
                except PluginConflictError:
                    self.deactivate()  # leave torch exactly as it was
                    raise
                return self.plugins()
            for part in PARTS:
                if part.trigger is None:
                    self._install_part_safely(part)
                else:
                    import_hooks.when_imported(
                        part.trigger, lambda _module, part=part: self._install_part_safely(part)
                    )
            return self.plugins()

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
                    errors.append(f"{entry.owner}: {_describe(error)}")
            _run_after_change(changed)
            self._parts_done.clear()
            self._active = False
            for record in self._records.values():
                if record.state == "active":
                    record.state = "inactive"
                # Re-collect on the next activate: ops a plugin defines are new objects then.
                record.contributions.clear()
            if errors:
                warnings.warn(
                    "dt-core: deactivate could not undo: " + "; ".join(errors),
                    RuntimeWarning,
                    stacklevel=3,
                )

    def is_active(self) -> bool:
        return self._active

    def plugins(self) -> list[PluginInfo]:
        """One PluginInfo per found plugin: name, distribution, version, claims, state."""
        with self._lock:
            self.discover()
            # While inactive, hooks that name ops a plugin defines would fail: list what
            # can be known without installing anything.
            for kind in KINDS if self._active else kinds_of(PARTS[0]):
                self._collect(kind)
            return [record.snapshot() for record in self._records.values()]

    def conflicts(self) -> list[Conflict]:
        """Every (claim, plugin, plugin) claimed twice among usable plugins, in any part."""
        with self._lock:
            self.plugins()
            return [c for part in PARTS for c in self._conflicts(part)]


def _run_after_change(kinds: Iterable[Kind]) -> None:
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
discover = ACTIVATION.discover
activate = ACTIVATION.activate
deactivate = ACTIVATION.deactivate
is_active = ACTIVATION.is_active
plugins = ACTIVATION.plugins
conflicts = ACTIVATION.conflicts
