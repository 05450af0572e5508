"""Run a callback right after a module finishes importing (or now, if it already has).

Lazy activation rests on this: importing DTensor or Inductor's config is what installs
the plugins' contributions into them, so a plain `import torch` pays almost nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]

_lock = threading.RLock()
_callbacks: dict[str, list[Callback]] = {}


# Modules whose code has run and whose callbacks are running now: importlib still marks
# them initializing, but a callback asking for them (e.g. a patch installed while
# DTensor's import activates the plugins) must be served at once, not wait for an
# import that has already happened.
_firing: set[str] = set()


def _is_loaded(name: str) -> bool:
    module = sys.modules.get(name)
    if module is None:
        return False
    if name in _firing:
        return True
    spec = getattr(module, "__spec__", None)
    return not getattr(spec, "_initializing", False)


def _fire(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _callbacks.pop(name, [])
        if not _callbacks:
            _uninstall_finder()
        _firing.add(name)
    try:
        for callback in callbacks:
            try:
                callback(module)
            except Exception as error:  # noqa: BLE001 - an import must never break because of us
                warnings.warn(
                    f"dt-core: a callback after importing {name} failed: "
                    f"{type(error).__name__}: {error}",
                    RuntimeWarning,
                    stacklevel=2,
                )
    finally:
        with _lock:
            _firing.discard(name)


class _NotifyingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then fires the callbacks for the module."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader  # reloads go straight to the real one
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        # importlib binds a submodule to its parent only after exec_module returns; do it
        # now so callbacks can use `import a.b.c as m` and attribute access alike.
        parent, _, child = self._name.rpartition(".")
        if parent and parent in sys.modules:
            setattr(sys.modules[parent], child, module)
        _fire(self._name, module)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._loader, attribute)


class _WatchingFinder(importlib.abc.MetaPathFinder):
    """Finds watched modules through the other finders and wraps their loader."""

    def find_spec(
        self, name: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name not in _callbacks:
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _NotifyingLoader(spec.loader, name)
                return spec
        return None


_finder = _WatchingFinder()


def _install_finder() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def _uninstall_finder() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def when_imported(name: str, callback: Callback) -> None:
    """Call `callback(module)` once `name` is imported; at once if it already is."""
    with _lock:
        if not _is_loaded(name):
            _callbacks.setdefault(name, []).append(callback)
            _install_finder()
            return
    callback(sys.modules[name])


def cancel(name: str | None = None) -> None:
    """Forget pending callbacks for `name` (all of them when None)."""
    with _lock:
        if name is None:
            _callbacks.clear()
        else:
            _callbacks.pop(name, None)
        if not _callbacks:
            _uninstall_finder()


def cancel_callback(name: str, callback: Callback) -> bool:
    """Forget one pending `callback` for `name`; False if it already ran or was never set."""
    with _lock:
        waiting = _callbacks.get(name, [])
        if callback not in waiting:
            return False
        waiting.remove(callback)
        if not waiting:
            del _callbacks[name]
        if not _callbacks:
            _uninstall_finder()
        return True


def pending() -> list[str]:
    with _lock:
        return sorted(_callbacks)
