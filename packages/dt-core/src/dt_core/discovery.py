"""Finding plugins: entry points in the `dt.plugins` group, minus the disabled ones."""

from __future__ import annotations

import os
from importlib.metadata import EntryPoint, entry_points

ENTRY_POINT_GROUP = "dt.plugins"
DISABLE_ENV = "DT_PLUGINS_DISABLE"


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
    return dist.metadata["Name"], dist.version
