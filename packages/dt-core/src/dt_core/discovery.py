"""Finding plugins: entry points in the `dt.plugins` group, minus the disabled ones, and
loading them with messages that name the plugin and the fix when that goes wrong."""

from __future__ import annotations

import importlib
import os
from importlib.metadata import EntryPoint, entry_points
from typing import Any

ENTRY_POINT_GROUP = "dt.plugins"
DISABLE_ENV = "DT_PLUGINS_DISABLE"


class PluginLoadError(Exception):
    """A plugin could not be loaded; the message says why and what to do."""


def disabled_names() -> set[str]:
    """Plugin names listed in DT_PLUGINS_DISABLE (comma separated; "all" or "*" for all)."""
    raw = os.environ.get(DISABLE_ENV, "")
    return {name.strip() for name in raw.split(",") if name.strip()}


def is_disabled(name: str, disabled: set[str]) -> bool:
    return name in disabled or "all" in disabled or "*" in disabled


def plugin_entry_points() -> list[EntryPoint]:
    """Installed plugin entry points, one per name (the first found wins, like pip's path)."""
    seen: dict[str, EntryPoint] = {}
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        seen.setdefault(entry_point.name, entry_point)
    return list(seen.values())


def distribution_of(entry_point: EntryPoint) -> tuple[str | None, str | None]:
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return None, None
    metadata = dist.metadata  # parsed anew on each access: read both from one parse
    return metadata["Name"], metadata["Version"]


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _where(entry_point: EntryPoint) -> str:
    return f"entry point '{entry_point.name} = {entry_point.value}'"


def _dist(entry_point: EntryPoint) -> str:
    """For messages only: reading the name parses the distribution's METADATA."""
    return distribution_of(entry_point)[0] or "its distribution"


def _names_dt_core(error: ImportError) -> bool:
    return (error.name or "").split(".")[0] == "dt_core" or "'dt_core" in str(error)


def load_plugin(entry_point: EntryPoint) -> Any:
    """Import the module an entry point names and return the object it names.

    Raises PluginLoadError naming the entry point and the fix: a module that is not
    installed, an object the module lacks, or an import of a dt-core name that this
    dt-core does not have (a plugin built for a newer core).
    """
    module_name = entry_point.module
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise PluginLoadError(
                f"{_where(entry_point)} names module {module_name!r}, which is not installed: "
                f"reinstall {_dist(entry_point)} or uninstall it"
            ) from error
        raise PluginLoadError(f"import failed: {_describe(error)}") from error
    except ImportError as error:
        if _names_dt_core(error):
            from .plugin_api import newer_core_hint

            raise PluginLoadError(
                f"import failed: {_describe(error)}; {newer_core_hint()}"
            ) from error
        raise PluginLoadError(f"import failed: {_describe(error)}") from error
    except Exception as error:  # noqa: BLE001 - a broken plugin must not break torch
        raise PluginLoadError(f"import failed: {_describe(error)}") from error
    for attribute in (entry_point.attr or "").split(".") if entry_point.attr else ():
        if not hasattr(target, attribute):
            raise PluginLoadError(
                f"{_where(entry_point)} names {entry_point.attr!r}, which module "
                f"{module_name!r} does not define: reinstall {_dist(entry_point)} or uninstall it"
            )
        target = getattr(target, attribute)
    return target
