"""Hook specifications of the `dt` pluggy project: everything a plugin can contribute.

A plugin is a module (named by an entry point in the `dt.plugins` group) holding
functions marked with `dt_core.hookimpl`. Each hook is called lazily, when the part of
torch it targets is first imported, so plugin modules should import heavy torch
modules inside their hook functions rather than at top level.
"""

from __future__ import annotations

from collections.abc import Sequence

import pluggy

from .contributions import GraphPass, HopRule, LibraryOps, OpHandler, ShardingStrategy

PROJECT = "dt"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def dt_op_handlers() -> Sequence[OpHandler]:
    """Ops whose whole DTensor dispatch the plugin takes over."""


@hookspec
def dt_hop_rules() -> Sequence[HopRule]:
    """Higher-order-operator rules for tensor subclasses (installed with DTensor's part)."""


@hookspec
def dt_sharding_strategies() -> Sequence[ShardingStrategy]:
    """Sharding strategies / propagation rules the plugin registers."""


@hookspec
def dt_library_ops() -> Sequence[LibraryOps]:
    """torch.library ops (definitions, kernels, fake kernels) the plugin registers."""


@hookspec
def dt_graph_passes() -> Sequence[GraphPass]:
    """Inductor post-grad graph passes the plugin contributes."""
