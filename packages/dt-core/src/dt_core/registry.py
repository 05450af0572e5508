"""The plugins dt-core found: loading them, checking their hook-API range, calling their
hooks one plugin at a time, and marking (and warning once about) the ones that fail."""

from __future__ import annotations

import functools
import importlib
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pluggy

from . import discovery, hookspecs, plugin_api
from .kinds import Kind
from .records import PluginRecord, State


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class PluginRegistry:
    """Records of every found plugin (entry points and in-process ones) and their hooks.

    `on_unusable(name)` is called when a plugin fails after it may have been installed
    in part, so the owner can take out whatever of it is in torch.
    """

    def __init__(self, lock: threading.RLock, on_unusable: Callable[[str], None]) -> None:
        self._lock = lock
        self._on_unusable = on_unusable
        self._records: dict[str, PluginRecord] = {}
        self._manager: pluggy.PluginManager | None = None
        self._in_process: dict[str, Any] = {}  # plugins registered with register()

    def register(self, plugin: Any, name: str) -> None:
        with self._lock:
            self._in_process[name] = plugin
            self.forget()

    def unregister(self, name: str) -> None:
        with self._lock:
            self._in_process.pop(name, None)
            self.forget()

    def forget(self) -> None:
        """Discover again on next use (the environment or the in-process plugins changed)."""
        self._records.clear()
        self._manager = None

    def records(self) -> list[PluginRecord]:
        """Every found plugin's record (discovering them first if needed)."""
        self.discover()
        return self.known()

    def known(self) -> list[PluginRecord]:
        """The records found so far, without discovering."""
        return list(self._records.values())

    def usable(self) -> list[PluginRecord]:
        return [record for record in self.records() if record.usable]

    def mark_unusable(self, record: PluginRecord, state: State, reason: str) -> None:
        """Mark a plugin failed (or incompatible), have what of it was installed taken
        out, and warn once."""
        record.state, record.reason = state, reason
        self._on_unusable(record.name)
        if not record.warned:
            record.warned = True
            what = "failed" if state == "failed" else "is incompatible"
            warnings.warn(
                f"dt-core: plugin {record.name!r} {what} and is skipped: {reason}",
                RuntimeWarning,
                stacklevel=4,
            )

    def fail(self, record: PluginRecord, reason: str) -> None:
        self.mark_unusable(record, "failed", reason)

    def fail_all_quietly(self, reason: str) -> list[str]:
        """Mark every usable plugin failed for one shared `reason` (nothing of theirs is
        installed yet) without a warning each; return their names for the caller's one
        warning."""
        names = []
        for record in self.usable():
            record.state, record.reason, record.warned = "failed", reason, True
            names.append(record.name)
        return names

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
                record = PluginRecord(entry_point.name, entry_point)
                candidates.append((record, functools.partial(discovery.load_plugin, entry_point)))
            for name, plugin in self._in_process.items():
                loaded: Callable[[], Any] = functools.partial(_itself, plugin)
                candidates.append((PluginRecord(name), loaded))
            for record, load in candidates:
                self._records[record.name] = record
                if discovery.is_disabled(record.name, disabled):
                    record.state, record.reason = "disabled", f"listed in {discovery.DISABLE_ENV}"
                    continue
                try:
                    plugin = load()
                except discovery.PluginLoadError as error:
                    self.fail(record, str(error))
                    continue
                self._admit(manager, record, plugin)
            self._manager = manager
            return manager

    def plugin_object(self, record: PluginRecord) -> Any:
        """The plugin's module (or object), loading it if discovery did not (a disabled
        one): for reading what it declares, never registered. None if it cannot load."""
        if record.module is not None:
            return record.module
        if record.origin is None:
            return self._in_process.get(record.name)
        try:
            return discovery.load_plugin(record.origin)
        except discovery.PluginLoadError:
            return None

    def _admit(self, manager: pluggy.PluginManager, record: PluginRecord, plugin: Any) -> None:
        """Check the plugin's hook-API range, then register its hooks."""
        try:
            record.api = plugin_api.declared_api(plugin)
            problem = plugin_api.incompatibility(record.api, lambda: record.distribution)
        except plugin_api.InvalidApiRange as error:
            self.fail(record, f"{error}; fix the plugin's DT_API (e.g. '>=1.0,<2')")
            return
        if problem:
            self.mark_unusable(record, "incompatible", problem)
            return
        try:
            record.settings_modules = plugin_api.declared_settings(plugin)
        except plugin_api.InvalidSettingsDeclaration as error:
            self.fail(record, f"{error}; fix the plugin's DT_SETTINGS (e.g. 'package.config')")
            return
        try:
            manager.register(plugin, name=record.name)
            manager.check_pending()
        except Exception as error:  # noqa: BLE001 - isolate one plugin's mistakes
            if manager.is_registered(plugin):
                manager.unregister(plugin)
            self.fail(record, f"invalid hooks: {describe(error)}")
            return
        record.module = plugin

    def load_settings(self) -> None:
        """Import the settings modules every loaded plugin declares (DT_SETTINGS): each
        registers its stores as it is imported. A module that fails to import fails its
        plugin, as a failing hook does."""
        with self._lock:
            for record in self.records():
                if record.module is None or record.state == "failed":
                    continue
                for module in record.settings_modules:
                    try:
                        importlib.import_module(module)
                    except Exception as error:  # noqa: BLE001 - isolate one plugin's mistakes
                        self.fail(
                            record, f"importing its settings {module!r} failed: {describe(error)}"
                        )
                        break

    def collect(self, kind: Kind) -> None:
        """Call one kind's hook per usable plugin (not through pluggy's fan-out) so that
        each result, and each failure, belongs to the plugin that produced it. Once per
        plugin until `forget_contributions()`."""
        with self._lock:
            hook = getattr(self.discover().hook, kind.hook)
            impls = {impl.plugin_name: impl for impl in hook.get_hookimpls()}
            for record in self.usable():
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
                    self.fail(record, f"{kind.hook}() raised {describe(error)}")
                    continue
                record.contributions[kind.name] = result

    def forget_contributions(self) -> None:
        """Collect again next time: ops a plugin defines are new objects after a reinstall."""
        for record in self._records.values():
            record.contributions.clear()


def _itself(plugin: Any) -> Any:
    """An in-process plugin is already loaded."""
    return plugin
