"""Hook specifications of the `dt` pluggy project: everything a plugin can contribute.

A plugin is a module (named by an entry point in the `dt.plugins` group) holding
functions marked with `dt_core.hookimpl`. There is one hook per contribution kind, and
its specification is made from that kind's entry in `dt_core.kinds.KINDS` (name, record
type, docstring). Each hook is called lazily, when the part of torch it targets is first
imported, so plugin modules should import heavy torch modules inside their hook functions
rather than at top level.

The hooks form a versioned API, `HOOK_API_VERSION` ("MAJOR.MINOR"): a new hook or a new
optional field raises MINOR (plugins written for an older minor keep working); removing
or changing one raises MAJOR. A plugin module states the range it was written for as
`DT_API = ">=1.0,<2"` (default when absent: `DEFAULT_PLUGIN_API`); outside it the plugin
is not activated and `dt-plugins list` shows it as incompatible.

A plugin with settings names the module(s) that create its `dt_core.kit.SettingsStore`
as `DT_SETTINGS = "package.config"` (API 1.3) instead of importing them: dt-core imports
them when the settings are listed (`dt_core.kit.registered_settings()`), so `import
torch`, which loads every plugin module, does not pay for them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pluggy

from .kinds import KINDS, Kind

PROJECT = "dt"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

# 1.0: op handlers, HOP rules, sharding strategies, library ops, graph passes.
# 1.1: patches (dt_patches), LibraryOps.defined_in.
# 1.2: rules for torch's LocalTensorMode (dt_local_tensor_rules).
# 1.3: DT_SETTINGS, settings modules imported when the settings are listed.
HOOK_API_VERSION = "1.3"
DEFAULT_PLUGIN_API = ">=1.0,<2"  # what a plugin without DT_API was written for
PLUGIN_API_ATTRIBUTE = "DT_API"
SETTINGS_ATTRIBUTE = "DT_SETTINGS"


def _specification(kind: Kind) -> Callable[[], Sequence[Any]]:
    """The pluggy hook specification of `kind`: a hook without arguments returning
    `kind.record_type` records, documented by `kind.doc`."""

    def specification() -> Sequence[Any]:
        raise NotImplementedError  # never called: pluggy calls the plugins' hookimpls

    specification.__name__ = specification.__qualname__ = kind.hook
    specification.__doc__ = kind.doc
    specification.__annotations__ = {"return": f"Sequence[{kind.record_type.__name__}]"}
    return hookspec(specification)


# One hook per entry of the kinds table: dt_library_ops, dt_op_handlers,
# dt_sharding_strategies, dt_hop_rules, dt_patches, dt_graph_passes, dt_local_tensor_rules.
globals().update({kind.hook: _specification(kind) for kind in KINDS})
