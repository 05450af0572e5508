"""Hook specifications of the `dt` pluggy project: everything a plugin can contribute.

A plugin is a module (named by an entry point in the `dt.plugins` group) holding
functions marked with `dt_core.hookimpl`. There is one hook per contribution kind, written
out below as a function (what pluggy calls a specification); the kinds table
(`dt_core.kinds.KINDS`) says what dt-core does with each, and its tests check the two
name the same hooks and record types. Each hook is called lazily, when the part of torch
it targets is first imported, so plugin modules should import heavy torch modules inside
their hook functions rather than at top level.

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

from collections.abc import Sequence

import pluggy

from .contributions import (
    GraphPass,
    HopRule,
    LibraryOps,
    LocalTensorRule,
    OpHandler,
    Patch,
    ShardingStrategy,
)

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


# The hooks. Each is called without arguments and returns the plugin's contributions of
# one kind; these bodies never run (pluggy calls the plugins' hookimpls).


@hookspec
def dt_library_ops() -> Sequence[LibraryOps]:
    """torch.library ops (definitions, kernels, fake kernels) the plugin registers."""
    raise NotImplementedError


@hookspec
def dt_op_handlers() -> Sequence[OpHandler]:
    """Ops whose whole DTensor dispatch the plugin takes over."""
    raise NotImplementedError


@hookspec
def dt_sharding_strategies() -> Sequence[ShardingStrategy]:
    """Sharding strategies / propagation rules the plugin registers."""
    raise NotImplementedError


@hookspec
def dt_hop_rules() -> Sequence[HopRule]:
    """Higher-order-operator rules for tensor subclasses (installed with DTensor's part)."""
    raise NotImplementedError


@hookspec
def dt_patches() -> Sequence[Patch]:
    """Attributes of torch the plugin replaces while active (API 1.1; DTensor's part)."""
    raise NotImplementedError


@hookspec
def dt_graph_passes() -> Sequence[GraphPass]:
    """Inductor post-grad graph passes the plugin contributes."""
    raise NotImplementedError


@hookspec
def dt_local_tensor_rules() -> Sequence[LocalTensorRule]:
    """How ops run under torch's LocalTensorMode (API 1.2; installed when that mode's
    module is first imported)."""
    raise NotImplementedError
