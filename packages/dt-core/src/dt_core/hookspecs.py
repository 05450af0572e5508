"""Hook specifications of the `dt` pluggy project: everything a plugin can contribute.

A plugin is a module (named by an entry point in the `dt.plugins` group) holding
functions marked with `dt_core.hookimpl`. Each hook is called lazily, when the part of
torch it targets is first imported (see `dt_core.kinds`), so plugin modules should import
heavy torch modules inside their hook functions rather than at top level.

The hooks form a versioned API, `HOOK_API_VERSION` ("MAJOR.MINOR"): a new hook or a new
optional field raises MINOR (plugins written for an older minor keep working); removing
or changing one raises MAJOR. A plugin module states the range it was written for as
`DT_API = ">=1.0,<2"` (default when absent: `DEFAULT_PLUGIN_API`); outside it the plugin
is not activated and `dt-plugins list` shows it as incompatible.
"""

from __future__ import annotations

from collections.abc import Sequence

import pluggy

from . import contributions

PROJECT = "dt"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

# 1.0: op handlers, HOP rules, sharding strategies, library ops, graph passes.
# 1.1: patches (dt_patches), LibraryOps.defined_in.
# 1.2: rules for torch's LocalTensorMode (dt_local_tensor_rules).
HOOK_API_VERSION = "1.2"
DEFAULT_PLUGIN_API = ">=1.0,<2"  # what a plugin without DT_API was written for
PLUGIN_API_ATTRIBUTE = "DT_API"


@hookspec
def dt_op_handlers() -> Sequence[contributions.OpHandler]:
    """Ops whose whole DTensor dispatch the plugin takes over."""


@hookspec
def dt_hop_rules() -> Sequence[contributions.HopRule]:
    """Higher-order-operator rules for tensor subclasses (installed with DTensor's part)."""


@hookspec
def dt_sharding_strategies() -> Sequence[contributions.ShardingStrategy]:
    """Sharding strategies / propagation rules the plugin registers."""


@hookspec
def dt_library_ops() -> Sequence[contributions.LibraryOps]:
    """torch.library ops (definitions, kernels, fake kernels) the plugin registers."""


@hookspec
def dt_graph_passes() -> Sequence[contributions.GraphPass]:
    """Inductor post-grad graph passes the plugin contributes."""


@hookspec
def dt_patches() -> Sequence[contributions.Patch]:
    """Attributes of torch the plugin replaces while active (API 1.1; DTensor's part)."""


@hookspec
def dt_local_tensor_rules() -> Sequence[contributions.LocalTensorRule]:
    """How ops run under torch's LocalTensorMode (API 1.2; installed when that mode's
    module is first imported)."""
