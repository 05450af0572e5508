"""The table of contribution kinds: one entry says everything dt-core does with a kind.

Each `Kind` names its hook, the record type the hook returns, the torch part whose import
installs it, its installer (one contribution in, its undo out), the conflict key (two
usable plugins with the same key in the same part conflict) and the column
`dt-plugins list` shows it in. Activation (`dt_core.activation`) is driven by this table
alone; the hook specifications are written out in `dt_core.hookspecs` (the tests check
both name the same hooks): adding a kind is a hook there, one entry here and one
installer.

The installers are referenced directly (`dt_core.installers`, a light module: the torch
internals each reaches through `dt_core.compat` load on first use); the table itself is
read during `import torch`, when only library ops are installed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from . import contributions, installers

Column = Literal["ops", "passes", "patches"]


@dataclass(frozen=True)
class Part:
    """A group of kinds installed together: when `trigger` is first imported (None: as
    soon as activation starts, so library ops exist before anyone calls them)."""

    name: str
    trigger: str | None


LIBRARY = Part("torch", None)
DTENSOR = Part("dtensor", "torch.distributed.tensor")
INDUCTOR = Part("inductor", "torch._inductor.config")
LOCAL_TENSOR = Part("local_tensor", "torch.distributed._local_tensor")
# install order: strategies may name library ops
PARTS = (LIBRARY, DTENSOR, INDUCTOR, LOCAL_TENSOR)


@dataclass(frozen=True)
class Kind:
    """One kind of contribution (see the module docstring)."""

    name: str  # key in PluginRecord.contributions
    hook: str  # the hook, specified (and documented) in `dt_core.hookspecs`
    record_type: type
    part: Part
    install: Callable[[str, Any], installers.Undo]  # (plugin name, contribution) -> undo
    claims: Callable[[str, Any], list[str]]  # (plugin name, contribution) -> conflict keys
    column: Column  # where `dt-plugins list` shows the claims
    describe: Callable[[Any], dict[str, Any]] | None = None  # extra detail for the listing
    after_change: Callable[[], None] | None = None  # once after installing or removing any


def _lazy(module: str, name: str) -> Callable[..., Any]:
    """`dt_core.<module>.<name>`, imported when first called: for the two helpers that
    reach torch internals not loaded during `import torch` (DTensor's caches, the pass
    settings); the installers themselves are light and referenced directly."""

    def call(*args: Any) -> Any:
        return getattr(importlib.import_module(f"dt_core.{module}"), name)(*args)

    call.__qualname__ = call.__name__ = name
    return call


# One object for both DTensor kinds, so a change to both clears the caches once.
_clear_sharding_caches = _lazy("compat.dispatch", "clear_sharding_caches")

KINDS: tuple[Kind, ...] = (
    Kind(
        name="library_ops",
        hook="dt_library_ops",
        record_type=contributions.LibraryOps,
        part=LIBRARY,
        install=installers.install_library_ops,
        claims=lambda owner, lib: list(lib.ops),
        column="ops",
    ),
    Kind(
        name="op_handlers",
        hook="dt_op_handlers",
        record_type=contributions.OpHandler,
        part=DTENSOR,
        install=installers.install_op_handler,
        claims=lambda owner, handler: [handler.claim(owner)],
        column="ops",
        after_change=_clear_sharding_caches,
    ),
    Kind(
        name="sharding_strategies",
        hook="dt_sharding_strategies",
        record_type=contributions.ShardingStrategy,
        part=DTENSOR,
        install=installers.install_sharding_strategy,
        claims=lambda owner, strategy: [str(strategy.op)],
        column="ops",
        after_change=_clear_sharding_caches,
    ),
    Kind(
        name="hop_rules",
        hook="dt_hop_rules",
        record_type=contributions.HopRule,
        part=DTENSOR,
        install=installers.install_hop_rule,
        claims=lambda owner, rule: [rule.claim()],
        column="ops",
    ),
    Kind(
        name="patches",
        hook="dt_patches",
        record_type=contributions.Patch,
        part=DTENSOR,
        install=installers.install_patch,
        claims=lambda owner, patch: [patch.claim()],
        column="patches",
        describe=lambda patch: {"torch": patch.torch_versions or "any"},
    ),
    Kind(
        name="graph_passes",
        hook="dt_graph_passes",
        record_type=contributions.GraphPass,
        part=INDUCTOR,
        install=installers.install_graph_pass,
        claims=lambda owner, graph_pass: [contributions.pass_identity(owner, graph_pass)],
        column="passes",
        describe=_lazy("graph_passes", "describe_settings"),
    ),
    Kind(
        name="local_tensor_rules",
        hook="dt_local_tensor_rules",
        record_type=contributions.LocalTensorRule,
        part=LOCAL_TENSOR,
        install=installers.install_local_tensor_rule,
        claims=lambda owner, rule: [rule.claim()],
        column="ops",
    ),
)


def kinds_of(part: Part) -> tuple[Kind, ...]:
    return tuple(kind for kind in KINDS if kind.part == part)
