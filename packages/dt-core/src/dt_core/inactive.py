"""Why an installed plugin is inactive, and how to turn it on: one answer for every place
that tells the user (`dt-plugins list` and `check`, the notes on failing ops).

Whether the user asked for it decides what `dt-plugins check` makes of it: autoload
turned off or a plugin disabled by name is a choice (check says so and passes); a plugin
that failed, is built for another hook API or meets an untested torch is a problem.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .discovery import DISABLE_ENV
from .records import PluginInfo

AUTOLOAD_ENV = "DT_PLUGINS_AUTOLOAD"  # as dt_core.autoload, which this must not import
TORCH_AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"  # torch's switch for every backend


@dataclass(frozen=True)
class Inactive:
    """Why one plugin is inactive (`label`: a word or two for the listing's column)."""

    label: str
    reason: str
    turn_on: str
    requested: bool  # the user asked for it: autoload off, or disabled by name

    def sentence(self) -> str:
        return f"{self.reason}; to turn it on: {self.turn_on}"


def autoload_off() -> Inactive | None:
    """Autoload turned off on purpose (dt-core's switch or torch's), else None."""
    if os.environ.get(AUTOLOAD_ENV, "1") == "0":
        return Inactive(
            "autoload off",
            f"autoload is off ({AUTOLOAD_ENV}=0)",
            f"call dt_core.activate() before using DTensor, or unset {AUTOLOAD_ENV}",
            requested=True,
        )
    if os.environ.get(TORCH_AUTOLOAD_ENV, "1") != "1":
        return Inactive(
            "autoload off",
            f"torch's backend autoload is off ({TORCH_AUTOLOAD_ENV}=0), so dt-core's did not run",
            f"call dt_core.activate() before using DTensor, or unset {TORCH_AUTOLOAD_ENV}",
            requested=True,
        )
    return None


def why_inactive(info: PluginInfo, active: bool) -> Inactive | None:
    """Why plugin `info` is not active (None: it is); `active`: whether dt-core is."""
    if info.state == "active":
        return None
    if info.state == "disabled":
        value = os.environ.get(DISABLE_ENV, "")
        every = {"all", "*"} & {name.strip() for name in value.split(",")}
        turn_on = f"remove {info.name!r} from {DISABLE_ENV}"
        if every:
            turn_on = f"name only the plugins to skip in {DISABLE_ENV}, not {every.pop()!r}"
        return Inactive(
            "disabled", f"disabled by name ({DISABLE_ENV}={value})", turn_on, requested=True
        )
    reason = info.reason or "no reason recorded"
    if info.state == "incompatible":
        return Inactive(
            "incompatible", reason, "install the releases the reason names", requested=False
        )
    if info.state == "failed":
        return _failed(reason)
    if not active:
        off = autoload_off()
        if off is not None:
            return off
    return Inactive(
        "not activated",
        "dt-core is not active: dt_core.deactivate() was called, or autoload failed "
        "(its warning at `import torch` says why)",
        "call dt_core.activate()",
        requested=False,
    )


def _failed(reason: str) -> Inactive:
    from .compat.torch_version import (
        ALLOW_UNTESTED_ENV,
        TESTED_TORCH_SPEC,
        torch_version,
        torch_version_problem,
    )

    if reason == torch_version_problem():
        return Inactive(
            "untested torch",
            f"torch {torch_version()} is outside the tested releases ({TESTED_TORCH_SPEC})",
            f"install torch {TESTED_TORCH_SPEC}, or set {ALLOW_UNTESTED_ENV}=1 to try anyway",
            requested=False,
        )
    if reason.startswith("conflict:"):
        return Inactive(
            "conflict",
            reason,
            f"disable one of the plugins named with {DISABLE_ENV}=<name>",
            requested=False,
        )
    return Inactive(
        "failed",
        f"it failed: {reason}",
        "fix what the reason names (`dt-plugins check` lists every problem), then restart",
        requested=False,
    )
