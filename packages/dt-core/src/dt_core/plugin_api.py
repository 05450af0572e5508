"""The hook-API contract between dt-core and a plugin: is this plugin written for the
hook API this dt-core provides, and if not, what should be upgraded."""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from typing import Any

from .hookspecs import (
    DEFAULT_PLUGIN_API,
    HOOK_API_VERSION,
    PLUGIN_API_ATTRIBUTE,
    SETTINGS_ATTRIBUTE,
)
from .versions import in_range, lower_bound, release


def core_release() -> str:
    """The installed dt-core distribution's version, for messages."""
    try:
        return metadata.version("dt-core")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "(not installed)"


def newer_core_hint() -> str:
    """The fix for a plugin that imports a dt-core name this dt-core lacks."""
    return (
        f"the plugin needs a newer dt-core than {core_release()} "
        f"(hook API {HOOK_API_VERSION}): upgrade dt-core"
    )


class InvalidApiRange(ValueError):
    """A plugin's DT_API is not a version range."""


def declared_api(plugin: Any) -> str:
    """The hook-API range `plugin` declares (DT_API), or the default for older plugins."""
    declared = getattr(plugin, PLUGIN_API_ATTRIBUTE, None)
    if declared is None:
        return DEFAULT_PLUGIN_API
    if not isinstance(declared, str):
        raise InvalidApiRange(f"{PLUGIN_API_ATTRIBUTE} = {declared!r} is not a string")
    return declared


def incompatibility(declared: str, distribution: Callable[[], str | None]) -> str | None:
    """Why a plugin written for hook API `declared` cannot run on this dt-core (None if
    it can), naming both versions and what to upgrade. InvalidApiRange when malformed.
    `distribution()` names the plugin's distribution; it is asked only for a message
    (reading it parses the distribution's METADATA)."""
    try:
        if in_range(HOOK_API_VERSION, declared):
            return None
        lowest = lower_bound(declared)
    except ValueError as error:
        raise InvalidApiRange(f"{PLUGIN_API_ATTRIBUTE}: {error}") from error
    if lowest is not None and lowest > release(HOOK_API_VERSION):
        fix = "upgrade dt-core (pip install -U dt-core)"
    else:
        target = distribution() or "the plugin"
        fix = f"upgrade {target} to a release written for hook API {HOOK_API_VERSION}"
    return (
        f"written for dt-core hook API {declared}, but dt-core {core_release()} provides "
        f"hook API {HOOK_API_VERSION}: {fix}"
    )


class InvalidSettingsDeclaration(ValueError):
    """A plugin's DT_SETTINGS does not name modules."""


def declared_settings(plugin: Any) -> tuple[str, ...]:
    """The modules creating `plugin`'s settings stores (DT_SETTINGS: one name or several)."""
    declared = getattr(plugin, SETTINGS_ATTRIBUTE, ())
    names = (declared,) if isinstance(declared, str) else declared
    if not isinstance(names, (tuple, list)) or not all(
        isinstance(name, str) and name for name in names
    ):
        raise InvalidSettingsDeclaration(
            f"{SETTINGS_ATTRIBUTE} = {declared!r} is not a module name or a list of them"
        )
    return tuple(names)
