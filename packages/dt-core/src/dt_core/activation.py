"""Activation: collect plugins' contributions and install them into torch, or take them out.

Contributions are installed in parts, each when the torch module it targets is loaded:
library ops right away, DTensor handlers, strategies and higher-order-operator rules
when `torch.distributed.tensor` is imported, graph passes when `torch._inductor.config`
is. `activate(lazy=True)` (what autoload does) arms those imports; `activate()` installs
every part now. Every change is recorded with the value it replaced, so `deactivate()`
restores exactly what was there.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import pluggy

from . import compat, discovery, graph_passes, hookspecs, import_hooks
from .contributions import DTENSOR_TRIGGER, INDUCTOR_TRIGGER
from .errors import PluginConflictError, UnsupportedTorchError
from .records import PluginInfo, PluginRecord

LIBRARY_PART = "torch"  # library ops: installed as soon as activation starts
PARTS = (LIBRARY_PART, DTENSOR_TRIGGER, INDUCTOR_TRIGGER)

_lock = threading.RLock()
_records: dict[str, PluginRecord] = {}
_manager: pluggy.PluginManager | None = None
_in_process: dict[str, Any] = {}  # plugins registered with register_plugin()
_undo: list[tuple[str, str, Callable[[], None]]] = []  # (part, plugin, undo) in install order
_installed_parts: set[str] = set()
_active = False
_raise_conflicts = True


# --- discovery --------------------------------------------------------------------------


def register_plugin(plugin: Any, name: str) -> None:
    """Add an in-process plugin (an object or module with hookimpls); takes effect on the
    next `activate()`. Entry points are the normal route; this serves tests and scripts."""
    with _lock:
        _in_process[name] = plugin
        _reset_discovery()


def unregister_plugin(name: str) -> None:
    with _lock:
        _in_process.pop(name, None)
        _reset_discovery()


def _reset_discovery() -> None:
    global _manager
    if _active:
        raise RuntimeError("deactivate() before changing the registered plugins")
    _records.clear()
    _manager = None


def _warn_failure(record: PluginRecord) -> None:
    if not record.warned:
        record.warned = True
        warnings.warn(
            f"dt-core: plugin {record.name!r} failed and is skipped: {record.reason}",
            RuntimeWarning,
            stacklevel=3,
        )


def _fail(record: PluginRecord, reason: str) -> None:
    """Mark a plugin failed and take out whatever of it was already installed."""
    record.state = "failed"
    record.reason = reason
    _rollback(record.name)
    _warn_failure(record)


def _rollback(name: str) -> None:
    mine = [entry for entry in _undo if entry[1] == name]
    for entry in reversed(mine):
        _undo.remove(entry)
        entry[2]()


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _register(manager: pluggy.PluginManager, record: PluginRecord, plugin: Any) -> None:
    try:
        manager.register(plugin, name=record.name)
        manager.check_pending()
    except Exception as error:  # noqa: BLE001 - isolate one plugin's mistakes
        if manager.is_registered(plugin):
            manager.unregister(plugin)
        _fail(record, f"invalid hooks: {_describe(error)}")
        return
    record.module = plugin


def discover() -> pluggy.PluginManager:
    """Find plugins (entry points and in-process ones) and import them, once."""
    global _manager
    with _lock:
        if _manager is not None:
            return _manager
        manager = pluggy.PluginManager(hookspecs.PROJECT)
        manager.add_hookspecs(hookspecs)
        disabled = discovery.disabled_names()
        candidates: list[tuple[PluginRecord, Callable[[], Any]]] = []
        for entry_point in discovery.plugin_entry_points():
            dist, version = discovery.distribution_of(entry_point)
            candidates.append((PluginRecord(entry_point.name, dist, version), entry_point.load))
        for name, plugin in _in_process.items():
            candidates.append((PluginRecord(name, None, None), lambda plugin=plugin: plugin))
        for record, load in candidates:
            _records[record.name] = record
            if discovery.is_disabled(record.name, disabled):
                record.state, record.reason = "disabled", f"listed in {discovery.DISABLE_ENV}"
                continue
            try:
                plugin = load()
            except Exception as error:  # noqa: BLE001 - a broken plugin must not break torch
                _fail(record, f"import failed: {_describe(error)}")
                continue
            _register(manager, record, plugin)
        _manager = manager
        return manager


# --- collection ---------------------------------------------------------------------------

_HOOK_FIELDS = {
    LIBRARY_PART: ("dt_library_ops", "library_ops"),
    DTENSOR_TRIGGER: ("dt_op_handlers", "op_handlers"),
    "strategies": ("dt_sharding_strategies", "strategies"),
    "hop_rules": ("dt_hop_rules", "hop_rules"),
    INDUCTOR_TRIGGER: ("dt_graph_passes", "graph_passes"),
}


def _usable(record: PluginRecord) -> bool:
    return record.module is not None and record.state not in ("failed", "disabled")


def _collect(field: str) -> None:
    """Call one hook per plugin (not through pluggy's fan-out) so that each result, and
    each failure, belongs to the plugin that produced it."""
    hook_name, attribute = _HOOK_FIELDS[field]
    manager = discover()
    impls = {impl.plugin_name: impl for impl in getattr(manager.hook, hook_name).get_hookimpls()}
    for record in _records.values():
        if not _usable(record) or getattr(record, attribute) is not None:
            continue
        impl = impls.get(record.name)
        try:
            result = list(impl.function() or ()) if impl is not None else []
        except Exception as error:  # noqa: BLE001
            _fail(record, f"{hook_name}() raised {_describe(error)}")
            continue
        setattr(record, attribute, result)


def _fields_of(part: str) -> tuple[str, ...]:
    return (DTENSOR_TRIGGER, "strategies", "hop_rules") if part == DTENSOR_TRIGGER else (part,)


def _claims(part: str, record: PluginRecord) -> list[str]:
    if part == LIBRARY_PART:
        return [name for lib in record.library_ops or () for name in lib.ops]
    if part == DTENSOR_TRIGGER:
        ops = [str(c.op) for c in [*(record.op_handlers or ()), *(record.strategies or ())]]
        return ops + [rule.claim() for rule in record.hop_rules or ()]
    return record.pass_names()


def _conflicts(part: str) -> list[tuple[str, str, str]]:
    """(op, first plugin, second plugin) for every op two usable plugins both claim."""
    owners: dict[str, str] = {}
    found = []
    for record in _records.values():
        if not _usable(record):
            continue
        for claim in dict.fromkeys(_claims(part, record)):
            if claim in owners:
                found.append((claim, owners[claim], record.name))
            else:
                owners[claim] = record.name
    return found


def _conflict_message(conflicts: Iterable[tuple[str, str, str]]) -> str:
    lines = [
        f"plugins {first!r} and {second!r} both claim {claim}" for claim, first, second in conflicts
    ]
    hint = f"disable one of them, e.g. {discovery.DISABLE_ENV}=<name>"
    return "; ".join(lines) + f" ({hint})"


def _check_conflicts(part: str) -> None:
    conflicts = _conflicts(part)
    if not conflicts:
        return
    message = _conflict_message(conflicts)
    if _raise_conflicts:
        raise PluginConflictError(message)
    for _, first, second in conflicts:
        for name in (first, second):
            if _records[name].state != "failed":
                _fail(_records[name], f"conflict: {message}")


# --- installation ---------------------------------------------------------------------------


def _install_library_ops(record: PluginRecord) -> list[Callable[[], None]]:
    undo = []
    for library_ops in record.library_ops or ():
        lib = compat.new_library(library_ops.namespace, library_ops.kind)
        undo.append(lambda lib=lib: compat.destroy_library(lib))
        library_ops.define(lib)
    return undo


def _install_dtensor(record: PluginRecord) -> list[Callable[[], None]]:
    undo = []
    for handler in record.op_handlers or ():
        previous = compat.swap_op_handler(handler.op, handler.handler)
        undo.append(lambda op=handler.op, previous=previous: compat.swap_op_handler(op, previous))
    for strategy in record.strategies or ():
        if strategy.kind == "placements":
            func, schema_info = compat.placement_strategy(strategy.op, strategy.func)
            strategy = type(strategy)(strategy.op, func, strategy.schema_info or schema_info)
        previous = compat.swap_sharding_strategy(strategy)
        kind = strategy.kind
        undo.append(
            lambda op=strategy.op, kind=kind, previous=previous: compat.restore_sharding_strategy(
                op, kind, previous
            )
        )
    for rule in record.hop_rules or ():
        previous = compat.swap_hop_rule(rule.hop, rule.subclass, rule.fn)
        undo.append(
            lambda rule=rule, previous=previous: compat.swap_hop_rule(
                rule.hop, rule.subclass, previous
            )
        )
    return undo


def _install_passes(records: list[PluginRecord]) -> list[Callable[[], None]]:
    by_stage: dict[str, list[tuple[int, str, Any]]] = {}
    for record in records:
        for graph_pass in record.graph_passes or ():
            identity = f"{record.name}:{graph_pass.name}"
            wrapped = compat.make_graph_pass(
                identity, graph_pass.fn, graph_passes.uuid_function(identity, graph_pass)
            )
            by_stage.setdefault(graph_pass.stage, []).append((graph_pass.order, identity, wrapped))
    undo = []
    for stage, entries in by_stage.items():
        compat.install_graph_passes(stage, [wrapped for _, _, wrapped in sorted(entries)])
        undo.append(lambda stage=stage: compat.uninstall_graph_passes(stage))  # type: ignore[misc]
    return undo


def _install_part(part: str) -> None:
    """Collect and install one part for every usable plugin (idempotent)."""
    with _lock:
        if part in _installed_parts or not _active:
            return
        for field in _fields_of(part):
            _collect(field)
        _check_conflicts(part)
        _installed_parts.add(part)
        usable = [r for r in _records.values() if _usable(r)]
        if part == INDUCTOR_TRIGGER:
            # One undo per stage, shared by all plugins: a failing plugin is rolled back
            # before this point, so its passes are never installed.
            if any(r.graph_passes for r in usable):
                _undo.extend((part, "*", fn) for fn in _install_passes(usable))
            return
        installer = _install_library_ops if part == LIBRARY_PART else _install_dtensor
        for record in usable:
            try:
                steps = installer(record)
            except Exception as error:  # noqa: BLE001
                _fail(record, f"installing into {part} failed: {_describe(error)}")
                continue
            _undo.extend((part, record.name, step) for step in steps)
        if part == DTENSOR_TRIGGER and any(r.op_handlers or r.strategies for r in usable):
            compat.clear_sharding_caches()


def _install_part_safely(part: str) -> None:
    """Lazy path: errors become warnings (an import in user code must not break)."""
    try:
        _install_part(part)
    except Exception as error:  # noqa: BLE001
        warnings.warn(
            f"dt-core: activating plugins for {part} failed: {_describe(error)}",
            RuntimeWarning,
            stacklevel=2,
        )


# --- public entry points --------------------------------------------------------------------


def activate(*, lazy: bool = False) -> list[PluginInfo]:
    """Install every enabled plugin's contributions; return the plugin table.

    lazy=True installs each part when its torch module is first imported (autoload uses
    this). With lazy=False everything is installed now and a conflict between two
    plugins raises PluginConflictError naming both.
    """
    global _active, _raise_conflicts
    with _lock:
        problem = compat.torch_version_problem()
        if problem and os.environ.get(compat.ALLOW_UNTESTED_ENV, "0") != "1":
            if not lazy:
                raise UnsupportedTorchError(problem)
            discover()
            for record in _records.values():
                if _usable(record):
                    _fail(record, problem)
            return plugins()
        discover()
        _raise_conflicts = not lazy
        _active = True
        for record in _records.values():
            if _usable(record):
                record.state, record.reason = "active", None
        if lazy:
            _install_part_safely(LIBRARY_PART)
            for part in (DTENSOR_TRIGGER, INDUCTOR_TRIGGER):
                import_hooks.when_imported(part, lambda _m, part=part: _install_part_safely(part))
        else:
            try:
                for part in PARTS:  # library ops first: strategies may name the ops they define
                    _install_part(part)
            except PluginConflictError:
                deactivate()  # leave torch exactly as it was
                raise
        return plugins()


def deactivate() -> None:
    """Take every contribution out again, restoring what was there (the same objects)."""
    global _active
    with _lock:
        import_hooks.cancel(DTENSOR_TRIGGER)
        import_hooks.cancel(INDUCTOR_TRIGGER)
        touched_dtensor = any(part == DTENSOR_TRIGGER for part, _, _ in _undo)
        errors = []
        while _undo:
            _, name, step = _undo.pop()
            try:
                step()
            except Exception as error:  # noqa: BLE001 - undo as much as possible
                errors.append(f"{name}: {_describe(error)}")
        if touched_dtensor:
            compat.clear_sharding_caches()
        _installed_parts.clear()
        _active = False
        for record in _records.values():
            if record.state == "active":
                record.state = "inactive"
            # Re-collect on the next activate: ops a plugin defines are new objects then.
            record.op_handlers = record.strategies = record.library_ops = None
            record.graph_passes = record.hop_rules = None
        if errors:
            warnings.warn(
                "dt-core: deactivate could not undo: " + "; ".join(errors),
                RuntimeWarning,
                stacklevel=2,
            )


def is_active() -> bool:
    return _active


def plugins() -> list[PluginInfo]:
    """One PluginInfo per found plugin: name, distribution, version, ops, passes, state."""
    with _lock:
        discover()
        # While inactive, hooks that name ops a plugin defines would fail: list what
        # can be known without installing anything.
        for field in _HOOK_FIELDS if _active else (LIBRARY_PART,):
            _collect(field)
        return [record.snapshot() for record in _records.values()]


def conflicts() -> list[tuple[str, str, str]]:
    """Every (op, plugin, plugin) claimed twice among usable plugins, over all parts."""
    with _lock:
        plugins()
        return [c for part in PARTS for c in _conflicts(part)]


def installed_parts() -> set[str]:
    with _lock:
        return set(_installed_parts)
